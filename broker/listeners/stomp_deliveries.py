"""A STOMP session's deliveries: MESSAGE frames to its subscriptions (the queue calls
``deliver`` on the session, as on an AMQP channel), ACK and NACK of them, a subscription
ended by the broker. Not subscribing (``stomp_session``) nor the headers' mapping
(``stomp_mapping``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..queues.queue import Consumer
from ..stomp.codec import Frame
from .amqp_channel import Unacked
from .stomp_mapping import StompError, delivery_number, destination_of, message_headers

if TYPE_CHECKING:
    from ..queues.queue import Queue


class Subscription:
    __slots__ = ("ack", "consumer", "destination", "durable_queue", "id", "queue")

    def __init__(self, sub_id: str, destination: str, ack: str, queue: Queue, consumer: Consumer,
                 durable_queue: bool):
        self.id = sub_id
        self.destination = destination
        self.ack = ack  # auto | client | client-individual
        self.queue = queue
        self.consumer = consumer
        self.durable_queue = durable_queue


class StompDeliveries:
    """The delivering part of ``StompSession`` (a mixin: the session's attributes)."""

    conn: Any
    audit: Any
    ended: bool
    delivery_stalled: bool
    output_high_water: int
    subscriptions: dict[str, Subscription]
    consumers: dict[str, Consumer]
    unacked: dict[int, tuple[Subscription, Unacked]]
    _delivery: int
    wake: Callable[[], None]

    # ---- ACK / NACK ----
    def _on_ack(self, command: str, h: dict) -> None:
        ack_id = h.get("id") if self.conn.version == "1.2" else h.get("message-id")
        header = "id" if self.conn.version == "1.2" else "message-id"
        n = delivery_number(ack_id)
        if n is None:
            raise StompError("Invalid header",
                             f'"{command}" must include a valid "{header}" header\n')
        found = self.unacked.get(n)
        if found is None:  # (already acknowledged, or never delivered on this connection)
            raise StompError("Subscription not found",
                             f'Message with id "{ack_id}" has no subscription')
        sub = found[0]
        if sub.ack == "client":  # cumulative: every earlier delivery of the subscription
            numbers = [k for k, v in self.unacked.items() if v[0] is sub and k <= n]
        else:
            numbers = [n]
        taken = [self.unacked.pop(k)[1] for k in numbers]
        touched: dict = {}
        audit = self.audit
        if command == "ACK":
            for item in taken:
                if audit is not None:
                    audit.acked(self, item)  # the queue's SETTLE, as the client's ack
                item.queue.ack(item.entry, item.consumer, reported=True)
                touched[item.queue] = None
            for q in touched:
                if q.consumers:
                    q.dispatch()
            return
        requeue = h.get("requeue", "true").lower() != "false"
        if audit is not None:
            audit.rejected(self, taken, requeue, "nacked")
        if not requeue:
            for item in taken:
                item.queue.reject(item.entry, item.consumer)  # dead-lettered, if so set
                touched[item.queue] = None
        else:
            by_queue: dict = {}
            for item in taken:
                by_queue.setdefault(item.queue, []).append((item.entry, item.consumer))
            for q, items in by_queue.items():
                items.sort(key=lambda pair: -pair[0].seq)
                q.requeue(items)
        for q in touched:
            if q.consumers:
                q.dispatch()

    # ---- deliveries (the queue calls these, as on an AMQP channel) ----
    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    def deliver(self, consumer: Consumer, queue: Queue, entry) -> None:
        was_empty = not self.conn.pending_output
        sub = self.subscriptions.get(consumer.tag[2:])
        message = entry.message
        self._delivery += 1
        n = self._delivery
        message_id = f"T_{consumer.tag[2:]}@@{self.conn.session_id}@@{n}"
        headers = {"subscription": consumer.tag[2:],
                   "destination": destination_of(message),
                   "message-id": message_id,
                   "redelivered": "true" if entry.redelivered else "false"}
        item = None
        if not consumer.no_ack and sub is not None:
            if self.conn.version == "1.2":
                headers["ack"] = message_id
            item = Unacked(n, entry, queue, consumer)
            self.unacked[n] = (sub, item)
        message_headers(message.properties, headers)
        self.conn.send(Frame("MESSAGE", headers, message.body))
        audit = self.audit
        if audit is not None:
            pos = audit.delivered(self, consumer.tag, n, queue, entry)
            if item is not None:
                item.audit_pos = pos
        if was_empty:
            self.wake()

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away (deleted over AMQP or management): the subscription ends
        and the client is told with RabbitMQ's ERROR frame, which leaves it connected."""
        sub = self.subscriptions.pop(consumer.tag[2:], None)
        self.consumers.pop(consumer.tag, None)
        if sub is not None and not self.ended:
            self.conn.subscription_cancelled(sub.id)
            self.wake()

    def output_drained(self) -> None:
        if self.delivery_stalled and self.conn.pending_output <= self.output_high_water:
            self.delivery_stalled = False
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()
