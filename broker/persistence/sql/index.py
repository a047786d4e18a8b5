"""Reading the stored entry index: per queue, its totals and its entries' columns in seq order
by ranges of seqs (a binary COPY on PostgreSQL, a SELECT elsewhere), and messages by id.
Does not restore queues (loader.py) nor read pages of messages (paging.py)."""
from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from sqlalchemy import select, text

from ...queues.entry import QueueEntry
from ...queues.retry import restore_delivery_count
from .. import sql_schema as S
from .. import sql_totals
from ..records import decode_message
from .common import (
    NAN,
    _chunks,
)
from .state import SQLStoreState

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from ...message import Message
    from ...queues.queue import Queue


class _QueueIndex:
    """Stored entries of one queue, as read from the index (columns, seq order)."""
    __slots__ = ("blens", "exps", "flags", "mids", "prios", "seqs", "unsized")

    def __init__(self) -> None:
        self.seqs = array("q")
        self.mids = array("q")
        self.exps = array("d")
        self.blens = array("I")
        self.prios = array("B")
        self.flags = array("B")
        self.unsized: list[int] = []  # positions whose size column is NULL (older rows)

    def extend(self, cols: list[Any], start: int, end: int) -> None:
        """Rows ``start:end`` of columns (qid, seq, message id, expiry, priority,
        delivered, body length, deliveries)."""
        self.seqs.extend(cols[1][start:end])
        self.mids.extend(cols[2][start:end])
        self.exps.extend([NAN if e is None else e for e in cols[3][start:end]])
        self.prios.extend([p if 0 <= p <= 255 else 0 for p in cols[4][start:end]])
        # the delivery count (255 = 255 or more); an older row has only the flag: one
        self.flags.extend([min(n, 255) if n else (1 if d else 0)
                           for d, n in zip(cols[5][start:end], cols[7][start:end], strict=True)])
        sizes = cols[6][start:end]
        if None in sizes:
            base = len(self.blens)
            self.unsized.extend(base + i for i, s in enumerate(sizes) if s is None)
            sizes = [0 if s is None else s for s in sizes]
        self.blens.extend(sizes)

    def entry(self, queue: Queue, i: int, messages: dict[int, Message],
              wall_minus_mono: float) -> QueueEntry | None:
        message = messages.get(self.mids[i])
        if message is None:
            return None
        exp = self.exps[i]
        entry = QueueEntry(message, self.seqs[i], None if exp != exp else exp - wall_minus_mono,
                           self.prios[i])
        if self.flags[i]:
            restore_delivery_count(queue, entry, self.flags[i])
        return entry

    def extend_arrays(self, cols: list[Any], start: int, end: int) -> None:
        """Rows ``start:end`` of numpy columns (seq, message id, expiry or NaN, priority,
        body length or -1 when NULL, delivery count) read by ``_pg_index_chunks``."""
        import numpy as np

        self.seqs.frombytes(cols[0][start:end].tobytes())
        self.mids.frombytes(cols[1][start:end].tobytes())
        self.exps.frombytes(cols[2][start:end].tobytes())
        p = cols[3][start:end]
        self.prios.frombytes(np.where((p >= 0) & (p <= 255), p, 0).astype(np.uint8).tobytes())
        sizes = cols[4][start:end]
        unsized = np.flatnonzero(sizes < 0)
        if len(unsized):
            self.unsized.extend((unsized + len(self.blens)).tolist())
            sizes = np.maximum(sizes, 0)
        self.blens.frombytes(sizes.astype(np.uint32).tobytes())
        self.flags.frombytes(cols[5][start:end].astype(np.uint8).tobytes())

    def extend_index(self, other: _QueueIndex) -> None:
        """The entries of ``other`` (read after these) appended."""
        self.seqs.extend(other.seqs)
        self.mids.extend(other.mids)
        self.exps.extend(other.exps)
        self.blens.extend(other.blens)
        self.prios.extend(other.prios)
        self.flags.extend(other.flags)

    def columns(self, start: int) -> tuple[array[Any], ...]:
        """(seqs, message ids, expiries, body lengths, delivery counts) from ``start``."""
        return (self.seqs[start:], self.mids[start:], self.exps[start:], self.blens[start:],
                self.flags[start:])


COPY_FROM = 20_000  # PostgreSQL reads a range of at least this many entries by binary COPY


class _QueueTotals(NamedTuple):
    """A queue's stored entries in total, read before the broker serves."""
    entries: int
    top: int        # the highest seq
    nbytes: int     # body bytes of the rows that hold their size
    unsized: int    # rows an older version wrote without a size
    expiring: bool  # some row has an expiry


class IndexReader(SQLStoreState):
    """The store's reads of the entry index (start-up, and after it) and of messages."""

    # per queue, one pass over the entries' rows (the primary key's order, no message read)
    _TOTALS_SQL = ("SELECT qid, COUNT(*), MAX(seq), COALESCE(SUM(size), 0), COUNT(size), "
                   "COUNT(expires_at) FROM triomq_entries GROUP BY qid")
    _TOTALS_KEPT_SQL = ("SELECT qid, entries, top_seq, nbytes, entries - unsized, expiring "
                        "FROM triomq_totals")

    def _load_index(self, c: Connection, by_qid: dict[int, Any], window: int
                    ) -> tuple[dict[int, Any], dict[int, Any], set[int]]:
        """Before the broker serves: per queue of ``by_qid``, the index of its first
        ``window`` entries and its totals (``_QueueTotals``); and the qids of entries
        without a queue. What this reads is bounded by the window, not by the backlog: the
        rest is read by ``_index_part`` once the broker serves (``Loader._load_rest``)."""
        progress = self.progress
        phase = progress.phase("sql index", unit="entries") if progress is not None else None
        totals: dict[int, _QueueTotals] = {}
        orphans: set[int] = set()
        # one row per queue where the database keeps the totals (sql_totals.py), else a
        # pass over every stored entry
        sql = self._TOTALS_KEPT_SQL if sql_totals.kept(self.dialect) else self._TOTALS_SQL
        for qid, n, top, nbytes, sized, expiring in c.execute(text(sql)):
            if not n:
                if qid not in by_qid:
                    orphans.add(qid)  # a queue deleted (its row goes with it) or never written
                continue
            if qid in by_qid:
                totals[qid] = _QueueTotals(int(n), int(top), int(nbytes), int(n) - int(sized),
                                           bool(expiring))
            else:
                orphans.add(qid)
        heads: dict[int, _QueueIndex] = {}
        for qid, t in totals.items():
            heads[qid] = ix = self._index_part(c, qid, -1, t.top, window)
            if phase is not None:
                phase.advance(len(ix.seqs))
        if phase is not None:
            phase.finish()
        return heads, totals, orphans

    # PostgreSQL: the same columns as a binary COPY of fixed-width rows (no NULL: NaN
    # expiry, size -1 for an older row, the delivery count computed as ``extend`` does),
    # turned into columns by numpy -- no Python object per row, about 3x faster at 1M
    _INDEX_COPY = ("COPY (SELECT qid, seq, message_id, COALESCE(expires_at, 'NaN'::float8), "
                   "priority::int8, COALESCE(size, -1), (CASE WHEN deliveries > 0 THEN "
                   "LEAST(deliveries, 255) WHEN delivered THEN 1 ELSE 0 END)::int8 "
                   "FROM triomq_entries WHERE qid = {qid} AND seq > {after} AND seq <= {top} "
                   "ORDER BY seq LIMIT {limit}) TO STDOUT (FORMAT BINARY)")

    _COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

    def _index_part(self, c: Connection, qid: int, after: int, top: int, limit: int) -> _QueueIndex:
        """The index of queue ``qid``'s first ``limit`` entries with seqs in ``(after, top]``,
        in seq order, each with its body length (an older row's measured from its message)."""
        ix = _QueueIndex()
        # a window through a SELECT: numpy is not imported before the broker serves
        if self.dialect == "postgresql" and limit >= COPY_FROM:
            sql = self._INDEX_COPY.format(qid=int(qid), after=int(after), top=int(top),
                                          limit=int(limit))
            for qids, cols in self._pg_index_chunks(c, sql):
                ix.extend_arrays(cols, 0, len(qids))
        else:
            E = S.entries
            rows = c.execute(select(E.c.qid, E.c.seq, E.c.message_id, E.c.expires_at,
                                    E.c.priority, E.c.delivered, E.c.size, E.c.deliveries)
                             .where(E.c.qid == qid, E.c.seq > after, E.c.seq <= top)
                             .order_by(E.c.seq).limit(limit)).all()
            if rows:
                ix.extend(list(zip(*rows, strict=True)), 0, len(rows))
        if ix.unsized:
            at = {ix.mids[i]: i for i in ix.unsized}
            for part in _chunks(list(at), 5000):
                for mid, message in self._read_messages(c, part).items():
                    ix.blens[at[mid]] = len(message.body)
            ix.unsized = []
        return ix

    def _read_index_part(self, qid: int, after: int, top: int, limit: int) -> _QueueIndex:
        """``_index_part`` on a connection of its own (a worker thread, after start-up)."""
        with self.engine.connect() as c:
            return self._index_part(c, qid, after, top, limit)

    def _pg_index_chunks(self, c: Connection, sql: str, chunk_bytes: int = 8 << 20
                         ) -> Iterator[tuple[Any, list[Any]]]:
        """(qids, [seqs, mids, exps, prios, sizes, flags]) numpy columns of ``sql`` (an
        ``_INDEX_COPY``), a few MB of rows at a time."""
        import numpy as np

        fields = [("n", ">i2")]
        for name, code in (("qid", ">i8"), ("seq", ">i8"), ("mid", ">i8"), ("exp", ">f8"),
                           ("prio", ">i8"), ("size", ">i8"), ("flags", ">i8")):
            fields += [("len_" + name, ">i4"), (name, code)]
        row = np.dtype(fields)  # packed: 2 + 7 * 12 = 86 bytes

        def parse(buf: bytearray, at: int) -> tuple[tuple[Any, list[Any]], int]:
            k = (len(buf) - at) // row.itemsize
            rec = np.frombuffer(buf, row, count=k, offset=at)
            if k and (bool((rec["n"] != 7).any())
                      or any(bool((rec["len_" + f] != 8).any()) for f in ("qid", "seq", "mid",
                                                                          "exp", "prio", "size",
                                                                          "flags"))):
                raise ValueError("unexpected row in the entry index's binary COPY")
            out = (rec["qid"].astype(np.int64),
                   [rec["seq"].astype(np.int64), rec["mid"].astype(np.int64),
                    rec["exp"].astype(np.float64), rec["prio"].astype(np.int64),
                    rec["size"].astype(np.int64), rec["flags"].astype(np.int64)])
            del rec
            return out, at + k * row.itemsize

        cur = cast(Any, c.connection.dbapi_connection).cursor()  # psycopg's, for COPY
        buf = bytearray()
        at = -1  # where rows start once the header is read
        try:
            with cur.copy(sql) as copy:
                for data in copy:
                    buf += data
                    if at < 0 and len(buf) >= 19:
                        if bytes(buf[:11]) != self._COPY_SIGNATURE:
                            raise ValueError("not a binary COPY")
                        at = 19 + int.from_bytes(buf[15:19], "big")
                    if at >= 0 and len(buf) - at >= chunk_bytes:
                        out, used = parse(buf, at)
                        del buf[:used]
                        at = 0
                        yield out
            if at >= 0 and len(buf) - at > 2:
                out, used = parse(buf, at)
                if len(out[0]):
                    yield out
        finally:
            cur.close()

    @staticmethod
    def _read_messages(c: Connection, mids: Iterable[int]) -> dict[int, Message]:
        """id -> Message for the ids ``mids`` (those still stored)."""
        messages = {}
        for part in _chunks(sorted(mids)):
            # fetched whole: iterating a result fetches row by row (psycopg: ~50 us a row)
            for mid, body in c.execute(select(S.msgs.c.id, S.msgs.c.body)
                                       .where(S.msgs.c.id.in_(part))).all():
                messages[mid] = decode_message(bytes(body))
        return messages
