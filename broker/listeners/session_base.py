"""What every non-0-9-1 protocol session (MQTT, STOMP, AMQP 1.0, RabbitMQ Stream) is alike in:
a member of ``broker.sessions`` (``closed``, ``session``, ``connection_info``), the
``channel`` of its consumers (no prefetch, no channels), the OAuth 2 login wait the edge
resolves, and publisher flow control (``queue_over_threshold`` / ``flow_released``).
Not here: parsing, login decisions, routing, delivery, closing (each protocol's own).

How a session adopts it (MQTT, Stream, ...):

- ``class XSession(FlowControlledSession)`` (or ``ProtocolSession`` for a session whose
  publishers are not held by queue flow, as the Stream protocol's). A ``__slots__``
  session keeps its slots, less ``login_wait``, ``flow_queues`` and ``flow_resumed``:
  the base classes hold those (and add no ``__dict__``).
- Define ``protocol`` (property) and ``client_properties()``; override
  ``heartbeat_timeout()`` / ``negotiated_frame_max()`` where the management API shows one,
  and set ``auth_mechanism`` when it is not PLAIN. Delete the copies of ``closed``,
  ``session``, ``connection_info``, ``queue_over_threshold``, ``flow_released``.
- Input: define ``handle_input(data)`` (what ``data_received`` did inside the audit
  clock) and, if the connection can end there, ``input_handled()``; ``resume_login``:
  define ``login_resumed(request)`` (decide the held login request, then what came
  behind it).
- ``can_deliver``: deliveries stop while the connection's unwritten output is over
  ``output_high_water`` (``delivery_stalled``; the edge calls ``output_drained``).
- Flow: ``flow_lifted()`` runs when the last queue lets the publisher go, before the
  edge's ``flow_resumed`` ("read again"); ``connection_lost`` calls ``forget_flow()``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..audit.recorder import AuditTrail
    from ..broker import Broker
    from ..message import Message
    from ..queues.queue import Consumer, Queue
    from ..security.authz import Authz
    from ..security.model import User
    from ..vhost import VirtualHost

NO_QUEUES: frozenset[Queue] = frozenset()


def _nothing() -> None:
    pass


Input = TypeVar("Input")


def clocked(audit: AuditTrail | None, handle: Callable[[Input], None], arg: Input) -> None:
    """``handle(arg)`` with the audit clock running: one read's events share one time."""
    if audit is None:
        handle(arg)
        return
    audit.clock_start()
    try:
        handle(arg)
    finally:
        audit.clock_stop()


class ProtocolSession:
    """One connection of a protocol other than AMQP 0-9-1, as the broker lists it."""

    # the attributes this class assigns; a subclass without __slots__ has a __dict__ too
    __slots__ = ("login_wait",)

    global_prefetch = 0
    prefetch = 0  # as a channel: the limit is per consumer (``Consumer.prefetch``)
    number = 0  # as a channel, in the management API's consumer details
    # these protocols have no AMQP channels: read-only, shared by every session
    channels: Mapping[int, Any] = MappingProxyType({})
    auth_mechanism = "PLAIN"
    # messages written by its stream publishers (the Stream protocol's session counts them)
    messages_published = 0

    # set by every session's __init__ (and the edge: local_port, tls, wake)
    broker: Broker  # the edge keeps the broker (docs/architecture.md, "Extension points")
    conn: Any  # the protocol's sans-IO connection
    audit: AuditTrail | None
    delivering: bool
    delivery_stalled: bool
    output_high_water: int
    ended: bool
    finished: bool
    local_port: int
    tls: bool
    metrics_protocol: str | None  # RabbitMQ's protocol label of its counters
    peer: str  # "host:port"
    blocked_sent: bool  # told it is blocked (an alarm)
    vhost: VirtualHost | None  # None before the login
    user: User | None
    # the queues holding this publisher: a set made when first needed (an empty set costs
    # 216 bytes on each of thousands of idle connections)
    flow_queues: set[Queue] | frozenset[Queue]
    login_wait: tuple[str, Any] | None
    wake: Callable[[], None]

    # ---- hooks ----
    @property
    def protocol(self) -> str:
        raise NotImplementedError

    def client_properties(self) -> dict[str, Any]:
        """The management API's ``client_properties`` of the connection."""
        raise NotImplementedError

    def heartbeat_timeout(self) -> int:
        """Seconds, for the management API's ``timeout``."""
        return 0

    def negotiated_frame_max(self) -> int:
        return 0

    def login_resumed(self, request: Any) -> None:
        """Decide ``request`` (held in ``login_wait`` while the edge introspected its
        token), then what came behind it."""
        raise NotImplementedError

    @property
    def input_held(self) -> bool:
        """The session holds more of what it read than it may (behind an answer waiting for
        the store): the edge reads nothing more until it lets go (``flow_resumed``)."""
        return False

    def handle_input(self, data: bytes) -> None:
        """The bytes the edge read (the audit clock runs)."""
        raise NotImplementedError

    def input_handled(self) -> None:
        """After input was handled: e.g. end the session when the connection finished."""

    # ---- input ----
    def data_received(self, data: bytes) -> None:
        clocked(self.audit, self.handle_input, data)
        self.input_handled()

    # ---- the login wait (the edge introspects an opaque OAuth 2 token) ----
    def resume_login(self) -> None:
        """The edge introspected ``login_wait``'s token: the login is decided now."""
        wait = self.login_wait
        self.login_wait = None
        if wait is None or self.finished:
            return
        audit = self.audit
        if audit is not None:
            audit.clock_start()
        try:
            self.login_resumed(wait[1])
        finally:
            if audit is not None:
                audit.clock_stop()
        self.input_handled()
        self.wake()

    # ---- deliveries (the queue calls this, as on an AMQP channel) ----
    @property
    def can_deliver(self) -> bool:
        if not self.delivering:
            return False
        if self.conn.pending_output > self.output_high_water:
            # (a subclass's slot or __dict__ holds it)
            self.delivery_stalled = True  # type: ignore[misc]
            return False
        return True

    # ---- as the origin of its publishes (publishing.PublishOrigin) ----
    def confirm_decided(self, seq: int, ok: bool, external: bool = False) -> None:
        """No AMQP publisher confirms: these sessions publish with ``seq`` 0 and answer
        their client from the path's outcome (a PUBACK, a receipt, a disposition)."""

    def send_return(self, message: Message, code: int, text: str) -> None:
        """No mandatory returns: these sessions publish with ``mandatory`` False (an
        unroutable message is the outcome's to answer)."""

    def queue_over_threshold(self, queue: Queue) -> None:
        """Flow control: not held by a queue's flow (the Stream protocol's publishers,
        whose records go into a log); ``FlowControlledSession`` holds its publishers."""

    # ---- as a connection in broker.sessions ----
    @property
    def closed(self) -> bool:
        return self.ended

    @property
    def session(self) -> ProtocolSession:
        """As the channel of its consumers: its connection is itself."""
        return self

    def connection_info(self) -> dict[str, Any]:
        """The protocol's own fields of the management API's connection object."""
        return {"protocol": self.protocol, "auth_mechanism": self.auth_mechanism,
                "channel_max": 0, "frame_max": self.negotiated_frame_max(),
                "timeout": self.heartbeat_timeout(), "port": self.local_port,
                "ssl": self.tls, "client_properties": self.client_properties()}


class FlowControlledSession(ProtocolSession):
    """A session whose publishers a queue over its length threshold holds
    (``queues/queue.py``: ``flow_wait`` calls ``flow_released``)."""

    __slots__ = ("flow_queues", "flow_resumed")

    flow_resumed: Callable[[], None]  # set by the edge: "read again"
    consumers: dict[Any, Consumer]
    authz: Authz | None
    username: str | None

    def start_unauthenticated(self) -> None:
        """Before login: no vhost, user or permissions; the edge's hooks not yet wired."""
        self.wake = _nothing
        self.flow_resumed = _nothing
        self.flow_queues = NO_QUEUES
        # (a subclass's slots or __dict__ hold these: mypy sees only this class's slots)
        self.vhost = None  # type: ignore[misc]
        self.user = None  # type: ignore[misc]
        self.authz = None  # type: ignore[misc]
        self.username = None  # type: ignore[misc]

    def flow_lifted(self) -> None:
        """The last queue let the publisher go (before the edge reads again)."""

    def queue_over_threshold(self, q: Queue) -> None:
        """Flow control (the publish path): a session that consumes is never stopped (its
        acks may be what the queue waits for)."""
        queues = self.flow_queues
        if q in queues or self.ended or self.consumers:
            return
        if not isinstance(queues, set):  # NO_QUEUES
            queues = self.flow_queues = set()
        queues.add(q)
        q.flow_wait(self, self.broker.config.flow_low)

    def flow_released(self, queue: Queue) -> None:
        queues = self.flow_queues
        if queue in queues and isinstance(queues, set):  # (NO_QUEUES holds none)
            queues.discard(queue)
            if not queues:
                self.flow_lifted()
                self.flow_resumed()

    def forget_flow(self) -> None:
        """The session ended: no queue holds it any more."""
        for q in self.flow_queues:
            q.flow_forget(self)
        self.flow_queues = NO_QUEUES
