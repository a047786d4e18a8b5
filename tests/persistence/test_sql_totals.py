"""Per-queue totals kept by the database (broker/persistence/sql_totals.py): a start reads one
row per queue instead of grouping every stored entry, and the totals stay exact through what
writes entries -- publishes, acks, a purge of an unread range, a queue's delete, a batch
written twice after an in-doubt commit, orphaned entries, a database an older version
wrote. On a real PostgreSQL server (MariaDB and SQLite keep no totals: their row triggers
cost too much per entry written, see sql_totals.py)."""
from __future__ import annotations

import pytest
import trio
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from broker.persistence.sql.state import _Batch

from .test_sql_paging import Paging, _fill
from .test_sql_store import _make_db, take


@pytest.fixture
def db():
    d = _make_db("postgresql")
    yield d
    d.drop()


def _query(url, sql):
    eng = create_engine(url, poolclass=NullPool)
    try:
        with eng.begin() as c:
            result = c.execute(text(sql))
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        eng.dispose()


GROUPED = ("SELECT qid, COUNT(*), MAX(seq), COALESCE(SUM(size), 0), COUNT(*) - COUNT(size), "
           "COUNT(expires_at) FROM triomq_entries GROUP BY qid ORDER BY qid")
KEPT = ("SELECT qid, entries, top_seq, nbytes, unsized, expiring FROM triomq_totals "
        "WHERE entries > 0 ORDER BY qid")


def _exact(url):
    """The kept totals are what grouping the rows gives (top_seq: an upper bound)."""
    grouped, kept = _query(url, GROUPED), _query(url, KEPT)
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in kept] == \
           [(int(r[0]), int(r[1]), int(r[3]), int(r[4]), int(r[5])) for r in grouped]
    assert all(k[2] >= g[2] for k, g in zip(kept, grouped, strict=True))
    return {r[0]: r[1] for r in kept}


class Statements:
    """The SQL every engine of this process runs while in the ``with``."""

    def __enter__(self):
        self.seen: list[str] = []
        event.listen(Engine, "before_cursor_execute", self._record)
        return self

    def _record(self, _conn, _cursor, statement, *_args):
        self.seen.append(" ".join(str(statement).split()).lower())

    def __exit__(self, *exc):
        event.remove(Engine, "before_cursor_execute", self._record)


def test_a_start_groups_no_stored_entry(db):
    """Restarting with a backlog reads the totals without a pass over the entries: every
    statement on triomq_entries a start runs names one queue (its first window)."""
    _fill(db.url, 300, name="a")
    _fill(db.url, 200, name="b")

    async def main():
        with Statements() as st:
            async with Paging(db.url) as p:
                assert p.vhost.queues["a"].message_count == 300
                assert p.vhost.queues["b"].message_count == 200
                opened = list(st.seen)
        on_entries = [s for s in opened if "from triomq_entries" in s]  # reads, not schema
        assert on_entries, opened
        assert not [s for s in on_entries if "group by" in s or "qid =" not in s], on_entries
    trio.run(main)


def test_totals_stay_exact_through_what_writes_entries(db):
    _fill(db.url, 120, name="kept", delivered=2)
    _fill(db.url, 150, name="purged")
    _fill(db.url, 30, name="deleted")
    assert sorted(_exact(db.url).values()) == [30, 120, 150]

    async def main():
        async with Paging(db.url) as p:
            store = p.store
            kept, purged = p.vhost.queues["kept"], p.vhost.queues["purged"]
            for _ in range(20):  # acks, one by one and in a batch
                kept.settled(take(kept))
            await p.durable()
            purged.purge()  # most of it never read: a delete by seq range
            p.vhost.delete_queue(p.vhost.queues["deleted"])
            await p.durable()
            # a batch whose commit was in doubt is written again: counted once
            qid = store._qids[("/", "kept")][1]
            b = _Batch()
            b.enq[qid] = {10_000: [1, None, 0, False, 7, None], 10_001: [2, 4e9, 0, False, 9, None]}
            b.rm[qid] = {10_000}
            for _ in range(2):
                assert store._write(b, store._gen) is None
    trio.run(main)
    totals = _exact(db.url)
    assert sorted(totals.values()) == [101]

    async def after():
        async with Paging(db.url) as p:
            assert p.vhost.queues["kept"].message_count == 101
            assert p.vhost.queues["purged"].message_count == 0
            assert "deleted" not in p.vhost.queues
    trio.run(after)


def test_a_database_without_totals_gets_them_once(db):
    """A database an older version wrote (no triomq_totals, no triggers): the first start
    counts the rows once and installs the triggers; entries of a queue that has no row any
    more are removed with their totals."""
    _fill(db.url, 80, name="old")
    _fill(db.url, 10, name="gone")
    qid_gone = _query(db.url, "SELECT qid FROM triomq_queues WHERE name = 'gone'")[0][0]
    _query(db.url, "DROP TRIGGER triomq_entries_totals_ins ON triomq_entries")
    _query(db.url, "DROP TRIGGER triomq_entries_totals_del ON triomq_entries")
    _query(db.url, "DROP TABLE triomq_totals")
    _query(db.url, f"DELETE FROM triomq_queues WHERE qid = {qid_gone}")  # orphaned entries
    _query(db.url, "UPDATE triomq_lock SET schema_version = 4")

    async def main():
        async with Paging(db.url) as p:
            q = p.vhost.queues["old"]
            assert q.message_count == 80
            q.settled(take(q))
            await p.durable()
    trio.run(main)
    assert list(_exact(db.url).values()) == [79]
    assert _query(db.url, f"SELECT COUNT(*) FROM triomq_totals WHERE qid = {qid_gone}") == [(0,)]


def test_totals_follow_a_truncate_and_a_rollback(db):
    """An operator's TRUNCATE of the entries (no DELETE trigger fires for it) leaves no
    phantom messages at the next start; a transaction rolled back leaves the totals as
    they were (the triggers' writes are in it)."""
    _fill(db.url, 40, name="t")
    eng = create_engine(db.url, poolclass=NullPool)
    try:
        with eng.connect() as c:
            tx = c.begin()
            c.execute(text("DELETE FROM triomq_entries WHERE seq < 10"))
            tx.rollback()
    finally:
        eng.dispose()
    assert list(_exact(db.url).values()) == [40]
    _query(db.url, "TRUNCATE triomq_entries")
    assert _exact(db.url) == {}  # kept 40 before: a backlog's start would trust them

    async def main():
        async with Paging(db.url) as p:
            assert p.vhost.queues["t"].message_count == 0
    trio.run(main)


WAITING = ("SELECT 1 FROM pg_locks WHERE NOT granted AND database = "
           "(SELECT oid FROM pg_database WHERE datname = current_database())")


def test_two_brokers_install_the_totals_at_once(db):
    """Two processes opening a database without the totals at the same time (a master and a
    standby, the workers of one broker): the second install waits for the first, then
    finds the triggers there; before, its CREATE OR REPLACE FUNCTION failed with 'tuple
    concurrently updated' and its store did not open."""
    import threading

    from broker.persistence import sql_totals

    _fill(db.url, 10, name="a")
    _query(db.url, "DROP TRIGGER triomq_entries_totals_ins ON triomq_entries")
    eng = create_engine(db.url, poolclass=NullPool)
    errors: list[Exception] = []

    def second():
        try:
            with eng.begin() as c2:
                if not sql_totals.installed(c2, "postgresql"):
                    sql_totals.install(c2, "postgresql")
        except Exception as exc:  # what the test reports
            errors.append(exc)

    try:
        with eng.connect() as c1:
            tx = c1.begin()
            sql_totals.install(c1, "postgresql")
            thread = threading.Thread(target=second)
            thread.start()
            while not _query(db.url, WAITING):
                thread.join(0.01)  # until the second install waits for the first
            tx.commit()
        thread.join(30)
    finally:
        eng.dispose()
    assert not errors, errors
    assert list(_exact(db.url).values()) == [10]
