"""x-delivery-count, x-delivery-limit and the x-retry-delays level survive a restart of
the SQL store (every delivery is written, as on the journal) -- SQLite, PostgreSQL, MariaDB."""
from __future__ import annotations

import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.persistence.sql import SQLStore

from .test_delivery_count import message, queue_of, requeue_times
from .test_sql_store import BACKENDS, _make_db


@pytest.fixture(params=BACKENDS)
def db(request):
    d = _make_db(request.param)
    yield d
    d.drop()


def run_life(url, body):
    async def main():
        store = SQLStore(url)
        broker = Broker(Config(), store)
        await store.open()
        broker.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            result = body(broker)
            done = trio.Event()
            store.when_durable(done.set, on_failure=done.set)
            with trio.fail_after(20):
                await done.wait()
            nursery.cancel_scope.cancel()
        await store.close()
        return result
    return trio.run(main)


def test_delivery_count_and_limit_survive_restart(db):
    def first(broker):
        q = queue_of(broker, {"x-delivery-limit": 3})
        q.enqueue(message(b"a"))
        q.enqueue(message(b"b"))
        requeue_times(q, 2)  # "a" delivered twice

    def second(broker):
        q = queue_of(broker)
        e = q.get()
        got = (e.message.body, e.delivery_count, e.redelivered,
               e.message.properties["headers"]["x-delivery-count"])
        q.requeue([(e, None)])  # the third return
        return got

    def third(broker):
        q = queue_of(broker)
        requeue_times(q, 1)  # the fourth: over the limit of 3, dead-lettered (dropped here)
        return q.message_count, q.retry.dead_lettered

    run_life(db.url, first)
    assert run_life(db.url, second) == (b"a", 3, True, 2)
    assert run_life(db.url, third) == (1, 1)


def test_retry_level_survives_restart(db):
    args = {"x-retry-delays": [0, 0]}

    def first(broker):
        q = queue_of(broker, args)
        q.enqueue(message(b"a"))
        for _ in range(2):
            q.reject(q.get(), None)

    def second(broker):
        q = queue_of(broker)
        e = q.get()
        header = e.message.properties["headers"]["x-delivery-count"]
        q.reject(e, None)
        return header, q.message_count, q.retry.dead_lettered

    run_life(db.url, first)
    assert run_life(db.url, second) == (2, 0, 1)
