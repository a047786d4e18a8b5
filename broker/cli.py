"""Command line: ``python -m broker run --host H --port P --data-dir DIR [--store URL]``."""
from __future__ import annotations

import argparse
import logging
import os
import sys

import trio

from .broker import Broker
from .config import Config
from .persistence import StoreUnavailable, open_store
from .server import describe_listen_error, run_server


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triomq", description="TrioMQ, an AMQP 0-9-1 broker on trio")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the broker")
    run.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    run.add_argument("--port", type=int, default=5672, help="AMQP port (default 5672)")
    run.add_argument("--data-dir", default="./data", help="data directory (default ./data)")
    run.add_argument("--store", default=None,
                     help="storage backend: journal (default), memory, sqlite:///file, "
                          "postgresql+psycopg://..., mysql+pymysql://...")
    run.add_argument("--flush", choices=("sync", "async"), default="sync",
                     help="sync: fsync before confirming (default); async: fsync every few ms")
    run.add_argument("--heartbeat", type=int, default=60, help="heartbeat the server proposes (s)")
    run.add_argument("--memory-limit", type=int, default=None,
                     help="block publishers above this RSS in bytes (default 0.4 of RAM)")
    run.add_argument("--log-level", default=os.environ.get("TRIOMQ_LOG_LEVEL", "INFO"))
    for extension in _extensions():
        extension.add_subcommands(sub)
    return parser


def _extensions():
    """Modules that contribute subcommands (store tools, scheduler management)."""
    import importlib
    found = []
    for name in ("broker.persistence.tools", "broker.scheduler.tools"):
        try:
            found.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return found


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    handler = getattr(args, "handler", None)
    if handler is not None:
        return handler(args)
    return 2


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _run(args) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 0 <= args.port <= 65535:
        print(f"triomq: error: invalid port {args.port}", file=sys.stderr)
        return 2
    config = Config(host=args.host, port=args.port, data_dir=args.data_dir, store=args.store,
                    heartbeat=args.heartbeat, memory_limit_bytes=args.memory_limit,
                    flush=args.flush)
    try:
        os.makedirs(config.data_dir, exist_ok=True)
    except OSError as exc:
        print(f"triomq: error: cannot create data dir {config.data_dir}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        store = open_store(config.store, config.data_dir, config.flush)
        broker = Broker(config, store)
        trio.run(run_server, broker, config.host, config.port)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:  # trio wraps failures of its tasks in exception groups
        leaf = _leaf(exc)
        if isinstance(leaf, StoreUnavailable):
            print(f"triomq: error: {leaf}", file=sys.stderr)
            return 1
        if isinstance(leaf, OSError):
            print(f"triomq: error: {describe_listen_error(leaf, config.host, config.port)}",
                  file=sys.stderr)
            return 1
        raise
    return 0
