"""The core's calls into the journal (trio thread): definitions and queue operations turned
into records appended to the buffer. Does not write files."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .. import journal_format as jf
from ..paged import PagedFifo, PagedPriority
from ..records import (
    binding_def,
    encode_message,
    exchange_def,
    queue_def,
)
from .common import _DELIVER, _ENQUEUE, _REQUEUE, ENQ_MIN
from .shared import JournalStoreState
from .stored import _body_len

if TYPE_CHECKING:
    from ...exchanges.base import Binding, Exchange
    from ...queues.entry import QueueEntry
    from ...queues.ops import Op
    from ...queues.queue import Queue
    from ...vhost import VirtualHost


class JournalHooks(JournalStoreState):
    """The store's ``Store`` hooks."""

    def save_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        xd = exchange_def(vhost, exchange)
        self._exchanges[(xd.vhost, xd.name)] = xd
        self._append(jf.T_EXCHANGE, jf.pack_exchange(xd))

    def delete_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        self._exchanges.pop((vhost.name, exchange.name), None)
        self._append(jf.T_EXCHANGE_DEL, jf.pack_name(vhost.name, exchange.name))

    def save_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        qd = queue_def(vhost, queue)
        qid = self._next_qid
        self._next_qid += 1
        self._qids[queue] = qid
        self._queues[qid] = qd
        self._append(jf.T_QUEUE, jf.pack_queue(qd, qid))

    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        qid = self._qids.pop(queue, None)
        if qid is None:
            return
        self._queues.pop(qid, None)
        self._append(jf.T_QUEUE_DEL, jf.U32.pack(qid))

    def save_binding(self, vhost: VirtualHost, binding: Binding) -> None:
        bd = binding_def(vhost, binding)
        self._bindings[jf.binding_key(bd)] = bd
        self._append(jf.T_BINDING, jf.pack_binding(bd))

    def delete_binding(self, vhost: VirtualHost, binding: Binding) -> None:
        bd = binding_def(vhost, binding)
        self._bindings.pop(jf.binding_key(bd), None)
        self._append(jf.T_BINDING_DEL, jf.pack_binding(bd))

    def save_meta(self, kind: str, key: str, value: dict[str, Any]) -> None:
        from ..recovery import encode_meta
        raw = encode_meta(value)
        self._meta[(kind, key)] = raw
        self._append(jf.T_META, jf.pack_meta(kind, key, raw))

    def delete_meta(self, kind: str, key: str) -> None:
        if self._meta.pop((kind, key), None) is not None:
            self._append(jf.T_META_DEL, jf.pack_meta(kind, key))

    def queue_op(self, queue: Queue, op: Op, entry: QueueEntry) -> None:
        if not entry.message.persistent:
            return
        if op is _ENQUEUE:
            if self._failed is not None:
                # writes fail: recorded only once its publish is not nacked (when_durable)
                self._held[entry] = queue
                return
            self.enqueue(queue, entry)
        elif self._held and entry in self._held:
            if op is not _DELIVER and op is not _REQUEUE:
                del self._held[entry]  # left before it was recorded: nothing to write
        elif op is _DELIVER:
            if entry.loc:
                self._out[entry] = queue
                self._fresh_out[entry] = None
                self.delivered(queue, entry)  # every time: the count survives a restart
        else:
            if self._out.pop(entry, None) is not None:
                self._fresh_out.pop(entry, None)
                self._aging_out.pop(entry, None)
            if op is not _REQUEUE:
                self.remove(queue, entry)

    def enqueue(self, queue: Queue, entry: QueueEntry) -> None:
        qid = self._qids.get(queue)
        if qid is None:
            self.save_queue(queue.vhost, queue)
            qid = self._qids[queue]
        message = entry.message
        expires = None
        if entry.expires_at is not None:
            expires = time.time() + (entry.expires_at - queue.vhost.timers.now())
        blen = len(message.body)
        if message is self._last_msg and (self._last_msg_loc >> 32) == self._seg:
            loc = self._last_msg_loc
            self._append(jf.T_ENQ_REF, jf.pack_enq(qid, entry.seq, expires, entry.priority, blen, loc))
        else:
            loc = self._append(jf.T_ENQ, jf.pack_enq(qid, entry.seq, expires, entry.priority, blen, 0)
                               + encode_message(message))
            self._last_msg = message
            self._last_msg_loc = loc
            if message.id > self._max_msg_id:
                self._max_msg_id = message.id
        entry.loc = loc
        seg = loc >> 32
        live = self._seg_live
        live[seg] = live.get(seg, 0) + 1
        live_bytes = self._seg_bytes
        live_bytes[seg] = live_bytes.get(seg, 0) + ENQ_MIN + blen

    def paged_ready(self, queue: Queue, entries: list[QueueEntry]) -> PagedFifo | PagedPriority:
        restored = queue.retry.restored if queue.retry is not None else None
        budget = self.settings.queue_memory_budget
        if queue.opts.max_priority:
            return PagedPriority(self, queue.vhost.timers, queue.opts.max_priority, budget,
                                 entries, restored, queue.opts.two_level_priority)
        return PagedFifo(self, queue.vhost.timers, budget=budget, entries=entries,
                         restored=restored)

    def delivered(self, queue: Queue, entry: QueueEntry) -> None:
        qid = self._qids.get(queue)
        if qid is not None and entry.loc:
            self._append(jf.T_DELIVERED, jf.pack_delivered(qid, entry.seq, entry.delivery_count))

    def remove(self, queue: Queue, entry: QueueEntry) -> None:
        loc = entry.loc
        if not loc:
            return
        qid = self._qids.get(queue)
        if qid is not None:
            self._append(jf.T_REMOVE, jf.QSEQ.pack(qid, entry.seq))
        seg = loc >> 32
        live = self._seg_live
        n = live.get(seg, 0) - 1
        if n > 0:
            live[seg] = n
            # (a scheduler slot's entry may leave unread: its body length is on disk)
            blen = _body_len(entry) if entry.message is not None else self._stored_body_len(loc)
            self._seg_bytes[seg] -= ENQ_MIN + blen
        else:
            live.pop(seg, None)
            self._seg_bytes.pop(seg, None)
            m = self._maps.pop(seg, None)
            if m is not None:  # nothing left to read there: drop its mapped pages from RSS
                try:
                    m.close()
                except BufferError:  # pragma: no cover
                    self._maps[seg] = m
        entry.loc = 0
