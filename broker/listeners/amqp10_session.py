"""One AMQP 1.0 client as the broker sees it: SASL login, links onto exchanges and queues,
transfers into the routing core, deliveries out with link credit, dispositions as acks.
Synchronous (no trio): the edge (``amqp10.py``) feeds bytes and writes whatever the sans-IO
connection (``broker.amqp10.connection``) has queued whenever ``wake`` is called.

- A link the client **sends** on publishes to its target address (``addresses.parse_target``;
  a null target: each message's ``to``) through the same stages as every other protocol
  (publish hooks, ``VirtualHost.route``, ``Queue.enqueue``, audit). Its credit is the
  publisher's window: granted again while the connection is not in flow. An unsettled
  transfer is settled with RabbitMQ 4's outcomes: accepted once routed (and stored, for a
  persistent message in a durable queue), released when it routed nowhere, rejected when
  a queue refused it.
- A link the client **receives** on is a consumer of its source queue; each link is the
  ``channel`` of its ``Consumer`` (``OutLink``), so the queue delivers while the link has
  credit. accepted = ack, released = requeue, rejected = reject (dead-letter or drop),
  modified = requeue, or reject when ``undeliverable-here``.

Here: login, open, attaching and detaching links, outcomes, the connection's end. The
publishing is ``amqp10_publish``'s (a mixin), the links' types ``amqp10_links``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import Disposition, symbol

from .. import __version__, errors
from ..amqp10 import addresses
from ..amqp10.connection import ServerConnection
from ..amqp10.events import (
    ConnectionClosed,
    ConnectionOpened,
    CreditGiven,
    LinkAttached,
    LinkDetached,
    MessageReceived,
    NoSasl,
    OutcomeReceived,
    ProtocolError,
    SaslInit,
    SessionEnded,
)
from ..amqp10.sasl import plain_credentials
from ..queues.queue import Consumer, Queue
from .amqp10_links import InLink, OutLink
from .amqp10_mgmt import ManagementNode
from .amqp10_publish import PUBLISH_CREDIT, Amqp10Publishing, condition_of, description_of
from .amqp10_tx import Coordinator, TxnError
from .amqp_channel import Unacked, _selector
from .session_base import FlowControlledSession

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.amqp10")

MANAGEMENT = "/management"  # RabbitMQ 4's HTTP-over-AMQP management node
MAX_LINKS = 1024  # links per connection (each holds a little state)
class Amqp10Service:
    """The listener's broker-wide settings."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.max_message_size = broker.config.max_message_size
        self.anonymous_user: str | None = broker.config.amqp10_anonymous_user
        self.stopping = False
        self.bytes_received = 0


class Amqp10Session(Amqp10Publishing, FlowControlledSession):
    """One connection (a member of ``broker.sessions``)."""

    metrics_protocol = "amqp10"  # RabbitMQ's label (native AMQP 1.0, 4.0 and later)

    def __init__(self, service: Amqp10Service, peer: str, peer_host: str | None,
                 peer_cert_user: str | None = None):
        self.service = service
        self.broker = service.broker
        self.peer = peer
        self.peer_host = peer_host
        # the CN of the client's verified TLS certificate: SASL EXTERNAL's user
        self.peer_cert_user = peer_cert_user
        self.local_port = 0
        self.tls = False
        # EXTERNAL only with a verified certificate: proton's client picks EXTERNAL whenever
        # it is offered, which would fail every password login over TLS without one
        mechanisms = ((["EXTERNAL"] if peer_cert_user is not None else []) + ["PLAIN"]
                      + (["ANONYMOUS"] if service.anonymous_user else []))
        self.auth_mechanism = "PLAIN"
        self.conn = ServerConnection(service.max_message_size, mechanisms)
        self.output_high_water = self.broker.config.output_high_water
        self.pending_output = 0  # octets of deliveries handed to proton since the last write
        self.audit = self.broker.audit
        self.audit_ctx: tuple | None = None
        self.output_delay = 0.0
        self.start_unauthenticated()
        self.container = ""
        self.in_links: dict[Any, InLink] = {}
        self.out_links: dict[Any, OutLink] = {}
        self.coordinator: Coordinator | None = None  # its transactions, once a link asks
        self.management: ManagementNode | None = None  # its /management link pairs
        self.consumers: dict[str, Consumer] = {}
        self._ctag = 0
        self.delivering = False
        self.delivery_stalled = False
        self.is_publisher = False
        self.blocked_sent = False
        self.finished = False
        self.ended = False
        # (token, sasl-init) while the edge introspects an opaque OAuth 2 token (the
        # connection holds what came behind it); None: no login waiting
        self.login_wait: tuple[str, SaslInit] | None = None
        # an answer waits for the store (answer_when_durable): the events that came after
        # it wait too, in order, so no later answer overtakes it
        self._answer_waits = False
        self._held_events: list = []
        self._held_bytes = 0  # read while events are held (bounded: ``input_held``)

    # ---- input ----
    def login_resumed(self, request: SaslInit) -> None:
        """sasl-init is decided now (the connection holds what came behind it)."""
        self._on_sasl(request)

    def handle_input(self, data: bytes) -> None:
        self._handle(self.conn.receive_data(data))
        if self._answer_waits:  # (all of it: the held events came from it)
            self._held_bytes += len(data)

    @property
    def input_held(self) -> bool:
        """Events held behind an answer waiting for the store came from more than one read
        buffer of bytes: the edge reads nothing more until the answer goes (a client
        flooding transfers while the disk is full waits in its socket)."""
        return self._answer_waits and self._held_bytes > self.broker.config.receive_size

    def input_handled(self) -> None:
        if self.conn.finished:
            self.finished = True
            self.connection_lost()
        self.wake()

    def _handle(self, events: list) -> None:
        for i, ev in enumerate(events):
            if self.ended:
                break
            if self._answer_waits:
                self._held_events.extend(events[i:])
                return
            t = type(ev)
            if t is MessageReceived:
                self._on_message(ev)
            elif t is OutcomeReceived:
                self._on_outcome(ev)
            elif t is CreditGiven:
                self._on_credit(ev.link)
            elif t is LinkAttached:
                self._on_attach(ev)
            elif t is LinkDetached:
                self._on_detach(ev.link)
            elif t is SessionEnded:
                links: list[Any] = [*self.in_links.values(), *self.out_links.values()]
                for lk in [x.link for x in links if x.link.session_key == ev.key]:
                    self._on_detach(lk)
            elif t is SaslInit:
                self._on_sasl(ev)
            elif t is NoSasl:
                self._on_no_sasl()
            elif t is ConnectionOpened:
                self._on_open(ev)
            elif t is ConnectionClosed:
                self.finished = True
            elif t is ProtocolError:
                log.warning("amqp 1.0 connection %s: %s", self.peer, ev.description)
                self.finished = True

    def answer_when_durable(self, store: Any, answer: Callable[[], None]) -> None:
        """``answer()`` (an attach, a management response) once ``store`` (None: nothing
        stored) has made durable what it holds now, such as a new durable queue's
        definition: a crash after the answer must not lose the queue. The connection's
        later events are handled after it, so their answers cannot overtake it."""
        if store is None:
            answer()
            return
        self._answer_waits = True

        def durable() -> None:
            self._answer_waits = False
            if self.ended:
                return
            answer()
            held, self._held_events = self._held_events, []
            held_bytes, self._held_bytes = self._held_bytes, 0
            self._handle(held)
            if self._answer_waits:  # another answer holds the rest
                self._held_bytes = held_bytes
            self.wake()
            self.flow_resumed()  # the edge reads again (``input_held``)
        store.when_durable(durable)

    # ---- login ----
    def _login_failed(self, why: str) -> None:
        log.warning("amqp 1.0 connection %s: %s", self.peer, why)
        self.output_delay = self.broker.access.failure_delay
        self._handle(self.conn.sasl_outcome(False))
        self.finished = True

    def _on_sasl(self, ev: SaslInit) -> None:
        access = self.broker.access
        if self.broker.fenced or self.service.stopping:
            self._handle(self.conn.sasl_outcome(False))
            self.finished = True
            return
        if ev.mechanism == "PLAIN":
            creds = plain_credentials(ev.response)
            if creds is None:
                self._login_failed("malformed PLAIN response")
                return
            if access.needs_introspection(creds[0], creds[1]):
                self.login_wait = (creds[1], ev)  # an opaque OAuth 2 token
                return
            user = access.authenticate(creds[0], creds[1], self.peer_host, "amqp10")
            if user is None:
                self._login_failed(f"login refused for user '{creds[0]}'")
                return
        elif ev.mechanism == "EXTERNAL" and self.peer_cert_user is not None:
            # as rabbitmq_auth_mechanism_ssl: the certificate's CN is the user, the
            # response (an authorization identity) is not looked at
            user, _text = access.login("EXTERNAL", b"", self.peer_host, self.peer_cert_user,
                                       protocol="amqp10")
            if user is None:
                self._login_failed(f"EXTERNAL login refused for certificate CN "
                                   f"'{self.peer_cert_user}'")
                return
        elif ev.mechanism == "ANONYMOUS" and self.service.anonymous_user:
            user = access.user(self.service.anonymous_user)
            if user is None:
                self._login_failed("the anonymous login user does not exist")
                return
        else:
            self._login_failed(f"unsupported SASL mechanism '{ev.mechanism}'")
            return
        self.user = user
        self.username = user.name
        self.auth_mechanism = ev.mechanism
        self._handle(self.conn.sasl_outcome(True))

    def _on_no_sasl(self) -> None:
        name = self.service.anonymous_user
        user = self.broker.access.user(name) if name else None
        if user is None:
            # RabbitMQ 4 requires SASL unless an anonymous login user is configured
            self._login_failed("AMQP header without SASL (no anonymous login user)")
            return
        self.user = user
        self.username = user.name
        self._handle(self.conn.sasl_outcome(True))

    def _on_open(self, ev: ConnectionOpened) -> None:
        broker = self.broker
        access = broker.access
        hostname = ev.hostname or ""
        # RabbitMQ 4: "vhost:NAME" selects the vhost; any other host name is the default one
        vhost_name = hostname[len("vhost:"):] if hostname.startswith("vhost:") else "/"
        self.container = ev.container or ""
        conn = self.conn
        vhost = broker.vhosts.get(vhost_name)
        if vhost is None:
            conn.close("amqp:not-found", f"vhost '{vhost_name}' does not exist")
            self.finished = True
            return
        user = self.user
        try:
            access.check_vhost(user, vhost_name)  # refuses a connection without a user
            assert user is not None
            access.check_connection_limits(user, vhost_name, broker.sessions)
        except errors.AMQPError as exc:
            conn.close("amqp:unauthorized-access", exc.text)
            self.finished = True
            return
        self.vhost = vhost
        self.authz = access.authz(user, vhost_name)
        self.audit_ctx = (vhost_name, self.username, self.peer, None)
        conn.username = self.username
        conn.accept_open({symbol("product"): "TrioMQ", symbol("version"): __version__,
                          symbol("platform"): "Python/trio"})
        broker.session_opened(self)
        self.delivering = True
        log.info("amqp 1.0 connection %s: user %r vhost %r", self.peer, self.username,
                 vhost_name)

    # ---- links ----
    def _on_attach(self, ev: LinkAttached) -> None:
        link = ev.link
        conn = self.conn
        if self.vhost is None:
            conn.refuse_link(link, "amqp:not-allowed", "connection not open")
            return
        coordinator = self.coordinator
        node = self.management
        if len(self.in_links) + len(self.out_links) \
                + (len(coordinator.links) if coordinator else 0) \
                + (node.link_count if node else 0) >= MAX_LINKS:
            conn.refuse_link(link, "amqp:resource-limit-exceeded",
                             f"more than {MAX_LINKS} links on one connection")
            return
        try:
            if ev.coordinator:
                if coordinator is None:
                    coordinator = self.coordinator = Coordinator(self)
                coordinator.links.add(link.key)
                self.conn.attach_coordinator(link, PUBLISH_CREDIT)
            elif ev.address == MANAGEMENT and not ev.dynamic:
                if node is None:
                    node = self.management = ManagementNode(self)
                if link.is_receiver:
                    node.attach_requests(link)
                else:
                    node.attach_responses(link)
            elif link.is_receiver:
                self._attach_publisher(link, ev.address)
            else:
                self._attach_consumer(link, ev.address, ev.dynamic, ev.selector)
        except errors.AMQPError as exc:
            conn.refuse_link(link, condition_of(exc), description_of(exc))
        except addresses.AddressError as exc:
            conn.refuse_link(link, "amqp:invalid-field", str(exc))

    def _attach_publisher(self, link, address: str | None) -> None:
        target = None
        store = None
        if address is not None:
            target = addresses.parse_target(address)
            store = self._check_target(target)
        self.in_links[link.key] = InLink(link, target)
        # (the credit as it is when the attach is answered)
        self.answer_when_durable(store, lambda: self.conn.attach_receiver(
            link, address, 0 if self.flow_queues else PUBLISH_CREDIT))

    def _check_target(self, target: addresses.Target) -> Any:
        """Refuses a target the link may not publish to; returns the store of a durable
        queue it declared (None: none)."""
        vhost = self.vhost
        store = None
        if target.queue is not None:
            if target.declare:
                store = self._ensure_queue(target.queue)
            elif vhost.find_queue(target.queue) is None:
                raise errors.not_found(vhost.queue_resource(target.queue))
        elif vhost.exchanges.get(target.exchange) is None:
            raise errors.not_found(vhost.exchange_resource(target.exchange))
        authz = self.authz
        if target.exchange not in authz.write_ok:
            authz.check("exchange", target.exchange, "write")
        return store

    def _declare(self, name: str, durable: bool, auto_delete: bool, exclusive: bool):
        authz = self.authz

        def authorize(qname: str) -> None:
            authz.check("queue", qname, "configure")

        return self.vhost.declare_queue(name, self if exclusive else None, authorize,
                                        durable=durable, auto_delete=auto_delete,
                                        exclusive=exclusive, arguments={})

    def _ensure_queue(self, name: str) -> Any:
        """Declares the durable queue ``name`` when it is missing, as ActiveMQ creates a
        queue on use; the store its definition went to (None: none, or it existed)."""
        if self.vhost.find_queue(name) is None:
            return self._declare(name, True, False, False).store
        return None

    def _attach_consumer(self, link, address: str | None, dynamic: bool,
                         selector: str | None = None) -> None:
        vhost = self.vhost
        authz = self.authz
        store = None
        if dynamic:
            q = self._declare("", False, True, True)
            address = addresses.queue_address(q.name)
        else:
            if address is None:
                raise addresses.AddressError("a receiving link needs a source address")
            source = addresses.parse_source(address)
            if source.queue is not None:
                if source.declare:
                    store = self._ensure_queue(source.queue)
                q = vhost.get_queue(source.queue, self)
            else:
                assert source.exchange is not None
                vhost.get_exchange(source.exchange)
                q = self._declare("", False, True, True)
                authz.check("exchange", source.exchange, "read")
                if authz.topics:
                    authz.check_topic(source.exchange, source.key, "read")
                authz.check("queue", q.name, "write")
                vhost.bind(source.exchange, q, source.key, {})
        authz.check("queue", q.name, "read")
        compiled = _selector(selector)  # 406 (amqp:precondition-failed) when it is invalid
        self.answer_when_durable(store, lambda: self._consume(link, address, q, selector,
                                                              compiled))

    def _consume(self, link, address: str | None, q: Queue, selector: str | None,
                 compiled: Any) -> None:
        """Answers a consumer's attach: the link consumes ``q`` from now on."""
        if q.deleted:  # (deleted while the attach waited for the store)
            self.conn.refuse_link(link, "amqp:resource-deleted",
                                  f"queue '{q.name}' in vhost '{q.vhost.name}' deleted")
            return
        self.conn.attach_sender(link, address)
        settled = link.snd_settle_mode == link.SND_SETTLED
        out = OutLink(self, link, q, settled)
        self._ctag += 1
        tag = f"amq.ctag-amqp10-{self._ctag}"
        # a JMS selector (the source's filter) is the queue's x-filter consumer argument
        args = {"x-filter": selector} if selector is not None else {}
        out.consumer = Consumer(tag, out, q, settled, False, 0, 0, args, compiled)
        self.out_links[link.key] = out
        self.consumers[tag] = out.consumer
        q.add_consumer(out.consumer)

    def _on_detach(self, link) -> None:
        self.in_links.pop(link.key, None)
        out = self.out_links.pop(link.key, None)
        if self.management is not None:
            self.management.detached(link)
        coordinator = self.coordinator
        if coordinator is not None:
            if link.key in coordinator.links:
                coordinator.link_detached(link.key)
            elif out is not None:
                coordinator.link_gone(out)
        if out is not None:
            self._drop_out_link(out)

    def _drop_out_link(self, out: OutLink) -> None:
        # a detached link's unsettled deliveries go back to their queue (spec: they may
        # be resumed; RabbitMQ 4 requeues them)
        consumer = out.consumer
        if consumer is not None:
            self.consumers.pop(consumer.tag, None)
            out.queue.remove_consumer(consumer)
        items = [(item.entry, item.consumer) for item in out.unacked.values()]
        out.unacked.clear()
        if items:
            items.sort(key=lambda pair: -pair[0].seq)
            out.queue.requeue(items)

    # ---- consuming ----
    def _on_credit(self, link) -> None:
        out = self.out_links.get(link.key)
        if out is None:
            if self.management is not None:
                self.management.credit(link)
            return
        out.queue.dispatch()
        if link.drain_mode and link.credit > 0:
            link.drained()  # nothing more to send: the credit is used up (spec 2.6.7)

    def _on_outcome(self, ev: OutcomeReceived) -> None:
        out = self.out_links.get(ev.link.key)
        d = ev.delivery
        if out is None:
            d.settle()
            return
        item = out.unacked.pop(d.tag, None)
        d.settle()
        if item is None:
            return
        if ev.txn_id is not None:
            try:
                if self.coordinator is None:
                    raise TxnError("amqp:transaction:unknown-id", "no transaction")
                self.coordinator.settle(ev.txn_id, out, d.tag, item, ev.outcome,
                                        ev.undeliverable_here)
            except TxnError as exc:
                # the delivery stays unsettled here: requeued when its link goes
                out.unacked[d.tag] = item
                log.warning("amqp 1.0 connection %s: %s", self.peer, exc.description)
            return
        self.apply_outcome(out, item, ev.outcome, ev.undeliverable_here)
        if item.queue.consumers:
            item.queue.dispatch()

    def apply_outcome(self, out: OutLink, item: Unacked, outcome: int,
                      undeliverable_here: bool) -> None:
        """A consumer's outcome for one delivery: ack, reject or requeue."""
        q = item.queue
        audit = self.audit
        if outcome in (0, Disposition.ACCEPTED, Disposition.RECEIVED):
            if audit is not None:
                audit.acked(out, item)
            q.ack(item.entry, item.consumer, reported=True)
        elif outcome == Disposition.REJECTED or (outcome == Disposition.MODIFIED
                                                 and undeliverable_here):
            if audit is not None:
                audit.rejected(out, [item], False, "rejected")
            q.reject(item.entry, item.consumer)
        else:  # released, modified
            if audit is not None:
                audit.rejected(out, [item], True, "nacked")  # (the trail's name for a requeue)
            q.requeue([(item.entry, item.consumer)])

    # ---- deliveries ----
    @property
    def can_deliver(self) -> bool:
        if not self.delivering:
            return False
        if self.pending_output > self.output_high_water:
            self.delivery_stalled = True
            return False
        return True

    @property
    def unacked_count(self) -> int:
        return sum(len(o.unacked) for o in self.out_links.values())

    def output_written(self) -> None:
        """The edge wrote what was queued."""
        self.pending_output = 0
        if self.delivery_stalled:
            self.delivery_stalled = False
            for out in list(self.out_links.values()):
                out.queue.dispatch()

    # ---- flow: held, its links get no more credit ----
    def flow_lifted(self) -> None:
        for inlink in self.in_links.values():
            self.conn.grant(inlink.link, PUBLISH_CREDIT)
        self.wake()

    # ---- as a connection in broker.sessions ----
    @property
    def protocol(self) -> str:
        return "AMQP 1-0"

    def client_properties(self) -> dict:
        return {"container_id": self.container}

    def force_close(self, error: errors.AMQPError) -> None:
        self.conn.close("amqp:connection:forced", description_of(error))
        self.finished = True
        self.connection_lost()
        self.wake()

    def close(self, reason: str) -> None:
        if self.ended:
            return
        log.info("amqp 1.0 connection %s: closing: %s", self.peer, reason)
        self.conn.close("amqp:connection:forced", reason)
        self.finished = True
        self.connection_lost()
        self.wake()

    def connection_lost(self) -> None:
        """Every way a connection ends comes here once: unsettled deliveries back to their
        queues, consumers leave, the connection's exclusive queues go."""
        if self.ended:
            return
        self.ended = True
        self.delivering = False
        if self.coordinator is not None:
            self.coordinator.connection_lost()  # before the links requeue what they hold
        outs = list(self.out_links.values())
        self.out_links.clear()
        self.in_links.clear()
        for out in outs:
            self._drop_out_link(out)
        self.consumers.clear()
        self.forget_flow()
        if self.vhost is not None:
            self.vhost.drop_owner(self)
            self.broker.session_closed(self)
