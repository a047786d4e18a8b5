"""Figures for docs/sql-store.md ("What a name may hold", "A record the database refuses").

    .venv/bin/python -m bench.store_names [--url STORE_URL] [-n 200]

1. the per-call cost of the name rules: ``sql_names.db_name`` / ``from_db`` (plain name,
   name with NUL) and ``records.unstorable`` (a declare's check, with typical arguments);
2. on a real database (a scratch database created and dropped), the time for a batch of
   N persistent publishes to settle with and without one refused message in it (the
   batch then goes record by record).
"""
from __future__ import annotations

import argparse
import secrets
import time
import timeit

import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config
from broker.message import Message
from broker.persistence.records import unstorable
from broker.persistence.sql import SQLStore
from broker.persistence.sql_names import db_name, from_db
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue


def micro() -> None:
    plain, nul = "orders.eu-west.payments", "orders\x00eu\x00west"
    args = {"x-queue-type": b"classic", "x-max-length": 10000, "x-dead-letter-exchange": b"dlx"}
    for label, fn in [("db_name(plain)", lambda: db_name(plain)),
                      ("db_name(with NUL)", lambda: db_name(nul)),
                      ("from_db(plain)", lambda: from_db(plain)),
                      ("from_db(escaped)", lambda: from_db(db_name(nul))),
                      ("unstorable(name, 3 args)", lambda: unstorable(plain, args, 255))]:
        n = 200_000
        t = min(timeit.repeat(fn, number=n, repeat=3)) / n
        print(f"  {label:<28} {t * 1e9:8.0f} ns/call")


def _message(exchange: str, body: bytes) -> Message:
    props = {"delivery_mode": 2}
    return Message(exchange, "k", encode_properties(props), props, body)


async def _settle(url: str, n: int, refused: bool) -> float:
    store = SQLStore(url)
    broker = Broker(Config(), store)
    await store.open()
    broker.recover()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.run)
        vhost = broker.vhosts["/"]
        name = f"bench-{secrets.token_hex(3)}"
        q = Queue(vhost, name, durable=True, arguments={}, opts=parse_queue_arguments({}))
        vhost.add_queue(q)
        done = trio.Event()
        left = [n]

        def settled(_ok: bool) -> None:
            left[0] -= 1
            if not left[0]:
                done.set()
        # the queue's row first, so both runs time the same messages-only batch
        first = trio.Event()
        store.when_durable(first.set, on_failure=first.set)
        await first.wait()
        t0 = time.perf_counter()
        for i in range(n):
            bad = refused and i == n // 2
            q.enqueue(_message("x" * 300 if bad else "", b"%d" % i))
            store.when_durable(lambda: settled(True), on_failure=lambda: settled(False))
        await done.wait()
        elapsed = time.perf_counter() - t0
        vhost.delete_queue(q)
        nursery.cancel_scope.cancel()
    await store.close()
    return elapsed


def batches(url: str, n: int) -> None:
    for refused in (False, True, False, True):
        t = trio.run(_settle, url, n, refused)
        label = "one refused message" if refused else "all storable"
        print(f"  {n} publishes, {label:<20} settled in {t * 1000:7.1f} ms")


def _scratch_pg(host: str, port: int):
    """A fresh PostgreSQL database (URL, drop function), as the tests make them."""
    import psycopg
    name = "triomq_bench_" + secrets.token_hex(6)

    def admin(sql: str) -> None:
        with psycopg.connect(host=host, port=port, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=5) as c:
            c.execute(sql)
    admin(f'CREATE DATABASE "{name}"')
    return (f"postgresql+psycopg://postgres@{host}:{port}/{name}",
            lambda: admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", help="a store URL (default: a scratch PostgreSQL database on "
                                  "127.0.0.1:5432, dropped afterwards)")
    ap.add_argument("-n", type=int, default=200)
    a = ap.parse_args()
    print("name rules (per call):")
    micro()
    url, drop = (a.url, None) if a.url else _scratch_pg("127.0.0.1", 5432)
    try:
        print(f"batch with a refused record ({url}):")
        batches(url, a.n)
    finally:
        if drop is not None:
            drop()


if __name__ == "__main__":
    main()
