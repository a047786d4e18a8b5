"""One STOMP client as the broker sees it: login, SEND into the routing core, SUBSCRIBE as
queues, bindings and consumers, ACK/NACK, transactions and receipts. Synchronous (no
trio): the edge (``stomp.py``) feeds bytes and writes what the sans-IO connection queued
whenever ``wake`` is called.

Destinations are RabbitMQ's STOMP plugin's (docs/stomp.md):

- ``/queue/<name>``: SEND publishes to the default exchange with routing key <name>,
  SUBSCRIBE consumes <name>; both declare it (durable) first.
- ``/amq/queue/<name>``: the same without declaring (the queue must exist).
- ``/topic/<key>``: SEND publishes to amq.topic; SUBSCRIBE binds a queue of its own
  (exclusive, or durable with ``durable:true``/``persistent:true`` or ActiveMQ's
  ``activemq.subscriptionName``) to amq.topic with <key>.
- ``/exchange/<exchange>[/<key>]``: as /topic/ on any exchange.
- ``/temp-queue/<name>``: a queue of this connection (exclusive, server-named), made on
  first use; in ``reply-to`` it is rewritten to ``/reply-queue/<queue>`` and its messages
  come to subscription id ``/temp-queue/<name>``. ``/reply-queue/<queue>``: SEND to it.

Destinations and headers are mapped by ``stomp_mapping``. As the session is the
``channel`` of its consumers, the queues deliver to it as to an AMQP
channel. A SEND goes through the broker's publish hooks (scheduler: ActiveMQ's
``AMQ_SCHEDULED_*`` headers, cluster forwarding, transactions, Hermes) as an AMQP
publish without confirms or mandatory.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .. import errors
from ..amqp.fields import encode_properties
from ..message import Message
from ..publishing import NACKED, REFUSED, STORING
from ..queues.queue import Consumer
from ..stomp.codec import Frame
from ..stomp.connection import ConnectRequested, FrameReceived, ProtocolError, ServerConnection
from .amqp_channel import Unacked, _selector
from .session_base import FlowControlledSession
from .stomp_deliveries import StompDeliveries, Subscription
from .stomp_mapping import (
    StompError,
    amqp_error,
    int_header,
    is_host_name,
    message_properties,
    parse_destination,
    queue_arguments,
)

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import Queue
    from ..security.authz import Authz
    from ..vhost import VirtualHost

log = logging.getLogger("broker.stomp")

MAX_KEY = 255

class StompService:
    """The listener's broker-wide settings."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.max_body = broker.config.max_message_size
        self.stopping = False
        self.bytes_received = 0  # counted by the edge


class StompSession(StompDeliveries, FlowControlledSession):
    """One connection; also the ``channel`` of its subscriptions' consumers."""

    # RabbitMQ's STOMP adapter publishes over an AMQP 0-9-1 channel: its global counters
    # have no STOMP label
    metrics_protocol = "amqp091"

    def __init__(self, service: StompService, peer: str, peer_host: str | None):
        self.service = service
        self.broker = service.broker
        self.peer = peer
        self.peer_host = peer_host
        self.local_port = 0
        self.tls = False
        self.conn = ServerConnection(service.max_body)
        self.output_high_water = self.broker.config.output_high_water
        self.audit = self.broker.audit  # the audit trail, or None
        self.audit_ctx: tuple | None = None  # (vhost, user, peer, channel) of its events
        self.output_delay = 0.0
        # (token, CONNECT) while the edge introspects an opaque OAuth 2 token, and the
        # events that came behind it; None: no login waiting
        self.login_wait: tuple[str, Frame] | None = None
        self._held_events: list = []
        self.start_unauthenticated()
        self.client_id = ""
        self.subscriptions: dict[str, Subscription] = {}
        self.consumers: dict[str, Consumer] = {}  # consumer tag -> consumer
        # delivery number -> (subscription, queue, entry, consumer), in delivery order
        self.unacked: dict[int, tuple[Subscription, Unacked]] = {}
        self._delivery = 0
        self.transactions: dict[str, list[Frame]] = {}
        self.temp_queues: dict[str, Any] = {}  # /temp-queue/<name> -> its queue
        self.delivering = False
        self.delivery_stalled = False
        self.is_publisher = False
        self.blocked_sent = False
        self.finished = False
        self.ended = False
        self._receipts_waiting = 0  # receipts held for the store: later ones queue behind
        self._declared = False  # the frame being handled declared a durable queue
        self.disconnecting = False  # DISCONNECT seen, its receipt waits behind others

    # ---- input ----
    def login_resumed(self, request: Frame) -> None:
        """The CONNECT is decided now, then the frames that came behind it."""
        held, self._held_events = self._held_events, []
        self._on_connect(request)
        if self.login_wait is None:
            self._handle_events(held)

    def handle_input(self, data: bytes) -> None:
        self._handle_events(self.conn.receive_data(data))

    def _handle_events(self, events: list) -> None:
        for i, ev in enumerate(events):
            if self.finished or self.disconnecting:
                break  # (nothing after a DISCONNECT is handled)
            if isinstance(ev, FrameReceived):
                self._on_frame(ev.frame)
            elif isinstance(ev, ConnectRequested):
                self._on_connect(ev.frame)
                if self.login_wait is not None:
                    # frames pipelined behind the CONNECT wait for the login's decision
                    self._held_events = events[i + 1:]
                    break
            elif isinstance(ev, ProtocolError):
                log.warning("stomp connection %s: %s: %s", self.peer, ev.message, ev.detail)
                self._finish()
        if self.conn.has_output or self.finished:
            self.wake()

    def _on_frame(self, frame: Frame, in_tx: bool = False) -> None:
        receipt = frame.headers.get("receipt")
        if not in_tx:
            self._declared = False
        try:
            waits = self._dispatch(frame, in_tx)
        except errors.AMQPError as exc:
            self._error(amqp_error(exc), receipt)
            return
        except StompError as exc:
            self._error(exc, receipt)
            return
        if receipt is not None and not in_tx and not self.finished \
                and frame.command != "DISCONNECT":  # (its receipt is its own business)
            self._receipt(receipt, waits)

    def _receipt(self, receipt: str, waits: bool) -> None:
        # a durable queue the frame declared: its RECEIPT once its definition is durable (as
        # a queue.declare-ok); while the store's writes fail, it waits for the retry
        declared = self._declared and not waits
        if waits or declared or self._receipts_waiting:
            self._receipts_waiting += 1

            def send() -> None:
                self._receipts_waiting -= 1
                if not self.ended:
                    self.conn.receipt(receipt)
                    self.wake()
            if declared:
                self.broker.store.when_durable(send)
            else:
                self.broker.store.when_durable(send, on_failure=self._store_failed)
        else:
            self.conn.receipt(receipt)

    def _store_failed(self) -> None:
        """The store could not write what a held receipt waits for: the message is in
        doubt, so neither RECEIPT nor silence is true; the connection ends with an ERROR
        (as an AMQP publisher waiting for confirms is closed)."""
        self._receipts_waiting -= 1
        if not self.ended:
            self._error(StompError("Message not stored",
                                   "The store could not write the message: it is in doubt\n"),
                        None)
            self.wake()

    def _dispatch(self, frame: Frame, in_tx: bool) -> bool:
        """Handles one frame; True when its receipt must wait for the store."""
        command = frame.command
        headers = frame.headers
        tx = headers.get("transaction")
        if tx is not None and not in_tx and command in ("SEND", "ACK", "NACK"):
            if tx not in self.transactions:
                raise StompError("Bad transaction", f'Invalid transaction identifier: "{tx}"\n')
            self.transactions[tx].append(frame)
            return False
        if command == "SEND":
            return self._on_send(frame)
        if command == "SUBSCRIBE":
            self._on_subscribe(headers)
        elif command == "UNSUBSCRIBE":
            self._on_unsubscribe(headers)
        elif command in ("ACK", "NACK"):
            self._on_ack(command, headers)
        elif command == "BEGIN":
            # a BEGIN of a transaction already open starts it afresh (RabbitMQ's plugin does)
            self.transactions[self._tx_name(command, headers)] = []
        elif command == "COMMIT":
            frames = self._take_tx(command, headers)
            waits = False
            for f in frames:
                waits = self._dispatch(f, True) or waits
            return waits
        elif command == "ABORT":
            self._take_tx(command, headers)
        elif command == "DISCONNECT":
            receipt = headers.get("receipt")
            if receipt is not None and self._receipts_waiting:
                # receipts held for the store leave first, then this one, then the end
                self.disconnecting = True
                self._receipts_waiting += 1

                def send() -> None:
                    self._receipts_waiting -= 1
                    if not self.ended:
                        self.conn.receipt(receipt)
                        self._finish(graceful=True)
                        self.wake()
                self.broker.store.when_durable(send, on_failure=self._store_failed)
                return False
            if receipt is not None:
                self.conn.receipt(receipt)
            self._finish(graceful=True)
        return False

    def _tx_name(self, command: str, headers: dict) -> str:
        name = headers.get("transaction")
        if name is None:
            raise StompError("Missing transaction",
                             f'"{command}" must include a \'transaction\' header\n')
        return name

    def _take_tx(self, command: str, headers: dict) -> list[Frame]:
        name = self._tx_name(command, headers)
        frames = self.transactions.pop(name, None)
        if frames is None:
            raise StompError("Bad transaction", f'Invalid transaction identifier: "{name}"\n')
        return frames

    # ---- CONNECT ----
    def _on_connect(self, frame: Frame) -> None:
        conn = self.conn
        if self.broker.fenced or self.service.stopping:
            conn.error("Bad CONNECT", "broker not serving\n")
            self._finish()
            return
        h = frame.headers
        username = h.get("login", "guest")
        password = h.get("passcode", "guest" if "login" not in h else "")
        vhost_name = h.get("host") or "/"
        broker = self.broker
        access = broker.access
        if access.needs_introspection(username, password):
            self.login_wait = (password, frame)  # an opaque OAuth 2 token
            return
        user = access.authenticate(username, password, self.peer_host, "stomp")
        if user is None:
            self.output_delay = access.failure_delay
            log.warning("stomp connection %s: login refused for user %r", self.peer, username)
            conn.error("Bad CONNECT", f"Access refused for user '{username}'\n")
            self._finish()
            return
        if vhost_name not in broker.vhosts and is_host_name(vhost_name):
            # an ActiveMQ-style client sends its server's host name: the default vhost
            vhost_name = "/"
        vhost = broker.vhosts.get(vhost_name)
        try:
            if vhost is None:
                raise errors.access_refused("vhost not found")
            access.check_vhost(user, vhost_name)
            access.check_connection_limits(user, vhost_name, broker.sessions)
        except errors.AMQPError:
            conn.error("Bad CONNECT", f"Virtual host '{vhost_name}' access denied")
            self._finish()
            return
        self.user = user
        self.username = conn.username = username
        self.authz = access.authz(user, vhost_name)
        self.vhost = vhost
        self.client_id = h.get("client-id", "")
        self.audit_ctx = (vhost_name, username, self.peer, None)
        conn.accept()
        broker.session_opened(self)
        self.delivering = True
        log.info("stomp connection %s: user %r vhost %r version %s", self.peer, username,
                 vhost_name, conn.version)

    # ---- destinations ----
    def _open(self) -> tuple[VirtualHost, Authz]:
        """The vhost and permissions of the logged-in session (every frame but CONNECT is
        handled after the login)."""
        vhost, authz = self.vhost, self.authz
        assert vhost is not None and authz is not None, "a frame handled before the login"
        return vhost, authz

    def _declare(self, name: str, durable: bool, auto_delete: bool, exclusive: bool,
                 arguments: dict | None = None):
        vhost, authz = self._open()

        def authorize(qname: str) -> None:
            authz.check("queue", qname, "configure")

        q = vhost.declare_queue(name, self if exclusive else None, authorize,
                                durable=durable, auto_delete=auto_delete,
                                exclusive=exclusive, arguments=arguments or {})
        if q.store is not None:
            self._declared = True
        return q

    def _temp_queue(self, name: str):
        q = self.temp_queues.get(name)
        if q is None or q.deleted:
            q = self._declare("", False, True, True)
            self.temp_queues[name] = q
            sub_id = "/temp-queue/" + name
            if sub_id not in self.subscriptions:
                self._add_subscription(sub_id, "/reply-queue/" + q.name, "auto", q, False, 0, None)
        return q

    # ---- SEND ----
    def _on_send(self, frame: Frame) -> bool:
        h = frame.headers
        kind, name, key = parse_destination(h.get("destination"), "SEND")
        if kind in ("queue", "amq-queue", "reply-queue"):
            exchange, key = "", name
            if kind == "queue":
                self._ensure_queue(name, h)
        elif kind == "topic":
            exchange = "amq.topic"
        elif kind == "temp-queue":
            exchange, key = "", self._temp_queue(name).name
        else:
            exchange = name
        if len(key.encode()) > MAX_KEY:
            raise errors.precondition_failed("routing key longer than %d bytes", MAX_KEY)
        vhost, authz = self._open()
        if exchange not in authz.write_ok:
            authz.check("exchange", exchange, "write")
        if authz.topics:
            authz.check_topic(exchange, key, "write")
        if vhost.exchanges.get(exchange) is None:
            raise errors.not_found(vhost.exchange_resource(exchange))
        props = message_properties(h, self._temp_queue)
        if "user_id" in props and props["user_id"] != self.username:
            raise errors.precondition_failed(
                "user_id property set to '%s' but authenticated user was '%s'",
                props["user_id"], self.username)
        self.is_publisher = True
        message = Message(exchange, key, encode_properties(props), props, frame.body)
        needs_store = self._route(message)
        if needs_store is None and "receipt" in h:
            # a receipt would say the message is the broker's; RabbitMQ 3.10's plugin drops
            # the connection without a word here
            raise StompError("Message rejected",
                             "A queue refused the message (x-overflow reject-publish, or "
                             "its store is failing): it was not stored\n")
        return bool(needs_store)

    def _ensure_queue(self, name: str, headers: dict) -> None:
        if self._open()[0].find_queue(name) is None:
            self._declare(name, True, False, False, queue_arguments(headers))

    def _route(self, message: Message) -> bool | None:
        """Whether a store write must be durable before the receipt; None: a queue
        refused it."""
        # the one publish path, as an AMQP publish without confirms or mandatory: a hook
        # neither confirms nor returns it
        outcome = self.broker.publishing.publish(self, message)
        if outcome is NACKED or outcome is REFUSED:
            return None
        return outcome is STORING and message.persistent

    # ---- SUBSCRIBE / UNSUBSCRIBE ----
    def _on_subscribe(self, h: dict) -> None:
        destination = h.get("destination")
        kind, name, key = parse_destination(destination, "SUBSCRIBE")
        assert destination is not None
        sub_id = h.get("id") or destination  # 1.0 makes the id optional (RabbitMQ: the destination)
        if sub_id in self.subscriptions:
            raise StompError("Duplicated subscription identifier",
                             f"A subscription identified by 'T_{sub_id}' already exists.")
        ack = h.get("ack", "auto")
        if ack not in ("auto", "client", "client-individual"):
            raise StompError("Bad ack header",
                             f'"{ack}" is not a valid ack mode (auto, client or client-individual)\n')
        prefetch = int_header(h, "prefetch-count") or int_header(h, "activemq.prefetchSize")
        vhost, authz = self._open()
        durable_queue = False
        if kind in ("queue", "amq-queue", "reply-queue"):
            if kind == "queue":
                self._ensure_queue(name, h)
            q = vhost.get_queue(name, self)
        elif kind == "temp-queue":
            q = self._temp_queue(name)
        else:
            exchange = "amq.topic" if kind == "topic" else name
            vhost.get_exchange(exchange)
            sub_name = h.get("activemq.subscriptionName")
            durable = sub_name is not None or any(
                h.get(k, "").lower() == "true" for k in ("durable", "persistent"))
            if durable:
                if sub_name is None and not h.get("id"):
                    raise StompError("Missing Header",
                                     "Header 'id' is required for durable subscriptions")
                # the client id (ActiveMQ's client-id header) keeps clients' ids apart
                base = sub_name if sub_name is not None else sub_id
                if self.client_id:
                    base = f"{self.client_id}-{base}"
                q = self._declare("stomp-subscription-" + base, True,
                                  h.get("auto-delete", "").lower() == "true", False,
                                  queue_arguments(h))
                durable_queue = True
            else:
                q = self._declare("", False, True, True, queue_arguments(h))
            authz.check("exchange", exchange, "read")
            if authz.topics:
                authz.check_topic(exchange, key, "read")
            authz.check("queue", q.name, "write")
            vhost.bind(exchange, q, key, {})
        authz.check("queue", q.name, "read")
        args = {}
        selector = h.get("selector")
        if selector is not None:
            args["x-filter"] = selector
        self._add_subscription(sub_id, destination, ack, q, durable_queue, prefetch or 0,
                               _selector(selector), args)

    def _add_subscription(self, sub_id: str, destination: str, ack: str, q: Queue,
                          durable_queue: bool, prefetch: int, selector,
                          args: dict | None = None) -> None:
        consumer = Consumer("T_" + sub_id, self, q, ack == "auto", False, 0, prefetch,
                            args or {}, selector)
        sub = Subscription(sub_id, destination, ack, q, consumer, durable_queue)
        self.subscriptions[sub_id] = sub
        self.consumers[consumer.tag] = consumer
        q.add_consumer(consumer)

    def _on_unsubscribe(self, h: dict) -> None:
        sub_id = h.get("id") or h.get("destination")
        sub = self.subscriptions.pop(sub_id, None) if sub_id is not None else None
        if sub is None:
            raise StompError("No subscription found",
                             "UNSUBSCRIBE must refer to an existing subscription.\n"
                             f"Subscription to \"id='{sub_id}'\" not found.\n")
        self._cancel(sub)
        if sub.durable_queue and any(h.get(k, "").lower() == "true"
                                     for k in ("durable", "persistent")):
            # a durable subscription ends for good only when asked to (RabbitMQ's rule)
            vhost, authz = self._open()
            authz.check("queue", sub.queue.name, "configure")
            if not sub.queue.deleted:
                vhost.delete_queue(sub.queue, reason="durable STOMP subscription removed")

    def _cancel(self, sub: Subscription) -> None:
        # as basic.cancel: its unacknowledged deliveries stay the client's to ACK or NACK
        # (or go back to the queue with the connection)
        self.consumers.pop(sub.consumer.tag, None)
        sub.queue.remove_consumer(sub.consumer)

    # ---- as a connection in broker.sessions ----
    @property
    def protocol(self) -> str:
        return f"STOMP {self.conn.version}"

    def client_properties(self) -> dict:
        return {"client_id": self.client_id}

    def heartbeat_timeout(self) -> int:
        return self.conn.heartbeat_receive // 1000

    def force_close(self, error: errors.AMQPError) -> None:
        self._error(StompError("Connection closed", error.text + "\n"), None)
        self.wake()

    # ---- the end ----
    def _error(self, exc: StompError, receipt: str | None) -> None:
        log.warning("stomp connection %s: ERROR %s: %s", self.peer, exc.message,
                    exc.detail.strip())
        self.conn.error(exc.message, exc.detail, receipt)
        self._finish()

    def _finish(self, graceful: bool = False) -> None:
        self.finished = True
        self.connection_lost()

    def close(self, reason: str) -> None:
        """The server ends the connection (heart-beat missed, shutdown)."""
        if self.ended:
            return
        log.info("stomp connection %s: closing: %s", self.peer, reason)
        self.finished = True
        self.connection_lost()
        self.wake()

    def connection_lost(self) -> None:
        """Every way a connection ends comes here once: unacknowledged deliveries back to
        their queues, consumers leave, the connection's exclusive queues go."""
        if self.ended:
            return
        self.ended = True
        self.delivering = False
        self.transactions.clear()
        by_queue: dict = {}
        for _, item in self.unacked.values():
            by_queue.setdefault(item.queue, []).append((item.entry, item.consumer))
        self.unacked.clear()
        for q, items in by_queue.items():
            items.sort(key=lambda pair: -pair[0].seq)
            q.requeue(items)
        subs = list(self.subscriptions.values())
        self.subscriptions.clear()
        self.consumers.clear()
        for sub in subs:
            sub.queue.remove_consumer(sub.consumer)
        self.forget_flow()
        if self.vhost is not None:
            self.vhost.drop_owner(self)
            self.broker.session_closed(self)
