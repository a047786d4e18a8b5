"""``python -m broker ctl <verb>``: rabbitmqctl's verbs, arguments and output columns, over the
management HTTP API of a running broker (docs/management.md "ctl").

Connection: ``--url`` (``$TRIOMQ_URL``, default http://127.0.0.1:15672), ``--user`` /
``--password`` (``$TRIOMQ_USER`` / ``$TRIOMQ_PASSWORD``, default guest/guest).
Output: ``--formatter table`` (rabbitmqctl's default: a banner line, then tab-separated
columns with a header) or ``json``; ``-q`` drops the banner.
Errors: one line on stderr, exit status as rabbitmqctl's (sysexits): 64 usage, 65 bad data
(refused input, failed authentication), 67 no such user, 69 unavailable (broker unreachable,
no such vhost), 70 anything else, 77 not authorised.

Other features add verbs with ``register(Verb(...))`` from a module listed in
``EXTENSION_MODULES`` (imported when the ctl parser is built; a missing module is skipped).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

EX_OK, EX_USAGE, EX_DATAERR, EX_NOUSER, EX_UNAVAILABLE, EX_SOFTWARE, EX_NOPERM = (
    0, 64, 65, 67, 69, 70, 77)

# modules that register verbs of their own features (e.g. HTTP topics)
EXTENSION_MODULES: list[str] = ["broker.hermes.ctl", "broker.streams.ctl"]


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
    arguments: list[tuple[str, dict]] = field(default_factory=list)
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

    def call(self, method: str, path: str, body: Any = None, auth=None,
             not_found: tuple[str, int] | None = None) -> Any:
        import httpx
        kwargs: dict = {}
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

    def get(self, path: str, **kw) -> Any:
        return self.call("GET", path, **kw)


# ---- output --------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def emit(result: Any, formatter: str, out=None, headers: bool = True) -> None:
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
            print("\t".join(_cell(r.get(c)) for c in columns), file=out)


def _columns(args, default: list[str], valid: set[str]) -> list[str]:
    cols = [c for item in (args.columns or []) for c in item.split(",") if c] or default
    bad = [c for c in cols if c not in valid]
    if bad:
        raise CtlError(f"Info key(s) {','.join(bad)} are not supported", EX_USAGE)
    return cols


# ---- verbs ---------------------------------------------------------------------------------


def _user_verbs() -> None:
    def add_user(api: Api, a):
        existing = _exists(api, "/users/" + q(a.username))
        if existing:
            raise CtlError(f'User "{a.username}" already exists', EX_SOFTWARE)
        api.call("PUT", "/users/" + q(a.username), {"password": a.password, "tags": ""})

    def delete_user(api: Api, a):
        api.call("DELETE", "/users/" + q(a.username),
                 not_found=(f'User "{a.username}" does not exist', EX_NOUSER))

    def change_password(api: Api, a):
        user = api.get("/users/" + q(a.username),
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        api.call("PUT", "/users/" + q(a.username),
                 {"password": a.password, "tags": user.get("tags", [])})

    def authenticate_user(api: Api, a):
        r = api.client.get("/api/whoami", auth=(a.username, a.password))
        if r.status_code == 401 and "Login failed" in r.text:
            raise CtlError(f'Error: failed to authenticate user "{a.username}"\n'
                           f"user '{a.username}' - invalid credentials", EX_DATAERR)
        if r.status_code >= 400 and r.status_code != 401:
            raise CtlError(f"HTTP {r.status_code}", EX_SOFTWARE)
        return "Success"

    def set_user_tags(api: Api, a):
        user = api.get("/users/" + q(a.username),
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        body = {"password_hash": user["password_hash"],
                "hashing_algorithm": user.get("hashing_algorithm"), "tags": ",".join(a.tags)}
        api.call("PUT", "/users/" + q(a.username), body)

    def list_users(api: Api, a):
        return ["user", "tags"], [{"user": u["name"], "tags": u["tags"]}
                                  for u in api.get("/users")]

    def set_user_limits(api: Api, a):
        limits = _json_arg(a.definition, "limits")
        for name, value in limits.items():
            api.call("PUT", f"/user-limits/{q(a.username)}/{q(name)}", {"value": value},
                     not_found=(f'User "{a.username}" does not exist', EX_NOUSER))

    register(Verb("add_user", "Creates a new user", add_user,
                  [("username", {}), ("password", {})],
                  banner=lambda a: f'Adding user "{a.username}" ...'))
    register(Verb("delete_user", "Removes a user", delete_user, [("username", {})],
                  banner=lambda a: f'Deleting user "{a.username}" ...'))
    register(Verb("change_password", "Changes the user password", change_password,
                  [("username", {}), ("password", {})],
                  banner=lambda a: f'Changing password for user "{a.username}" ...'))
    register(Verb("authenticate_user", "Attempts to authenticate a user", authenticate_user,
                  [("username", {}), ("password", {})],
                  banner=lambda a: f'Authenticating user "{a.username}" ...'))
    register(Verb("set_user_tags", "Sets user tags", set_user_tags,
                  [("username", {}), ("tags", {"nargs": "*"})],
                  banner=lambda a: f'Setting tags for user "{a.username}" to [{", ".join(a.tags)}] ...'))
    register(Verb("list_users", "List user names and tags", list_users,
                  banner=lambda a: "Listing users ..."))
    register(Verb("set_user_limits", "Sets user limits", set_user_limits,
                  [("username", {}), ("definition", {})],
                  banner=lambda a: f'Setting user limits to "{a.definition}" for user '
                                   f'"{a.username}" ...'))


def _exists(api: Api, path: str) -> bool:
    try:
        api.get(path, not_found=("", EX_DATAERR))
    except CtlError as exc:
        if str(exc) == "":
            return False
        raise
    return True


def _json_arg(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        raise CtlError(f"{what}: not valid JSON: {text}", EX_DATAERR) from None
    if not isinstance(value, dict):
        raise CtlError(f"{what}: expected a JSON object", EX_DATAERR)
    return value


def _vhost_missing(vhost: str) -> tuple[str, int]:
    return f"Virtual host {vhost} does not exist", EX_UNAVAILABLE


def _vhost_verbs() -> None:
    def add_vhost(api: Api, a):
        body: dict = {}
        if a.description:
            body["description"] = a.description
        if a.tags:
            body["tags"] = a.tags
        if a.default_queue_type:
            body["default_queue_type"] = a.default_queue_type
        api.call("PUT", "/vhosts/" + q(a.vhost_name), body)

    def delete_vhost(api: Api, a):
        api.call("DELETE", "/vhosts/" + q(a.vhost_name),
                 not_found=(f"Virtual host {a.vhost_name} does not exist", EX_UNAVAILABLE))

    def list_vhosts(api: Api, a):
        cols = _columns(a, ["name"], {"name", "description", "tags", "tracing",
                                      "cluster_state", "default_queue_type"})
        return cols, api.get("/vhosts")

    def set_vhost_limits(api: Api, a):
        limits = _json_arg(a.definition, "limits")
        for name, value in limits.items():
            api.call("PUT", f"/vhost-limits/{q(a.vhost)}/{q(name)}", {"value": value},
                     not_found=_vhost_missing(a.vhost))

    register(Verb("add_vhost", "Creates a virtual host", add_vhost, [
        ("vhost_name", {}), ("--description", {"default": ""}), ("--tags", {"default": ""}),
        ("--default-queue-type", {"default": None})],
        banner=lambda a: f'Adding vhost "{a.vhost_name}" ...'))
    register(Verb("delete_vhost", "Deletes a virtual host", delete_vhost, [("vhost_name", {})],
                  banner=lambda a: f'Deleting vhost "{a.vhost_name}" ...'))
    register(Verb("list_vhosts", "Lists virtual hosts", list_vhosts,
                  [("columns", {"nargs": "*"})], banner=lambda a: "Listing vhosts ..."))
    register(Verb("set_vhost_limits", "Sets virtual host limits", set_vhost_limits,
                  [("definition", {})], vhost=True,
                  banner=lambda a: f'Setting vhost limits to "{a.definition}" for vhost '
                                   f'"{a.vhost}" ...'))


def _permission_verbs() -> None:
    def set_permissions(api: Api, a):
        _need_vhost(api, a.vhost)
        _need_user(api, a.username)
        api.call("PUT", f"/permissions/{q(a.vhost)}/{q(a.username)}",
                 {"configure": a.conf, "write": a.write, "read": a.read})

    def clear_permissions(api: Api, a):
        _need_vhost(api, a.vhost)
        _need_user(api, a.username)
        try:
            api.call("DELETE", f"/permissions/{q(a.vhost)}/{q(a.username)}")
        except CtlError as exc:
            if exc.status != EX_DATAERR:
                raise  # RabbitMQ: clearing absent permissions succeeds

    def list_permissions(api: Api, a):
        rows = api.get(f"/vhosts/{q(a.vhost)}/permissions", not_found=_vhost_missing(a.vhost))
        return ["user", "configure", "write", "read"], rows

    def list_user_permissions(api: Api, a):
        rows = api.get(f"/users/{q(a.username)}/permissions",
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        return ["vhost", "configure", "write", "read"], rows

    def set_topic_permissions(api: Api, a):
        _need_vhost(api, a.vhost)
        _need_user(api, a.username)
        api.call("PUT", f"/topic-permissions/{q(a.vhost)}/{q(a.username)}",
                 {"exchange": a.exchange, "write": a.write, "read": a.read})

    def list_topic_permissions(api: Api, a):
        rows = api.get(f"/vhosts/{q(a.vhost)}/topic-permissions",
                       not_found=_vhost_missing(a.vhost))
        return ["user", "exchange", "write", "read"], rows

    register(Verb("set_permissions", "Sets user permissions for a vhost", set_permissions,
                  [("username", {}), ("conf", {}), ("write", {}), ("read", {})], vhost=True,
                  banner=lambda a: f'Setting permissions for user "{a.username}" in vhost '
                                   f'"{a.vhost}" ...'))
    register(Verb("clear_permissions", "Revokes user permissions for a vhost",
                  clear_permissions, [("username", {})], vhost=True,
                  banner=lambda a: f'Clearing permissions for user "{a.username}" in vhost '
                                   f'"{a.vhost}" ...'))
    register(Verb("list_permissions", "Lists user permissions in a virtual host",
                  list_permissions, vhost=True,
                  banner=lambda a: f'Listing permissions for vhost "{a.vhost}" ...'))
    register(Verb("list_user_permissions", "Lists permissions of a user across all vhosts",
                  list_user_permissions, [("username", {})],
                  banner=lambda a: f'Listing permissions for user "{a.username}" ...'))
    register(Verb("set_topic_permissions", "Sets topic permission for an exchange",
                  set_topic_permissions,
                  [("username", {}), ("exchange", {}), ("write", {}), ("read", {})],
                  vhost=True,
                  banner=lambda a: f'Setting topic permissions on "{a.exchange}" for user '
                                   f'"{a.username}" in vhost "{a.vhost}" ...'))
    register(Verb("list_topic_permissions", "Lists topic permissions in a virtual host",
                  list_topic_permissions, vhost=True,
                  banner=lambda a: f'Listing topic permissions for vhost "{a.vhost}" ...'))


def _need_vhost(api: Api, vhost: str) -> None:
    api.get("/vhosts/" + q(vhost), not_found=_vhost_missing(vhost))


def _need_user(api: Api, user: str) -> None:
    api.get("/users/" + q(user), not_found=(f'User "{user}" does not exist', EX_NOUSER))


def _policy_verbs() -> None:
    def set_policy(api: Api, a):
        definition = _json_arg(a.definition, "definition")
        api.call("PUT", f"/policies/{q(a.vhost)}/{q(a.name)}",
                 {"pattern": a.pattern, "definition": definition, "priority": a.priority,
                  "apply-to": a.apply_to}, not_found=_vhost_missing(a.vhost))

    def clear_policy(api: Api, a):
        api.call("DELETE", f"/policies/{q(a.vhost)}/{q(a.name)}",
                 not_found=("Parameter does not exist", EX_DATAERR))

    def list_policies(api: Api, a):
        rows = api.get(f"/policies/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))
        return ["vhost", "name", "pattern", "apply-to", "definition", "priority"], rows

    register(Verb("set_policy", "Sets or updates a policy", set_policy, [
        ("name", {}), ("pattern", {}), ("definition", {}),
        ("--priority", {"type": int, "default": 0}),
        ("--apply-to", {"default": "all", "choices": ["queues", "classic_queues",
                                                    "quorum_queues", "streams", "exchanges",
                                                    "all"]})],
        vhost=True, banner=lambda a: f'Setting policy "{a.name}" for pattern "{a.pattern}" '
                                     f'to "{a.definition}" with priority "{a.priority}" for '
                                     f'vhost "{a.vhost}" ...'))
    register(Verb("clear_policy", "Clears (removes) a policy", clear_policy, [("name", {})],
                  vhost=True,
                  banner=lambda a: f'Clearing policy "{a.name}" on vhost "{a.vhost}" ...'))
    register(Verb("list_policies", "Lists all policies in a virtual host", list_policies,
                  vhost=True, banner=lambda a: f'Listing policies for vhost "{a.vhost}" ...'))


_QUEUE_KEYS = {"name", "durable", "auto_delete", "arguments", "policy", "operator_policy",
               "effective_policy_definition", "exclusive", "messages", "messages_ready",
               "messages_unacknowledged", "message_bytes", "message_bytes_ready", "consumers",
               "memory", "state", "type", "vhost", "consumer_utilisation",
               "exclusive_consumer_tag", "single_active_consumer_tag", "head_message_timestamp",
               # in a cluster, as the queue's master has them (the same from every node)
               "node", "leader", "members", "online", "slave_nodes",
               "synchronised_slave_nodes", "term"}
_EXCHANGE_KEYS = {"name", "type", "durable", "auto_delete", "internal", "arguments", "policy",
                  "vhost"}
_BINDING_KEYS = {"source_name", "source_kind", "destination_name", "destination_kind",
                 "routing_key", "arguments", "vhost"}
_CONNECTION_KEYS = {"name", "user", "vhost", "peer_host", "peer_port", "host", "port", "state",
                    "channels", "protocol", "auth_mechanism", "ssl", "timeout", "frame_max",
                    "channel_max", "client_properties", "connected_at", "type", "send_pend"}
_CONSUMER_KEYS = {"queue_name", "channel_pid", "consumer_tag", "ack_required",
                  "prefetch_count", "active", "activity_status", "arguments", "exclusive"}


def _entity_verbs() -> None:
    def list_queues(api: Api, a):
        cols = _columns(a, ["name", "messages"], _QUEUE_KEYS)
        return cols, api.get(f"/queues/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))

    def list_exchanges(api: Api, a):
        cols = _columns(a, ["name", "type"], _EXCHANGE_KEYS)
        return cols, api.get(f"/exchanges/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))

    def list_bindings(api: Api, a):
        cols = _columns(a, ["source_name", "source_kind", "destination_name",
                            "destination_kind", "routing_key", "arguments"], _BINDING_KEYS)
        rows = [{"source_name": b["source"], "source_kind": "exchange",
                 "destination_name": b["destination"], "destination_kind": b["destination_type"],
                 "routing_key": b["routing_key"], "arguments": b["arguments"],
                 "vhost": b["vhost"]}
                for b in api.get(f"/bindings/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))]
        return cols, rows

    def list_connections(api: Api, a):
        cols = _columns(a, ["user", "peer_host", "peer_port", "state"], _CONNECTION_KEYS)
        return cols, api.get("/connections")

    def list_consumers(api: Api, a):
        cols = _columns(a, ["queue_name", "channel_pid", "consumer_tag", "ack_required",
                            "prefetch_count", "active", "arguments"], _CONSUMER_KEYS)
        rows = [{"queue_name": c["queue"]["name"], "channel_pid": c["channel_details"]["name"],
                 "consumer_tag": c["consumer_tag"], "ack_required": c["ack_required"],
                 "prefetch_count": c["prefetch_count"], "active": c["active"],
                 "activity_status": c.get("activity_status"), "arguments": c["arguments"],
                 "exclusive": c["exclusive"]}
                for c in api.get(f"/consumers/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))]
        return cols, rows

    def close_connection(api: Api, a):
        api.client.headers["X-Reason"] = a.explanation
        api.call("DELETE", "/connections/" + q(a.connection_name),
                 not_found=(f"connection {a.connection_name} not found", EX_DATAERR))

    def purge_queue(api: Api, a):
        api.call("DELETE", f"/queues/{q(a.vhost)}/{q(a.queue)}/contents",
                 not_found=(f"queue '{a.queue}' in vhost '{a.vhost}' not found", EX_DATAERR))

    def delete_queue(api: Api, a):
        params = []
        if a.if_empty:
            params.append("if-empty=true")
        if a.if_unused:
            params.append("if-unused=true")
        suffix = "?" + "&".join(params) if params else ""
        queue = api.get(f"/queues/{q(a.vhost)}/{q(a.queue)}",
                        not_found=(f"queue '{a.queue}' in vhost '{a.vhost}' not found",
                                   EX_DATAERR))
        api.call("DELETE", f"/queues/{q(a.vhost)}/{q(a.queue)}{suffix}")
        return f"Queue was successfully deleted with {queue.get('messages', 0)} messages"

    cols = ("columns", {"nargs": "*"})
    register(Verb("list_queues", "Lists queues and their properties", list_queues, [cols],
                  vhost=True, banner=lambda a: f"Listing queues for vhost {a.vhost} ..."))
    register(Verb("list_exchanges", "Lists exchanges", list_exchanges, [cols], vhost=True,
                  banner=lambda a: f"Listing exchanges for vhost {a.vhost} ..."))
    register(Verb("list_bindings", "Lists all bindings on a vhost", list_bindings, [cols],
                  vhost=True, banner=lambda a: f"Listing bindings for vhost {a.vhost}..."))
    register(Verb("list_connections", "Lists AMQP 0.9.1 connections for the node",
                  list_connections, [cols], banner=lambda a: "Listing connections ..."))
    register(Verb("list_consumers", "Lists all consumers for a vhost", list_consumers, [cols],
                  vhost=True, banner=lambda a: f"Listing consumers in vhost {a.vhost} ..."))
    register(Verb("close_connection", "Instructs the broker to close the connection "
                  "associated with the Erlang process id", close_connection,
                  [("connection_name", {}), ("explanation", {})],
                  banner=lambda a: f'Closing connection "{a.connection_name}", reason: '
                                   f'{a.explanation}...'))
    register(Verb("purge_queue", "Purges a queue (removes all messages in it)", purge_queue,
                  [("queue", {})], vhost=True,
                  banner=lambda a: f"Purging queue '{a.queue}' in vhost '{a.vhost}' ..."))
    register(Verb("delete_queue", "Deletes a queue", delete_queue, [
        ("queue", {}), ("--if-empty", {"action": "store_true"}),
        ("--if-unused", {"action": "store_true"})], vhost=True,
        banner=lambda a: f"Deleting queue '{a.queue}' on vhost '{a.vhost}' ..."))


def _definitions_verbs() -> None:
    def export_definitions(api: Api, a):
        defs = api.get("/definitions")
        text = json.dumps(defs, indent=2)
        if a.path == "-":
            return text
        try:
            with open(a.path, "w") as f:
                f.write(text)
        except OSError as exc:
            raise CtlError(f"could not write {a.path}: {exc.strerror}", EX_DATAERR) from None
        return None

    def import_definitions(api: Api, a):
        try:
            raw = sys.stdin.read() if a.path == "-" else Path(a.path).read_text()
        except OSError as exc:
            raise CtlError(f"could not read {a.path}: {exc.strerror}", EX_DATAERR) from None
        try:
            defs = json.loads(raw)
        except ValueError:
            raise CtlError(f"{a.path}: not valid JSON", EX_DATAERR) from None
        api.call("POST", "/definitions", defs)

    def status(api: Api, a):
        overview = api.get("/overview")
        node = api.get("/nodes")[0]
        totals = overview.get("object_totals", {})
        if a.formatter == "json":
            return json.dumps({"pid": node.get("os_pid"), "product_name":
                               overview.get("product_name"), "product_version":
                               overview.get("product_version"), "uptime": node.get("uptime"),
                               "alarms": node.get("alarms", []), "listeners":
                               overview.get("listeners", []), "totals": totals,
                               "memory": {"used": node.get("mem_used"),
                                          "limit": node.get("mem_limit")}})
        lines = ["Runtime", "", f"OS PID: {node.get('os_pid')}",
                 f"Product name: {overview.get('product_name')}",
                 f"Product version: {overview.get('product_version')}",
                 f"Uptime (seconds): {int(node.get('uptime', 0)) // 1000}", "", "Alarms", "",
                 "\n".join(node.get("alarms") or []) or "(none)", "", "Memory", "",
                 f"Total memory used: {node.get('mem_used', 0) / 1e9:.4f} gb",
                 f"Memory high watermark: {node.get('mem_limit', 0) / 1e9:.4f} gb", "",
                 "Listeners", ""]
        for entry in overview.get("listeners", []):
            lines.append(f"Interface: {entry['ip_address']}, port: {entry['port']}, "
                         f"protocol: {entry['protocol']}")
        lines += ["", "Totals", ""] + [f"{k}: {v}" for k, v in sorted(totals.items())]
        return "\n".join(lines)

    register(Verb("export_definitions", "Exports definitions in JSON", export_definitions,
                  [("path", {})],
                  # to stdout: JSON only, as rabbitmqctl (``| jq`` must parse it)
                  banner=lambda a: None if a.path == "-" else
                  f'Exporting definitions in JSON to a file at "{a.path}" ...'))
    register(Verb("import_definitions", "Imports definitions in JSON", import_definitions,
                  [("path", {})], banner=lambda a: f'Importing definitions in JSON from a '
                                                   f'file at "{a.path}" ...'))
    register(Verb("status", "Displays status of a node", status,
                  banner=lambda a: "Status of node triomq@localhost ..."))


_CHANNEL_KEYS = {"pid", "connection", "name", "number", "user", "vhost", "transactional",
                 "confirm", "consumer_count", "messages_unacknowledged", "messages_uncommitted",
                 "acks_uncommitted", "messages_unconfirmed", "prefetch_count",
                 "global_prefetch_count"}


def _node_verbs() -> None:
    def list_channels(api: Api, a):
        cols = _columns(a, ["pid", "user", "consumer_count", "messages_unacknowledged"],
                        _CHANNEL_KEYS)
        rows = []
        for ch in api.get("/channels"):
            # a channel's pid is its name here ("peer -> local (n)"), as in the API
            rows.append({**ch, "pid": ch["name"],
                         "connection": ch.get("connection_details", {}).get("name")})
        return cols, rows

    def cluster_status(api: Api, a):
        overview = api.get("/overview")
        name = api.get("/cluster-name")["name"]
        nodes = api.get("/nodes")
        running = [n["name"] for n in nodes if n.get("running")]
        alarms = [f"Node {n['name']}, {alarm}" for n in nodes for alarm in n.get("alarms", [])]
        if a.formatter == "json":
            return json.dumps({"cluster_name": name, "disk_nodes": [n["name"] for n in nodes],
                               "running_nodes": running, "alarms": alarms,
                               "versions": {n["name"]: {
                                   "rabbitmq_version": overview.get("rabbitmq_version"),
                                   "product_name": overview.get("product_name"),
                                   "product_version": overview.get("product_version")}
                                   for n in nodes},
                               "listeners": overview.get("listeners", [])})
        lines = ["Basics", "", f"Cluster name: {name}", "", "Disk Nodes", "",
                 *[n["name"] for n in nodes], "", "Running Nodes", "", *running, "",
                 "Versions", "",
                 *[f"{n['name']}: {overview.get('product_name')} "
                   f"{overview.get('product_version')} (RabbitMQ "
                   f"{overview.get('rabbitmq_version')} compatible)" for n in nodes], "",
                 "Maintenance status", "",
                 *[f"Node: {n['name']}, status: "
                   f"{'under maintenance' if n.get('being_drained') else 'not under maintenance'}"
                   for n in nodes], "",
                 "Alarms", "", *(alarms or ["(none)"]), "", "Network Partitions", "",
                 *([f"{n['name']}: {p}" for n in nodes for p in n.get("partitions", [])]
                   or ["(none)"]), "", "Listeners", ""]
        for entry in overview.get("listeners", []):
            lines.append(f"Node: {entry.get('node')}, interface: {entry['ip_address']}, "
                         f"port: {entry['port']}, protocol: {entry['protocol']}")
        return "\n".join(lines)

    def version(api: Api, a):
        from . import __version__
        return __version__  # the CLI's own version, as rabbitmqctl's

    def await_startup(api: Api, a):
        # ask until the broker answers: it is up once its HTTP API serves (it binds after
        # AMQP listens); unreachable until --timeout is 69, as rabbitmqctl
        import time
        deadline = time.monotonic() + a.timeout
        while True:
            try:
                api.get("/overview")
                return None
            except CtlError as exc:
                if exc.status != EX_UNAVAILABLE or time.monotonic() >= deadline:
                    raise
            time.sleep(0.2)

    def environment(api: Api, a):
        env = api.get("/environment")
        if a.formatter == "json":
            return json.dumps(env)
        items = ",\n   ".join(f"{{{k},{json.dumps(v)}}}" for k, v in sorted(env.items()))
        return f"[{{triomq,\n  [{items}]}}]"

    register(Verb("list_channels", "Lists all channels in the node", list_channels,
                  [("columns", {"nargs": "*"})], banner=lambda a: "Listing channels ..."))
    register(Verb("cluster_status", "Displays all the nodes in the cluster grouped by node "
                  "type, together with the currently running nodes", cluster_status,
                  banner=lambda a: "Cluster status of node triomq@localhost ..."))
    register(Verb("version", "Displays CLI tools version", version))
    register(Verb("await_startup", "Waits for the node to finish booting", await_startup))
    register(Verb("environment", "Displays the name and value of each variable in the "
                  "application environment", environment,
                  banner=lambda a: "Application environment of node triomq@localhost ..."))


def _parameter_verbs() -> None:
    def set_operator_policy(api: Api, a):
        definition = _json_arg(a.definition, "definition")
        api.call("PUT", f"/operator-policies/{q(a.vhost)}/{q(a.name)}",
                 {"pattern": a.pattern, "definition": definition, "priority": a.priority,
                  "apply-to": a.apply_to}, not_found=_vhost_missing(a.vhost))

    def clear_operator_policy(api: Api, a):
        api.call("DELETE", f"/operator-policies/{q(a.vhost)}/{q(a.name)}",
                 not_found=("Parameter does not exist", EX_DATAERR))

    def list_operator_policies(api: Api, a):
        rows = api.get(f"/operator-policies/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))
        return ["vhost", "name", "pattern", "apply-to", "definition", "priority"], rows

    def list_parameters(api: Api, a):
        _need_vhost(api, a.vhost)
        # policies and operator policies have verbs of their own (rabbitmqctl leaves them out)
        rows = [p for p in api.get("/parameters") if p.get("vhost") == a.vhost
                and p.get("component") not in ("policy", "operator_policy")]
        return ["component", "name", "value"], rows

    def list_global_parameters(api: Api, a):
        # values as JSON, as rabbitmqctl prints them ("name" quoted)
        return ["name", "value"], [{"name": p["name"], "value": json.dumps(p["value"])}
                                   for p in api.get("/global-parameters")]

    def list_vhost_limits(api: Api, a):
        if a.global_:
            rows = [{"vhost": r["vhost"], "limits": r["value"]}
                    for r in api.get("/vhost-limits")]
            return ["vhost", "limits"], rows
        rows = api.get(f"/vhost-limits/{q(a.vhost)}", not_found=_vhost_missing(a.vhost))
        if not rows:
            return None
        return json.dumps(rows[0]["value"], separators=(",", ":"))

    def clear_vhost_limits(api: Api, a):
        for r in api.get(f"/vhost-limits/{q(a.vhost)}", not_found=_vhost_missing(a.vhost)):
            for name in r["value"]:
                api.call("DELETE", f"/vhost-limits/{q(a.vhost)}/{q(name)}")

    def list_user_limits(api: Api, a):
        if a.global_ or a.user is None:
            rows = [{"user": r["user"], "limits": r["value"]} for r in api.get("/user-limits")]
            return ["user", "limits"], rows
        rows = api.get(f"/user-limits/{q(a.user)}",
                       not_found=(f'User "{a.user}" does not exist', EX_NOUSER))
        return json.dumps(rows[0]["value"] if rows else {}, separators=(",", ":"))

    def clear_user_limits(api: Api, a):
        rows = api.get(f"/user-limits/{q(a.username)}",
                       not_found=(f'User "{a.username}" does not exist', EX_NOUSER))
        names = [n for r in rows for n in r["value"]] if a.limit_name == "all" \
            else [a.limit_name]
        for name in names:
            api.call("DELETE", f"/user-limits/{q(a.username)}/{q(name)}",
                     not_found=(f'User "{a.username}" does not exist', EX_NOUSER))

    register(Verb("set_operator_policy", "Sets an operator policy that overrides a subset of "
                  "arguments in user policies", set_operator_policy, [
                      ("name", {}), ("pattern", {}), ("definition", {}),
                      ("--priority", {"type": int, "default": 0}),
                      ("--apply-to", {"default": "queues",
                                      "choices": ["queues", "classic_queues", "quorum_queues",
                                                  "streams"]})],
                  vhost=True,
                  banner=lambda a: f'Setting operator policy override "{a.name}" for pattern '
                                   f'"{a.pattern}" to "{a.definition}" with priority '
                                   f'"{a.priority}" for vhost "{a.vhost}" ...'))
    register(Verb("clear_operator_policy", "Clears an operator policy",
                  clear_operator_policy, [("name", {})], vhost=True,
                  banner=lambda a: f'Clearing operator policy "{a.name}" on vhost '
                                   f'"{a.vhost}" ...'))
    register(Verb("list_operator_policies", "Lists operator policy overrides for a virtual "
                  "host", list_operator_policies, vhost=True,
                  banner=lambda a: f'Listing operator policy overrides for vhost "{a.vhost}" '
                                   f'...'))
    register(Verb("list_parameters", "Lists runtime parameters for a virtual host",
                  list_parameters, vhost=True,
                  banner=lambda a: f'Listing runtime parameters for vhost "{a.vhost}" ...'))
    register(Verb("list_global_parameters", "Lists global runtime parameters",
                  list_global_parameters,
                  banner=lambda a: "Listing global runtime parameters ..."))
    register(Verb("list_vhost_limits", "Displays configured virtual host limits",
                  list_vhost_limits,
                  [("--global", {"action": "store_true", "dest": "global_"})], vhost=True,
                  banner=lambda a: "Listing limits for all vhosts ..." if a.global_ else
                  f'Listing limits for vhost "{a.vhost}" ...'))
    register(Verb("clear_vhost_limits", "Clears virtual host limits", clear_vhost_limits,
                  vhost=True,
                  banner=lambda a: f'Clearing vhost "{a.vhost}" limits ...'))
    register(Verb("list_user_limits", "Displays configured user limits", list_user_limits,
                  # rabbitmqctl's ``--user U``: a positional here, --user being the login
                  [("user", {"nargs": "?", "default": None}),
                   ("--global", {"action": "store_true", "dest": "global_"})],
                  banner=lambda a: "Listing limits for all users ..."
                  if a.global_ or a.user is None else f'Listing limits for user "{a.user}" ...'))
    register(Verb("clear_user_limits", "Clears user connection/channel limits",
                  clear_user_limits, [("username", {}), ("limit_name", {})],
                  banner=lambda a: f'Clearing "{a.limit_name}" limit for user '
                                   f'"{a.username}" ...'))


def _quorum_queue(api: Api, a) -> dict:
    queue = api.get(f"/queues/{q(a.vhost)}/{q(a.queue)}", not_found=("not_found", EX_UNAVAILABLE))
    if queue.get("type") != "quorum":
        raise CtlError(f"{a.queue} is not a quorum queue", EX_UNAVAILABLE)
    return queue


def _quorum_verbs() -> None:
    """rabbitmq-queues' verbs for quorum queues, as RabbitMQ answers them on one node: the
    node is every quorum queue's only member, so it cannot be added again nor removed."""
    def quorum_status(api: Api, a):
        queue = _quorum_queue(api, a)
        online = queue.get("online", queue.get("members", []))
        # in a cluster: the queue's term, its members down ("noproc", as RabbitMQ), and the
        # log as its leader has it (seqs: the leader's last and commit index, the highest
        # each follower confirmed; a follower commits what it has up to the leader's)
        logs = queue.get("log_index") or {}
        commit = queue.get("commit_index")

        def index(m, committed=False):
            if m not in logs:
                return "undefined"
            return min(logs[m], commit) if committed and commit is not None else logs[m]
        rows = [{"Node Name": m, "Raft State": "leader" if m == queue.get("leader")
                 else "follower" if m in online else "noproc", "Log Index": index(m),
                 "Commit Index": index(m, True), "Snapshot Index": "undefined",
                 "Term": queue.get("term") or 1, "Machine Version": "undefined"}
                for m in queue.get("members", [])]
        return ["Node Name", "Raft State", "Log Index", "Commit Index", "Snapshot Index",
                "Term", "Machine Version"], rows

    def _members(api: Api, a, method: str) -> None:
        # a cluster's node (its queue view has a term) takes the change to the leader
        api.call(method, f"/queues/{q(a.vhost)}/{q(a.queue)}/members/{q(a.node)}",
                 not_found=(f"Error:\n{a.node} is not a node of this cluster",
                            EX_UNAVAILABLE))

    def add_member(api: Api, a):
        queue = _quorum_queue(api, a)
        if a.node in queue.get("members", []):
            return  # already a member: nothing to do, success as RabbitMQ
        if "term" not in queue:
            raise CtlError(f"Error:\n{a.node} is not a node of this cluster", EX_UNAVAILABLE)
        _members(api, a, "PUT")

    def delete_member(api: Api, a):
        queue = _quorum_queue(api, a)
        members = queue.get("members", [])
        if a.node not in members:
            raise CtlError("Error:\nnot_found", EX_UNAVAILABLE)
        if len(members) == 1:
            raise CtlError("Error:\nlast_node", EX_UNAVAILABLE)
        _members(api, a, "DELETE")

    def _quorum_queues(api: Api, a) -> list[dict]:
        return [x for x in api.get("/queues") if x.get("type") == "quorum"]

    def _member_path(x: dict, node: str) -> str:
        return f"/queues/{q(x['vhost'])}/{q(x['name'])}/members/{q(node)}"

    def grow(api: Api, a):
        # one node: every quorum queue already has it; a cluster's queues (their view has a
        # term) get it as a member, all of them or (even) those with an even group
        for x in _quorum_queues(api, a):
            members = x.get("members", [])
            if "term" in x and a.node not in members and (
                    a.strategy == "all" or len(members) % 2 == 0):
                api.call("PUT", _member_path(x, a.node),
                         not_found=(f"Error:\n{a.node} is not a node of this cluster",
                                    EX_UNAVAILABLE))
        return ""

    def shrink(api: Api, a):
        rows = []
        for x in _quorum_queues(api, a):
            members = x.get("members", [])
            if a.node not in members:
                continue
            result = "error: the last node cannot be removed"
            if "term" in x and len(members) > 1:
                if a.node == x.get("leader"):
                    result = "error: the leader is not removed (move it first)"
                else:
                    api.call("DELETE", _member_path(x, a.node))
                    result = "ok"
            rows.append({"vhost": x["vhost"], "name": x["name"], "size": len(members),
                         "result": result})
        return ["vhost", "name", "size", "result"], rows

    qv: list[tuple[str, dict]] = [("queue", {})]
    register(Verb("quorum_status", "Displays quorum status of a quorum queue", quorum_status,
                  qv, vhost=True, banner=lambda a: f"Status of quorum queue {a.queue} on "
                                                   f"node triomq@localhost ..."))
    register(Verb("add_member", "Adds a quorum queue member (replica) on the given node",
                  add_member, [*qv, ("node", {})], vhost=True,
                  banner=lambda a: f"Adding a replica for queue {a.queue} on node "
                                   f"{a.node}..."))
    register(Verb("delete_member", "Removes a quorum queue member (replica) on the given "
                  "node", delete_member, [*qv, ("node", {})], vhost=True,
                  banner=lambda a: f"Removing a replica of queue {a.queue} on node "
                                   f"{a.node}..."))
    register(Verb("grow", "Grows quorum queue clusters by adding a member (replica) on the "
                  "specified node for all matching queues", grow,
                  [("node", {}), ("strategy", {"choices": ["all", "even"]})],
                  banner=lambda a: f"Growing {a.strategy} quorum queues on {a.node}..."))
    register(Verb("shrink", "Shrinks quorum queue clusters by removing any members "
                  "(replicas) on the given node", shrink, [("node", {})],
                  banner=lambda a: f"Shrinking quorum queues on {a.node}..."))


for _group in (_user_verbs, _vhost_verbs, _permission_verbs, _policy_verbs, _entity_verbs,
               _definitions_verbs, _node_verbs, _parameter_verbs, _quorum_verbs):
    _group()


# ---- command line --------------------------------------------------------------------------


def _load_extensions() -> None:
    for name in EXTENSION_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # rabbitmqctl: usage errors exit 64
        self.print_usage(sys.stderr)
        print(f"Error (argument validation): {message}", file=sys.stderr)
        sys.exit(EX_USAGE)


def add_subcommands(subparsers) -> None:
    _load_extensions()
    ctl = subparsers.add_parser("ctl", help="rabbitmqctl's verbs over the management HTTP API")
    ctl.error = types.MethodType(_Parser.error, ctl)  # type: ignore[method-assign]
    _common(ctl)
    verbs = ctl.add_subparsers(dest="verb", required=True, metavar="<verb>", parser_class=_Parser)
    for verb in sorted(VERBS.values(), key=lambda v: v.name):
        p = verbs.add_parser(verb.name, help=verb.help)
        _common(p, suppress=True)
        if verb.vhost:
            p.add_argument("-p", "--vhost", default="/", help="virtual host (default /)")
        for name, kwargs in verb.arguments:
            p.add_argument(name, **kwargs)
    ctl.set_defaults(handler=run)


def _common(p, suppress: bool = False) -> None:
    d = argparse.SUPPRESS if suppress else None

    def default(value):
        return d if suppress else value

    p.add_argument("--url", default=default(os.environ.get("TRIOMQ_URL",
                                                           "http://127.0.0.1:15672")),
                   help="management API URL (default $TRIOMQ_URL or http://127.0.0.1:15672)")
    p.add_argument("--user", dest="api_user",
                   default=default(os.environ.get("TRIOMQ_USER", "guest")),
                   help="user (default $TRIOMQ_USER or guest)")
    p.add_argument("--password", dest="api_password",
                   default=default(os.environ.get("TRIOMQ_PASSWORD", "guest")),
                   help="password (default $TRIOMQ_PASSWORD or guest)")
    p.add_argument("--formatter", choices=("table", "json"), default=default("table"))
    p.add_argument("-q", "--quiet", action="store_true", default=default(False))
    # rabbitmqctl's: -s drops the banner and the header row, --no-table-headers the latter
    p.add_argument("-s", "--silent", action="store_true", default=default(False))
    p.add_argument("--no-table-headers", action="store_true", default=default(False))
    p.add_argument("--timeout", type=float, default=default(60.0))


def run(args) -> int:
    verb = VERBS[args.verb]
    try:
        api = Api(args.url, args.api_user, args.api_password, args.timeout)
        quiet = args.quiet or args.silent
        banner = verb.banner(args) if verb.banner is not None else None
        if banner is not None and not quiet and args.formatter != "json":
            print(banner)
        result = verb.run(api, args)
        emit(result, args.formatter, headers=not (args.silent or args.no_table_headers))
    except CtlError as exc:
        message = str(exc)
        print(message if message.startswith("Error") else f"Error: {message}", file=sys.stderr)
        return exc.status
    return EX_OK
