"""The core's calls into the SQL store (trio thread): definitions, enqueue, deliveries,
removals and ``when_durable``, buffered into the current batch. Never touches the database."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..recovery import encode_meta
from .common import (
    _DELIVER,
    _ENQUEUE,
    _REQUEUE,
    DELIVERIES_MAX,
    log,
)
from .state import SQLStoreState, _Batch

if TYPE_CHECKING:
    from ...exchanges.base import Binding, Exchange
    from ...queues.entry import QueueEntry
    from ...queues.ops import Op
    from ...queues.queue import Queue
    from ...vhost import VirtualHost


class CoreHooks(SQLStoreState):
    """The store's ``Store`` hooks: they only buffer (``_batch``)."""

    def _poke(self) -> None:
        if self.flush == "sync":
            self._wake.set()

    def save_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        from ..records import exchange_def
        self._batch.defs.append(("x+", exchange_def(vhost, exchange)))
        self._poke()

    def delete_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None:
        self._batch.defs.append(("x-", vhost.name, exchange.name))
        self._poke()

    def save_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        from ..records import queue_def
        key = (vhost.name, queue.name)
        have = self._qids.get(key)
        if have is not None and have[0] is queue:
            qid = have[1]
        else:
            qid = self._next_qid
            self._next_qid += 1
            self._qids[key] = (queue, qid)
            self._queue_of[qid] = queue
        self._batch.defs.append(("q+", queue_def(vhost, queue), qid))
        self._poke()

    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        key = (vhost.name, queue.name)
        have = self._qids.get(key)
        if have is None or have[0] is not queue:
            return
        del self._qids[key]
        qid = have[1]
        self._queue_of.pop(qid, None)
        b = self._batch
        pending = b.enq.pop(qid, None)
        if pending:
            for r in pending.values():
                self._unref(b, r[0])
        b.dlv.pop(qid, None)
        b.rm.pop(qid, None)
        b.defs.append(("q-", vhost.name, queue.name, qid))
        self._poke()

    def save_binding(self, vhost: VirtualHost, binding: Binding) -> None:
        from ..records import binding_def
        self._batch.defs.append(("b+", binding_def(vhost, binding)))
        self._poke()

    def delete_binding(self, vhost: VirtualHost, binding: Binding) -> None:
        from ..records import binding_def
        self._batch.defs.append(("b-", binding_def(vhost, binding)))
        self._poke()

    def save_meta(self, kind: str, key: str, value: dict[str, Any]) -> None:
        self._meta_seq += 1
        self._batch.defs.append(("m+", kind, key, encode_meta(value), self._meta_seq))
        self._poke()

    def delete_meta(self, kind: str, key: str) -> None:
        self._batch.defs.append(("m-", kind, key))
        self._poke()

    def _qid(self, queue: Queue) -> int | None:
        have = self._qids.get((queue.vhost.name, queue.name))
        if have is None or have[0] is not queue:
            return None
        return have[1]

    def enqueue(self, queue: Queue, entry: QueueEntry) -> None:
        qid = self._qid(queue)
        if qid is None:
            if queue.durable and queue.vhost.queues.get(queue.name) is queue:
                self.save_queue(queue.vhost, queue)
                qid = cast(int, self._qid(queue))  # save_queue has just registered it
            else:
                return
        b = self._batch
        message = entry.message
        m = b.msgs.get(message.id)
        if m is None:
            b.msgs[message.id] = [message, 1]
            size = len(message.body)
            b.nbytes += size
            self._unwritten += size
            if b.nbytes >= self.settings.batch_bytes:
                self._seal()
        else:
            m[1] += 1
        expires = None
        if entry.expires_at is not None:
            expires = time.time() + (entry.expires_at - queue.vhost.timers.now())
        seqs = b.enq.get(qid)
        if seqs is None:
            seqs = b.enq[qid] = {}
        seqs[entry.seq] = [message.id, expires, entry.priority, entry.delivery_count > 0,
                           len(message.body), min(entry.delivery_count, DELIVERIES_MAX) or None]
        if not queue.internal:
            self._held.append((queue, entry))  # taken back if the publish is nacked
        self._poke()

    def queue_op(self, queue: Queue, op: Op, entry: QueueEntry) -> None:
        """As ``Store.queue_op``, but every delivery is written, not only the first: the
        count survives a restart (delivery limits, retry levels), as on the journal."""
        if not entry.message.persistent:
            return
        if op is _ENQUEUE:
            self.enqueue(queue, entry)
        elif op is _DELIVER:
            self.delivered(queue, entry)
        elif op is not _REQUEUE:
            self.remove(queue, entry)

    def delivered(self, queue: Queue, entry: QueueEntry) -> None:
        qid = self._qid(queue)
        if qid is None:
            return
        b = self._batch
        count = min(entry.delivery_count, DELIVERIES_MAX) or 1
        seqs = b.enq.get(qid)
        if seqs is not None:
            r = seqs.get(entry.seq)
            if r is not None:
                r[3] = True
                r[5] = count
                return
        s = b.dlv.get(qid)
        if s is None:
            s = b.dlv[qid] = {}
        s[entry.seq] = count
        self._poke()

    def remove(self, queue: Queue, entry: QueueEntry) -> None:
        qid = self._qid(queue)
        if qid is None:
            return
        b = self._batch
        if self._cancel(b, qid, entry.seq):
            return  # never handed to the database: nothing to write at all
        for rb in self._retry:
            # a failed batch (database down) need not keep it; its commit outcome may be
            # unknown, so the delete below is written as well
            self._cancel(rb, qid, entry.seq)
        d = b.dlv.get(qid)
        if d is not None:
            d.pop(entry.seq, None)
        s = b.rm.get(qid)
        if s is None:
            s = b.rm[qid] = set()
        s.add(entry.seq)
        b.rm_msgs.add(entry.message.id)
        self._poke()

    def _cancel(self, b: _Batch, qid: int, seq: int) -> bool:
        seqs = b.enq.get(qid)
        if seqs is None:
            return False
        r = seqs.pop(seq, None)
        if r is None:
            return False
        if not seqs:
            del b.enq[qid]
        self._unref(b, r[0])
        return True

    def _unref(self, b: _Batch, msg_id: int) -> None:
        m = b.msgs.get(msg_id)
        if m is None:
            b.rm_msgs.add(msg_id)  # written by an earlier batch (rare: re-enqueued message)
            return
        m[1] -= 1
        if m[1] <= 0:
            del b.msgs[msg_id]
            size = len(m[0].body)
            b.nbytes -= size
            self._unwritten -= size
            self._check_backlog()

    def _seal(self) -> None:
        """Close a batch that reached ``batch_bytes``: it waits (in ``_retry``) to be written
        in a transaction of its own, so no write, and no encoding buffer, grows past that."""
        self._retry.append(self._batch)
        self._batch = _Batch()
        self._check_backlog()
        self._poke()

    def _check_backlog(self) -> None:
        """Block publishers (a resource alarm, through the broker) while more than
        ``max_unwritten`` body bytes wait for the database; unblock below half of it."""
        limit = self.settings.max_unwritten
        if not self._backlog_full and self._unwritten > limit:
            self._backlog_full = True
            log.warning("store %s: %d MB wait for the database (limit %d MB): publishers are "
                        "blocked", self.safe_url, self._unwritten >> 20, limit >> 20)
        elif self._backlog_full and self._unwritten <= limit // 2:
            self._backlog_full = False
        else:
            return
        if self.broker is not None:
            self.broker.on_store_backlog(self, self._backlog_full)

    def when_durable(self, callback: Callable[[], None],
                     on_failure: Callable[[], None] | None = None) -> None:
        # the entries enqueued since the last call are this publish's (the publish path
        # enqueues, then calls this at once): a nack takes them back from their queues
        held, self._held = self._held, []
        if self._down:
            if on_failure is not None:
                self._fail([(callback, on_failure, held)])
            else:
                self._batch.callbacks.append((callback, None, ()))
            return
        if self.flush == "async":
            callback()
            return
        if not self._inflight and not self._retry and self._batch.empty() \
                and not self._batch.callbacks:
            callback()
            return
        self._batch.callbacks.append((callback, on_failure, held if on_failure else ()))
        self._wake.set()
