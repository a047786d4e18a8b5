"""Start-up: reading definitions, metadata and each queue's index (index.py), restoring them
into the broker, and the one clean-up of orphaned messages after it. Does not write."""
from __future__ import annotations

import time

import trio
from sqlalchemy import delete, exists, func, select
from sqlalchemy.exc import SQLAlchemyError

from ...message import set_message_id_floor
from .. import sql_schema as S
from ..records import (
    BindingDef,
    ExchangeDef,
    QueueDef,
    decode_arguments,
)
from ..recovery import restore, restore_meta
from ..sql_names import from_db as D
from .common import (
    ORPHAN_GC_DELAY,
    ORPHAN_GC_RANGE,
    _reason,
    log,
)
from .state import SQLStoreState


class Loader(SQLStoreState):
    """The store's ``_load`` (worker thread), ``recover`` (trio thread) and orphan clean-up."""

    def _load(self) -> None:
        """Definitions, every queue's entry index, and the messages of the first
        ``page_window`` entries of each queue (the rest is read in pages: sql_paged.py)."""
        with self.engine.begin() as c:
            xs = [ExchangeDef(D(r.vhost), D(r.name), r.type, True, r.auto_delete, r.internal,
                              decode_arguments(r.arguments))
                  for r in c.execute(select(S.exchanges))]
            qrows = list(c.execute(select(S.queues).order_by(S.queues.c.qid)))
            qs = [QueueDef(D(r.vhost), D(r.name), True, r.auto_delete, decode_arguments(r.arguments))
                  for r in qrows]
            by_qid = {r.qid: (D(r.vhost), D(r.name)) for r in qrows}
            bs = [BindingDef(D(r.vhost), D(r.source), r.destination_kind, D(r.destination),
                             D(r.routing_key), decode_arguments(r.arguments))
                  for r in c.execute(select(S.bindings))]
            index, orphans = self._load_index(c, by_qid)
            for qid in orphans:
                c.execute(delete(S.entries).where(S.entries.c.qid == qid))
            window = self.settings.page_window
            messages = self._read_messages(
                c, {mid for ix in index.values() for mid in ix.mids[:window]})
            max_id = c.execute(select(func.max(S.msgs.c.id))).scalar() or 0
            meta = [(r.kind, D(r.name), r.value, r.seq)
                    for r in c.execute(select(S.meta).order_by(S.meta.c.seq))]
        self._next_qid = max(by_qid, default=0) + 1
        self._meta_seq = max((m[3] for m in meta), default=0)
        self._loaded_meta = [m[:3] for m in meta]
        self._loaded = (xs, qs, bs, index, messages, by_qid, max_id)

    def recover(self, broker) -> None:
        self.broker = broker
        if self._loaded is None:
            return
        xs, qs, bs, index, messages, by_qid, max_id = self._loaded
        self._loaded = None
        restore_meta(broker, self._loaded_meta)
        self._loaded_meta = []
        restore(broker, xs, qs, bs, [], {})
        window = self.settings.page_window
        total = paged = 0
        for qid, (vname, qname) in by_qid.items():
            vhost = broker.vhosts.get(vname)
            q = vhost.queues.get(qname) if vhost is not None else None
            if q is None or not q.durable:
                continue
            self._qids[(vname, qname)] = (q, qid)
            self._queue_of[qid] = q
            ix = index.get(qid)
            if ix is None:
                continue
            n = len(ix.seqs)
            k = min(n, window) if q.restores_paged else n
            if k > window:  # a queue that cannot page (priority, a variant): all of it now
                # (before the listeners open: nothing else waits on the event loop yet)
                with self.engine.connect() as c:
                    messages.update(self._read_messages(c, ix.mids[window:]))
            wall_minus_mono = time.time() - vhost.timers.now()
            entries = [entry for i in range(k)
                       if (entry := ix.entry(q, i, messages, wall_minus_mono)) is not None]
            rest = ix.columns(k) if k < n else None
            total += q.restore(entries, paged=rest)
            paged += n - k
        set_message_id_floor(max_id)
        log.info("store %s: recovered %d messages (%d left in the database, read as consumers "
                 "drain)", self.safe_url, total, paged)

    async def _collect_orphans(self) -> None:
        """Once, after start-up: delete messages whose last entry went away without them
        (a queue delete chunks its message GC; one transaction per batch otherwise). Off the
        start-up path -- an anti-join over a million rows takes seconds -- and in id ranges,
        so no statement holds locks for long; an unreferenced row is only wasted space."""
        await trio.sleep(ORPHAN_GC_DELAY)
        try:
            removed = await trio.to_thread.run_sync(self._collect_orphans_sync)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("store %s: orphaned message clean-up failed (%s); retried at the next "
                        "start", self.safe_url, _reason(exc))
            return
        if removed:
            log.info("store %s: removed %d orphaned messages", self.safe_url, removed)

    def _collect_orphans_sync(self) -> int:
        M, E = S.msgs, S.entries
        with self.engine.connect() as c:
            top = c.execute(select(func.max(M.c.id))).scalar() or 0
        removed = 0
        lo = 0
        while lo <= top:
            with self.engine.connect() as c:  # ranges of ORPHAN_GC_RANGE stored ids
                hi = c.execute(select(M.c.id).where(M.c.id >= lo).order_by(M.c.id)
                               .offset(ORPHAN_GC_RANGE).limit(1)).scalar() or top + 1
            with self.engine.begin() as c:
                removed += c.execute(delete(M).where(
                    M.c.id >= lo, M.c.id < hi,
                    ~exists().where(E.c.message_id == M.c.id))).rowcount or 0
            lo = hi
        return removed
