"""The worker thread's transactions: a batch (``_Batch``) written in one transaction, or
record by record when the database refuses a value. Runs off the trio thread; does not
decide confirms or nacks (commit.py)."""
from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import delete, exists, insert, select, update
from sqlalchemy.exc import SQLAlchemyError

from .. import sql_schema as S
from ..records import (
    encode_arguments,
    encode_message,
)
from ..sql_names import db_name as N
from .common import (
    IDLE_RECHECK,
    _abort_socket,
    _binding_key,
    _chunks,
    _meta_key,
    _reason,
    _refused_record,
    log,
)
from .state import SQLStoreState, _Batch

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


class BatchWriter(SQLStoreState):
    """The store's writes of a batch (worker thread only)."""

    def _write(self, batch: _Batch, gen: int) -> str | None:
        """One transaction for ``batch``; returns None or the error text. ``gen`` changes
        when the trio side gave up on this call: its connection is then dropped here."""
        if batch.empty():
            return None
        c = self._conn
        try:
            if c is not None and time.monotonic() - self._conn_used > IDLE_RECHECK:
                self._conn = None  # may have been closed by the server: take a pinged one
                c.close()
                c = None
            if c is None:
                c = self.engine.connect()
                if gen == self._gen:
                    self._conn = c
            try:
                with c.begin():
                    self._write_batch(c, batch)
            except (SQLAlchemyError, ValueError, TypeError) as exc:
                if not _refused_record(exc):
                    raise
                log.warning("store %s: the database refused a record (%s): writing the batch "
                            "record by record", self.safe_url, _reason(exc))
                self._drop(c)
                c = None
                self._write_apart(batch)
            self._conn_used = time.monotonic()
            # a big statement leaves the driver's buffers that big for the connection's life
            if c is not None and (gen != self._gen or batch.nbytes >= self.settings.batch_bytes // 2):
                self._drop(c)
            return None
        except (SQLAlchemyError, ValueError, TypeError) as exc:
            self._drop(c)
            return _reason(exc)

    def _write_apart(self, b: _Batch) -> None:
        """``b`` failed for a value of one of its records: write its definitions, then its
        messages (each with its entries), in halves that are halved again while they fail
        (about 2·log2(n) transactions for one bad record among n, in order), then the
        rest, so only what the database refuses is left out (``b.rejected``,
        ``b.rejected_msgs``; the trio side nacks those publishes). Idempotent, as a retry
        is; a failure that is not a refused record is raised (an outage, as any other)."""
        def attempt(part: _Batch) -> str | None:
            try:
                with self.engine.begin() as c:
                    self._write_batch(c, part)
                return None
            except (SQLAlchemyError, ValueError, TypeError) as exc:
                if not _refused_record(exc):
                    raise
                return _reason(exc)

        def halves(items: list[Any], make: Callable[[list[Any]], _Batch],
                   refused: list[tuple[Any, str]]) -> None:
            if not items:
                return
            reason = attempt(make(items))
            if reason is None:
                return
            if len(items) == 1:
                refused.append((items[0], reason))
                return
            half = len(items) // 2
            halves(items[:half], make, refused)
            halves(items[half:], make, refused)

        def defs_part(ops: list[Any]) -> _Batch:
            part = _Batch()
            part.defs = ops
            return part

        # snapshots: the trio side may cancel entries of a batch waiting for a retry
        defs = list(b.defs)
        refused_defs: list[tuple[Any, str]] = []
        halves(defs, defs_part, refused_defs)
        b.rejected.extend(refused_defs)
        tried = {id(op) for op in defs}
        b.defs = [op for op in b.defs if id(op) not in tried]  # written or refused: never again
        # a refused queue has no row: its entries would be orphans, so their messages are out
        lost = {op[2] for op, _ in refused_defs if op[0] == "q+"}
        enq = {qid: dict(seqs) for qid, seqs in list(b.enq.items())}
        msgs = dict(b.msgs)
        by_mid: dict[int, dict[int, dict[int, list[Any]]]] = {}  # message id -> {qid: {seq: row}}
        for qid, seqs in enq.items():
            for seq, r in seqs.items():
                by_mid.setdefault(r[0], {}).setdefault(qid, {})[seq] = r
        doomed = {mid for mid, qs in by_mid.items() if lost.intersection(qs)}
        b.rejected_msgs.update(doomed)

        def msgs_part(mids: list[int]) -> _Batch:
            part = _Batch()
            for mid in mids:
                part.msgs[mid] = msgs[mid]
                for qid, seqs in by_mid.get(mid, {}).items():
                    part.enq.setdefault(qid, {}).update(seqs)
            return part

        refused_msgs: list[tuple[int, str]] = []
        halves([mid for mid in msgs if mid not in doomed], msgs_part, refused_msgs)
        b.rejected_msgs.update(mid for mid, _ in refused_msgs)
        rest = _Batch()  # entries of messages an earlier batch wrote, deliveries, removals
        for mid, qs in by_mid.items():
            if mid not in msgs and mid not in doomed:
                for qid, seqs in qs.items():
                    rest.enq.setdefault(qid, {}).update(seqs)
        rest.dlv, rest.rm, rest.rm_msgs = b.dlv, b.rm, b.rm_msgs
        for mid in msgs:
            b.msgs.pop(mid, None)
        for qs in by_mid.values():
            for qid, seqs in qs.items():
                left = b.enq.get(qid)
                if left is not None:
                    for seq in seqs:
                        left.pop(seq, None)
                    if not left:
                        b.enq.pop(qid, None)
        # ids and numbers only, nothing to refuse: a failure here is an outage (raised)
        with self.engine.begin() as c:
            self._write_batch(c, rest)
        b.dlv, b.rm, b.rm_msgs = {}, {}, set()

    def _drop(self, c: Connection) -> None:
        if c is None:
            return
        try:
            c.invalidate()
            c.close()
        except Exception:
            pass
        if self._conn is c:
            self._conn = None

    def _drop_conn(self) -> None:
        self._drop(self._conn)

    def _abandon_conn(self) -> None:
        """The writer thread is stuck (silent database): reset its socket, forget it."""
        self._gen += 1
        c, self._conn = self._conn, None
        if c is not None:
            _abort_socket(c, self.dialect)

    def _write_batch(self, c: Connection, b: _Batch) -> None:
        E = S.entries
        rows = 0
        for op in b.defs:
            rows += self._write_def(c, op)
        if b.msgs:
            params = [(mid, encode_message(v[0])) for mid, v in b.msgs.items()]
            self._bulk_insert(c, "msgs", params)
            rows += len(params)
        if b.enq:
            erows = [(qid, seq, r[0], r[1], r[2], r[3], r[4], r[5])
                     for qid, seqs in b.enq.items() for seq, r in seqs.items()]
            if erows:
                self._bulk_insert(c, "entries", erows)
                rows += len(erows)
        pg = self.dialect == "postgresql"
        seqs: Collection[int]
        for qid, counts in b.dlv.items():
            by_count: dict[int, list[int]] = {}  # nearly always one group: first deliveries
            for seq, n in counts.items():
                by_count.setdefault(n, []).append(seq)
            for n, seqs in by_count.items():
                if pg:
                    c.exec_driver_sql("UPDATE triomq_entries SET delivered = true, deliveries = %s "
                                      "WHERE qid = %s AND seq = ANY(%s)", (n, qid, seqs))
                    continue
                for part in _chunks(seqs):
                    c.execute(update(E).where(E.c.qid == qid, E.c.seq.in_(part))
                              .values(delivered=True, deliveries=n))
        for qid, seqs in b.rm.items():
            rows += len(seqs)
            if pg:
                c.exec_driver_sql("DELETE FROM triomq_entries WHERE qid = %s AND seq = ANY(%s)",
                                  (qid, list(seqs)))
                continue
            for part in _chunks(seqs):
                c.execute(delete(E).where(E.c.qid == qid, E.c.seq.in_(part)))
        if b.rm_msgs:
            self._gc_messages(c, b.rm_msgs)
        self.rows_written += rows

    # Vendor "adapters" for the two hot inserts, as ActiveMQ has per-database JDBC adapters:
    # PostgreSQL inserts a whole batch as arrays (unnest), MariaDB/MySQL get one multi-row
    # INSERT IGNORE from pymysql's executemany, SQLite uses sqlite3's executemany.
    _INSERTS: ClassVar[dict[tuple[str, str], str]] = {
        ("postgresql", "msgs"):
            "INSERT INTO triomq_msgs (id, body) SELECT * FROM unnest(%s::bigint[], %s::bytea[]) "
            "ON CONFLICT DO NOTHING",
        ("postgresql", "entries"):
            "INSERT INTO triomq_entries (qid, seq, message_id, expires_at, priority, delivered, "
            "size, deliveries) SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], "
            "%s::double precision[], %s::smallint[], %s::boolean[], %s::bigint[], %s::integer[]) "
            "ON CONFLICT DO NOTHING",
        ("mysql", "msgs"): "INSERT IGNORE INTO triomq_msgs (id, body) VALUES (%s, %s)",
        ("mysql", "entries"):
            "INSERT IGNORE INTO triomq_entries (qid, seq, message_id, expires_at, priority, "
            "delivered, size, deliveries) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        ("sqlite", "msgs"): "INSERT OR IGNORE INTO triomq_msgs (id, body) VALUES (?, ?)",
        ("sqlite", "entries"):
            "INSERT OR IGNORE INTO triomq_entries (qid, seq, message_id, expires_at, priority, "
            "delivered, size, deliveries) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    }

    def _bulk_insert(self, c: Connection, what: str, rows: list[tuple[Any, ...]]) -> None:
        sql = self._INSERTS.get((self.dialect, what))
        if sql is None:  # another SQLAlchemy dialect: portable Core executemany
            table = S.msgs if what == "msgs" else S.entries
            names = [col.name for col in table.columns]
            c.execute(self.insert_ignore(table), [dict(zip(names, r, strict=True)) for r in rows])
            return
        if self.dialect == "postgresql":
            for part in _chunks(rows, 5000):
                c.exec_driver_sql(sql, tuple(list(col) for col in zip(*part, strict=True)))
        else:
            c.exec_driver_sql(sql, rows)

    def _gc_messages(self, c: Connection, ids: Iterable[int]) -> None:
        M = S.msgs
        for part in _chunks(ids):
            c.execute(delete(M).where(M.c.id.in_(part),
                                      ~exists().where(S.entries.c.message_id == M.c.id)))

    def _write_def(self, c: Connection, op: Any) -> int:
        kind = op[0]
        if kind == "x+":
            xd = op[1]
            vhost, name = N(xd.vhost), N(xd.name)
            c.execute(delete(S.exchanges).where(S.exchanges.c.vhost == vhost,
                                                S.exchanges.c.name == name))
            c.execute(insert(S.exchanges).values(vhost=vhost, name=name, type=xd.type,
                                                 auto_delete=xd.auto_delete, internal=xd.internal,
                                                 arguments=encode_arguments(xd.arguments)))
        elif kind == "x-":
            vhost, name = N(op[1]), N(op[2])
            B = S.bindings
            c.execute(delete(S.exchanges).where(S.exchanges.c.vhost == vhost, S.exchanges.c.name == name))
            c.execute(delete(B).where(B.c.vhost == vhost, B.c.source == name))
            c.execute(delete(B).where(B.c.vhost == vhost, B.c.destination_kind == "exchange",
                                      B.c.destination == name))
        elif kind == "q+":
            qd, qid = op[1], op[2]
            vhost, name = N(qd.vhost), N(qd.name)
            Q = S.queues
            c.execute(delete(Q).where(Q.c.vhost == vhost, Q.c.name == name))
            c.execute(insert(Q).values(qid=qid, vhost=vhost, name=name,
                                       auto_delete=qd.auto_delete,
                                       arguments=encode_arguments(qd.arguments)))
        elif kind == "q-":
            vhost, name, qid = N(op[1]), N(op[2]), op[3]
            E, Q, B = S.entries, S.queues, S.bindings
            ids = [r[0] for r in c.execute(select(E.c.message_id).where(E.c.qid == qid).distinct())]
            c.execute(delete(E).where(E.c.qid == qid))
            c.execute(delete(S.totals).where(S.totals.c.qid == qid))  # a later start reuses qids
            c.execute(delete(Q).where(Q.c.qid == qid))
            c.execute(delete(B).where(B.c.vhost == vhost, B.c.destination_kind == "queue",
                                      B.c.destination == name))
            self._gc_messages(c, ids)
        elif kind == "r-":  # a purge of entries whose index was not read yet
            qid, lo, hi = op[1], op[2], op[3]
            E = S.entries
            seqs = (E.c.qid == qid, E.c.seq > lo, E.c.seq <= hi)
            ids = [r[0] for r in c.execute(select(E.c.message_id).where(*seqs).distinct())]
            c.execute(delete(E).where(*seqs))
            self._gc_messages(c, ids)
        elif kind == "b+":
            bd = op[1]
            key = _binding_key(bd)
            c.execute(delete(S.bindings).where(S.bindings.c.bkey == key))
            c.execute(insert(S.bindings).values(bkey=key, vhost=N(bd.vhost), source=N(bd.source),
                                                destination_kind=bd.destination_kind,
                                                destination=N(bd.destination),
                                                routing_key=N(bd.routing_key),
                                                arguments=encode_arguments(bd.arguments)))
        elif kind == "b-":
            c.execute(delete(S.bindings).where(S.bindings.c.bkey == _binding_key(op[1])))
        elif kind == "m+":
            mkey = _meta_key(op[1], op[2])
            c.execute(delete(S.meta).where(S.meta.c.mkey == mkey))
            c.execute(insert(S.meta).values(mkey=mkey, kind=op[1], name=N(op[2]), value=op[3],
                                            seq=op[4]))
        elif kind == "m-":
            c.execute(delete(S.meta).where(S.meta.c.mkey == _meta_key(op[1], op[2])))
        return 1
