"""An AMQP 1.0 connection's links as the broker sees them: ``InLink`` (the client publishes
on it) and ``OutLink`` (the client consumes on it: the ``channel`` of its consumer, which
the queue delivers to while the link has credit). Not attaching, detaching or settling
them (``amqp10_session``), nor publishing (``amqp10_publish``).
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..amqp10 import addresses, mapping
from ..queues.queue import Consumer
from .amqp_channel import Unacked

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from .amqp10_session import Amqp10Session

# The encoded AMQP 1.0 form of messages published over AMQP 1.0, for AMQP 1.0 consumers:
# what the 0-9-1 properties cannot hold (an amqp-value body, footers) is kept. A message
# rebuilt by the broker (dead-lettered, recovered from the store) is converted instead.
ORIGINAL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class InLink:
    """A link the client publishes on."""
    __slots__ = ("link", "target")

    def __init__(self, link, target: addresses.Target | None):
        self.link = link
        self.target = target  # None: each message's ``to``


class OutLink:
    """A link the client consumes on; the ``channel`` of its consumer."""
    metrics_protocol = "amqp10"  # its deliveries in RabbitMQ's amqp10 counters
    global_prefetch = 0
    prefetch = 0
    number = 0

    def __init__(self, session: Amqp10Session, link, queue: Queue, settled: bool):
        self.session = session
        self.link = link
        self.queue = queue
        self.settled = settled
        self.consumer: Consumer | None = None
        self.unacked: dict[Any, Unacked] = {}  # by delivery tag
        self._tag = 0
        self.vhost = session.vhost

    @property
    def audit_ctx(self):
        return self.session.audit_ctx

    @property
    def closed(self) -> bool:
        return self.session.ended

    @property
    def can_deliver(self) -> bool:
        return self.link.credit > 0 and self.session.can_deliver

    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    def deliver(self, consumer: Consumer, queue: Queue, entry) -> None:
        session = self.session
        message = entry.message
        payload = ORIGINAL.get(message)
        if payload is not None and entry.redelivered:
            payload = mapping.redelivered(payload)
        if payload is None:
            payload = mapping.encode_fast(message.properties, message.body, message.exchange,
                                          message.routing_key, entry.redelivered)
        self._tag += 1
        n = self._tag
        delivery = session.conn.send(self.link, str(n).encode(), payload, consumer.no_ack)
        session.pending_output += len(payload)
        item = None
        if not consumer.no_ack:
            item = self.unacked[delivery.tag] = Unacked(n, entry, queue, consumer)
        audit = session.audit
        if audit is not None:
            pos = audit.delivered(self, consumer.tag, n, queue, entry)
            if item is not None:
                item.audit_pos = pos
        session.wake()

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away: RabbitMQ 4 detaches the link with amqp:resource-deleted."""
        session = self.session
        session.out_links.pop(self.link.key, None)
        if not session.ended:
            session.conn.detach(self.link, "amqp:resource-deleted",
                                f"queue '{self.queue.name}' in vhost '{self.vhost.name}' deleted")
            session.wake()
