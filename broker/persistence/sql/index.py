"""Reading the stored entry index at start-up: per queue, its entries' columns in seq order
(a binary COPY on PostgreSQL, a streamed cursor elsewhere), and messages by id. Does not
restore queues (loader.py) nor read pages later (paging.py)."""
from __future__ import annotations

from array import array

from sqlalchemy import select

from ...queues.entry import QueueEntry
from ...queues.retry import restore_delivery_count
from .. import sql_schema as S
from ..records import (
    decode_message,
)
from .common import (
    NAN,
    _chunks,
)
from .state import SQLStoreState


class _QueueIndex:
    """The stored entries of one queue, as read at start-up (columns, seq order)."""
    __slots__ = ("blens", "exps", "flags", "mids", "prios", "seqs", "unsized")

    def __init__(self):
        self.seqs = array("q")
        self.mids = array("q")
        self.exps = array("d")
        self.blens = array("I")
        self.prios = array("B")
        self.flags = array("B")
        self.unsized: list[int] = []  # positions whose size column is NULL (older rows)

    def extend(self, cols: list, start: int, end: int) -> None:
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

    def entry(self, queue, i: int, messages: dict, wall_minus_mono: float) -> QueueEntry | None:
        message = messages.get(self.mids[i])
        if message is None:
            return None
        exp = self.exps[i]
        entry = QueueEntry(message, self.seqs[i], None if exp != exp else exp - wall_minus_mono,
                           self.prios[i])
        if self.flags[i]:
            restore_delivery_count(queue, entry, self.flags[i])
        return entry

    def extend_arrays(self, cols, start: int, end: int) -> None:
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

    def columns(self, start: int) -> tuple:
        """(seqs, message ids, expiries, body lengths, delivery counts) from ``start``."""
        return (self.seqs[start:], self.mids[start:], self.exps[start:], self.blens[start:],
                self.flags[start:])


class IndexReader(SQLStoreState):
    """The store's start-up reads of the entry index and of messages."""

    # in the primary key's order, without touching the messages
    _INDEX_SQL = ("SELECT qid, seq, message_id, expires_at, priority, delivered, size, "
                  "deliveries FROM triomq_entries ORDER BY qid, seq")

    def _load_index(self, c, by_qid: dict) -> tuple[dict, set]:
        """qid -> _QueueIndex of its entries in seq order, and the qids without a queue.
        Streamed through the driver's own cursor in chunks turned into columns at C
        speed: a million entries cost their arrays (~30 bytes each), not row objects."""
        index: dict[int, _QueueIndex] = {}
        orphans: set[int] = set()
        progress = self.progress
        phase = progress.phase("sql index", unit="entries") if progress is not None else None
        if self.dialect == "postgresql":
            self._load_index_pg(c, by_qid, index, orphans, phase)
        for rows in (() if self.dialect == "postgresql" else self._stream(c, self._INDEX_SQL)):
            if phase is not None:
                phase.advance(len(rows))
            cols = list(zip(*rows, strict=True))
            qids = cols[0]
            start = 0
            while start < len(qids):
                qid = qids[start]
                end = start + 1
                if qids[-1] == qid:
                    end = len(qids)
                else:
                    while qids[end] == qid:
                        end += 1
                if qid in by_qid:
                    ix = index.get(qid)
                    if ix is None:
                        ix = index[qid] = _QueueIndex()
                    ix.extend(cols, start, end)
                else:
                    orphans.add(qid)
                start = end
        for ix in index.values():
            if ix.unsized:  # rows an older version wrote: measured from their messages
                at = {ix.mids[i]: i for i in ix.unsized}
                for part in _chunks(list(at), 5000):
                    for mid, message in self._read_messages(c, part).items():
                        ix.blens[at[mid]] = len(message.body)
                ix.unsized = []
        if phase is not None:
            phase.finish()
        return index, orphans

    # PostgreSQL: the same columns as one binary COPY of fixed-width rows (no NULL: NaN
    # expiry, size -1 for an older row, the delivery count computed as ``extend`` does),
    # turned into columns by numpy -- no Python object per row, about 3x faster at 1M
    _INDEX_COPY = ("COPY (SELECT qid, seq, message_id, COALESCE(expires_at, 'NaN'::float8), "
                   "priority::int8, COALESCE(size, -1), (CASE WHEN deliveries > 0 THEN "
                   "LEAST(deliveries, 255) WHEN delivered THEN 1 ELSE 0 END)::int8 "
                   "FROM triomq_entries ORDER BY qid, seq) TO STDOUT (FORMAT BINARY)")

    _COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

    def _load_index_pg(self, c, by_qid: dict, index: dict, orphans: set, phase) -> None:
        from itertools import pairwise

        import numpy as np

        for qids, cols in self._pg_index_chunks(c):
            if phase is not None:
                phase.advance(len(qids))
            bounds = [0, *(np.flatnonzero(qids[1:] != qids[:-1]) + 1).tolist(), len(qids)]
            for start, end in pairwise(bounds):
                qid = int(qids[start])
                if qid in by_qid:
                    ix = index.get(qid)
                    if ix is None:
                        ix = index[qid] = _QueueIndex()
                    ix.extend_arrays(cols, start, end)
                else:
                    orphans.add(qid)

    def _pg_index_chunks(self, c, chunk_bytes: int = 8 << 20):
        """(qids, [seqs, mids, exps, prios, sizes, flags]) numpy columns of ``_INDEX_COPY``,
        a few MB of rows at a time."""
        import numpy as np

        fields = [("n", ">i2")]
        for name, code in (("qid", ">i8"), ("seq", ">i8"), ("mid", ">i8"), ("exp", ">f8"),
                           ("prio", ">i8"), ("size", ">i8"), ("flags", ">i8")):
            fields += [("len_" + name, ">i4"), (name, code)]
        row = np.dtype(fields)  # packed: 2 + 7 * 12 = 86 bytes

        def parse(buf: bytearray, at: int):
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

        cur = c.connection.dbapi_connection.cursor()
        buf = bytearray()
        at = -1  # where rows start once the header is read
        try:
            with cur.copy(self._INDEX_COPY) as copy:
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

    def _stream(self, c, sql: str, size: int = 20_000):
        """Chunks of rows of ``sql`` from a server-side cursor (PostgreSQL, MariaDB) or
        SQLite's lazy one, within ``c``'s transaction."""
        raw = c.connection.dbapi_connection
        if self.dialect == "postgresql":
            cur = raw.cursor(name="triomq_index")
            cur.itersize = size
        elif self.dialect == "mysql":
            import pymysql.cursors
            cur = raw.cursor(pymysql.cursors.SSCursor)
        else:
            cur = raw.cursor()
        try:
            cur.execute(sql)
            while rows := cur.fetchmany(size):
                yield rows
        finally:
            cur.close()

    @staticmethod
    def _read_messages(c, mids) -> dict:
        """id -> Message for the ids ``mids`` (those still stored)."""
        messages = {}
        for part in _chunks(sorted(mids)):
            for mid, body in c.execute(select(S.msgs.c.id, S.msgs.c.body).where(S.msgs.c.id.in_(part))):
                messages[mid] = decode_message(bytes(body))
        return messages
