"""Retry with backoff before dead-lettering (queue arguments).

* ``x-retry-delays``: array of ms delays (RocketMQ-style levels). A message that
  is rejected or nacked -- with or without requeue -- comes back after
  ``delays[n-1]`` where n is the number of failed deliveries so far; past the
  last level it is dead-lettered with reason ``rejected``.
* ``x-delivery-limit``: as RabbitMQ's quorum queues: once a message has been
  returned more than this many times it is dead-lettered with reason
  ``delivery_limit`` (the limit is checked before the delay levels). Without
  delays, requeues are immediate and reject-without-requeue behaves as usual.
* ``x-retry-ordered``: true = strictly ordered (Hermes-style): while a message
  waits for its retry, and until it is finally settled, nothing else of the
  queue is delivered.

Redeliveries carry ``x-delivery-count`` = previous deliveries (quorum queues'
header). The message keeps its id so the store's record stays the same. The
count is ``entry.delivery_count``, which stores persist with the entry (the
journal's delivered record and checkpoint flags); at restart a store hands it
back through ``restore_delivery_count``, so delivery limits and backoff levels
carry on where they were. A message that was waiting for its delay at the
restart is ready again at once; its next rejection uses the next level.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from ..amqp.fields import Long, encode_properties
from ..message import Message
from .args import ArgumentError, amqp_type_name, bool_arg, int_arg, register_queue_argument

if TYPE_CHECKING:
    from ..timers import TimerHandle
    from .entry import QueueEntry
    from .queue import Queue
    from .ready import PagedIndex, ReadyStore, Relocate

MAX_DELAY_MS = 2**32 - 1


def retry_delays(name: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ArgumentError(name, f"{{unacceptable_type,{amqp_type_name(value)}}}")
    if not value:
        raise ArgumentError(name, "{value_empty,[]}")
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ArgumentError(name, f"{{unacceptable_type,{amqp_type_name(item)}}}")
        if item < 0:
            raise ArgumentError(name, f"{{value_negative,{item}}}")
        if item > MAX_DELAY_MS:
            raise ArgumentError(name, f"{{value_too_large,{item},{MAX_DELAY_MS}}}")
        out.append(int(item))
    return tuple(out)


register_queue_argument("x-retry-delays", retry_delays)
# RabbitMQ 4: a negative limit is none (switches a quorum queue's default of 20 off)
register_queue_argument("x-delivery-limit", int_arg)
register_queue_argument("x-retry-ordered", bool_arg)


class RetryReady:
    """A ``ready.ReadyStore`` wrapping a queue's own (``RetryPolicy.wrap_ready``).

    Ordered mode only: while ``policy.blocked_by`` is set, only that entry (when at
    the head) may leave; everything else waits. (Entries waiting for their retry
    timer are in ``policy.waiting``; for the operation stream they are still
    delivered, not requeued, until ``Queue.put_back``.)
    """

    __slots__ = ("_inner", "_policy")
    accepts_paged_index = False

    @property
    def stored_behind(self) -> int:
        return self._inner.stored_behind

    def __init__(self, inner: ReadyStore, policy: RetryPolicy) -> None:
        self._inner = inner
        self._policy = policy

    def __len__(self) -> int:
        blocked = self._policy.blocked_by
        inner = self._inner
        if blocked is None:
            return len(inner)
        return 1 if len(inner) and inner.peek() is blocked else 0

    def __iter__(self) -> Iterator[QueueEntry]:
        return iter(self._inner)

    def append(self, entry: QueueEntry) -> None:
        self._inner.append(entry)

    def popleft(self) -> QueueEntry:
        return self._inner.popleft()

    def peek(self) -> QueueEntry | None:
        return self._inner.peek()

    def requeue(self, entry: QueueEntry) -> None:
        self._inner.requeue(entry)

    def clear(self) -> list[QueueEntry]:
        return self._inner.clear()

    def pop_tail(self) -> QueueEntry:
        return self._inner.pop_tail()

    def head_entries(self) -> list[QueueEntry]:
        return self._inner.head_entries()

    def paged_index(self) -> PagedIndex | None:
        return self._inner.paged_index()

    def relocate_paged(self, segments: Collection[int], move: Relocate) -> int:
        return self._inner.relocate_paged(segments, move)


class RetryPolicy:
    def __init__(self, queue: Queue, delays: tuple[int, ...], limit: int | None,
                 ordered: bool) -> None:
        self.queue = queue
        self.delays = delays
        self.limit = limit
        self.ordered = ordered
        self.blocked_by: QueueEntry | None = None
        self.waiting: dict[QueueEntry, TimerHandle] = {}  # see waiting_entries
        self.retried = 0
        self.dead_lettered = 0

    def set_limit(self, limit: int | None) -> None:
        """A policy changed ``x-delivery-limit`` (Queue.reconfigure): counts so far stay."""
        self.limit = limit

    @property
    def idle(self) -> bool:
        """Nothing left to do: no delays, no limit, unordered, nobody waiting."""
        return not self.delays and self.limit is None and not self.ordered and not self.waiting \
            and not self.queue.queue_type.delivery_count_header

    # ---- seams of Queue ----
    def wrap_ready(self, ready: ReadyStore) -> ReadyStore:
        """Called by ``Queue._new_ready``: the ready store the queue should use."""
        return RetryReady(ready, self) if self.ordered else ready

    def on_settled(self, entry: QueueEntry) -> None:
        """Called by the queue whenever an entry leaves it (settle, expire, DLX, ...)."""
        if self.blocked_by is entry:
            self.blocked_by = None
            self.queue.vhost.timers.call_later(0, self._kick)

    def waiting_entries(self) -> list[QueueEntry]:
        """Rejected entries waiting for their retry delay (delivered, still in the queue)."""
        return list(self.waiting)

    # called by Queue.reject (requeue=False) and Queue.requeue (requeue=True)
    def on_rejected(self, entry: QueueEntry, requeue: bool) -> bool:
        q = self.queue
        if q.deleted:
            return False
        failures = entry.delivery_count
        if self.limit is not None and failures > self.limit:
            self._dead_letter(entry, "delivery_limit")
            return True
        if self.delays:
            if failures > len(self.delays):
                self._dead_letter(entry, "rejected")
                return True
            delay = self.delays[max(failures, 1) - 1]
        elif requeue:
            delay = 0
        else:
            return False  # no delay levels, reject without requeue: the ordinary path
        self._mark(entry, failures)
        if self.ordered:
            self.blocked_by = entry
        self.retried += 1
        for observer in q.observers.told:  # the audit trail, if it follows this queue
            observer.retried(q, entry, delay)
        if delay == 0 and requeue:
            return False  # Queue.requeue puts it back and dispatches
        if delay == 0:
            self._put_back(entry, dispatch=False)
        else:
            self.waiting[entry] = q.vhost.timers.call_later(delay / 1000.0,
                                                            lambda: self._due(entry))
        return True

    def restored(self, entry: QueueEntry) -> None:
        """A stored entry came back at start-up with ``entry.delivery_count`` > 0: give
        its message the ``x-delivery-count`` header it had before the restart."""
        if entry.delivery_count:
            self._mark(entry, entry.delivery_count)

    def _mark(self, entry: QueueEntry, failures: int) -> None:
        old = entry.message
        props = dict(old.properties)
        headers = dict(props.get("headers") or {})
        headers["x-delivery-count"] = Long(failures)  # a long, as RabbitMQ writes it
        props["headers"] = headers
        entry.message = Message(old.exchange, old.routing_key, encode_properties(props), props,
                                old.body, msg_id=old.id)
        entry.redelivered = True

    def _dead_letter(self, entry: QueueEntry, reason: str) -> None:
        self.dead_lettered += 1
        self.queue.discard([entry], reason)  # dead-letters (if a DLX is set) and settles

    def _due(self, entry: QueueEntry) -> None:
        self.waiting.pop(entry, None)
        q = self.queue
        if q.deleted:
            q.settled(entry)
            return
        self._put_back(entry, dispatch=True)

    def _put_back(self, entry: QueueEntry, dispatch: bool) -> None:
        q = self.queue
        q.put_back(entry)
        if dispatch:
            q.dispatch()

    def _kick(self) -> None:
        if not self.queue.deleted:
            self.queue.dispatch()


def restore_delivery_count(queue: Queue, entry: QueueEntry, count: int) -> None:
    """Recovery (every store): ``entry`` was delivered ``count`` times before the
    restart. Sets its count and redelivered flag and, on a queue with a retry policy,
    its ``x-delivery-count`` header."""
    if count <= 0:
        return
    entry.delivery_count = count
    entry.redelivered = True
    if queue.retry is not None:
        queue.retry.restored(entry)


def make_retry_policy(queue: Queue) -> RetryPolicy | None:
    extra = queue.opts.extra
    delays = extra.get("x-retry-delays") or ()
    limit = extra.get("x-delivery-limit")
    ordered = bool(extra.get("x-retry-ordered"))
    if not delays and limit is None and not ordered \
            and not queue.queue_type.delivery_count_header:
        return None
    return RetryPolicy(queue, tuple(delays), limit, ordered)
