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
header). The message keeps its id so the store's record stays the same; the
count itself is not persisted (after a restart it starts again from the
store's redelivered flag).
"""
from __future__ import annotations

from ..amqp.fields import encode_properties
from ..message import Message
from .args import ArgumentError, amqp_type_name, bool_arg, non_neg_int, register_queue_argument

MAX_DELAY_MS = 2**32 - 1


def retry_delays(name: str, value) -> tuple:
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
register_queue_argument("x-delivery-limit", non_neg_int)
register_queue_argument("x-retry-ordered", bool_arg)


class RetryReady:
    """Wraps a queue's ready store.

    Ordered mode only: while ``policy.blocked_by`` is set, only that entry (when at
    the head) may leave; everything else waits. (Entries waiting for their retry
    timer are in ``policy.waiting``; the journal's checkpoint reads them there.)
    """

    def __init__(self, inner, policy):
        self._inner = inner
        self._policy = policy

    def __len__(self) -> int:
        blocked = self._policy.blocked_by
        inner = self._inner
        if blocked is None:
            return len(inner)
        return 1 if len(inner) and inner.peek() is blocked else 0

    def __iter__(self):
        return iter(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class RetryPolicy:
    def __init__(self, queue, delays: tuple, limit: int | None, ordered: bool):
        self.queue = queue
        self.delays = delays
        self.limit = limit
        self.ordered = ordered
        self.blocked_by = None
        self.waiting: dict = {}  # entry -> timer handle (read by the journal's checkpoint)
        self.retried = 0
        self.dead_lettered = 0
        if ordered:
            queue.ready = RetryReady(queue.ready, self)
            original_settled = queue.settled

            def settled(entry, _orig=original_settled):
                _orig(entry)
                if self.blocked_by is entry:
                    self.blocked_by = None
                    queue.vhost.timers.call_later(0, self._kick)

            queue.settled = settled

    # called by Queue.reject (requeue=False) and Queue.requeue (requeue=True)
    def on_rejected(self, entry, requeue: bool) -> bool:
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
        if delay == 0 and requeue:
            return False  # Queue.requeue puts it back and dispatches
        if delay == 0:
            self._put_back(entry, dispatch=False)
        else:
            self.waiting[entry] = q.vhost.timers.call_later(delay / 1000.0,
                                                            lambda: self._due(entry))
        return True

    def _mark(self, entry, failures: int) -> None:
        old = entry.message
        props = dict(old.properties)
        headers = dict(props.get("headers") or {})
        headers["x-delivery-count"] = failures
        props["headers"] = headers
        entry.message = Message(old.exchange, old.routing_key, encode_properties(props), props,
                                old.body, msg_id=old.id)
        entry.redelivered = True

    def _dead_letter(self, entry, reason: str) -> None:
        self.dead_lettered += 1
        self.queue._discard([entry], reason)  # dead-letters (if a DLX is set) and settles

    def _due(self, entry) -> None:
        self.waiting.pop(entry, None)
        q = self.queue
        if q.deleted:
            q.settled(entry)
            return
        self._put_back(entry, dispatch=True)

    def _put_back(self, entry, dispatch: bool) -> None:
        q = self.queue
        q.ready.requeue(entry)
        q.ready_bytes += len(entry.message.body)
        if dispatch:
            q.dispatch()

    def _kick(self) -> None:
        if not self.queue.deleted:
            self.queue.dispatch()


def make_retry_policy(queue):
    extra = queue.opts.extra
    delays = extra.get("x-retry-delays") or ()
    limit = extra.get("x-delivery-limit")
    ordered = bool(extra.get("x-retry-ordered"))
    if not delays and limit is None and not ordered:
        return None
    return RetryPolicy(queue, tuple(delays), limit, ordered)
