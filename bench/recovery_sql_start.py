"""Restart to listening on PostgreSQL with a backlog built by SQL, against the same start on
an empty database and on an empty journal, in one run.

1. A scratch PostgreSQL database on 127.0.0.1:5432 (dropped afterwards) gets one durable
   queue holding ``--messages`` 16-byte persistent messages, written by SQL
   (``generate_series``: seconds, where publishing a million through a client takes
   minutes); the first through a real store, so the rows are what the store writes.
2. Each start (``bench.recovery.start``: until an AMQP handshake completes) is followed by
   a SIGKILL, so each restart of the backlog's database is a restart after kill -9.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import trio

from .recovery import kill, start
from .store_names import _scratch_pg


def build(url: str, n: int) -> None:
    """One durable queue ``big`` with ``n`` stored 16-byte messages."""
    import psycopg

    from broker.amqp.fields import encode_properties
    from broker.broker import Broker
    from broker.config import Config
    from broker.message import Message
    from broker.persistence.sql import SQLStore
    from broker.queues.args import parse_queue_arguments
    from broker.queues.queue import Queue

    async def first() -> None:
        store = SQLStore(url)
        broker = Broker(Config(), store)
        await store.open()
        broker.recover()
        vhost = broker.vhosts["/"]
        q = Queue(vhost, "big", durable=True, arguments={}, opts=parse_queue_arguments({}))
        vhost.add_queue(q)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            props = {"delivery_mode": 2}
            q.enqueue(Message("", "big", encode_properties(props), props, b"x" * 16))
            done = trio.Event()
            store.when_durable(done.set)
            await done.wait()
            nursery.cancel_scope.cancel()
        await store.close()
    trio.run(first)
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as c:
        c.execute(f"INSERT INTO triomq_msgs (id, body) SELECT g, m.body FROM generate_series(2, {n}) g, "
                  "triomq_msgs m WHERE m.id = 1")
        c.execute("INSERT INTO triomq_entries (qid, seq, message_id, priority, delivered, size, "
                  f"deliveries) SELECT e.qid, g, g, 0, false, 16, NULL FROM generate_series(2, {n}) g, "
                  "triomq_entries e")
        c.execute("ANALYZE")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.recovery_sql_start",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args(argv)
    print("Command: `python -m bench.recovery_sql_start "
          + " ".join(argv if argv is not None else sys.argv[1:]) + "`", flush=True)
    empty_url, drop_empty = _scratch_pg("127.0.0.1", 5432)
    big_url, drop_big = _scratch_pg("127.0.0.1", 5432)
    try:
        build(big_url, args.messages)
        for store, name in ((empty_url, "empty PostgreSQL database"),
                            (big_url, f"PostgreSQL, {args.messages:,} queued"),
                            (None, "empty journal")):
            for _ in range(args.runs):
                d = tempfile.mkdtemp(prefix="triomq-sql-start-")
                try:
                    p, took = start(d, store, [])
                    kill(p)
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                print(f"{name}: listening after {took:.2f} s (load average "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
    finally:
        drop_empty()
        drop_big()
    return 0


if __name__ == "__main__":
    sys.exit(main())
