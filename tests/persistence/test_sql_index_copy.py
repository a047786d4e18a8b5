"""PostgreSQL reads the entry index as binary COPYs (by seq ranges of a queue) turned into
columns by numpy (SQLStore._index_part), not row tuples through a cursor: the same index as the
generic path for every kind of row (NULL expiry, size and delivery count of older rows,
the delivered flag, priorities out of range, several queues, an orphan queue id)."""
from __future__ import annotations

import pytest
import trio
from sqlalchemy import select, text

from broker.persistence import sql as sqlmod
from broker.persistence import sql_schema as S
from broker.persistence.sql import SQLStore

from .test_sql_paging import Paging
from .test_sql_store import _make_db, declare_queue, message, take


@pytest.fixture
def pg():
    d = _make_db("postgresql")
    yield d
    d.drop()


def _fill(url):
    async def main():
        async with Paging(url) as p:
            a = declare_queue(p.broker, "a")
            b = declare_queue(p.broker, "b", arguments={"x-message-ttl": 3_600_000})
            for i in range(300):
                a.enqueue(message("a", b"a%03d" % i))
            for i in range(40):
                b.enqueue(message("b", b"bb%03d" % i))
            for _ in range(5):
                take(a)  # delivered, not acked: a delivery count
            await p.durable()
    trio.run(main)


def _index(url, generic: bool):
    """The index as start-up reads it (without opening the store, which would also
    delete the orphan rows)."""
    store = SQLStore(url)
    store._make_engines()
    try:
        if generic:
            store.dialect = "generic"  # the cursor path every other database takes
        with store.engine.begin() as c:
            by_qid = {r.qid: r.name for r in c.execute(select(S.queues))}
            index, _totals, orphans = store._load_index(c, by_qid, 10**9)  # whole queues
    finally:
        store._dispose()
    return ({by_qid[q]: (ix.seqs.tolist(), ix.mids.tolist(), ix.exps.tobytes(),
                         ix.blens.tolist(), ix.prios.tolist(), ix.flags.tolist(),
                         list(ix.unsized))
             for q, ix in index.items()}, orphans)


def test_postgresql_index_copy_equals_the_cursor_path(pg, monkeypatch):
    _fill(pg.url)
    store = SQLStore(pg.url)
    store._make_engines()
    with store.engine.begin() as c:
        # rows as older versions and other paths leave them
        c.execute(text("UPDATE triomq_entries SET size = NULL WHERE seq % 7 = 0"))
        c.execute(text("UPDATE triomq_entries SET deliveries = NULL, delivered = true "
                       "WHERE seq % 11 = 0"))
        c.execute(text("UPDATE triomq_entries SET deliveries = 300 WHERE seq = 3"))
        c.execute(text("UPDATE triomq_entries SET priority = 9 WHERE seq % 5 = 0"))
        c.execute(text("UPDATE triomq_entries SET priority = -2 WHERE seq = 13"))
        c.execute(text("INSERT INTO triomq_entries (qid, seq, message_id, priority, delivered) "
                       "SELECT 9999, seq, message_id, 0, false FROM triomq_entries LIMIT 3"))
    store._dispose()

    copied = []
    real = SQLStore._pg_index_chunks

    def spy(self, c, sql, chunk_bytes=8 << 20):
        for out in real(self, c, sql, chunk_bytes=2000):  # several chunks, rows cut across them
            copied.append(len(out[0]))
            yield out

    monkeypatch.setattr(SQLStore, "_pg_index_chunks", spy)
    fast = _index(pg.url, generic=False)
    assert sum(copied) == 340 and len(copied) > 3  # the orphan rows are found, not copied
    monkeypatch.setattr(sqlmod._QueueIndex, "extend_arrays", None)  # the generic path
    slow = _index(pg.url, generic=True)
    assert fast == slow
    index, orphans = fast
    assert orphans == {9999}
    assert len(index["a"][0]) == 300 and len(index["b"][0]) == 40
    # sizes of the NULL-size rows measured from their messages, as for the cursor path
    assert set(index["a"][3]) == {4} and set(index["b"][3]) == {5}
    assert 255 in index["a"][5] and 1 in index["a"][5] and 9 in index["a"][4]
    assert 0 in index["a"][4]  # priority -2 read as 0
