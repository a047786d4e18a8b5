"""Start-up: reading definitions, metadata and each queue's totals and first window
(index.py), restoring them into the broker; then, once it serves, the rest of each index in
bounded steps, and the one clean-up of orphaned messages. Does not write."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

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
from ..sql_paged import SQLPagedFifo
from . import common
from .common import (
    ORPHAN_GC_DELAY,
    ORPHAN_GC_RANGE,
    PAGER_RETRY,
    _reason,
    log,
)
from .index import IndexReader, _QueueIndex

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from ...broker import Broker


class Loader(IndexReader):
    """The store's ``_load`` (worker thread), ``recover`` (trio thread), the read of the rest
    of each index once the broker serves (``_load_rest``) and the orphan clean-up."""

    def _load(self) -> None:
        """Definitions, each queue's totals and the index and messages of its first
        ``page_window`` entries: what the broker needs before it serves, whatever the
        backlog (the rest of the index: ``_load_rest``; messages in pages: sql_paged.py)."""
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
            heads, totals, orphans = self._load_index(c, by_qid, self.settings.page_window)
            for qid in orphans:
                c.execute(delete(S.entries).where(S.entries.c.qid == qid))
                c.execute(delete(S.totals).where(S.totals.c.qid == qid))
            messages = self._read_messages(c, {mid for ix in heads.values() for mid in ix.mids})
            max_id = c.execute(select(func.max(S.msgs.c.id))).scalar() or 0
            meta = [(r.kind, D(r.name), r.value, r.seq)
                    for r in c.execute(select(S.meta).order_by(S.meta.c.seq))]
        self._next_qid = max(by_qid, default=0) + 1
        self._meta_seq = max((m[3] for m in meta), default=0)
        self._loaded_meta = [m[:3] for m in meta]
        self._loaded = (xs, qs, bs, heads, totals, messages, by_qid, max_id)

    def recover(self, broker: Broker) -> None:
        self.broker = broker
        if self._loaded is None:
            return
        xs, qs, bs, heads, totals, messages, by_qid, max_id = self._loaded
        self._loaded = None
        restore_meta(broker, self._loaded_meta)
        self._loaded_meta = []
        restore(broker, xs, qs, bs, [], {})
        total = paged = 0
        for qid, (vname, qname) in by_qid.items():
            vhost = broker.vhosts.get(vname)
            q = vhost.queues.get(qname) if vhost is not None else None
            if vhost is None or q is None or not q.durable:
                continue
            self._qids[(vname, qname)] = (q, qid)
            self._queue_of[qid] = q
            ix, t = heads.get(qid), totals.get(qid)
            if ix is None or t is None or not len(ix.seqs):
                continue
            n, k = t.entries, len(ix.seqs)
            # the rest of a paging FIFO's index is read once the broker serves; a queue that
            # cannot page (priority, a variant) or rows an older version wrote without their
            # size: all of it now, before the listeners open
            later = n > k and not t.unsized and isinstance(q.ready, SQLPagedFifo)
            rest = None
            if n > k and not later:
                with self.engine.connect() as c:
                    rest = self._index_rest(c, qid, ix.seqs[-1], t.top)
                    if not q.restores_paged:
                        messages.update(self._read_messages(c, rest.mids))
                        ix.extend_index(rest)
                        rest = None
            wall_minus_mono = time.time() - vhost.timers.now()
            entries = [entry for i in range(len(ix.seqs))
                       if (entry := ix.entry(q, i, messages, wall_minus_mono)) is not None]
            total += q.restore(entries, paged=rest.columns(0) if rest is not None else None)
            if rest is not None:
                paged += len(rest.seqs)
            if later:
                cast(SQLPagedFifo, q.ready).restore_pending(n - k, ix.seqs[-1], t.top)
                q.restore_behind(n - k, t.nbytes - sum(ix.blens), t.top, t.expiring)
                self._unloaded.append((qid, q, q.ready, ix.seqs[-1], t.top, n - k))
                total += n - k
                paged += n - k
        set_message_id_floor(max_id)
        log.info("store %s: recovered %d messages (%d left in the database, read as consumers "
                 "drain)", self.safe_url, total, paged)

    def _index_rest(self, c: Connection, qid: int, after: int, top: int) -> _QueueIndex:
        """The index of queue ``qid`` past seq ``after``, whole (in steps: no read holds a
        million rows at once)."""
        ix = _QueueIndex()
        while True:
            part = self._index_part(c, qid, after, top, common.INDEX_STEP)
            ix.extend_index(part)
            if len(part.seqs) < common.INDEX_STEP:
                return ix
            after = part.seqs[-1]

    async def _load_rest(self) -> None:
        """Once the broker serves: the index of each queue past its first window, read in
        steps of ``INDEX_STEP`` entries in a worker thread and appended to its ready store
        (``SQLPagedFifo.index_arrived``); consumers, publishers, purges and deletes go on
        meanwhile -- what is published waits behind the part still to be read."""
        todo, self._unloaded = self._unloaded, []
        if not todo:
            return
        progress = self.progress
        phase = (progress.phase("sql index (background)", sum(t[5] for t in todo), unit="entries")
                 if progress is not None else None)
        for qid, queue, ready, after, top, _n in todo:
            gen = ready.generation
            while not queue.deleted and queue.ready is ready:
                step = common.INDEX_STEP
                try:
                    ix = await trio.to_thread.run_sync(self._read_index_part, qid, after, top, step)
                except (SQLAlchemyError, OSError) as exc:
                    log.warning("store %s: cannot read queue %r's index (%s); retrying",
                                self.safe_url, queue.name, _reason(exc))
                    await trio.sleep(PAGER_RETRY)
                    continue
                if queue.deleted or not ready.index_arrived(gen, *ix.columns(0)):
                    break  # deleted or purged meanwhile: the database dropped the rest too
                if phase is not None:
                    phase.advance(len(ix.seqs))
                if len(ix.seqs) < step:
                    ready.index_done(gen)
                    queue.dispatch()
                    break
                after = ix.seqs[-1]
        if phase is not None:
            phase.finish()

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
