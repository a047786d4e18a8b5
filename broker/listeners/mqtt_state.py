"""An MQTT session's attributes, set up once: the typed base of its mixins; no behaviour."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from ..mqtt import codec, enhanced_auth
from ..mqtt.connection import ServerConnection
from ..queues.consumer import ConsumerChannel
from ..queues.queue import Consumer
from .mqtt_mapping import NO_DECISIONS, NO_DICT, NO_LIST
from .mqtt_qos2 import SessionState
from .session_base import NO_QUEUES, FlowControlledSession

if TYPE_CHECKING:
    from .mqtt_session import MQTTService


class MQTTSessionState(FlowControlledSession):
    """The attributes of ``MQTTSession``; and, for the type checker, the methods one of its
    parts calls on another."""

    # __weakref__: the management API keeps when it first saw a connection in a weak map
    __slots__ = ("__weakref__", "_ack_now", "_auth_step", "_awaiting_store", "_decided", "_filter_qos",
                 "_held_bytes", "_held_events", "_keys", "_one_qos", "_pubacks", "_pubrels", "_seq",
                 "_suback_waits", "_topics", "_touched", "audit", "audit_ctx", "authz",
                 "blocked_sent", "broker", "clean", "client_id", "conn",
                 "consumers", "delivering", "delivery_stalled", "end_session", "ended",
                 "expiry", "filters", "finished", "is_publisher",
                 "local_port", "metrics_protocol", "output_delay",
                 "output_high_water", "peer", "peer_host", "qos2",
                 "receive_max", "service", "sub_opts", "tls", "unroutable", "user",
                 "username", "vhost", "wake", "will")

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
        self.flow_queues = NO_QUEUES
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
        self.sub_opts: dict[str, tuple[int, int]] = NO_DICT
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
        self.filters: dict[str, int] = NO_DICT  # made on the first SUBSCRIBE
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
        self._pubacks: list[tuple[int, int]] = NO_LIST
        self._decided: dict[int, bool] = NO_DECISIONS
        self._seq = 0
        # packet ids of this read's QoS 1 publishes acknowledged at once (nothing waits
        # for the store before them): written in one go at the end of the read
        self._ack_now: list[int] = NO_LIST  # (made on the first publish)
        # queues acked in this batch: dispatched once at its end (made on the first ack)
        self._touched: dict = NO_DICT
        # routing key -> encoded MQTT topic (made on the first delivery)
        self._topics: dict[str, bytes] = NO_DICT
        # MQTT topic -> routing key (checked for length), made on the first PUBLISH
        self._keys: dict[str, str] = NO_DICT
        # outbound QoS 2 packet ids whose PUBREL waits for the store (persistent sessions)
        self._pubrels: list[int] | None = None
        # seqs of this read's QoS 1 publishes whose PUBACK waits for the store: one
        # durability callback per read, not per message
        self._awaiting_store: list[int] = NO_LIST
        # an enhanced authentication's challenge awaiting the client's AUTH 0x18: (the
        # method's step, the CONNECT it is for, or None when re-authenticating)
        self._auth_step: tuple[enhanced_auth.Step, codec.Connect | None] | None = None
        # a persistent session's SUBACK waits for the store to make its queue and bindings
        # durable (mqtt_subscriptions): the answer to send then, set until the read's end
        # registers it; and what the client sent behind that SUBSCRIBE, handled after it
        # (None: nothing waits)
        self._suback_waits: Callable[[], None] | None = None
        self._held_events: list | None = None
        self._held_bytes = 0  # read while packets are held (bounded: ``input_held``)

    def as_channel(self) -> ConsumerChannel:
        """The session as its consumers' channel (the delivering part: mqtt_delivery)."""
        return cast(ConsumerChannel, self)

    if TYPE_CHECKING:  # defined by the session and its mixins
        def close(self, reason: str, reason_code: int = ...) -> None: ...
        def _on_connect(self, c: codec.Connect,
                        verified: enhanced_auth.Verified | None = None) -> None: ...
        def _check(self, kind: str, name: str, perm: str) -> None: ...
        def _check_topic(self, routing_key: str, perm: str) -> None: ...
        def _subscription_qos(self, routing_key: str) -> int: ...
