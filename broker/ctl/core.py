"""The ctl verbs' shared parts: exit statuses, the verb registry, the management API client and
the table/JSON output. Does not define verbs (access_verbs, entity_verbs, node_verbs do) nor
parse the command line (``broker.ctl``)."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import quote

EX_OK, EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE, EX_NOPERM = (
    0, 64, 65, 67, 69, 70, 77)


# what a verb returns: ``(columns, rows)`` for a list, a string to print, or None
Rows = tuple[list[str], list[dict[str, Any]]]
Result = Rows | str | None


class CtlError(Exception):
    def __init__(self, message: str, status: int = EX_SOFTWARE):
        super().__init__(message)
        self.status = status


@dataclass
class Verb:
    """One rabbitmqctl verb. ``arguments``: (name, argparse kwargs) pairs; ``run(api, args)``
    returns None (nothing to print), or ``(columns, rows)`` for a list (rows are dicts),
    or a string to print."""
    name: str
    help: str
    run: Callable[[Api, argparse.Namespace], Any]
    arguments: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    banner: Callable[[argparse.Namespace], str | None] | None = None
    vhost: bool = False  # takes -p/--vhost


VERBS: dict[str, Verb] = {}


def register(verb: Verb) -> Verb:
    VERBS[verb.name] = verb
    return verb


def q(value: str) -> str:
    return quote(value, safe="")


class Api:
    """The management API of the broker, with rabbitmqctl's exit statuses on failure."""

    def __init__(self, url: str, user: str, password: str, timeout: float = 60.0):
        import httpx
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, auth=(user, password), timeout=timeout)

    def call(self, method: str, path: str, body: Any = None,
             auth: tuple[str, str] | None = None,
             not_found: tuple[str, int] | None = None) -> Any:
        import httpx
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["json"] = body
        if auth is not None:
            kwargs["auth"] = auth
        try:
            r = self.client.request(method, "/api" + path, **kwargs)
        except httpx.HTTPError as exc:
            raise CtlError(f"unable to reach the broker at {self.url}: {exc}",
                           EX_UNAVAILABLE) from None
        if r.status_code < 300:
            return r.json() if r.content else None
        try:
            reason = r.json().get("reason", r.text)
        except ValueError:
            reason = r.text
        if r.status_code == 401:
            raise CtlError(f"not authorised: {reason}", EX_NOPERM)
        if r.status_code == 404:
            if not_found is not None:
                raise CtlError(*not_found)
            if "vhost" in str(reason):
                raise CtlError(f"virtual host does not exist ({reason})", EX_UNAVAILABLE)
            raise CtlError(f"not found: {path}", EX_DATAERR)
        if r.status_code == 400:
            raise CtlError(str(reason), EX_DATAERR)
        raise CtlError(f"HTTP {r.status_code}: {reason}", EX_SOFTWARE)

    def get(self, path: str, **kw: Any) -> Any:
        return self.call("GET", path, **kw)


# ---- output --------------------------------------------------------------------------------


def cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list):
        return "[" + ", ".join(cell(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def emit(result: Any, formatter: str, out: TextIO | None = None, headers: bool = True) -> None:
    if result is None:
        return
    if out is None:  # looked up now: whoever called may have replaced sys.stdout
        out = sys.stdout
    if isinstance(result, str):
        print(result, file=out)
        return
    columns, rows = result
    if formatter == "json":
        out.write(json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=None))
        out.write("\n")
        return
    if rows:
        if headers:
            print("\t".join(columns), file=out)
        for r in rows:
            print("\t".join(cell(r.get(c)) for c in columns), file=out)


def columns(args: argparse.Namespace, default: list[str], valid: set[str]) -> list[str]:
    cols = [c for item in (args.columns or []) for c in item.split(",") if c] or default
    bad = [c for c in cols if c not in valid]
    if bad:
        raise CtlError(f"Info key(s) {','.join(bad)} are not supported", EX_USAGE)
    return cols


# ---- verbs ---------------------------------------------------------------------------------


def exists(api: Api, path: str) -> bool:
    try:
        api.get(path, not_found=("", EX_DATAERR))
    except CtlError as exc:
        if str(exc) == "":
            return False
        raise
    return True


def json_arg(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise CtlError(f"{what}: not valid JSON: {text}", EX_DATAERR) from None
    if not isinstance(value, dict):
        raise CtlError(f"{what}: expected a JSON object", EX_DATAERR)
    return value


def vhost_missing(vhost: str) -> tuple[str, int]:
    return f"Virtual host {vhost} does not exist", EX_UNAVAILABLE


def need_vhost(api: Api, vhost: str) -> None:
    api.get("/vhosts/" + q(vhost), not_found=vhost_missing(vhost))


def need_user(api: Api, user: str) -> None:
    api.get("/users/" + q(user), not_found=(f'User "{user}" does not exist', EX_NOUSER))
