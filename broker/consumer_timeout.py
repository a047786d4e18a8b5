"""Consumer timeouts, as RabbitMQ's ``consumer_timeout``: a delivery left unacknowledged too
long closes its channel (406 PRECONDITION_FAILED "delivery acknowledgement on channel N timed
out ...") and, as any channel close does, its unacknowledged deliveries are requeued.

The timeout is broker-wide (``Config.consumer_timeout``, ms, RabbitMQ's default 30 minutes),
or per queue: the ``x-consumer-timeout`` argument and the ``consumer-timeout`` policy key
(RabbitMQ 3.12+), the lower of the two when both are set; an ``x-consumer-timeout`` consumer
argument (basic.consume, newer RabbitMQ) overrides them for that consumer's deliveries.

Cheap on the hot path: one sweep on the broker's timer heap every ``interval`` seconds looks
at each channel's oldest unacknowledged delivery, as RabbitMQ's channel tick does, and a
delivery with acks only records the ``Period`` between two sweeps it was sent in (an attribute
read: no clock read, no timer, no task). The period's end, the next sweep's time, bounds the
delivery's time from above, however late a loaded loop runs the sweep: a delivery never times
out early, and at most two intervals (plus the timer's lateness) after its timeout.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import errors
from .queues.args import non_neg_int, register_queue_argument

if TYPE_CHECKING:
    from .listeners.amqp_channel import Channel
    from .queues.queue import Consumer, Queue
    from .timers import TimerHandle, TimerQueue

log = logging.getLogger("broker.consumer_timeout")

ARGUMENT = "x-consumer-timeout"
POLICY_KEY = "consumer-timeout"


# RabbitMQ 3.12+ validates it at declare; not in its equivalence list
register_queue_argument(ARGUMENT, non_neg_int, equivalence=False)


def _ms(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def delivery_timeout_ms(consumer: Consumer | None, queue: Queue) -> int | None:
    """The timeout of a delivery by ``consumer`` (None: basic.get) from ``queue``; None: the
    broker's."""
    if consumer is not None and consumer.arguments:
        own = _ms(consumer.arguments.get(ARGUMENT))
        if own is not None:
            return own
    return queue_timeout_ms(queue)


def queue_timeout_ms(queue: Queue) -> int | None:
    """The queue's own timeout (argument, policy; the lower of both), None: the broker's."""
    arg = _ms(queue.arguments.get(ARGUMENT)) if queue.arguments else None
    policy = _ms(queue.effective_policy_definition.get(POLICY_KEY))
    if arg is None:
        return policy
    return arg if policy is None else min(arg, policy)


class Period:
    """The time between two sweeps; ``end`` (the second sweep's time) is set when it ends."""

    __slots__ = ("end",)

    def __init__(self) -> None:
        self.end: float | None = None


class ConsumerTimeouts:
    """The sweep over the broker's AMQP channels; channels register while open."""

    def __init__(self, timers: TimerQueue, timeout_ms: int | None, interval: float = 1.0):
        self.timers = timers
        self.timeout_ms = timeout_ms or None  # broker-wide; None/0: none
        self.interval = interval
        self.period = Period()  # the current one: what deliveries record
        self.channels: set[Channel] = set()
        # users whose channels are never timed out (the cluster's node-to-node links: their
        # deliveries wait on the other node's consumers, which have timeouts of their own)
        self.exempt_users: set[str] = set()
        self._handle: TimerHandle | None = None

    def watch(self, channel: Channel) -> None:
        user = channel.session.user
        if user is not None and user.name in self.exempt_users:
            return
        self.channels.add(channel)
        if self._handle is None:
            self._handle = self.timers.call_later(self.interval, self._sweep)

    def forget(self, channel: Channel) -> None:
        self.channels.discard(channel)

    def _sweep(self) -> None:
        self._handle = None
        now = self.timers.now()
        ended = self.period
        ended.end = now
        self.period = Period()
        default = self.timeout_ms
        expired = []
        for ch in self.channels:
            unacked = ch.unacked
            if not unacked:
                continue
            # out for a whole period: compacted (listeners/amqp_unacked.py), off the hot path
            unacked.age(ended)
            oldest = unacked.oldest()
            if oldest is None:
                continue
            own = delivery_timeout_ms(oldest.consumer, oldest.queue)
            timeout = own if own is not None else default
            sent_by = oldest.at.end if oldest.at is not None else None  # a bound: never early
            if timeout is not None and sent_by is not None and now - sent_by > timeout / 1000:
                expired.append((ch, timeout, oldest))
        for ch, timeout, oldest in expired:
            tag = oldest.consumer.tag if oldest.consumer is not None else "basic.get"
            log.warning("consumer %s on channel %d of %s has timed out waiting for delivery "
                        "acknowledgement (timeout %d ms)", tag, ch.number, ch.session.peer,
                        timeout)
            ch.session.close_channel(ch, errors.precondition_failed(
                "delivery acknowledgement on channel %d timed out. Timeout value used: %d ms. "
                "This timeout value can be configured, see consumers doc guide to learn more",
                ch.number, timeout))
        if self.channels:
            self._handle = self.timers.call_later(self.interval, self._sweep)
