"""A consumer of a queue: its channel, prefetch, unacked count and place in the rotation;
not delivery or settlement (queue.py)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .queue import Queue


class AdmittedChannel(Protocol):
    """What ``Queue.admit_consumer`` reads of the AMQP channel a basic.consume came on."""

    @property
    def global_prefetch(self) -> int: ...

    @property
    def prefetch(self) -> int: ...


class ConsumerChannel(Protocol):
    """What a queue may call on the side that consumes (an AMQP channel, an MQTT, STOMP or
    AMQP 1.0 session's link, a Hermes push subscriber): deliver, cancel, and the credit it
    reads. Each protocol's class implements it; the queue never looks for anything else."""

    @property
    def metrics_protocol(self) -> str | None:
        """RabbitMQ's protocol label for the delivered-message counters; None where the
        channel counts its own deliveries (AMQP 0-9-1)."""

    @property
    def session(self) -> Any:
        """Its connection (the management API's and the metrics' view of a consumer); the
        channel itself where it is its own (an MQTT, STOMP or Stream session, a Hermes push
        subscriber)."""

    @property
    def closed(self) -> bool: ...

    @property
    def can_deliver(self) -> bool: ...

    @property
    def global_prefetch(self) -> int: ...

    @property
    def unacked_count(self) -> int: ...

    def deliver(self, consumer: Consumer, queue: Any, entry: Any) -> None: ...

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None: ...


class Consumer:
    __slots__ = (
        "arguments",
        "channel",
        "exclusive",
        "global_qos",
        "no_ack",
        "parked",
        "prefetch",
        "priority",
        "queue",
        "selector",
        "tag",
        "tag_raw",
        "unacked",
    )

    def __init__(self, tag: str, channel: ConsumerChannel, queue: Queue, no_ack: bool, exclusive: bool,
                 priority: int, prefetch: int, arguments: dict[str, Any],
                 selector: Callable[[Any], bool] | None = None):
        self.tag = tag
        raw = tag.encode("utf-8", "surrogateescape")
        self.tag_raw = bytes((len(raw),)) + raw
        self.channel: ConsumerChannel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.unacked = 0
        # at its own prefetch limit: out of the queue's rotation until an ack returns credit,
        # so a dispatch does not walk past every busy consumer (1,000 at prefetch 1)
        self.parked = False
        self.arguments = arguments
        self.selector = selector  # x-filter: a predicate over messages (queues/selector.py)
        # whether the channel's global prefetch limits it: not on a quorum queue, whose
        # consumers RabbitMQ keeps out of the channel's limiter (a later qos global=true)
        self.global_qos = queue.queue_type.global_qos

    def can_take(self) -> bool:
        ch = self.channel
        if not ch.can_deliver:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return not (ch.global_prefetch and ch.unacked_count >= ch.global_prefetch
                    and self.global_qos)
