"""``Store.open_early``: the SQL store connects, checks its schema and takes its lease in a
thread started before the broker is built (``triomq run``), so the database's round trips
overlap the process's imports; ``open`` takes that connection over, or reports its failure
in the one line it always did. It reads nothing back: recovery stays in ``open``."""
from __future__ import annotations

import pytest
import trio

from broker.broker import Broker
from broker.config import Config
from broker.persistence.base import StoreUnavailable
from broker.persistence.sql import SQLStore

from .test_sql_store import _closed_port, declare_queue, message, pg  # noqa: F401 - a fixture


def test_open_early_holds_the_lease_then_open_recovers(pg):  # noqa: F811 - the fixture
    async def first():
        store = SQLStore(pg.url)
        broker = Broker(Config(), store)
        await store.open()
        broker.recover()
        q = declare_queue(broker, "kept")
        q.enqueue(message("kept", b"m"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            done = trio.Event()
            store.when_durable(done.set)
            await done.wait()
            nursery.cancel_scope.cancel()
        await store.close()
    trio.run(first)

    store = SQLStore(pg.url)
    store.open_early()
    assert store._early is not None
    store._early[0].join()  # connected in its thread: the lease is this store's already
    other = SQLStore(pg.url)
    with pytest.raises(StoreUnavailable) as ei:
        trio.run(other.open)
    assert "locked by" in str(ei.value)

    async def second():
        broker = Broker(Config(), store)
        await store.open()  # takes the early connection over, then reads back
        broker.recover()
        assert broker.vhosts["/"].queues["kept"].message_count == 1
        await store.close()
    trio.run(second)


def test_open_early_failure_is_the_one_line_open_reports():
    store = SQLStore(f"postgresql+psycopg://postgres@127.0.0.1:{_closed_port()}/x")
    store.open_early()
    with pytest.raises(StoreUnavailable) as ei:
        trio.run(store.open)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("cannot open store")
