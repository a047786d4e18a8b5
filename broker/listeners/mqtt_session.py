"""One MQTT client as the broker sees it: login, publishes into the routing core,
subscriptions as queues and bindings, deliveries to the client. Synchronous (no trio):
the edge (``mqtt.py``) feeds bytes and writes out what the sans-IO connection queued
whenever ``wake`` is called.

The mapping is RabbitMQ's MQTT plugin's (docs/mqtt.md):

- PUBLISH goes to the configured topic exchange (amq.topic) with the topic translated
  ('/' -> '.'); QoS 1 messages are persistent (delivery_mode 2), QoS 0 transient, both
  carry the headers ``x-mqtt-publish-qos`` and ``x-mqtt-dup``. A QoS 1 PUBLISH is answered
  with PUBACK once routed and, when a durable queue took it, once the store has it
  (``when_durable``); a publish a queue refused (overflow reject-publish) or the store
  failed gets no PUBACK, so the client sends it again. PUBACKs leave in PUBLISH order.
- Each client has one subscription queue, ``mqtt-subscription-<client id>qos1`` (the name
  RabbitMQ gives its QoS 1 queue, so sessions stored by earlier versions carry on), with
  one consumer; every SUBSCRIBE filter is a binding of it whose arguments carry the filter
  and its granted QoS. A message is delivered once, at the highest QoS of the session's
  filters that match its topic, lowered to the QoS it was published with (section 3.3.5).
  QoS 0 deliveries are settled as they are written; QoS 1 ones stay unacknowledged
  (``prefetch`` at most in flight) until the client's PUBACK, QoS 2 ones until its PUBREC
  (then the PUBREL/PUBCOMP phase is the session's QoS 2 state, ``mqtt_qos2``).
- A QoS 2 PUBLISH is routed once, when it arrives (method A of figure 4.3), and answered
  with PUBREC as a QoS 1 PUBLISH is with PUBACK; its packet id stays received until the
  PUBREL, and a PUBLISH with that id meanwhile is answered with PUBREC without routing.
- clean session: the queue is transient and auto-delete, and goes with the connection;
  otherwise it is durable and stays, with its bindings, messages and the QoS 2 state,
  until a clean session of the same client id.

As an AMQP publish, a PUBLISH (and a will) passes the broker's publish hooks (cluster
forwarding, Hermes topics' schemas, scheduler, transactions: seen as a publish without
confirms or mandatory) and is recorded by the audit trail (``published``; ``delivered``
and ``acked`` for its deliveries, the packet identifier standing for the delivery tag).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import errors
from ..mqtt import codec, enhanced_auth
from ..mqtt import properties as P
from ..mqtt.events import (
    AuthContinued,
    ConnectRequested,
    DeliveryAcked,
    DeliveryCompleted,
    DeliveryReceived,
    Disconnected,
    ProtocolViolation,
    ReauthRequested,
    ReleaseReceived,
    SubscribeRequested,
    UnsubscribeRequested,
)
from .mqtt_delivery import MQTTDelivery
from .mqtt_login import LOGIN_WAITS, MQTTLogin
from .mqtt_mapping import (
    MAX_EXPIRY,
    MAX_KEY,
    NEVER_EXPIRES,
    NO_DICT,
    RECEIVE_MAXIMUM,
    TOPIC_ALIAS_MAXIMUM,
    is_utf8,
    queue_names,
)
from .mqtt_publish import MQTTPublishing
from .mqtt_qos2 import OUTBOUND, QoS2Sessions
from .mqtt_retained import RetainedStore
from .mqtt_subscriptions import MQTTSubscriptions

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.mqtt")


class MQTTService:
    """The listener's broker-wide state: settings, the client id registry (for session
    takeover) and the retained messages. Live sessions are in ``broker.sessions``."""

    def __init__(self, broker: Broker):
        config = broker.config
        self.broker = broker
        self.exchange = config.mqtt_exchange
        self.prefetch = config.mqtt_prefetch
        self.max_packet = config.max_message_size + 65_546  # body + a topic and a packet id
        self.clients: dict[tuple[str, str], MQTTSession] = {}
        self.retained = RetainedStore(broker)
        self.qos2 = QoS2Sessions(broker)
        self.stopping = False  # broker shutdown: no will messages
        # MQTT 5 wills waiting out their Will Delay Interval:
        # (vhost, client id) -> (timer, the publish to do then)
        self.delayed_wills: dict[tuple[str, str], tuple[Any, Callable[[], None]]] = {}
        # $SYS counters (mqtt_sys.py): plain increments where the data passes
        self.bytes_received = self.bytes_sent = 0  # MQTT bytes (counted by the edge)
        self.publish_received = self.publish_sent = 0  # PUBLISH packets
        self.publish_bytes_received = self.publish_bytes_sent = 0  # their payloads
        self.sockets_opened = self.connections_accepted = 0


class MQTTSession(MQTTLogin, MQTTPublishing, MQTTSubscriptions, MQTTDelivery):
    """One connection; also the ``channel`` of its two consumers (the queue calls
    ``can_deliver``, ``deliver`` ... on it, as on an AMQP channel). What it does is in
    the mixins: login, inbound publishes, subscriptions, deliveries;
    its attributes are ``MQTTSessionState``'s."""

    __slots__ = ()

    # ---- input ----

    def login_resumed(self, request: codec.Connect) -> None:
        """The edge introspected ``login_wait``'s token (``resume_login``): the CONNECT is
        decided now, and what came behind it handled."""
        self._on_connect(request)
        if not self.finished and self.login_wait is None:
            self._handle(b"")

    def data_received(self, data: bytes) -> None:
        audit = self.audit
        if audit is None:
            self._handle(data)
            return
        audit.clock_start()  # the batch's events share one time
        try:
            self._handle(data)
        finally:
            audit.clock_stop()

    def _handle(self, data: bytes, events: list | None = None) -> None:
        """``data`` read, or ``events`` held behind a SUBACK waiting for the store."""
        if events is None:
            events = self.conn.receive_data(data)
            if self._held_events is not None:
                # a SUBACK waits for the store: what came behind it waits too, in order, so
                # no later answer overtakes it (a PINGRESP does: the connection answers a
                # PINGREQ at once, and no order applies to it); past a bound, the edge
                # stops reading (``input_held``)
                self._held_events += events
                self._held_bytes += len(data)
                if self.conn.has_output:
                    self.wake()
                return
        n = len(events)
        i = 0
        while i < n:
            ev = events[i]
            i += 1
            if type(ev) is codec.Publish:  # a run of PUBLISHes: one pass
                j = i
                while j < n and type(events[j]) is codec.Publish:
                    j += 1
                self._on_publishes(events, i - 1, j)
                i = j
            elif type(ev) is DeliveryAcked:  # a run of PUBACKs: one pass too
                j = i
                while j < n and type(events[j]) is DeliveryAcked:
                    j += 1
                self._on_deliveries_acked(events, i - 1, j)
                i = j
            elif isinstance(ev, ReleaseReceived):
                self._on_release(ev.packet_id)
            elif isinstance(ev, DeliveryReceived):
                self._on_delivery_received(ev.token, ev.packet_id)
            elif isinstance(ev, DeliveryCompleted):
                if not self.clean:
                    self.service.qos2.remove(self.vhost.name, self.client_id, OUTBOUND,
                                             ev.packet_id)
            elif isinstance(ev, ConnectRequested):
                self._on_connect(ev.connect)
                if self.login_wait is not None:
                    return  # the rest waits in the connection for the login's decision
                if not self.finished:
                    self._handle(b"")  # what came right behind the CONNECT
                    return
            elif isinstance(ev, SubscribeRequested):
                self._on_subscribe(ev.packet_id, ev.topics, ev.properties)
                if self._suback_waits is not None:
                    self._held_events = events[i:]
                    self._held_bytes = max(self._held_bytes, len(data))
                    break
            elif isinstance(ev, UnsubscribeRequested):
                self._on_unsubscribe(ev.packet_id, ev.topics)
            elif isinstance(ev, Disconnected):
                if ev.reason_code == P.SUCCESS:
                    # only a normal DISCONNECT discards the will: 0x04 asks for it, and a
                    # client's error code is no normal end (section 3.14.4)
                    self.will = None
                if ev.properties and self.expiry is not None:
                    self._expiry_at_disconnect(ev.properties)
                self.finished = True
                # the client id is free at once, as on EOF: a reconnect that follows right
                # behind must not find this session still registered
                self.connection_lost()
            elif isinstance(ev, ReauthRequested):
                self._on_reauth(ev.data)
            elif isinstance(ev, AuthContinued):
                if self._on_auth_continued(ev.data):
                    self._handle(b"")  # what came right behind the client's last AUTH
                    return
            elif isinstance(ev, ProtocolViolation):
                log.warning("mqtt connection %s: closing: %s", self.peer, ev.reason)
                self.finished = True
            if self.finished:
                break
        touched = self._touched
        if touched:
            self._touched = NO_DICT
            for q in touched:
                if q.consumers:
                    q.dispatch()
        if self._ack_now:  # (then nothing is in _pubacks: they are older)
            self.conn.pubacks(self._ack_now)
            self._ack_now = []
        pubrels = self._pubrels
        if pubrels:
            self._pubrels = None
            self.broker.store.when_durable(lambda: self._send_pubrels(pubrels))
        awaiting = self._awaiting_store
        if awaiting:
            self._awaiting_store = []
            self.broker.store.when_durable(lambda: self._stored(awaiting, True),
                                           on_failure=lambda: self._stored(awaiting, False))
        if self._pubacks:
            self._flush_pubacks()
        answer = self._suback_waits
        if answer is not None:
            self._suback_waits = None
            self.delivering = False  # the new subscription's retained messages come first
            self.broker.store.when_durable(lambda: self._subscribed(answer))
        if self.finished:
            self.delivering = False  # nothing more is written: leave messages in the queues
        if self.conn.has_output or self.finished:
            self.wake()

    def _subscribed(self, answer: Callable[[], None]) -> None:
        """The store made a SUBSCRIBE's queue and bindings durable (or, while its writes
        fail, waits for the retry: no SUBACK meanwhile): its SUBACK and retained messages,
        deliveries again, then what the client sent behind it."""
        held = self._held_events
        if held is None or self.ended:
            return  # the connection ended: ``connection_lost`` handled what was held
        self._held_events = None
        answer()
        self.delivering = True
        self._handle_again(held)
        if self.delivering:
            for consumer in list(self.consumers.values()):
                consumer.queue.dispatch()
        self.wake()

    def _handle_held(self) -> None:
        """The connection ends while a SUBACK waits for the store: what the client sent
        behind it still takes effect (publishes routed, PUBACKs of deliveries, a
        DISCONNECT's will and expiry); no SUBACK is sent (``ended``)."""
        held = self._held_events
        if held is None:
            return
        self._held_events = None
        finished, self.finished = self.finished, False
        self._handle_again(held)
        self.finished = self.finished or finished

    def _handle_again(self, held: list) -> None:
        """The held packets handled; the edge reads again (``input_held``) unless another
        SUBSCRIBE among them holds the rest (its bytes counted as all of them)."""
        held_bytes, self._held_bytes = self._held_bytes, 0
        self._handle(b"", held)
        if self._held_events is not None:
            self._held_bytes = held_bytes
        self.flow_resumed()

    @property
    def input_held(self) -> bool:
        """Packets held behind a SUBACK waiting for the store came from more than one read
        buffer of bytes: the edge reads nothing more until the SUBACK goes (a client
        flooding PUBLISHes while the disk is full waits in its socket)."""
        return (self._held_events is not None
                and self._held_bytes > self.broker.config.receive_size)

    # ---- CONNECT ----

    def _on_connect(self, c: codec.Connect,
                    verified: enhanced_auth.Verified | None = None) -> None:
        """``verified``: the identity a challenge exchange proved (the CONNECT's method is
        then done)."""
        conn = self.conn
        service = self.service
        if self.broker.fenced or service.stopping:
            conn.refuse(codec.REFUSED_SERVER_UNAVAILABLE, "broker not serving")
            self.finished = True
            return
        v5 = c.protocol_level == 5
        self.metrics_protocol = ("mqtt50" if v5 else "mqtt311" if c.protocol_level == 4
                                 else "mqtt310")
        props = c.properties or {}
        will = c.will
        if (v5 and will is not None and will.properties
                and will.properties.get(P.PAYLOAD_FORMAT_INDICATOR) == 1
                and not is_utf8(will.message)):  # section 3.1.3.2.3: the server may check
            conn.refuse(P.PAYLOAD_FORMAT_INVALID, "will payload not UTF-8 with Payload "
                        "Format Indicator 1")
            self.finished = True
            return
        method_name = props.get(P.AUTHENTICATION_METHOD) if v5 else None
        credentials = None
        if method_name is not None and verified is None:  # enhanced authentication (4.12)
            method = enhanced_auth.METHODS.get(method_name)
            if method is None:
                conn.refuse(P.BAD_AUTHENTICATION_METHOD,
                            f"authentication method {method_name[:40]!r} not offered")
                self.finished = True
                return
            outcome = method.start(props.get(P.AUTHENTICATION_DATA, b""),
                                   self.broker.access.scram_lookup)
            if isinstance(outcome, enhanced_auth.Challenge):
                conn.auth_method = method_name
                self._auth_step = (outcome.step, c)
                conn.challenge(outcome.data)
                return
            if isinstance(outcome, enhanced_auth.NotOffered):
                log.warning("mqtt connection %s: refused: %s", self.peer, outcome.reason)
                conn.refuse(P.BAD_AUTHENTICATION_METHOD, outcome.reason)
                self.finished = True
                return
            if isinstance(outcome, enhanced_auth.Refused):
                conn.refuse(codec.REFUSED_BAD_CREDENTIALS, outcome.reason)
                self.output_delay = self.broker.access.failure_delay
                self.finished = True
                return
            credentials = outcome
        client_id = c.client_id
        assigned = capped = False
        if not client_id:
            if not c.clean_session and not v5:  # section 3.1.3-8 (v5 assigns one: 3.1.3-6)
                conn.refuse(codec.REFUSED_IDENTIFIER, "empty client id without clean session")
                self.finished = True
                return
            client_id = "triomq-" + os.urandom(8).hex()
            assigned = True
        if len(queue_names(client_id)[1].encode()) > MAX_KEY:
            conn.refuse(codec.REFUSED_IDENTIFIER, "client id too long")
            self.finished = True
            return
        refusal = self._login(c, credentials, verified)
        if refusal is LOGIN_WAITS:
            return  # the edge introspects the token, then resume_login
        if refusal is not None:
            code, reason = refusal
            log.warning("mqtt connection %s: refused: %s", self.peer, reason)
            conn.refuse(code, reason)
            self.finished = True
            return
        self.client_id = client_id
        start_clean = c.clean_session  # v5: Clean Start
        if v5:
            # the session lives as long as its expiry interval says, not as Clean Start
            # says (section 3.1.2.11): expiry 0 is a session ending with the connection
            self.expiry = props.get(P.SESSION_EXPIRY_INTERVAL, 0)
            capped = self.expiry != NEVER_EXPIRES and self.expiry > MAX_EXPIRY
            if capped:
                self.expiry = MAX_EXPIRY
            self.receive_max = props.get(P.RECEIVE_MAXIMUM, 65535)
            self.clean = start_clean and not self.expiry
            self.end_session = not self.clean and not self.expiry
        else:
            self.clean = start_clean
        self.will = c.will
        key = (self.vhost.name, client_id)
        old = service.clients.get(key)
        if old is not None:
            # section 3.1.4-2: the existing connection of this client id is closed first
            log.info("mqtt client %r: connection %s takes over from %s", client_id, self.peer,
                     old.peer)
            # the session carries on with this connection, whatever expiry the old one had
            old.end_session = False
            old.close("another connection took the session over", P.SESSION_TAKEN_OVER)
        service.clients[key] = self
        pending = service.delayed_wills.pop(key, None)
        if pending is not None:  # a will waiting out its delay: this connection resumes
            pending[0].cancel()  # the session (not sent), or starts a new one (the old
            if start_clean:  # session has ended: sent now)
                pending[1]()
        q0_name, q1_name = queue_names(client_id)
        vhost = self.vhost
        legacy_q0 = vhost.find_queue(q0_name)
        q1 = vhost.find_queue(q1_name)
        qos2_store = service.qos2
        present = False
        if start_clean:
            # a clean session starts without the previous one's state
            for q in (legacy_q0, q1):
                if q is not None:
                    vhost.delete_queue(q, reason="clean MQTT session")
            qos2_store.discard(vhost.name, client_id)
            legacy_q0 = q1 = None
        if not self.clean:
            present = legacy_q0 is not None or q1 is not None or (
                (vhost.name, client_id) in qos2_store.states)
            self.qos2 = qos2_store.get(vhost.name, client_id)
            # the connection's outbound PUBREL phase is the session's (kept across connections)
            conn.releasing = self.qos2.releasing
        if v5:
            # what this server does and does not do, stated as MQTT 5 lets it (section
            # 3.2.2.3; Maximum QoS is absent: 2 is supported)
            caps: dict[int, Any]  # values of several types (ints, the client id, bytes)
            caps = {P.RECEIVE_MAXIMUM: RECEIVE_MAXIMUM,
                    P.MAXIMUM_PACKET_SIZE: service.max_packet + 2,
                    P.TOPIC_ALIAS_MAXIMUM: TOPIC_ALIAS_MAXIMUM,
                    P.RETAIN_AVAILABLE: 1,
                    P.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
                    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1,
                    P.SHARED_SUBSCRIPTION_AVAILABLE: 1}
            if assigned:
                caps[P.ASSIGNED_CLIENT_IDENTIFIER] = client_id
            if capped:  # section 3.2.2.3.2: the interval the server uses instead
                caps[P.SESSION_EXPIRY_INTERVAL] = MAX_EXPIRY
            if method_name is not None:  # section 3.2.2.3.17: the method in use
                caps[P.AUTHENTICATION_METHOD] = method_name
                conn.auth_method = method_name
                if verified is not None:  # the method's last message (SCRAM's server-final)
                    caps[P.AUTHENTICATION_DATA] = verified.data
            conn.accept(present, self.username, caps)
        else:
            conn.accept(present, self.username)
        service.connections_accepted += 1
        # the trail's shared context of this connection's events (no channel: MQTT has none)
        self.audit_ctx = (vhost.name, self.username, self.peer, None)
        # listed, limited and closed with the AMQP connections (management API, ctl,
        # metrics, max-connections, store fencing, vhost deletion)
        self.broker.session_opened(self)
        log.info("mqtt connection %s: client %r user %r vhost %r (clean session %s)",
                 self.peer, client_id, self.username, vhost.name, self.clean)
        self.delivering = True
        if not self.clean:  # the stored session's PUBRELs and messages follow the CONNACK
            if conn.releasing:
                conn.resend_pubrel()
            if legacy_q0 is not None:
                q1 = self._adopt_legacy_queue(legacy_q0, q1)
            if q1 is not None:
                self._restore_filters(q1)
                self._consume(q1)

    # ---- as a connection in broker.sessions (session_base) ----
    @property
    def protocol(self) -> str:
        level = self.conn.protocol_level
        return "MQTT 5.0" if level == 5 else "MQTT 3.1.1" if level == 4 else "MQTT 3.1"

    def client_properties(self) -> dict:
        return {"client_id": self.client_id, "clean_session": self.clean}

    def heartbeat_timeout(self) -> int:
        return self.conn.keep_alive

    def force_close(self, error: errors.AMQPError) -> None:
        """The broker ends the connection (management, store fencing, vhost deleted):
        MQTT 3.1.1 has no close frame, the socket is closed and the will published; a v5
        client gets a DISCONNECT saying why."""
        if "shutdown" in error.text:
            code = P.SERVER_SHUTTING_DOWN
        elif error.code == 320:  # CONNECTION_FORCED: management, vhost deleted, fencing
            code = P.ADMINISTRATIVE_ACTION
        else:
            code = P.UNSPECIFIED_ERROR
        self.close(error.text, code)

    def _expiry_at_disconnect(self, props: dict) -> None:
        """A v5 DISCONNECT's Session Expiry Interval (section 3.14.2.2.2): 0 ends the
        session now. (A non-zero one after a CONNECT with 0 is a Protocol Error the server
        may ignore: the connection is ending anyway; the session still ends.)"""
        expiry = props.get(P.SESSION_EXPIRY_INTERVAL)
        if expiry == 0 and self.expiry:
            self.expiry = 0
            self.end_session = True

    # ---- the end ----

    def close(self, reason: str, reason_code: int = P.UNSPECIFIED_ERROR) -> None:
        """The server ends the connection (takeover, keep-alive, refused publish, shutdown):
        the will is published, the socket closed once pending output is written (a v5
        client's last packet is a DISCONNECT with ``reason_code``)."""
        if self.ended:
            return
        log.info("mqtt connection %s: closing: %s", self.peer, reason)
        if self._held_events is not None:
            # packets held behind a SUBACK waiting for the store take effect now, their
            # answers before the DISCONNECT (none after it: section 3.14.4)
            self.finished = True
            self.connection_lost()
        self.conn.close(reason, reason_code)
        self.finished = True
        self.connection_lost()
        self.wake()

    def connection_lost(self) -> None:
        """Every way a connection ends comes here once: the will (unless the client sent
        DISCONNECT or the broker is stopping), then unacknowledged QoS 1 deliveries back
        to their queues (redelivered, with DUP), then the consumers leave (a clean
        session's auto-delete queues go with them)."""
        if self.ended:
            return
        self.ended = True
        self.delivering = False
        self._handle_held()
        service = self.service
        will, self.will = self.will, None
        if will is not None and self.vhost is not None and not service.stopping:
            delay = (will.properties or NO_DICT).get(P.WILL_DELAY_INTERVAL, 0)
            if delay and not self.clean and not self.end_session and self.expiry:
                # section 3.1.3.2.2: after the delay or when the session ends, whichever
                # comes first; a new connection to the session before then cancels it
                self._delay_will((self.vhost.name, self.client_id), will,
                                 min(delay, self.expiry))
            else:
                self._publish_will(will)
        by_queue: dict = {}
        qos2_out = self.conn.qos2_out
        resend = None if self.clean or self.qos2 is None else self.qos2.resend
        for pid, token in self.conn.inflight.items():
            if token is not None:
                queue, entry, consumer, _ = token
                by_queue.setdefault(queue, []).append((entry, consumer))
                if resend is not None and pid in qos2_out:
                    resend[(queue.name, entry.seq)] = pid
        self.conn.take_inflight()
        for q, items in by_queue.items():
            items.sort(key=lambda pair: -pair[0].seq)
            q.requeue(items)
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)
        self.forget_flow()
        if self.vhost is not None and service.clients.get((self.vhost.name,
                                                           self.client_id)) is self:
            del service.clients[(self.vhost.name, self.client_id)]
            if self.end_session:
                # a v5 session of expiry 0 that resumed a stored one ends here
                q = self.vhost.find_queue(queue_names(self.client_id)[1])
                if q is not None:
                    self.vhost.delete_queue(q, reason="MQTT session expired")
                service.qos2.discard(self.vhost.name, self.client_id)
            elif not self.clean:
                service.qos2.release(self.vhost.name, self.client_id)
        self.broker.session_closed(self)
