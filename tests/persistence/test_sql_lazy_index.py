"""Restart on the SQL store with a backlog: before it serves, the broker reads each queue's
totals and its first window only; the rest of the entry index is read after, in bounded
steps, while consumers, publishers, purges and deletes go on -- nothing delivered twice
or lost, order kept (broker/persistence/sql/index.py, sql_paged.SQLPagedFifo).

On SQLite, PostgreSQL and MariaDB in-process (real stores, the broker's queues), and once
on PostgreSQL through a real broker process killed with SIGKILL and a pika client."""
from __future__ import annotations

import threading
import time

import pytest
import trio

from broker.persistence.sql import common
from broker.recovery_progress import RecoveryProgress

from .test_recovery_bounded import _start, procs  # noqa: F401 - a fixture
from .test_sql_paging import WINDOW, Paging, _fill
from .test_sql_store import BACKENDS, _make_db, _pika, message, take

STEP = 100  # index entries read per background step in these tests


@pytest.fixture(params=BACKENDS)
def db(request):
    d = _make_db(request.param)
    yield d
    d.drop()


@pytest.fixture
def small_steps(monkeypatch):
    monkeypatch.setattr(common, "INDEX_STEP", STEP, raising=False)


class Restarted(Paging):
    """``Paging`` whose recovery progress is recorded, as the broker's listener sets it."""

    def __init__(self, url):
        super().__init__(url)
        self.store.progress = self.progress = RecoveryProgress()

    def phase(self, name):
        return next(p for p in self.progress.phases if p.name == name)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_what_is_read_before_serving_does_not_grow_with_the_backlog(db, small_steps):
    """The entries read before the broker serves (the 'sql index' phase) are the first
    window, whether the queue holds 200 or 2,000; the counts are whole at once."""
    read = {}
    for n in (200, 2000):
        _fill(db.url, n, name=f"b{n}")

        async def main(n=n):
            async with Restarted(db.url) as p:
                q = p.vhost.queues[f"b{n}"]
                # recovered (what the broker does before it listens): counts are exact
                assert q.message_count == n
                assert q.ready_bytes == 6 * n
                read[n] = p.phase("sql index").done
                await p.drain(q, 5)
        trio.run(main)
    # each start read the window of both queues (the first start: of the one it had)
    assert read[200] <= WINDOW and read[2000] <= 2 * WINDOW, read


def test_consumed_in_order_while_the_index_loads(db, small_steps):
    """A consumer drains a 1,000-entry backlog while its index is still being read, and a
    publisher adds 200 more meanwhile: each message once, the backlog first, in order."""
    n, more = 1000, 200
    _fill(db.url, n, delivered=2)

    async def main():
        async with Restarted(db.url) as p:
            q = p.vhost.queues["backlog"]
            assert q.message_count == n
            assert q.ready.loading == n - WINDOW  # serving starts with the index unread

            async def publish():
                for i in range(more):
                    q.enqueue(message("backlog", b"new%03d" % i))
                    if i % 10 == 0:
                        await trio.sleep(0.001)

            got = []
            loading_seen = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish)
                with trio.fail_after(60):
                    while len(got) < n + more:
                        if len(q.ready):
                            loading_seen = max(loading_seen, q.ready.loading)
                            got.append(take(q))
                            q.settled(got[-1])
                        else:
                            await trio.sleep(0.001)
            bodies = [e.message.body for e in got]
            assert bodies == [b"m%05d" % i for i in range(n)] + [b"new%03d" % i for i in range(more)]
            assert [e.redelivered for e in got[:3]] == [True, True, False]
            assert loading_seen > 0  # taken while the index was still loading
            assert p.phase("sql index (background)").done == n - WINDOW
            assert q.message_count == 0
            await p.durable()
    trio.run(main)

    async def after():
        async with Paging(db.url) as p:
            assert p.vhost.queues["backlog"].message_count == 0
    trio.run(after)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_purge_and_delete_while_the_index_loads(db, small_steps):
    """A purge or a queue delete before the index is read deletes the unread part in the
    database too: nothing of it comes back after a restart."""
    _fill(db.url, 600, name="purged")
    _fill(db.url, 600, name="deleted")

    async def main():
        async with Restarted(db.url) as p:
            q = p.vhost.queues["purged"]
            assert q.ready.loading > 0
            assert q.purge() == 600
            assert q.message_count == 0
            q.enqueue(message("purged", b"after purge"))
            d = p.vhost.queues["deleted"]
            assert d.ready.loading > 0
            p.vhost.delete_queue(d)
            await p.durable()
            got = await p.drain(q, 1)
            assert got[0].message.body == b"after purge"
            q.settled(got[0])
            await trio.sleep(0.3)  # the load in flight ends without putting anything back
            assert q.message_count == 0
            await p.durable()
    trio.run(main)

    async def after():
        async with Paging(db.url) as p:
            assert p.vhost.queues["purged"].message_count == 0
            assert "deleted" not in p.vhost.queues
    trio.run(after)


@pytest.mark.slow  # 20 s; test_consumed_in_order_while_the_index_loads is its fast version
@pytest.mark.timeout(120)
def test_kill9_then_consume_in_order_while_loading_with_a_publisher(tmp_path, procs):  # noqa: F811
    """A real broker on PostgreSQL killed with SIGKILL holding a backlog of 8,000 (the
    default window is 5,000): the restart serves having read one window of the index; a
    pika consumer takes every message once and in order while another connection
    publishes 300 more."""
    db = _make_db("postgresql")
    n, more = 8_000, 300
    try:
        _fill(db.url, n)
        for d in ("a", "b"):
            (tmp_path / d).mkdir()
        _start(procs, tmp_path / "a", "--store", db.url).kill()
        b = _start(procs, tmp_path / "b", "--store", db.url)
        phases = {ph["name"]: ph for ph in b.recovery()["phases"]}
        assert phases["sql index"]["done"] <= 5000, phases  # read before serving: one window
        # the rest is reported as it loads (the management API; /metrics reads the same)
        assert phases["sql index (background)"]["total"] == n - 5000, phases
        published = threading.Event()

        def publisher():
            conn = _pika(b.port)
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(more):
                ch.basic_publish("", "backlog", b"new%03d" % i)
            conn.close()
            published.set()

        conn = _pika(b.port)
        ch = conn.channel()
        assert ch.queue_declare("backlog", durable=True, passive=True).method.message_count == n
        ch.basic_qos(prefetch_count=1000)
        t = threading.Thread(target=publisher)
        t.start()
        got = []
        deadline = time.monotonic() + 60
        for method, _props, body in ch.consume("backlog", inactivity_timeout=5):
            assert body is not None and time.monotonic() < deadline, len(got)
            got.append(body)
            if len(got) % 500 == 0 or len(got) == n + more:
                ch.basic_ack(method.delivery_tag, multiple=True)
            if len(got) == n + more:
                break
        t.join(30)
        assert published.is_set()
        assert got[:n] == [b"m%05d" % i for i in range(n)]
        assert got[n:] == [b"new%03d" % i for i in range(more)]
        conn.close()
    finally:
        for p in procs:
            p.kill()
        procs.clear()
        db.drop()
