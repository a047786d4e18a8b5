"""``python -m broker scheduled list|remove ID|remove-all|stats --data-dir DIR [--store URL]``.

Talks to the running broker through its control socket in the data dir; when no
broker answers there, opens the store offline, recovers and operates on it.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

from .control import socket_path


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("scheduled", help="list / remove pending scheduled messages")
    p.add_argument("action", choices=("list", "remove", "remove-all", "stats"))
    p.add_argument("id", nargs="?", help="scheduled message id (for remove)")
    p.add_argument("--data-dir", default="./data", help="the broker's data directory")
    p.add_argument("--store", default=None, help="store URL when operating offline")
    p.add_argument("--limit", type=int, default=None, help="list at most this many")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=main)


def _request(args) -> dict:
    req = {"op": args.action}
    if args.action == "remove":
        req["id"] = args.id
    if args.limit is not None:
        req["limit"] = args.limit
    return req


def _online(data_dir: str, request: dict) -> dict | None:
    path = socket_path(data_dir)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(path)
            s.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (FileNotFoundError, ConnectionRefusedError):
        return None
    return json.loads(data.decode())


def _missing_store(args) -> str | None:
    """Why there is no store to open offline (None: there is one). A tool that reads or
    edits a store must never create one: a mistyped --data-dir would report '0 pending'."""
    from ..persistence.base import journal_dir

    url = args.store
    where = f"no broker answers on {socket_path(args.data_dir)}"
    if url == "memory":
        return f"{where}, and the memory store keeps nothing to read offline"
    if url and "://" in url:
        import sqlalchemy

        engine = sqlalchemy.create_engine(url)
        db = engine.url.database
        if engine.url.get_backend_name() == "sqlite" and db and not os.path.exists(db):
            return f"{where}, and there is no SQLite database {db}"  # connecting makes one
        try:
            with engine.connect() as conn:
                if not sqlalchemy.inspect(conn).has_table("triomq_msgs"):
                    return f"{where}, and the database {engine.url.render_as_string()} holds no TrioMQ store"
        finally:
            engine.dispose()
        return None
    jdir = os.path.join(journal_dir(url, args.data_dir), "journal")
    if not os.path.isdir(jdir) or not any(n.endswith(".log") or n == "checkpoint"
                                          for n in os.listdir(jdir)):
        return f"{where}, and {jdir} holds no journal (is --data-dir right?)"
    return None


def _offline(args, request: dict) -> dict:
    import trio

    from ..broker import Broker
    from ..config import Config
    from ..persistence import open_store
    from .control import handle_request

    async def run():
        store = open_store(args.store, args.data_dir)
        await store.open()
        broker = Broker(Config(data_dir=args.data_dir, store=args.store), store)
        broker.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            response = handle_request(broker.scheduler, request)
            done = trio.Event()
            store.when_durable(done.set)
            with trio.move_on_after(30):
                await done.wait()
            nursery.cancel_scope.cancel()
        await store.close()
        response["offline"] = True
        response["store"] = store.name
        return response

    return trio.run(run)


def main(args) -> int:
    if args.action == "remove" and not args.id:
        print("triomq: error: scheduled remove needs an ID", file=sys.stderr)
        return 2
    request = _request(args)
    response = _online(args.data_dir, request)
    if response is None:
        try:
            missing = _missing_store(args)
            if missing is not None:
                print(f"triomq: error: {missing}", file=sys.stderr)
                return 2
            response = _offline(args, request)
        except Exception as exc:
            print(f"triomq: error: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(response, indent=2))
    elif args.action == "list":
        items = response.get("items", [])
        for it in items:
            due = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(it["due"]))
            what = (it["cron"] and f"cron={it['cron']!r}") or f"delay={it['delay']}ms"
            print(f"{it['id']}\t{due}\t{it['vhost']}\t{it['exchange'] or '(default)'}\t"
                  f"{it['routing_key']}\t{it['kind']}\t{what}\trepeat={it['repeat']}"
                  f"\tperiod={it['period']}ms")
        print(f"{len(items)} pending")
    elif args.action == "remove":
        print(("removed " if response.get("ok") else "not found: ") + str(args.id))
    elif args.action == "remove-all":
        print(f"removed {response.get('removed', 0)}")
    else:
        for k, v in response.get("stats", {}).items():
            print(f"{k}: {v}")
    if args.action == "remove" and not response.get("ok"):
        return 1
    return 0
