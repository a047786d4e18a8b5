"""An MQTT session's deliveries: queue entries out as PUBLISHes, settled by PUBACK; no inbound."""
from __future__ import annotations

import logging
from typing import Any

from ..mqtt import properties as P
from ..mqtt.encoding import topic_field
from ..mqtt.topics import matches, to_mqtt_topic
from ..queues.entry import QueueEntry
from ..queues.queue import Consumer, Queue
from .amqp_channel import Unacked
from .mqtt_mapping import (
    NO_DICT,
    NO_LOCAL,
    PUBLISHER_HEADER,
    QOS_ARG,
    RETAIN_AS_PUBLISHED,
    RETAIN_HEADER,
    SUBSCRIPTION_ID_ARG,
    encode_v5_props,
    v5_delivery_props,
)
from .mqtt_qos2 import OUTBOUND
from .mqtt_state import MQTTSessionState

log = logging.getLogger("broker.mqtt")

# what a QoS 1/2 delivery leaves in the connection's in-flight map until the client's PUBACK
# (PUBREC): [its queue, the entry, the consumer, the packet id (set once sent)]
DeliveryToken = list[Any]


class MQTTDelivery(MQTTSessionState):
    """The session as the channel of its consumers: the queue calls ``can_deliver``,
    ``deliver`` ... on it."""

    __slots__ = ()

    @property
    def can_deliver(self) -> bool:
        if not self.delivering:
            return False
        if self.conn.pending_output > self.output_high_water:
            self.delivery_stalled = True
            return False
        return True

    @property
    def unacked_count(self) -> int:
        return len(self.conn.inflight)

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        # whoever queued output before this since the edge last took it has called (or
        # will call, before going back to the loop) ``wake``: one wake per batch
        was_empty = not self.conn.pending_output
        message = entry.message
        service = self.service
        service.publish_sent += 1
        service.publish_bytes_sent += len(message.body)
        topic = self._topics.get(message.routing_key)
        if topic is None:
            if len(self._topics) >= 256:  # bounded: thousands of sessions keep one each
                self._topics.clear()
            elif self._topics is NO_DICT:
                self._topics = {}
            topic = self._topics[message.routing_key] = topic_field(
                to_mqtt_topic(message.routing_key))
        if consumer.arguments:  # a shared subscription's consumer
            self._deliver_shared(consumer, queue, entry, topic, was_empty)
            return
        if self.expiry is not None:  # v5: properties, options (3.1.1 stays on this path)
            self._deliver_v5(consumer, queue, entry, topic, was_empty)
            return
        audit = self.audit
        if consumer.no_ack:
            self.conn.publish(topic, message.body, 0)
            if audit is not None:
                audit.delivered(self, consumer.tag, None, queue, entry)
        else:
            # the highest QoS of the matching subscriptions, lowered to the publish's QoS
            # (section 3.3.5); an AMQP-published message takes the subscriptions'
            qos = self._one_qos
            if qos is None:
                qos = self._subscription_qos(message.routing_key)
            if qos:
                headers = message.properties.get("headers")
                if headers:
                    pub_qos = headers.get("x-mqtt-publish-qos")
                    if pub_qos is not None and pub_qos < qos:
                        qos = pub_qos
            if not qos:
                self.conn.publish(topic, message.body, 0)
                if audit is not None:
                    audit.delivered(self, consumer.tag, None, queue, entry)
                queue.ack(entry, consumer)
            else:
                # the token: [queue, entry, consumer, packet id] (the id is known once sent)
                token = [queue, entry, consumer, 0]
                want = 0
                if qos == 2:
                    # a QoS 2 PUBLISH sent again (reconnect, restart) must keep its packet id
                    # (section 4.4): the id it had before a reconnect, else one derived from
                    # the entry's seq, which a restart keeps (used when free)
                    want = entry.seq % 65535 + 1
                    state = self.qos2
                    if entry.redelivered and state is not None and state.resend:
                        want = state.resend.pop((queue.name, entry.seq), want)
                token[3] = pid = self.conn.publish(topic, message.body, qos, token,
                                                   dup=entry.redelivered, packet_id=want)
                if audit is not None:
                    audit.delivered(self, consumer.tag, pid, queue, entry)
        if was_empty:
            self.wake()

    def _deliver_v5(self, consumer: Consumer, queue: Queue, entry: QueueEntry,
                    topic: bytes, was_empty: bool) -> None:
        """A delivery to a v5 session: the message's properties mapped back, then as
        ``deliver`` (through ``_deliver_with_options`` when filters have options)."""
        message = entry.message
        v5props = v5_delivery_props(message, entry, queue.vhost.timers.now())
        if self.sub_opts:
            self._deliver_with_options(consumer, queue, entry, topic, v5props, was_empty)
            return
        qos = 0
        if not consumer.no_ack:
            one = self._one_qos
            qos = self._subscription_qos(message.routing_key) if one is None else one
        self._send(consumer, queue, entry, topic, qos, False, encode_v5_props(v5props), was_empty)

    def _deliver_with_options(self, consumer: Consumer, queue: Queue, entry: QueueEntry,
                              topic: bytes, v5props: dict[int, Any], was_empty: bool) -> None:
        """A delivery to a v5 session with subscription options: the QoS of the matching
        filters that take it (No Local: not those of a client's own messages), RETAIN as
        published if one of them says so, and their Subscription Identifiers."""
        message = entry.message
        headers = message.properties.get("headers") or NO_DICT
        own = headers.get(PUBLISHER_HEADER) == self.client_id
        mqtt_topic = to_mqtt_topic(message.routing_key)
        qos = -1
        matched = False
        retain = False
        ids = []
        sub_opts = self.sub_opts
        for f, fqos in self.filters.items():
            if not matches(f, mqtt_topic):
                continue
            matched = True
            bits, sub_id = sub_opts.get(f, (0, 0))
            if own and bits & NO_LOCAL:
                continue  # section 3.8.3.1
            if fqos > qos:
                qos = fqos
            if bits & RETAIN_AS_PUBLISHED and headers.get(RETAIN_HEADER):
                retain = True
            if sub_id:
                ids.append(sub_id)
        if qos < 0:
            if matched:  # only No Local filters match this client's own message: not sent
                if not consumer.no_ack:
                    queue.ack(entry, consumer)
                return
            qos = 1  # queued before an UNSUBSCRIBE, or bound over AMQP
        if ids:
            v5props[P.SUBSCRIPTION_IDENTIFIER] = ids
        self._send(consumer, queue, entry, topic, qos, retain, encode_v5_props(v5props), was_empty)

    def _deliver_shared(self, consumer: Consumer, queue: Queue, entry: QueueEntry,
                        topic: bytes, was_empty: bool) -> None:
        """A delivery of a shared subscription's queue: at its granted QoS (lowered to the
        publish's), with its identifier."""
        args = consumer.arguments
        props = b""
        if self.expiry is not None:
            v5props = v5_delivery_props(entry.message, entry, queue.vhost.timers.now())
            sub_id = args.get(SUBSCRIPTION_ID_ARG)
            if sub_id:
                v5props[P.SUBSCRIPTION_IDENTIFIER] = [sub_id]
            props = encode_v5_props(v5props)
        self._send(consumer, queue, entry, topic, args.get(QOS_ARG, 1), False, props, was_empty)

    def _send(self, consumer: Consumer, queue: Queue, entry: QueueEntry, topic: bytes,
              qos: int, retain: bool, props: bytes, was_empty: bool) -> None:
        """The slow paths' delivery: ``qos`` lowered to the publish's, then as ``deliver``."""
        message = entry.message
        headers = message.properties.get("headers") or NO_DICT
        pub_qos = headers.get("x-mqtt-publish-qos")
        if pub_qos is not None and pub_qos < qos:
            qos = pub_qos
        if consumer.no_ack:
            qos = 0
        audit = self.audit
        if not qos:
            self.conn.publish(topic, message.body, 0, retain=retain, props=props)
            if audit is not None:
                audit.delivered(self, consumer.tag, None, queue, entry)
            if not consumer.no_ack:
                queue.ack(entry, consumer)
        else:
            token = [queue, entry, consumer, 0]
            want = 0
            if qos == 2:  # the packet id kept across a reconnect or restart, as ``deliver``
                want = entry.seq % 65535 + 1
                state = self.qos2
                if entry.redelivered and state is not None and state.resend:
                    want = state.resend.pop((queue.name, entry.seq), want)
            token[3] = pid = self.conn.publish(topic, message.body, qos, token, retain,
                                               entry.redelivered, want, props)
            if pid < 0:
                queue.ack(entry, consumer)
            elif audit is not None:
                audit.delivered(self, consumer.tag, pid, queue, entry)
        if was_empty:
            self.wake()

    def _on_delivery_acked(self, token: DeliveryToken | None) -> None:
        if token is None:
            return  # a retained message sent at subscribe time: nothing to settle
        queue, entry, consumer, pid = token
        if self.audit is not None:  # the queue's SETTLE, as the client's ack
            self.audit.acked(self, Unacked(pid, entry, queue, consumer))
        queue.ack(entry, consumer, reported=True)
        if self._touched is NO_DICT:
            self._touched = {}
        self._touched[queue] = None

    def _on_deliveries_acked(self, events: list, start: int, end: int) -> None:
        """``_on_delivery_acked`` for a read's run of PUBACKs (``events[start:end]``)."""
        if self.audit is not None:
            for i in range(start, end):
                self._on_delivery_acked(events[i].token)
            return
        touched = self._touched
        last = None
        for i in range(start, end):
            token = events[i].token
            if token is None:
                continue  # a retained message sent at subscribe time: nothing to settle
            queue, entry, consumer, _ = token
            queue.ack(entry, consumer, reported=True)
            if queue is not last:
                if touched is NO_DICT:
                    touched = self._touched = {}
                touched[queue] = None
                last = queue

    def _on_delivery_received(self, token: DeliveryToken, packet_id: int) -> None:
        """PUBREC: the message is the client's; the queue entry is settled and the PUBREL
        phase carries on until the PUBCOMP. A persistent session's PUBREL state is stored
        before the ack (which never lands without it) and PUBREL is sent once it is
        durable: a restart then sends PUBREL again, never the PUBLISH the client has
        released already."""
        if not self.clean and self.service.qos2.durable:
            self.service.qos2.add(self.vhost.name, self.client_id, OUTBOUND, packet_id)
            if self._pubrels is None:
                self._pubrels = []
            self._pubrels.append(packet_id)
        else:
            self.conn.pubrels([packet_id])
        self._on_delivery_acked(token)

    def _send_pubrels(self, packet_ids: list[int]) -> None:
        if self.ended:
            return  # the next connection of the session sends them (``releasing``)
        self.conn.pubrels(packet_ids)
        self.wake()

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The subscription queue was deleted (by AMQP or management): its subscriptions
        are gone; the client is not told (MQTT 3.1.1 has no way to)."""
        for name, c in list(self.consumers.items()):
            if c is consumer:
                del self.consumers[name]
        # unacknowledged deliveries of that queue stay in flight: their PUBACKs settle them
        # with the deleted queue (which emits DELETE for them)

    def output_drained(self) -> None:
        if self.delivery_stalled and self.conn.pending_output <= self.output_high_water:
            self.delivery_stalled = False
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()
