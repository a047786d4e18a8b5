"""Dead-lettering: republish to x-dead-letter-exchange with x-death as RabbitMQ 3.10 writes it.

Reasons: 'rejected' (reject/nack without requeue), 'expired' (TTL), 'maxlen'
(overflow), and 'delivery_limit' (delivery limit). The x-death array holds one
table per (queue, reason), most recent first, with count, reason, queue, time,
exchange, routing-keys and original-expiration when a per-message TTL was
removed; x-first-death-{reason,queue,exchange} are set once.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..amqp.fields import Long, Timestamp
from ..publishing import ROUTED, STORING, Source, when_all

if TYPE_CHECKING:
    from ..message import Message
    from .entry import QueueEntry
    from .queue import Queue

AUTOMATIC_REASONS = ("expired", "maxlen", "delivery_limit")


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _raw(name: str) -> bytes:
    """A name or routing key as the bytes it arrived as (not UTF-8 ones included)."""
    return name.encode("utf-8", "surrogateescape")


def _is_name(value: object, name: str) -> bool:
    """Whether an x-death field (bytes, or text a client wrote) is the name ``name``."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    return isinstance(value, (bytes, bytearray)) and bytes(value) == _raw(name)


def routing_keys_of(message: Message) -> list[str]:
    keys = [message.routing_key]
    headers = message.headers
    for name in ("CC", "BCC"):
        extra = headers.get(name)
        if isinstance(extra, list):
            keys.extend(_text(k) for k in extra)
    return keys


def dead_lettered_message(message: Message, queue_name: str, reason: str, dlx: str,
                          dlx_routing_key: str | None) -> Message:
    props = dict(message.properties)
    headers = dict(props.get("headers") or {})
    headers.pop("BCC", None)
    x_death = list(headers.get("x-death") or [])
    entry = None
    for i, item in enumerate(x_death):
        if isinstance(item, dict) and _is_name(item.get("queue"), queue_name) \
                and _text(item.get("reason", b"")) == reason:
            entry = x_death.pop(i)
            break
    if entry is None:
        entry = {
            "count": Long(1),
            "reason": reason.encode(),
            "queue": _raw(queue_name),
            "time": Timestamp(int(time.time())),
            "exchange": _raw(message.exchange),
            "routing-keys": [_raw(k) for k in routing_keys_of(message)],
        }
        expiration = props.get("expiration")
        if expiration is not None:
            entry["original-expiration"] = _text(expiration).encode()
    else:
        entry = dict(entry)
        entry["count"] = Long(int(entry.get("count", 0)) + 1)
        entry["time"] = Timestamp(int(time.time()))
    x_death.insert(0, entry)
    headers["x-death"] = x_death
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason.encode()
        headers["x-first-death-queue"] = _raw(queue_name)
        headers["x-first-death-exchange"] = _raw(message.exchange)
    props["headers"] = headers
    props.pop("expiration", None)
    return message.with_changes(exchange=dlx,
                                routing_key=dlx_routing_key if dlx_routing_key is not None
                                else message.routing_key,
                                properties=props)


def is_cycle(message: Message, target_queue: str) -> bool:
    """Drop rather than loop: the target already dead-lettered this message and
    no client rejection happened along the way (RabbitMQ's rule)."""
    seen = False
    for item in message.headers.get("x-death") or []:
        if not isinstance(item, dict):
            continue
        if _text(item.get("reason", b"")) == "rejected":
            return False
        if _is_name(item.get("queue"), target_queue):
            seen = True
    return seen


def dead_letter(queue: Queue, entries: list[QueueEntry], reason: str) -> None:
    """Republish ``entries`` from ``queue`` to its DLX (if it has one and it exists)."""
    dlx = queue.opts.dead_letter_exchange
    if not entries:
        return
    queue.vhost.churn.dead_letters(queue, "disabled" if dlx is None else "at_most_once", reason,
                                   len(entries))
    if dlx is None:
        return
    vhost = queue.vhost
    origin = _origin(queue)
    for entry in entries:
        message = dead_lettered_message(entry.message, queue.name, reason, dlx,
                                        queue.opts.dead_letter_routing_key)
        vhost.publishing.publish(origin, message, hooks=False, queues_report=True,
                                 drop=_cycle_filter(message, reason))


def _origin(queue: Queue) -> Source:
    """Dead letters are published by no client: a ``Source`` of the queue's vhost, without
    user or connection (nothing to confirm, return or slow down)."""
    return Source(queue.vhost, None, None)


def _cycle_filter(message: Message, reason: str) -> Callable[[Queue], bool] | None:
    """The targets left out of routing: a cycle without a client's rejection."""
    if reason not in AUTOMATIC_REASONS:
        return None
    return lambda target: is_cycle(message, target.name)


# at-least-once: how long a dead letter that no queue took waits before it is routed again
# (doubling up to the cap), as RabbitMQ's dead-letter worker retries
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0


def dead_letter_confirmed(queue: Queue, entries: list[QueueEntry], reason: str,
                          delay: float = RETRY_FIRST_S,
                          again: bool = False) -> None:
    """``x-dead-letter-strategy: at-least-once`` (queues/types.py decides when): each entry
    stays in ``queue`` -- unsettled, so a restart brings it back -- until every queue its
    dead letter was routed to has it: enqueued, and written by those queues' stores
    (``when_durable``). A dead letter that no queue took (no binding yet, a target
    refusing at its limit) is routed again later; the copies targets already took may
    then arrive twice, which at-least-once allows."""
    # at-least-once needs a DLX (QueueType.dead_letters_at_least_once)
    dlx = cast("str", queue.opts.dead_letter_exchange)
    vhost = queue.vhost
    if not again:  # a dead letter routed again is counted once
        vhost.churn.dead_letters(queue, "at_least_once", reason, len(entries))
    origin = _origin(queue)
    for entry in entries:
        message = dead_lettered_message(entry.message, queue.name, reason, dlx,
                                        queue.opts.dead_letter_routing_key)
        targets = _Targets(message, reason)
        # answered: a target's failing store refuses a persistent dead letter, which then
        # stays here and is routed again, as one no queue took
        outcome = vhost.publishing.publish(origin, message, hooks=False, answered=True,
                                           queues_report=True, drop=targets)
        if outcome not in (ROUTED, STORING):
            vhost.timers.call_later(delay, lambda e=entry: _again(queue, e, reason, delay))
            continue
        # every target's store, whatever the message's persistence (a transient message is
        # confirmed by the store's next write); a queue durable on its own (a stream: its
        # log) instead of its store, which never gets its messages
        waits: dict[int, Any] = {}  # stores and logs (persistence/, streams/)
        for t in targets.kept:
            w = t.durability if t.durability is not None else t.store
            if w is not None:
                waits[id(w)] = w
        when_all(list(waits.values()), _Leave(queue, entry, reason), lambda: None)


class _Targets:
    """``drop`` for an at-least-once dead letter: leaves out the cycles, keeps the rest
    (whose stores the entry waits for)."""

    __slots__ = ("automatic", "kept", "message")

    def __init__(self, message: Message, reason: str) -> None:
        self.message, self.automatic = message, reason in AUTOMATIC_REASONS
        self.kept: list[Queue] = []

    def __call__(self, target: Queue) -> bool:
        if self.automatic and is_cycle(self.message, target.name):
            return True
        self.kept.append(target)
        return False


def _again(queue: Queue, entry: QueueEntry, reason: str, delay: float) -> None:
    if not queue.deleted:
        dead_letter_confirmed(queue, [entry], reason, min(delay * 2, RETRY_MAX_S), again=True)


class _Leave:
    """The entry leaves its queue once its targets (their stores, a stream's log) made its
    dead letter durable."""

    __slots__ = ("entry", "queue", "reason")

    def __init__(self, queue: Queue, entry: QueueEntry, reason: str) -> None:
        self.queue, self.entry, self.reason = queue, entry, reason

    def __call__(self) -> None:
        from .ops import Op
        q = self.queue
        if not q.deleted:
            q.leave_reason = self.reason
            q._left(self.entry, Op.DEAD_LETTER)
            q.leave_reason = None
