"""A durable FIFO queue's backlog on the SQL store stays in the database at start-up and
is read in pages as it drains (broker/persistence/sql_paged.py): order, counts,
redelivered flags, expiry, purge, new publishes behind the backlog -- on SQLite,
PostgreSQL and MariaDB."""
from __future__ import annotations

import time

import pytest
import trio

from broker.broker import Broker
from broker.config import Config, SQLSettings
from broker.persistence.sql import SQLStore
from broker.persistence.sql_paged import SQLPagedFifo

from .test_sql_store import BACKENDS, _make_db, declare_queue, message, take


@pytest.fixture(params=BACKENDS)
def db(request):
    d = _make_db(request.param)
    yield d
    d.drop()


WINDOW, PAGE = 50, 20


class Paging:
    """A broker on an SQL store with a small page window, its store task running."""

    def __init__(self, url):
        self.store = SQLStore(url, settings=SQLSettings(page_window=WINDOW, page_size=PAGE))
        self.broker = Broker(Config(), self.store)
        self.vhost = self.broker.vhosts["/"]

    async def __aenter__(self):
        await self.store.open()
        self.broker.recover()
        self._cm = trio.open_nursery()
        self.nursery = await self._cm.__aenter__()
        self.nursery.start_soon(self.store.run)
        return self

    async def __aexit__(self, *exc):
        self.nursery.cancel_scope.cancel()
        await self._cm.__aexit__(None, None, None)
        with trio.CancelScope(shield=True):
            await self.store.close()

    async def durable(self):
        done = trio.Event()
        self.store.when_durable(done.set, on_failure=done.set)
        with trio.fail_after(20):
            await done.wait()

    async def drain(self, q, n):
        """Take ``n`` entries as a consumer would, waiting for pages to arrive."""
        got = []
        with trio.fail_after(30):
            while len(got) < n:
                if len(q.ready):
                    got.append(take(q))
                else:
                    await trio.sleep(0.01)
        return got


def _fill(url, n, name="backlog", delivered=0, extra=None):
    async def main():
        async with Paging(url) as p:
            q = declare_queue(p.broker, name, arguments=extra)
            for i in range(n):
                q.enqueue(message(name, b"m%05d" % i))
            for _ in range(delivered):
                take(q)  # delivered, never acked: back redelivered after the restart
            await p.durable()
    trio.run(main)


def test_backlog_is_read_in_pages_in_order(db):
    n = 500
    _fill(db.url, n, delivered=3)

    async def main():
        async with Paging(db.url) as p:
            q = p.vhost.queues["backlog"]
            assert isinstance(q.ready, SQLPagedFifo)
            assert q.message_count == n  # the whole backlog counts ...
            assert len(q.ready) <= WINDOW  # ... but only the window is in memory
            q.enqueue(message("backlog", b"new"))  # published after the restart: behind it
            assert q.message_count == n + 1
            entries = await p.drain(q, n + 1)
            assert [e.message.body for e in entries] == [b"m%05d" % i for i in range(n)] + [b"new"]
            assert [e.redelivered for e in entries[:4]] == [True, True, True, False]
            assert q.message_count == 0
            for e in entries:
                q.settled(e)
            await p.durable()

    trio.run(main)

    async def after():
        async with Paging(db.url) as p:
            assert p.vhost.queues["backlog"].message_count == 0
    trio.run(after)


def test_purge_of_an_unread_backlog_deletes_it_in_the_database(db):
    _fill(db.url, 300)

    async def main():
        async with Paging(db.url) as p:
            q = p.vhost.queues["backlog"]
            assert q.ready.stored_behind > 0
            assert q.purge() == 300
            assert q.message_count == 0
            q.enqueue(message("backlog", b"after purge"))
            await p.durable()

    trio.run(main)

    async def after():
        async with Paging(db.url) as p:
            q = p.vhost.queues["backlog"]
            assert q.message_count == 1
            (e,) = await p.drain(q, 1)
            assert e.message.body == b"after purge"
    trio.run(after)


def test_expired_entries_of_the_backlog_expire_when_read(db):
    _fill(db.url, 200, extra={"x-message-ttl": 1500})
    time.sleep(1.6)

    async def main():
        async with Paging(db.url) as p:
            q = p.vhost.queues["backlog"]
            with trio.fail_after(20):
                while q.message_count:
                    q.get()  # expired entries are dropped as they reach the head
                    await trio.sleep(0.01)
            await p.durable()

    trio.run(main)

    async def after():
        async with Paging(db.url) as p:
            assert p.vhost.queues["backlog"].message_count == 0
    trio.run(after)


def test_a_priority_queue_is_read_whole(db):
    _fill(db.url, 120, name="prio", extra={"x-max-priority": 5})

    async def main():
        async with Paging(db.url) as p:
            q = p.vhost.queues["prio"]
            assert not isinstance(q.ready, SQLPagedFifo)
            assert len(q.ready) == q.message_count == 120
    trio.run(main)


def test_version_2_rows_without_size_are_indexed_through_their_messages(tmp_path):
    """A database written before entries had a size column: the column is added at
    start, old rows are measured from their message, the backlog pages as usual."""
    url = f"sqlite:///{tmp_path}/store.db"
    _fill(url, 120)
    import sqlite3
    c = sqlite3.connect(f"{tmp_path}/store.db")
    c.execute("ALTER TABLE triomq_entries DROP COLUMN size")
    c.execute("UPDATE triomq_lock SET schema_version = 2")
    c.commit()
    c.close()

    async def main():
        async with Paging(url) as p:
            q = p.vhost.queues["backlog"]
            assert q.message_count == 120 and q.ready_bytes == 120 * len(b"m00000")
            entries = await p.drain(q, 120)
            assert [e.message.body for e in entries] == [b"m%05d" % i for i in range(120)]
    trio.run(main)
    c = sqlite3.connect(f"{tmp_path}/store.db")
    assert "size" in [r[1] for r in c.execute("PRAGMA table_info(triomq_entries)")]
    c.close()


def test_orphaned_messages_are_collected_after_start(tmp_path, monkeypatch):
    from broker.persistence.sql import loader
    monkeypatch.setattr(loader, "ORPHAN_GC_DELAY", 0.0)
    monkeypatch.setattr(loader, "ORPHAN_GC_RANGE", 7)
    url = f"sqlite:///{tmp_path}/store.db"
    _fill(url, 30)
    import sqlite3
    c = sqlite3.connect(f"{tmp_path}/store.db")
    c.execute("DELETE FROM triomq_entries WHERE seq % 2 = 0")  # as a chunked queue delete leaves
    c.commit()
    c.close()

    async def main():
        async with Paging(url) as p:
            assert p.vhost.queues["backlog"].message_count == 15
            with trio.fail_after(10):
                while True:
                    c = sqlite3.connect(f"{tmp_path}/store.db")
                    left = c.execute("SELECT COUNT(*) FROM triomq_msgs").fetchone()[0]
                    c.close()
                    if left == 15:
                        break
                    await trio.sleep(0.05)
    trio.run(main)


def test_a_backlog_built_while_running_leaves_memory_once_written(db):
    """Beyond a full head, committed persistent messages are paged out to the database
    (index only) and read back in order; a transient one keeps its place in memory."""
    async def main():
        async with Paging(db.url) as p:
            q = declare_queue(p.broker, "live")
            n = 400
            for i in range(n):
                q.enqueue(message("live", b"m%05d" % i, persistent=(i != 250)))
                if i % 50 == 49:
                    await p.durable()
            await p.durable()
            ready = q.ready
            assert isinstance(ready, SQLPagedFifo)
            assert ready.unread > 0 and len(ready) == WINDOW
            assert q.message_count == n
            in_memory = len(list(ready))
            assert in_memory < n
            entries = await p.drain(q, n)
            assert [e.message.body for e in entries] == [b"m%05d" % i for i in range(n)]
            for e in entries:
                q.settled(e)
            await p.durable()
            assert q.message_count == 0 and ready.unread == 0
    trio.run(main)
