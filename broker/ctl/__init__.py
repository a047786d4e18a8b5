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
This module parses the command line and runs a verb; it does not define verbs (access_verbs,
entity_verbs, node_verbs) nor talk HTTP (core.Api).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import types
from typing import Any, NoReturn

from . import (  # noqa: F401  (they register their verbs)
    access_verbs,
    entity_verbs,
    node_verbs,
    stream_verbs,
)
from .core import (  # the verb API other features import
    EX_DATAERR,
    EX_NOPERM,
    EX_NOUSER,
    EX_OK,
    EX_SOFTWARE,
    EX_UNAVAILABLE,
    EX_USAGE,
    VERBS,
    Api,
    CtlError,
    Verb,
    emit,
    q,
    register,
)

__all__ = ["EX_DATAERR", "EX_NOPERM", "EX_NOUSER", "EX_OK", "EX_SOFTWARE", "EX_UNAVAILABLE",
           "EX_USAGE", "VERBS", "Api", "CtlError", "Verb", "emit", "q", "register"]

# modules that register verbs of their own features (e.g. HTTP topics)
EXTENSION_MODULES: list[str] = ["broker.hermes.ctl", "broker.streams.ctl"]


# ---- command line --------------------------------------------------------------------------


def _load_extensions() -> None:
    for name in EXTENSION_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # rabbitmqctl: usage errors exit 64
        self.print_usage(sys.stderr)
        print(f"Error (argument validation): {message}", file=sys.stderr)
        sys.exit(EX_USAGE)


def add_subcommands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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


def _common(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    d = argparse.SUPPRESS if suppress else None

    def default(value: Any) -> Any:
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


def run(args: argparse.Namespace) -> int:
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
