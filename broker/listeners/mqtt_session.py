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
import math
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from .. import errors
from ..amqp import spec
from ..amqp.fields import encode_properties
from ..exchanges.topic import MQTT_SUBSCRIPTION_ARG
from ..message import Message
from ..mqtt import codec, enhanced_auth
from ..mqtt import properties as P
from ..mqtt.connection import FORMAT_INVALID_BIT, NO_MATCH_BIT, PUBREC_BIT, ServerConnection
from ..mqtt.encoding import topic_field
from ..mqtt.events import (
    AuthContinued,
    ConnectRequested,
    DeliveryAcked,
    DeliveryCompleted,
    DeliveryReceived,
    Disconnected,
    ProtocolViolation,
    PublishReceived,
    ReauthRequested,
    ReleaseReceived,
    SubscribeRequested,
    UnsubscribeRequested,
)
from ..mqtt.topics import matches, to_mqtt_topic, to_routing_key
from ..persistence import DURABLE
from ..publishing import NACKED, REFUSED, STORING, UNROUTABLE
from ..queues.args import MAX_EXPIRY_MS
from ..queues.queue import Consumer
from ..channel import Unacked
from .mqtt_qos2 import INBOUND, OUTBOUND, QoS2Sessions, SessionState
from .mqtt_retained import RetainedStore

log = logging.getLogger("broker.mqtt")

MAX_KEY = 255  # an AMQP shortstr: routing keys and queue names
_NO_QUEUES: frozenset = frozenset()
# empty stand-ins shared by sessions until they need their own: each place that would
# write to one replaces it first (thousands of idle connections carry no containers)
_NO_LIST: list = []
_NO_DECISIONS: dict = {}
_NO_DICT: dict = {}
# the binding argument carrying a subscription's granted QoS (a binding without it is one
# stored by an earlier version: QoS 1 in the ...qos1 queue, QoS 0 in the ...qos0 queue)
QOS_ARG = "x-mqtt-qos"
# MQTT 5 subscription options kept in the binding (so a stored session gets them back):
# No Local (0x04) and Retain As Published (0x08) bits, and the Subscription Identifier
OPTIONS_ARG = "x-mqtt-options"
SUBSCRIPTION_ID_ARG = "x-mqtt-subscription-id"
NO_LOCAL, RETAIN_AS_PUBLISHED = 0x04, 0x08
# headers on messages that need them: the v5 publisher's client id (No Local), and the
# RETAIN flag of a PUBLISH (Retain As Published)
PUBLISHER_HEADER = "x-mqtt-publisher"
SHARED_ARG = "x-mqtt-shared"  # the share name of a shared subscription's binding
RETAIN_HEADER = "x-mqtt-retain"
# MQTT 5.0: the inbound QoS 1/2 PUBLISHes a client may have without PUBACK/PUBCOMP, and the
# topic aliases it may define, as the CONNACK states them (both enforced by the connection)
RECEIVE_MAXIMUM = 1024
TOPIC_ALIAS_MAXIMUM = 64
NEVER_EXPIRES = 0xFFFFFFFF  # Session Expiry Interval: the session does not expire
# the longest x-expires / expiration the queues take (RabbitMQ's ten years), in seconds:
# a longer Session Expiry Interval is lowered to it (and the CONNACK says so), a longer
# Message Expiry Interval too
MAX_EXPIRY = MAX_EXPIRY_MS // 1000


def _props(qos: int, dup: bool, retain: bool = False) -> tuple[dict, bytes]:
    headers: dict[str, Any] = {"x-mqtt-publish-qos": qos, "x-mqtt-dup": dup}
    if retain:
        headers[RETAIN_HEADER] = True
    props = {"delivery_mode": 2 if qos else 1, "headers": headers}
    return props, encode_properties(props)


# the property sets an MQTT publish can have, built and encoded once and shared by every
# such message (a Message's properties are never changed once routed: a header is changed
# on a copy, Message.with_changes); retained publishes say so (Retain As Published)
_PROPS = {(q, d): _props(q, d) for q in (0, 1, 2) for d in (False, True)}
_PROPS_RETAINED = {(q, d): _props(q, d, True) for q in (0, 1, 2) for d in (False, True)}


# MQTT 5 PUBLISH properties that travel with the message (as AMQP properties and headers)
_MAPPED = frozenset((P.PAYLOAD_FORMAT_INDICATOR, P.MESSAGE_EXPIRY_INTERVAL, P.CONTENT_TYPE,
                     P.RESPONSE_TOPIC, P.CORRELATION_DATA, P.USER_PROPERTY))
# headers carrying what has no AMQP property of its own (and the ones above, internal)
CORRELATION_HEADER = "x-mqtt-correlation-data"  # correlation data that is not a shortstr
FORMAT_HEADER = "x-mqtt-payload-format-indicator"


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _v5_message_props(qos: int, dup: bool, v5: dict, retain: bool = False,
                      publisher: str | None = None) -> tuple[dict, bytes]:
    """The AMQP properties of a message published with MQTT 5 properties (docs/mqtt.md):
    user properties -> headers (a name given twice: an array of its values), Content
    Type -> content_type, Response Topic -> reply_to (as a routing key), Correlation Data
    -> correlation_id when it is UTF-8 of at most 255 bytes, else the header
    x-mqtt-correlation-data (bytes), Message Expiry Interval -> expiration (ms), Payload
    Format Indicator 1 -> the header x-mqtt-payload-format-indicator."""
    base = (_PROPS_RETAINED if retain else _PROPS)[(qos, dup)][0]
    headers: dict[str, Any] = {}
    for name, value in v5.get(P.USER_PROPERTY, ()):
        if name.startswith("x-mqtt-") or len(name.encode()) > MAX_KEY:
            # the broker's own headers are not a client's to set; an AMQP table key is a
            # shortstr (a longer name cannot travel as a header)
            continue
        old = headers.get(name)
        if old is None:
            headers[name] = value
        elif isinstance(old, list):
            old.append(value)
        else:
            headers[name] = [old, value]
    headers.update(base["headers"])
    if publisher is not None:
        headers[PUBLISHER_HEADER] = publisher
    props: dict[str, Any] = {"delivery_mode": base["delivery_mode"], "headers": headers}
    expiry = v5.get(P.MESSAGE_EXPIRY_INTERVAL)
    if expiry is not None:
        props["expiration"] = str(min(expiry, MAX_EXPIRY) * 1000)
    content_type = v5.get(P.CONTENT_TYPE)
    if content_type is not None and len(content_type.encode()) <= MAX_KEY:
        props["content_type"] = content_type
    response = v5.get(P.RESPONSE_TOPIC)
    if response is not None:
        key = to_routing_key(response)
        if len(key.encode()) <= MAX_KEY:
            props["reply_to"] = key
    data = v5.get(P.CORRELATION_DATA)
    if data is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(data) <= MAX_KEY:
            props["correlation_id"] = text
        else:
            headers[CORRELATION_HEADER] = data
    if v5.get(P.PAYLOAD_FORMAT_INDICATOR):
        headers[FORMAT_HEADER] = 1
    return props, encode_properties(props)


def _v5_delivery_props(message, entry, now: float) -> dict[int, Any]:
    """A v5 PUBLISH's encoded properties from an AMQP message: the mapping back of
    ``_v5_message_props`` (any AMQP header that is not the broker's becomes a user
    property), and the Message Expiry Interval left (section 3.3.2.3.3)."""
    mp = message.properties
    out: dict[int, Any] = {}
    headers = mp.get("headers")
    if headers:
        users = []
        for name, value in headers.items():
            if name.startswith("x-mqtt-"):
                continue
            for v in (value if isinstance(value, list) else (value,)):
                if isinstance(v, bytes):
                    v = v.decode("utf-8", "replace")
                elif not isinstance(v, str):
                    if isinstance(v, (dict, list)):
                        continue  # a table or nested array has no string form worth sending
                    v = str(v)
                users.append((name, v))
        if users:
            out[P.USER_PROPERTY] = users
        if headers.get(FORMAT_HEADER) == 1:
            out[P.PAYLOAD_FORMAT_INDICATOR] = 1
        data = headers.get(CORRELATION_HEADER)
        if isinstance(data, bytes):
            out[P.CORRELATION_DATA] = data
    if "content_type" in mp:
        out[P.CONTENT_TYPE] = mp["content_type"]
    if "reply_to" in mp:
        out[P.RESPONSE_TOPIC] = to_mqtt_topic(mp["reply_to"])
    if "correlation_id" in mp and P.CORRELATION_DATA not in out:
        out[P.CORRELATION_DATA] = mp["correlation_id"].encode("utf-8", "replace")
    if "expiration" in mp and entry is not None and entry.expires_at is not None:
        out[P.MESSAGE_EXPIRY_INTERVAL] = max(1, math.ceil(entry.expires_at - now))
    return out


def _encode_props(props: dict[int, Any]) -> bytes:
    if not props:
        return b""
    try:
        return P.encode(props)
    except ValueError:  # a value MQTT cannot carry (a string over 65535 bytes)
        return b""


def shared_queue_name(group: str, topic_filter: str) -> str:
    """The queue of the shared subscription ``$share/<group>/<filter>``: one per group and
    filter, its members' sessions its competing consumers."""
    return f"mqtt-shared-{group}-{topic_filter}"


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """(share name, filter) of ``$share/<name>/<filter>`` (section 4.8.2), None if it is
    not a valid one."""
    parts = topic_filter.split("/", 2)
    if len(parts) < 3 or not parts[1] or not parts[2] or "+" in parts[1] or "#" in parts[1]:
        return None
    return parts[1], parts[2]


def queue_names(client_id: str) -> tuple[str, str]:
    """(the QoS 0 queue of sessions stored by earlier versions, the subscription queue)"""
    base = f"mqtt-subscription-{client_id}"
    return base + "qos0", base + "qos1"


class MQTTService:
    """The listener's broker-wide state: settings, the client id registry (for session
    takeover) and the retained messages. Live sessions are in ``broker.sessions``."""

    def __init__(self, broker):
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


# _login's answer while an opaque token's introspection decides
_LOGIN_WAITS = (-1, "the login waits for the token's introspection")


class MQTTSession:
    """One connection; also the ``channel`` of its two consumers (the queue calls
    ``can_deliver``, ``deliver`` ... on it, as on an AMQP channel)."""

    # __weakref__: the management API keeps when it first saw a connection in a weak map
    __slots__ = ("__weakref__", "_ack_now", "_auth_step", "_awaiting_store", "_decided", "_filter_qos",
                 "_keys", "_one_qos", "_pubacks", "_pubrels", "_seq", "_topics", "_touched", "audit",
                 "audit_ctx", "authz", "blocked_sent", "broker", "clean", "client_id", "conn",
                 "consumers", "delivering", "delivery_stalled", "end_session", "ended",
                 "expiry", "filters", "finished", "flow_queues", "flow_resumed", "is_publisher",
                 "local_port", "login_wait", "metrics_protocol", "output_delay",
                 "output_high_water", "peer", "peer_host", "qos2",
                 "receive_max", "service", "sub_opts", "tls", "unroutable", "user",
                 "username", "vhost", "wake", "will")

    global_prefetch = 0
    prefetch = 0  # as a channel: the limit is per consumer (``Consumer.prefetch``)
    number = 0  # as a channel, in the management API's consumer details
    # As a connection in ``broker.sessions``: MQTT 3.1.1 has no channels (RabbitMQ's
    # native MQTT lists none either); read-only, shared by every session.
    channels: Mapping = MappingProxyType({})

    def __init__(self, service: MQTTService, peer: str, peer_host: str | None):
        self.service = service
        self.broker = service.broker
        self.peer = peer
        self.peer_host = peer_host
        self.local_port = 0  # the listener's port (set by the edge), for the management API
        self.tls = False
        self.conn = ServerConnection(service.max_packet)
        # RabbitMQ's ``protocol`` label of native MQTT's global counters (3.12 and later),
        # set from the CONNECT; an attribute, not a property: every publish and delivery
        # reads it
        self.metrics_protocol = "mqtt311"
        self.audit = self.broker.audit  # the audit trail, or None
        self.output_high_water = self.broker.config.output_high_water
        self.output_delay = 0.0  # seconds the edge waits before writing a refused login's CONNACK
        self.wake = lambda: None  # set by the edge: "there is output to write"
        self.flow_resumed = lambda: None  # set by the edge: "read again"
        # the queues holding this publisher in flow: a set made when first needed (an empty
        # set costs 216 bytes on each of thousands of idle connections)
        self.flow_queues: set | frozenset = _NO_QUEUES
        self.vhost: Any = None
        self.user: Any = None
        self.authz: Any = None  # the user's cached permission checks in the vhost, shared
        self.username: str | None = None
        self.client_id = ""
        self.clean = True
        # MQTT 5.0: the Session Expiry Interval (None for 3.1/3.1.1), whether the session
        # ends with this connection although it resumed a stored one (Clean Start 0 and
        # expiry 0), and the client's Receive Maximum (bounds QoS 1/2 deliveries in flight)
        self.expiry: int | None = None
        self.end_session = False
        self.receive_max = 65535
        # v5 filters with No Local / Retain As Published / a Subscription Identifier:
        # filter -> (option bits, identifier); deliveries take the slow path while any
        self.sub_opts: dict[str, tuple[int, int]] = _NO_DICT
        # the QoS 1/2 publish just routed reached no queue (a v5 PUBACK says 0x10)
        self.unroutable = False
        self.will: codec.Will | None = None
        # 1 -> the subscription queue's consumer; a shared subscription's queue name -> this
        # session's consumer of it (its arguments hold the granted QoS, and the
        # subscription identifier)
        self.consumers: dict[int | str, Consumer] = {}
        # the session's subscriptions: MQTT filter -> granted QoS, and what a delivery's QoS
        # needs from them: the one QoS they all share (None: they differ), else the highest
        # QoS matching each routing key seen (a bounded cache)
        self.filters: dict[str, int] = _NO_DICT  # made on the first SUBSCRIBE
        self._one_qos: int | None = None
        self._filter_qos: dict[str, int] | None = None  # made when first needed
        # QoS 2 packet-id state: a persistent session's comes from service.qos2, a clean
        # session's is made when first needed (None until then)
        self.qos2: SessionState | None = None
        self.delivering = False
        self.delivery_stalled = False
        self.is_publisher = False
        # (token, CONNECT) while the edge introspects an opaque OAuth 2 token; None: no login
        # waiting
        self.login_wait: tuple[str, codec.Connect] | None = None
        # a resource alarm saw this publisher (Broker.notify_blocked); MQTT cannot tell the
        # client, the edge stops reading it instead
        self.blocked_sent = False
        self.finished = False  # the edge closes the socket once output is written
        self.ended = False
        # (seq, packet id) of QoS 1 publishes, in order (a list: a deque costs 600 bytes
        # on each of thousands of idle connections, and this one stays short)
        # (these three are made on the first publish that waits: shared empties until then)
        self._pubacks: list[tuple[int, int]] = _NO_LIST
        self._decided: dict[int, bool] = _NO_DECISIONS
        self._seq = 0
        # packet ids of this read's QoS 1 publishes acknowledged at once (nothing waits
        # for the store before them): written in one go at the end of the read
        self._ack_now: list[int] = _NO_LIST  # (made on the first publish)
        # queues acked in this batch: dispatched once at its end (made on the first ack)
        self._touched: dict = _NO_DICT
        # routing key -> encoded MQTT topic (made on the first delivery)
        self._topics: dict[str, bytes] = _NO_DICT
        # MQTT topic -> routing key (checked for length), made on the first PUBLISH
        self._keys: dict[str, str] = _NO_DICT
        # outbound QoS 2 packet ids whose PUBREL waits for the store (persistent sessions)
        self._pubrels: list[int] | None = None
        # seqs of this read's QoS 1 publishes whose PUBACK waits for the store: one
        # durability callback per read, not per message
        self._awaiting_store: list[int] = _NO_LIST
        # an enhanced authentication's challenge awaiting the client's AUTH 0x18: (the
        # method's step, the CONNECT it is for, or None when re-authenticating)
        self._auth_step: tuple[enhanced_auth.Step, codec.Connect | None] | None = None

    # ---- input ----
    def resume_login(self) -> None:
        """The edge introspected ``login_wait``'s token: the CONNECT is decided now, and
        what came behind it handled."""
        wait = self.login_wait
        self.login_wait = None
        if wait is None or self.finished:
            return
        audit = self.audit
        if audit is not None:
            audit.clock_start()
        try:
            self._on_connect(wait[1])
            if not self.finished and self.login_wait is None:
                self._handle(b"")
        finally:
            if audit is not None:
                audit.clock_stop()
        self.wake()

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

    def _handle(self, data: bytes) -> None:
        for ev in self.conn.receive_data(data):
            if isinstance(ev, PublishReceived):
                self._on_publish(ev.publish)
            elif isinstance(ev, DeliveryAcked):
                self._on_delivery_acked(ev.token)
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
            self._touched = _NO_DICT
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
        if self.finished:
            self.delivering = False  # nothing more is written: leave messages in the queues
        if self.conn.has_output or self.finished:
            self.wake()

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
                and not _is_utf8(will.message)):  # section 3.1.3.2.3: the server may check
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
        if refusal is _LOGIN_WAITS:
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

    def _restore_filters(self, q) -> None:
        """The subscriptions of a stored session, from its queue's bindings."""
        exchanges = self.vhost.exchanges
        for source, bkey in list(q.bindings):
            x = exchanges.get(source)
            binding = x.bindings.get(bkey) if x is not None else None
            if binding is None or source != self.service.exchange:
                continue
            args = binding.arguments
            topic_filter = args.get(MQTT_SUBSCRIPTION_ARG)
            if not isinstance(topic_filter, str):
                topic_filter = to_mqtt_topic(binding.routing_key.replace("*", "+"))
            qos = args.get(QOS_ARG, 1)
            if self.filters is _NO_DICT:
                self.filters = {}
            self.filters[topic_filter] = qos if qos in (0, 1, 2) else 1
            bits, sub_id = args.get(OPTIONS_ARG, 0), args.get(SUBSCRIPTION_ID_ARG, 0)
            if isinstance(bits, int) and isinstance(sub_id, int):
                self._set_options(topic_filter, bits, sub_id)
        self._filters_changed()

    def _adopt_legacy_queue(self, q0, q1):
        """A session stored by a version with a separate QoS 0 queue: its subscriptions
        become QoS 0 bindings of the subscription queue, and the queue goes (with what
        it held: transient QoS 0 messages, which at most once allows to lose)."""
        exchanges = self.vhost.exchanges
        filters = []
        for source, bkey in list(q0.bindings):
            x = exchanges.get(source)
            binding = x.bindings.get(bkey) if x is not None else None
            if binding is not None and source == self.service.exchange:
                f = binding.arguments.get(MQTT_SUBSCRIPTION_ARG)
                if not isinstance(f, str):
                    f = to_mqtt_topic(binding.routing_key.replace("*", "+"))
                filters.append((f, binding.routing_key))
        self.vhost.delete_queue(q0, reason="MQTT session upgraded to one queue")
        if not filters:
            return q1
        if q1 is None:
            q1 = self._declare_queue()
        for f, key in filters:
            self.vhost.bind(self.service.exchange, q1, key, self._binding_args(f, 0))
        return q1

    def _login(self, c: codec.Connect,
               credentials: enhanced_auth.Credentials | None = None,
               verified: enhanced_auth.Verified | None = None) -> tuple[int, str] | None:
        """Authenticate and pick the vhost ('vhost:user' in the user name, as RabbitMQ);
        (CONNACK code, reason) when refused. No user name: guest, as RabbitMQ's default
        ``allow_anonymous`` (so only from loopback, like guest over AMQP). ``credentials``:
        from an enhanced authentication method, instead of User Name and Password;
        ``verified``: a user whose password a challenge exchange proved."""
        if verified is not None:
            username: str | None = verified.username
            password: str | None = ""
        elif credentials is not None:
            username = credentials.username
            password = credentials.password
        else:
            username = c.username
            password = (c.password.decode("utf-8", "replace") if c.password is not None
                        else None)
        if username is None:
            username, password = "guest", "guest"
        vhost_name = "/"
        if ":" in username:
            vhost_name, username = username.split(":", 1)
        if password is None:
            return codec.REFUSED_BAD_CREDENTIALS, "no password"
        broker = self.broker
        access = broker.access
        if verified is not None:
            user = access.verified_login(username, self.peer_host, "mqtt")
        elif credentials is None and access.needs_introspection(username, password):
            self.login_wait = (password, c)  # an opaque OAuth 2 token
            return _LOGIN_WAITS
        else:
            user = access.authenticate(username, password, self.peer_host, "mqtt")
        if user is None:
            # the edge holds the refusal back, as for AMQP logins (brute force)
            self.output_delay = access.failure_delay
            return codec.REFUSED_BAD_CREDENTIALS, f"login refused for user {username!r}"
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None:
            return codec.REFUSED_NOT_AUTHORIZED, f"vhost {vhost_name!r} not found"
        try:
            access.check_vhost(user, vhost_name)
            # max-connections of the vhost and the user count AMQP and MQTT connections
            access.check_connection_limits(user, vhost_name, broker.sessions)
        except errors.AMQPError as exc:
            return codec.REFUSED_NOT_AUTHORIZED, exc.text
        self.user = user
        self.authz = access.authz(user, vhost_name)
        self.username = username
        self.vhost = vhost
        return None

    def _on_auth_continued(self, data: bytes) -> bool:
        """The client's AUTH 0x18 answering a challenge; True when a CONNECT was accepted
        by it (what the client sent behind its AUTH is then handed out)."""
        pending, self._auth_step = self._auth_step, None
        if pending is None:  # (the connection only reports an AUTH 0x18 after a challenge)
            self.close("AUTH without a challenge", P.PROTOCOL_ERROR)
            return False
        step, connect = pending
        outcome = step.next(data)
        if isinstance(outcome, enhanced_auth.Refused):  # a failed login, as a wrong password
            self.broker.access.count_attempt("mqtt", False)
        if connect is None:  # re-authenticating
            if isinstance(outcome, enhanced_auth.Refused):
                self.close(f"re-authentication refused: {outcome.reason}", P.NOT_AUTHORIZED)
            else:
                self._reauthenticated(outcome.username, None, outcome.data)
            return False
        if isinstance(outcome, enhanced_auth.Refused):
            log.warning("mqtt connection %s: refused: %s", self.peer, outcome.reason)
            self.conn.refuse(codec.REFUSED_BAD_CREDENTIALS, outcome.reason)
            self.output_delay = self.broker.access.failure_delay
            self.finished = True
            return False
        self._on_connect(connect, outcome)
        return not self.finished

    def _on_reauth(self, data: bytes) -> None:
        """AUTH 0x19 (section 4.12.1): the same user in the same vhost, checked again (a
        changed password or revoked access ends the connection), its permissions read anew."""
        method = enhanced_auth.METHODS[self.conn.auth_method or ""]
        outcome = method.start(data, self.broker.access.scram_lookup)
        if isinstance(outcome, enhanced_auth.Challenge):
            self._auth_step = (outcome.step, None)
            self.conn.challenge(outcome.data)
            return
        if isinstance(outcome, (enhanced_auth.Refused, enhanced_auth.NotOffered)):
            self.close(f"re-authentication refused: {outcome.reason}", P.NOT_AUTHORIZED)
            return
        self._reauthenticated(outcome.username, outcome.password)

    def _reauthenticated(self, username: str, password: str | None,
                         data: bytes | None = None) -> None:
        """A re-authentication's identity checked: ``password`` against the user, or None
        when a challenge exchange proved it (``data``: its last message)."""
        vhost_name = "/"
        if ":" in username:
            vhost_name, username = username.split(":", 1)
        if username != self.username or vhost_name != self.vhost.name:
            self.close("re-authentication as another user or vhost", P.NOT_AUTHORIZED)
            return
        access = self.broker.access
        if password is None:
            user = access.verified_login(username, self.peer_host, "mqtt")
        else:
            user = access.authenticate(username, password, self.peer_host, "mqtt")
        if user is None:
            self.close(f"re-authentication refused for user {username!r}", P.NOT_AUTHORIZED)
            return
        try:
            access.check_vhost(user, vhost_name)
        except errors.AMQPError as exc:
            self.close(exc.text, P.NOT_AUTHORIZED)
            return
        self.user = user
        self.authz = access.authz(user, vhost_name)
        self.conn.auth_success(data)

    def _check(self, kind: str, name: str, perm: str) -> None:
        self.broker.access.check(self.user, self.vhost.name, kind, name, perm)

    def _check_topic(self, routing_key: str, perm: str) -> None:
        self.broker.access.check_topic(self.user, self.vhost.name, self.service.exchange,
                                       routing_key, perm)

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
            elif self._keys is _NO_DICT:
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
        if v5 and v5.get(P.PAYLOAD_FORMAT_INDICATOR) == 1 and not _is_utf8(p.payload):
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
                if self._ack_now is _NO_LIST:
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
            if stored is False and not self._pubacks:
                # the common case: routed, no store write to wait for, none before it waits
                if self._ack_now is _NO_LIST:
                    self._ack_now = []
                self._ack_now.append(ack_id)
                return
            if self._ack_now:  # those go first (PUBACKs in PUBLISH order)
                self.conn.pubacks(self._ack_now)
                self._ack_now = []
            if self._decided is _NO_DECISIONS:
                self._pubacks, self._decided, self._awaiting_store = [], {}, []
            seq = self._seq = self._seq + 1
            self._pubacks.append((seq, ack_id))
            if stored is None:
                self._decided[seq] = False
            elif stored:
                self._awaiting_store.append(seq)
            else:
                self._decided[seq] = True

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
            props, raw = _v5_message_props(qos, dup, v5 or _NO_DICT, retain, self.client_id)
        elif retain:
            props, raw = _PROPS_RETAINED[(qos, dup)]
        else:
            props, raw = _PROPS[(qos, dup)]
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

    # ---- SUBSCRIBE / UNSUBSCRIBE ----
    def _on_subscribe(self, packet_id: int, topics: list[tuple[str, int]],
                      properties: dict | None = None) -> None:
        sub_id = properties.get(P.SUBSCRIPTION_IDENTIFIER, 0) if properties else 0
        codes = []
        vhost = self.vhost
        exchange = self.service.exchange
        granted = []
        v5 = self.expiry is not None
        for topic_filter, options in topics:
            qos = options & 0x03
            send_retained = True
            bits = 0
            if topic_filter.startswith("$share/"):  # section 4.8.2 (Mosquitto: in 3.1.1 too)
                codes.append(self._subscribe_shared(topic_filter, qos, sub_id))
                continue
            if v5:
                bits = options & (NO_LOCAL | RETAIN_AS_PUBLISHED)
                handling = (options >> 4) & 0x03  # section 3.8.3.1: Retain Handling
                send_retained = handling == 0 or (handling == 1
                                                  and topic_filter not in self.filters)
            key = to_routing_key(topic_filter)
            try:
                if len(key.encode()) > MAX_KEY:
                    raise errors.precondition_failed("topic filter longer than %d bytes", MAX_KEY)
                q = self._subscription_queue()
                self._check("queue", q.name, "write")
                self._check("exchange", exchange, "read")
                self._check_topic(key, "read")
                args = self._binding_args(topic_filter, qos, bits, sub_id)
                olds = self._old_binding_args(topic_filter, args)
                vhost.bind(exchange, q, key, args)
                # the same filter subscribed before with other options, or as bound by
                # earlier versions (no QoS; no filter before the '$' rule existed)
                for old in olds:
                    vhost.unbind(exchange, q, key, old)
                if self.filters is _NO_DICT:
                    self.filters = {}
                self.filters[topic_filter] = qos
                self._set_options(topic_filter, bits, sub_id)
            except errors.AMQPError as exc:
                log.warning("mqtt client %r: subscription to %r refused: %s", self.client_id,
                            topic_filter, exc.text)
                codes.append(P.NOT_AUTHORIZED if exc.code == 403
                             else codec.SUBACK_FAILURE)
                continue
            codes.append(qos)
            if send_retained:
                granted.append((topic_filter, qos))
        self._filters_changed()
        self.conn.suback(packet_id, codes)
        retained = self.service.retained
        for topic_filter, qos in granted:  # after the SUBACK (section 3.3.1.3)
            for topic, payload, rqos in retained.matching(vhost.name, topic_filter):
                extra = None
                if retained.extra:
                    extra = retained.properties(vhost.name, topic)
                    if extra is None and retained.get(vhost.name, topic) is None:
                        continue  # its Message Expiry Interval has passed: dropped
                props = b""
                if v5:  # its properties, the expiry left, the subscription's identifier
                    v5props: dict[int, Any] = {}
                    if extra is not None:
                        v5props.update(extra[0])
                        if extra[1] is not None:
                            v5props[P.MESSAGE_EXPIRY_INTERVAL] = extra[1]
                    if sub_id:
                        v5props[P.SUBSCRIPTION_IDENTIFIER] = [sub_id]
                    props = _encode_props(v5props)
                self.conn.publish(topic_field(topic), payload, min(qos, rqos), None, retain=True,
                                  props=props)

    def _subscribe_shared(self, full: str, qos: int, sub_id: int) -> int:
        """A shared subscription: this session becomes a consumer of the group's queue
        (bound once per group and filter); no retained messages (section 4.8.2). The
        reason code for the SUBACK."""
        parsed = split_shared(full)
        if parsed is None:
            return P.TOPIC_FILTER_INVALID
        group, topic_filter = parsed
        name = shared_queue_name(group, topic_filter)
        key = to_routing_key(topic_filter)
        if len(name.encode()) > MAX_KEY or len(key.encode()) > MAX_KEY:
            return P.TOPIC_FILTER_INVALID
        exchange = self.service.exchange
        vhost = self.vhost
        try:
            self._check("queue", name, "configure")
            self._check("queue", name, "read")
            self._check("queue", name, "write")
            self._check("exchange", exchange, "read")
            self._check_topic(key, "read")
            q = vhost.find_queue(name)
            if q is None:
                # lives while it has members: the last one leaving deletes it
                m = spec.Queue.Declare(queue=name, durable=False, auto_delete=True)
                q = vhost.declare_queue(m, None)
            vhost.bind(exchange, q, key, {MQTT_SUBSCRIPTION_ARG: topic_filter, SHARED_ARG: group})
        except errors.AMQPError as exc:
            log.warning("mqtt client %r: shared subscription %r refused: %s", self.client_id,
                        full, exc.text)
            return P.NOT_AUTHORIZED if exc.code == 403 else codec.SUBACK_FAILURE
        args = {QOS_ARG: qos}
        if sub_id:
            args[SUBSCRIPTION_ID_ARG] = sub_id
        old = self.consumers.pop(name, None)
        if old is not None:  # subscribed again: the new QoS and identifier
            old.arguments = args
            old.no_ack = qos == 0
            self.consumers[name] = old
            return qos
        prefetch = min(self.service.prefetch, self.receive_max)
        consumer = Consumer(f"mqtt-{self.client_id}-{name}", self, q, qos == 0, False, 0, prefetch,
                            args)
        self.consumers[name] = consumer
        q.add_consumer(consumer)
        return qos

    def _unsubscribe_shared(self, full: str) -> int:
        parsed = split_shared(full)
        consumer = None
        if parsed is not None:
            consumer = self.consumers.pop(shared_queue_name(*parsed), None)
        if consumer is None:
            return P.NO_SUBSCRIPTION_EXISTED
        consumer.queue.remove_consumer(consumer)  # the last member: the queue goes
        return P.SUCCESS

    @staticmethod
    def _binding_args(topic_filter: str, qos: int, bits: int = 0, sub_id: int = 0) -> dict:
        args: dict[str, Any] = {MQTT_SUBSCRIPTION_ARG: topic_filter, QOS_ARG: qos}
        if bits:
            args[OPTIONS_ARG] = bits
        if sub_id:
            args[SUBSCRIPTION_ID_ARG] = sub_id
        return args

    def _old_binding_args(self, topic_filter: str, new: dict | None = None) -> list[dict]:
        olds: list[dict] = [{}, {MQTT_SUBSCRIPTION_ARG: topic_filter}]
        prev = self.filters.get(topic_filter)
        if prev is not None:
            bits, sub_id = self.sub_opts.get(topic_filter, (0, 0))
            old = self._binding_args(topic_filter, prev, bits, sub_id)
            if old != new:
                olds.append(old)
        return olds

    def _set_options(self, topic_filter: str, bits: int, sub_id: int) -> None:
        if bits or sub_id:
            if self.sub_opts is _NO_DICT:
                self.sub_opts = {}
            self.sub_opts[topic_filter] = (bits, sub_id)
        elif topic_filter in self.sub_opts:
            del self.sub_opts[topic_filter]

    def _filters_changed(self) -> None:
        values = set(self.filters.values())
        self._one_qos = values.pop() if len(values) == 1 else None
        self._filter_qos = None
        consumer = self.consumers.get(1)
        if consumer is not None:
            # only QoS 0 subscriptions: deliveries are settled as the queue hands them out
            # (no ack per message); deliveries in flight before a change settle as they were
            consumer.no_ack = self._one_qos == 0

    def _subscription_qos(self, routing_key: str) -> int:
        """The highest QoS of the filters matching ``routing_key`` (1 if none does any
        more: the message was queued before an UNSUBSCRIBE, or bound over AMQP)."""
        cache = self._filter_qos
        if cache is None:
            cache = self._filter_qos = {}
        qos = cache.get(routing_key)
        if qos is None:
            if len(cache) >= 256:  # bounded, as the topic cache
                cache.clear()
            topic = to_mqtt_topic(routing_key)
            found = [q for f, q in self.filters.items() if matches(f, topic)]
            qos = cache[routing_key] = max(found) if found else 1
        return qos

    def _subscription_queue(self):
        consumer = self.consumers.get(1)
        if consumer is not None:
            return consumer.queue
        q = self._declare_queue()
        self._consume(q)
        return q

    def _declare_queue(self):
        name = queue_names(self.client_id)[1]
        self._check("queue", name, "configure")
        self._check("queue", name, "read")
        # Durable unless clean. A clean session lasts as long as its connection (MQTT 3.1.1
        # section 3.1.2.4; a restart ends it), so its messages need no disk (RabbitMQ's 3.x
        # plugin declares it durable and auto-delete: a difference).
        args = {}
        if self.expiry and self.expiry != NEVER_EXPIRES:
            # an MQTT 5 session expires that long after its last connection ends: the queue's
            # x-expires (unused that long: no consumer) is exactly that (section 3.1.2.11.2)
            args["x-expires"] = self.expiry * 1000
        m = spec.Queue.Declare(queue=name, durable=not self.clean, auto_delete=self.clean,
                               arguments=args)
        return self.vhost.declare_queue(m, None)

    def _consume(self, q) -> None:
        tag = f"mqtt-{self.client_id}-qos1"
        # a v5 client's Receive Maximum bounds the QoS 1/2 deliveries in flight (3.3.4)
        prefetch = min(self.service.prefetch, self.receive_max)
        consumer = Consumer(tag, self, q, self._one_qos == 0, False, 0, prefetch, {})
        self.consumers[1] = consumer
        q.add_consumer(consumer)

    def _on_unsubscribe(self, packet_id: int, topics: list[str]) -> None:
        exchange = self.service.exchange
        codes = [P.SUCCESS if f in self.filters else P.NO_SUBSCRIPTION_EXISTED for f in topics]
        for i, topic_filter in enumerate(topics):
            if topic_filter.startswith("$share/"):
                codes[i] = self._unsubscribe_shared(topic_filter)
                continue
            key = to_routing_key(topic_filter)
            main = self.consumers.get(1)
            for consumer in (main,) if main is not None else ():
                try:
                    for args in self._old_binding_args(topic_filter):
                        self.vhost.unbind(exchange, consumer.queue, key, args)
                except errors.AMQPError as exc:  # pragma: no cover - not our exclusive queue
                    log.warning("mqtt client %r: unsubscribe %r: %s", self.client_id,
                                topic_filter, exc.text)
            self.filters.pop(topic_filter, None)
            if topic_filter in self.sub_opts:
                del self.sub_opts[topic_filter]
        self._filters_changed()
        self.conn.unsuback(packet_id, codes)

    # ---- deliveries (the queue calls these, as on an AMQP channel) ----
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

    def deliver(self, consumer: Consumer, queue, entry) -> None:
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
            elif self._topics is _NO_DICT:
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

    def _deliver_v5(self, consumer: Consumer, queue, entry, topic: bytes,
                    was_empty: bool) -> None:
        """A delivery to a v5 session: the message's properties mapped back, then as
        ``deliver`` (through ``_deliver_with_options`` when filters have options)."""
        message = entry.message
        v5props = _v5_delivery_props(message, entry, queue.vhost.timers.now())
        if self.sub_opts:
            self._deliver_with_options(consumer, queue, entry, topic, v5props, was_empty)
            return
        qos = 0
        if not consumer.no_ack:
            one = self._one_qos
            qos = self._subscription_qos(message.routing_key) if one is None else one
        self._send(consumer, queue, entry, topic, qos, False, _encode_props(v5props), was_empty)

    def _deliver_with_options(self, consumer: Consumer, queue, entry, topic: bytes,
                              v5props: dict[int, Any], was_empty: bool) -> None:
        """A delivery to a v5 session with subscription options: the QoS of the matching
        filters that take it (No Local: not those of a client's own messages), RETAIN as
        published if one of them says so, and their Subscription Identifiers."""
        message = entry.message
        headers = message.properties.get("headers") or _NO_DICT
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
        self._send(consumer, queue, entry, topic, qos, retain, _encode_props(v5props), was_empty)

    def _deliver_shared(self, consumer: Consumer, queue, entry, topic: bytes,
                        was_empty: bool) -> None:
        """A delivery of a shared subscription's queue: at its granted QoS (lowered to the
        publish's), with its identifier."""
        args = consumer.arguments
        props = b""
        if self.expiry is not None:
            v5props = _v5_delivery_props(entry.message, entry, queue.vhost.timers.now())
            sub_id = args.get(SUBSCRIPTION_ID_ARG)
            if sub_id:
                v5props[P.SUBSCRIPTION_IDENTIFIER] = [sub_id]
            props = _encode_props(v5props)
        self._send(consumer, queue, entry, topic, args.get(QOS_ARG, 1), False, props, was_empty)

    def _send(self, consumer: Consumer, queue, entry, topic: bytes, qos: int, retain: bool,
              props: bytes, was_empty: bool) -> None:
        """The slow paths' delivery: ``qos`` lowered to the publish's, then as ``deliver``."""
        message = entry.message
        headers = message.properties.get("headers") or _NO_DICT
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

    def _on_delivery_acked(self, token) -> None:
        if token is None:
            return  # a retained message sent at subscribe time: nothing to settle
        queue, entry, consumer, pid = token
        if self.audit is not None:  # the queue's SETTLE, as the client's ack
            self.audit.acked(self, Unacked(pid, entry, queue, consumer))
        queue.ack(entry, consumer, reported=True)
        if self._touched is _NO_DICT:
            self._touched = {}
        self._touched[queue] = None

    def _on_delivery_received(self, token, packet_id: int) -> None:
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

    # ---- flow (queues/queue.py: flow_wait calls flow_released) ----
    def queue_over_threshold(self, q) -> None:
        """Flow control (the publish path): a session that consumes is never stopped (its
        acks may be what the queue waits for)."""
        if q in self.flow_queues or self.ended or self.consumers:
            return
        if self.flow_queues is _NO_QUEUES:
            self.flow_queues = set()
        self.flow_queues.add(q)  # type: ignore[union-attr]
        q.flow_wait(self, self.broker.config.flow_low)

    def flow_released(self, queue) -> None:
        if queue in self.flow_queues:
            self.flow_queues.discard(queue)  # type: ignore[union-attr]
            if not self.flow_queues:
                self.flow_resumed()

    # ---- as a connection in broker.sessions (next to broker.session.Session) ----
    @property
    def closed(self) -> bool:
        return self.ended

    @property
    def session(self) -> MQTTSession:
        """As the channel of its consumers: its connection is itself."""
        return self


    @property
    def protocol(self) -> str:
        level = self.conn.protocol_level
        return "MQTT 5.0" if level == 5 else "MQTT 3.1.1" if level == 4 else "MQTT 3.1"

    def connection_info(self) -> dict:
        """The protocol's own fields of the management API's connection object."""
        return {"protocol": self.protocol, "auth_mechanism": "PLAIN", "channel_max": 0,
                "frame_max": 0, "timeout": self.conn.keep_alive, "port": self.local_port,
                "ssl": self.tls,
                "client_properties": {"client_id": self.client_id, "clean_session": self.clean}}

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
        service = self.service
        will, self.will = self.will, None
        if will is not None and self.vhost is not None and not service.stopping:
            delay = (will.properties or _NO_DICT).get(P.WILL_DELAY_INTERVAL, 0)
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
        for q in self.flow_queues:
            q.flow_forget(self)
        self.flow_queues = _NO_QUEUES
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
