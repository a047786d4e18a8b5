"""An MQTT session's PUBLISHes and wills into the publish path, PUBACKs in order; no deliveries."""
from __future__ import annotations

import logging

from .. import errors
from ..message import Message
from ..mqtt import codec
from ..mqtt import properties as P
from ..mqtt.connection import FORMAT_INVALID_BIT, NO_MATCH_BIT, PUBREC_BIT
from ..mqtt.topics import to_routing_key
from ..persistence import DURABLE
from ..publishing import NACKED, REFUSED, ROUTED, STORING, UNROUTABLE
from .mqtt_mapping import (
    MAX_KEY,
    NO_DECISIONS,
    NO_DICT,
    NO_LIST,
    PROPS,
    PROPS_BY_QOS,
    PROPS_RETAINED,
    is_utf8,
    v5_message_props,
)
from .mqtt_qos2 import INBOUND, SessionState
from .mqtt_state import MQTTSessionState

log = logging.getLogger("broker.mqtt")


class MQTTPublishing(MQTTSessionState):
    """PUBLISH from the client and will messages into the routing core, and their PUBACK /
    PUBREC order."""

    __slots__ = ()

    # ---- PUBLISH from the client ----

    def _on_publish(self, p: codec.Publish) -> None:
        service = self.service
        service.publish_received += 1
        service.publish_bytes_received += len(p.payload)
        topic = p.topic
        key = self._keys.get(topic)
        if key is None:
            key = to_routing_key(topic)
            if len(key.encode()) > MAX_KEY:
                self.close(f"topic {topic[:40]!r}... longer than {MAX_KEY} bytes",
                           P.TOPIC_NAME_INVALID)
                return
            if len(self._keys) >= 256:  # bounded: a device may publish to ever new topics
                self._keys.clear()
            elif self._keys is NO_DICT:
                self._keys = {}
            self._keys[topic] = key
        authz = self.authz
        if authz is not None:  # AMQP basic.publish's checks, on the same shared cache
            exchange = self.service.exchange
            try:
                if exchange not in authz.write_ok:
                    authz.check("exchange", exchange, "write")
                if authz.topics:
                    authz.check_topic(exchange, key, "write")
            except errors.AMQPError as exc:
                # RabbitMQ closes an MQTT connection that publishes where it may not
                self.close(exc.text, P.NOT_AUTHORIZED)
                return
        self.is_publisher = True
        qos = p.qos
        ack_id = p.packet_id or 0
        stored: bool | None
        v5 = p.properties
        if v5 and v5.get(P.PAYLOAD_FORMAT_INDICATOR) == 1 and not is_utf8(p.payload):
            # section 3.3.2.3.2: the receiver may check; the message is not taken: 0x99 on
            # the PUBACK/PUBREC, and for QoS 0 (no ack to carry it) a DISCONNECT 0x99
            if not qos:
                self.close("payload not UTF-8 with Payload Format Indicator 1",
                           P.PAYLOAD_FORMAT_INVALID)
                return
            if qos == 2:
                ack_id |= PUBREC_BIT
            ack_id |= FORMAT_INVALID_BIT
            if self._pubacks:  # behind PUBACKs that wait for the store
                seq = self._seq = self._seq + 1
                self._pubacks.append((seq, ack_id))
                self._decided[seq] = True
            else:
                if self._ack_now is NO_LIST:
                    self._ack_now = []
                self._ack_now.append(ack_id)
            return
        if qos == 2:
            ack_id |= PUBREC_BIT
            state = self.qos2
            if state is None:
                state = self.qos2 = SessionState()
            if p.packet_id in state.received:
                # section 4.3.3: a duplicate before the PUBREL is not delivered again; its
                # PUBREC follows the original's
                stored = False
            else:
                try:
                    stored = self._route(topic, key, p.payload, 2, p.retain, p.dup, p.packet_id,
                                         p.properties)
                except errors.AMQPError as exc:
                    self.close(exc.text, P.IMPLEMENTATION_SPECIFIC_ERROR)
                    return
                if stored is not None:
                    state.received.add(p.packet_id or 0)
                    if not self.clean:
                        self.service.qos2.add(self.vhost.name, self.client_id, INBOUND,
                                              p.packet_id or 0)
                        stored = stored or self.service.qos2.durable
        else:
            try:
                stored = self._route(topic, key, p.payload, qos, p.retain, p.dup, p.packet_id,
                                     p.properties)
            except errors.AMQPError as exc:  # a publish hook refused it (as a channel error)
                self.close(exc.text, P.IMPLEMENTATION_SPECIFIC_ERROR)
                return
        if qos:
            if self.unroutable and self.expiry is not None:
                self.unroutable = False
                ack_id |= NO_MATCH_BIT  # section 3.4.2.1 (the server knows: 0x10)
            self._acknowledge(ack_id, stored)

    def _acknowledge(self, ack_id: int, stored: bool | None) -> None:
        """A QoS 1/2 PUBLISH's PUBACK/PUBREC: now, or in PUBLISH order behind those waiting
        for the store; ``stored`` as ``_route`` answers."""
        if stored is False and not self._pubacks:
            # the common case: routed, no store write to wait for, none before it waits
            if self._ack_now is NO_LIST:
                self._ack_now = []
            self._ack_now.append(ack_id)
            return
        if self._ack_now:  # those go first (PUBACKs in PUBLISH order)
            self.conn.pubacks(self._ack_now)
            self._ack_now = []
        if self._decided is NO_DECISIONS:
            self._pubacks, self._decided, self._awaiting_store = [], {}, []
        seq = self._seq = self._seq + 1
        self._pubacks.append((seq, ack_id))
        if stored is None:
            self._decided[seq] = False
        elif stored:
            self._awaiting_store.append(seq)
        else:
            self._decided[seq] = True

    def _on_publishes(self, events: list, start: int, end: int) -> None:
        """A read's run of PUBLISHes (``events[start:end]``) in one pass: what holds for the
        whole read is looked up once; a 3.1.1 QoS 0/1 PUBLISH to a known topic the client
        may write goes straight to the publish path, any other through ``_on_publish``. A
        PUBACK that waits for nothing (the usual case) is collected here without a call."""
        service = self.service
        exchange = service.exchange
        authz = self.authz
        keys = self._keys
        fast = self.expiry is None and (
            authz is None or (exchange in authz.write_ok and not authz.topics))
        publish = self.broker.publishing.publish
        props_of = PROPS_BY_QOS
        ack_now = None  # the PUBACKs decided now, while none waits for the store
        count = size = 0
        for i in range(start, end):
            p = events[i]
            key = keys.get(p.topic) if fast else None
            qos = p.qos
            if key is None or p.retain or qos == 2 or key[0] == "$":
                if ack_now:
                    self._ack_now, ack_now = ack_now, None  # in PUBLISH order, before it
                self._on_publish(p)
                if self.finished:
                    break
                keys = self._keys  # (made on the first PUBLISH)
                continue
            count += 1
            if count == 1:
                self.is_publisher = True
            payload = p.payload
            size += len(payload)
            props, raw = props_of[qos][p.dup]
            try:
                outcome = publish(self, Message(exchange, key, raw, props, payload),
                                  answered=qos > 0, tag=p.packet_id)
            except errors.AMQPError as exc:  # a publish hook refused it (as a channel error)
                self.close(exc.text, P.IMPLEMENTATION_SPECIFIC_ERROR)
                break
            if qos:
                if outcome is ROUTED and not self._pubacks:
                    if ack_now is None:
                        ack_now = self._ack_now
                        if ack_now is NO_LIST:
                            ack_now = []
                    ack_now.append(p.packet_id)
                else:
                    if ack_now:
                        self._ack_now, ack_now = ack_now, None
                    self._acknowledge(p.packet_id or 0,
                                      None if outcome is NACKED or outcome is REFUSED
                                      else outcome is STORING)
            if self.finished:  # ended while routing (as the per-event loop stops)
                break
        if ack_now:
            self._ack_now = ack_now
        if count:
            service.publish_received += count
            service.publish_bytes_received += size

    def _route(self, topic: str, key: str, payload: bytes, qos: int, retain: bool,
               dup: bool = False, packet_id: int | None = None,
               v5: dict | None = None) -> bool | None:
        """Route one message; None if a queue refused it, else whether a store write must
        be durable before it counts as taken. A publish hook may refuse it (raises
        ``errors.AMQPError``) or take it over. ``v5``: the PUBLISH's MQTT 5 properties."""
        if key[:1] == "$" and (key == "$SYS" or key.startswith("$SYS.")):
            # the broker's own status (mqtt_sys.py): dropped, as Mosquitto does (a QoS 1
            # publish is still acknowledged)
            return False
        if self.expiry is not None:  # v5: the publisher's client id goes along (No Local)
            props, raw = v5_message_props(qos, dup, v5 or NO_DICT, retain, self.client_id)
        elif retain:
            props, raw = PROPS_RETAINED[(qos, dup)]
        else:
            props, raw = PROPS[(qos, dup)]
        message = Message(self.service.exchange, key, raw, props, payload)
        broker = self.broker
        # the one publish path, as an AMQP publish without confirms or mandatory: a hook
        # neither confirms nor returns it; the PUBACK waits for the store when it must
        outcome = broker.publishing.publish(self, message, answered=qos > 0, tag=packet_id)
        needs_store = False
        if retain:
            self.service.retained.set(self.vhost.name, topic, payload, qos, v5)
            needs_store = DURABLE in broker.store.capabilities
        if outcome is UNROUTABLE:
            if qos:
                self.unroutable = True  # read (and cleared) by the PUBACK decision right after
        elif outcome is STORING:
            needs_store = needs_store or qos > 0
        elif outcome is NACKED or outcome is REFUSED:
            return None
        return needs_store

    def _stored(self, seqs: list[int], ok: bool) -> None:
        """The store wrote (or failed to write) what one read's publishes put there."""
        if self.ended:
            return
        self._decided.update(dict.fromkeys(seqs, ok))
        self._flush_pubacks()
        self.wake()

    def _flush_pubacks(self) -> None:
        pubacks, decided = self._pubacks, self._decided
        n = 0
        acks = []
        for seq, pid in pubacks:
            ok = decided.pop(seq, None)
            if ok is None:
                break
            n += 1
            if ok:
                acks.append(pid)
            elif pid & PUBREC_BIT:  # not taken after all: the client's resend is routed
                self._forget_received(pid & 0xFFFF)
        if n:
            del pubacks[:n]
        if acks:
            self.conn.pubacks(acks)

    def _forget_received(self, packet_id: int) -> None:
        state = self.qos2
        if state is not None and packet_id in state.received:
            state.received.discard(packet_id)
            if not self.clean:
                self.service.qos2.remove(self.vhost.name, self.client_id, INBOUND, packet_id)

    def _on_release(self, packet_id: int) -> None:
        """PUBREL: the inbound QoS 2 message is the broker's alone; PUBCOMP (after the
        PUBRECs still waiting for the store, which come first in PUBLISH order)."""
        self._forget_received(packet_id)
        if self._ack_now:
            self.conn.pubacks(self._ack_now)
            self._ack_now = []
        self.conn.pubcomp(packet_id)

    def _delay_will(self, key: tuple[str, str], will: codec.Will, delay: int) -> None:
        service = self.service

        def publish() -> None:
            if not service.stopping:
                self._publish_will(will)

        def fire() -> None:
            if service.delayed_wills.get(key) is entry:
                del service.delayed_wills[key]
                publish()
        entry = (self.vhost.timers.call_later(delay, fire), publish)
        old = service.delayed_wills.get(key)
        if old is not None:
            old[0].cancel()
        service.delayed_wills[key] = entry

    def _publish_will(self, will: codec.Will) -> None:
        key = to_routing_key(will.topic)
        try:
            if len(key.encode()) > MAX_KEY:
                raise errors.precondition_failed("will topic too long")
            self._check("exchange", self.service.exchange, "write")
            self._check_topic(key, "write")
        except errors.AMQPError as exc:
            log.warning("mqtt client %r: will not published: %s", self.client_id, exc.text)
            return
        try:
            self._route(will.topic, key, will.message, will.qos, will.retain,
                        v5=will.properties)
        except errors.AMQPError as exc:  # a publish hook refused it
            log.warning("mqtt client %r: will not published: %s", self.client_id, exc.text)
