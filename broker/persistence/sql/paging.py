"""Paging of durable FIFO backlogs on the SQL store: the ready store of a durable queue, the
pager task reading next pages, and dropping written messages from memory. Does not read
the index at start-up (index.py)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import trio
from sqlalchemy.exc import SQLAlchemyError

from ...queues.priority import PriorityReady
from ..sql_paged import SQLPagedFifo
from .common import (
    PAGER_RETRY,
    _reason,
    log,
)
from .state import SQLStoreState, _Batch

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ...message import Message
    from ...queues.entry import QueueEntry
    from ...queues.queue import Queue


class Paging(SQLStoreState):
    """The store's side of ``SQLPagedFifo``."""

    def paged_ready(self, queue: Queue, entries: Iterable[QueueEntry]) -> PriorityReady | SQLPagedFifo:
        """The ready store of a durable queue (``PAGES_MESSAGES``): FIFO queues page; a
        priority queue keeps its messages in memory."""
        if queue.opts.max_priority:
            ready = PriorityReady(queue.opts.max_priority, queue.opts.two_level_priority)
            for entry in entries:
                ready.append(entry)
            return ready
        return SQLPagedFifo(self, queue, entries, page=self.settings.page_size,
                            window=self.settings.page_window)

    def _page_out(self, batch: _Batch) -> None:
        """After a commit: a queue holding a backlog behind its window may drop the
        messages it just got written from memory (``SQLPagedFifo.stored_up_to``)."""
        for qid, seqs in batch.enq.items():
            q = self._queue_of.get(qid)
            if q is not None and isinstance(q.ready, SQLPagedFifo):
                q.ready.stored_up_to(max(seqs))

    def want_page(self, ready: SQLPagedFifo) -> None:
        """``ready`` (an SQLPagedFifo) wants its next page read (once until it arrives)."""
        self._wanted.append(ready)
        self._page_wanted.set()

    def forget_unread(self, queue: Queue, seqs: Iterable[int], mids: Iterable[int]) -> None:
        """A purge dropped entries still only in the database: delete them there."""
        qid = self._qid(queue)
        if qid is None:
            return
        b = self._batch
        s = b.rm.get(qid)
        if s is None:
            s = b.rm[qid] = set()
        s.update(seqs)
        b.rm_msgs.update(mids)
        self._poke()

    def forget_range(self, queue: Queue, after_seq: int, top_seq: int) -> None:
        """A purge dropped stored entries whose index was not read yet (seqs in
        ``(after_seq, top_seq]``): delete them there."""
        qid = self._qid(queue)
        if qid is None:
            return
        self._batch.defs.append(("r-", qid, after_seq, top_seq))
        self._poke()

    async def _pager(self) -> None:
        """Read pages of the backlogs left in the database, one at a time, in a worker
        thread; a failed read is retried (the queue waits, nothing is lost)."""
        while True:
            await self._page_wanted.wait()
            self._page_wanted = trio.Event()
            while self._wanted:
                ready = self._wanted.popleft()
                gen, queue, _seqs, mids = ready.next_page()
                if queue.deleted:
                    continue
                try:
                    messages = await trio.to_thread.run_sync(self._read_page, mids)
                except (SQLAlchemyError, OSError) as exc:
                    log.warning("store %s: cannot read queue %r's messages (%s); retrying",
                                self.safe_url, queue.name, _reason(exc))
                    self._wanted.append(ready)
                    await trio.sleep(PAGER_RETRY)
                    continue
                wall_minus_mono = time.time() - queue.vhost.timers.now()
                if ready.page_arrived(gen, messages, wall_minus_mono) and not queue.deleted:
                    queue.dispatch()

    def _read_page(self, mids: Iterable[int]) -> dict[int, Message]:
        with self.engine.connect() as c:
            return self._read_messages(c, mids)
