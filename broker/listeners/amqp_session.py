"""One client connection as the broker sees it: channels, exclusive queues, flow state.

Synchronous: the trio edge (amqp.py) feeds it bytes and writes out what the
sans-IO connection has queued whenever ``wake`` is called.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import __version__, errors
from ..amqp import spec
from ..amqp.connection import ServerConnection
from ..amqp.events import (
    LOGIN_PENDING,
    AuthenticationFailed,
    ChannelClosedByPeer,
    ChannelOpened,
    ConnectionCloseCompleted,
    ConnectionClosedByPeer,
    ConnectionOpened,
    ContentReceived,
    ContentStarted,
    MethodReceived,
    ProtocolError,
    State,
)
from ..security.oauth2 import TokenUser
from .amqp_channel import Channel
from .session_base import clocked

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import Queue
    from ..security.authz import Authz
    from ..security.model import User
    from ..vhost import VirtualHost

log = logging.getLogger("broker.connection")

_PUBLISH = spec.Basic.Publish()


class Session:
    # its channels count their own deliveries and publishes (stats_*): the amqp091 ones
    metrics_protocol: str | None = None
    messages_published = 0  # a stream protocol counter: none here

    def __init__(self, broker: Broker, peer: str, peer_host: str | None,
                 peer_cert_user: str | None = None, tls: bool = False):
        self.broker = broker
        self.audit = broker.audit  # the audit trail, or None
        self.peer = peer
        self.peer_host = peer_host
        self.tls = tls  # the management API's ``ssl``
        # TLS: the client certificate's CN (the EXTERNAL mechanism's user), if verified
        self.peer_cert_user = peer_cert_user
        self.user: User | None = None  # once logged in
        # an opaque OAuth 2 token the edge introspects before start-ok is decided (None: no
        # login waiting); ``resume_login`` once it is done
        self.login_wait: str | None = None
        self.authz: Authz | None = None  # its cached permission checks in the vhost
        # seconds the edge waits before writing out a failed login's answer
        self.output_delay = 0.0
        self.conn = ServerConnection(
            self._authenticate, self._open_vhost,
            frame_max=broker.config.frame_max, channel_max=broker.config.channel_max,
            heartbeat=broker.config.heartbeat, max_message_size=broker.config.max_message_size,
            max_partial_bodies=broker.config.max_partial_bodies,
            server_properties={"version": __version__},
            mechanisms=b"AMQPLAIN PLAIN EXTERNAL" if tls else b"AMQPLAIN PLAIN")
        self.conn.update_secret = self._update_secret
        self.output_high_water = broker.config.output_high_water
        self.flow_high = broker.config.flow_high or float("inf")
        self.flow_low = broker.config.flow_low
        self.flow_high_bytes = (broker.config.flow_high_bytes if broker.config.flow_high
                                else 0) or float("inf")
        self.flow_low_bytes = broker.config.flow_low_bytes
        # Flow control: the queues this connection published into above their threshold
        # and that have not drained since. Non-empty = "in flow": the edge stops reading.
        self.flow_queues: set = set()
        self.flow_resumed = lambda: None  # set by the edge: "read again"
        self.vhost: VirtualHost | None = None
        self.channels: dict[int, Channel] = {}
        self._confirming: set = set()
        self.wake = lambda: None  # set by the edge: "there is output to write"
        self.delivery_stalled = False
        self.is_publisher = False
        self.blocked_sent = False
        self._partial_seen = 0  # conn.partial_bytes when last looked at (data_received)
        self.finished = False  # the socket should be closed once output is flushed
        self.closed = False

    # ---- security (broker.access) ----
    def _update_secret(self, secret: bytes, reason: str) -> None:
        """connection.update-secret: a new secret (an OAuth 2 token) for the same user; its
        permissions apply to every channel at once. Refused as RabbitMQ: 530. A password
        user keeps its login, whatever the secret (RabbitMQ's internal backend does too)."""
        user = self.user
        if not isinstance(user, TokenUser):
            return
        new, _why = self.broker.access.check_login(
            user.name if user is not None else "", secret.decode("utf-8", "replace"),
            self.peer_host)
        if new is None or user is None or new.name != user.name:
            log.warning("Secret update was refused for user '%s'",
                        user.name if user is not None else "")
            raise errors.not_allowed("New secret was refused by one of the backends")
        self.user = new
        if self.vhost is not None:
            self.authz = self.broker.access.authz(new, self.vhost.name)
            for ch in self.channels.values():
                ch.authz = self.authz
        log.info("connection %s: user '%s' updated secret, reason: %s", self.peer, new.name,
                 reason)

    def _authenticate(self, mechanism: str, response: bytes) -> tuple[str | None, str]:
        access = self.broker.access
        if access.oauth2 is not None and mechanism in ("PLAIN", "AMQPLAIN"):
            from ..security.login import parse_credentials
            creds = parse_credentials(mechanism, response)
            if creds is not None and access.needs_introspection(*creds):
                self.login_wait = creds[1]
                return None, LOGIN_PENDING
        user, refusal = access.login(mechanism, response, self.peer_host,
                                     self.peer_cert_user)
        if user is None:
            self.output_delay = self.broker.access.failure_delay
            return None, refusal
        self.user = user
        return user.name, ""

    def _open_vhost(self, name: str) -> bool:
        """connection.open: False if the vhost does not exist; 530 for the limits and a
        user without permissions there (RabbitMQ's order)."""
        if name not in self.broker.vhosts:
            return False
        user = self.user
        assert user is not None, "connection.open before the login"  # (the sans-IO's order)
        access = self.broker.access
        access.check_connection_limits(user, name, self.broker.sessions)
        access.check_vhost(user, name)
        self.authz = access.authz(user, name)
        return True

    @property
    def output_full(self) -> bool:
        if self.conn.pending_output > self.output_high_water:
            self.delivery_stalled = True
            return True
        return False

    # ---- input ----
    def resume_login(self) -> None:
        """The edge introspected ``login_wait``: start-ok is decided now."""
        self.login_wait = None
        events = self.conn.resume_login()
        if events:
            self._handle_events(events)
        if self.conn.has_output:
            self.wake()

    def data_received(self, data: bytes) -> None:
        events = self.conn.receive_data(data)
        partial = self.conn.partial_bytes
        if partial != self._partial_seen:  # large bodies in progress: the memory alarm
            if partial > self._partial_seen:
                self.broker.bodies_grew(partial - self._partial_seen)
            self._partial_seen = partial
        if events:
            clocked(self.audit, self._handle_events, events)
        if self._confirming:
            self.flush_confirms()
        if self.conn.has_output:
            self.wake()

    def _handle_events(self, events: list) -> None:
        channels = self.channels
        for ev in events:
            kind = type(ev)
            try:
                if kind is ContentReceived:
                    ch = channels.get(ev.channel)
                    if ch is not None:
                        self.is_publisher = True
                        ch.on_publish(ev)
                elif kind is MethodReceived:
                    ch = channels.get(ev.channel)
                    if ch is not None:
                        ch.handle(ev.method)
                elif kind is ContentStarted:
                    # a large body: refuse a publisher without write permission before
                    # its body is read (what follows on the channel is then dropped)
                    self.is_publisher = True
                    authz = self.authz
                    if authz is not None and ev.exchange not in authz.write_ok:
                        authz.check("exchange", ev.exchange, "write")
                elif kind is ChannelOpened:
                    channels[ev.channel] = Channel(self, ev.channel)
                    self.broker.churn.channels_opened += 1
                    if self.user is not None:
                        self.broker.access.check_channel_limit(self.user, self.broker.sessions)
                elif kind is ChannelClosedByPeer:
                    ch = channels.pop(ev.channel, None)
                    if ch is not None:
                        self._flush_channel_confirms(ch)
                        ch.close()
                    self.conn.accept_channel_close(ev.channel)
                elif kind is ConnectionOpened:
                    self.vhost = self.broker.vhosts[ev.vhost]
                    self.broker.session_opened(self)
                    log.info("connection %s: user %r opened vhost %r", self.peer, ev.username,
                             ev.vhost)
                elif kind is ConnectionClosedByPeer:
                    self._close_all_channels()
                    self.conn.accept_close()
                    self.finished = True
                elif kind is ConnectionCloseCompleted:
                    self.finished = True
                elif kind is ProtocolError:
                    log.warning("connection %s: closing: %s %s", self.peer, ev.reply_code,
                                ev.reply_text)
                    if self.conn.state is State.CLOSING or self.conn.state is State.CLOSED:
                        self._close_all_channels()
                elif kind is AuthenticationFailed:
                    log.warning("connection %s: authentication failed: %s", self.peer,
                                ev.reply_text)
            except errors.AMQPError as exc:
                number = ev.channel
                # The failing method is known here, not at the raise site.
                exc.for_method(ev.method if kind is MethodReceived
                               else _PUBLISH if kind is ContentReceived or kind is ContentStarted
                               else None)
                if exc.hard or number == 0:
                    log.warning("connection %s: closing: %s", self.peer, exc.text)
                    self.flush_confirms()
                    self.conn.close(exc.code, exc.text, exc.class_id, exc.method_id)
                    self._close_all_channels()
                    continue
                log.info("connection %s channel %s: %s", self.peer, number, exc.text)
                ch = channels.pop(number, None)
                if ch is not None:
                    self._flush_channel_confirms(ch)
                self.conn.close_channel(number, exc.code, exc.text, exc.class_id, exc.method_id)
                if ch is not None:
                    ch.close()
        if self.conn.state is State.CLOSED:
            self.finished = True

    # ---- confirms ----
    def confirms_pending(self, channel: Channel) -> None:
        self._confirming.add(channel)

    def flush_confirms(self) -> None:
        for ch in self._confirming:
            ch.flush_confirms()
        self._confirming.clear()
        self.wake()

    def _flush_channel_confirms(self, ch: Channel) -> None:
        """Confirms decided in this batch go out before the channel's close or close-ok."""
        if ch in self._confirming:
            self._confirming.discard(ch)
            ch.flush_confirms()

    # ---- flow ----
    @property
    def in_flow(self) -> bool:
        return bool(self.flow_queues)

    @property
    def flow_state(self) -> str:
        """``"flow"`` while throttled by credit flow, else ``"running"`` (management API)."""
        return "flow" if self.flow_queues else "running"

    def queue_over_threshold(self, queue: Queue) -> None:
        """This connection published into ``queue`` (which has consumers) above its flow
        threshold: put it in flow until the queue drains -- unless it consumes or holds
        unacknowledged messages itself, since then its unread acks could be what the queue
        (or another publisher's queue) waits for. Such a connection is only read in slices."""
        if queue in self.flow_queues or self.closed:
            return
        for ch in self.channels.values():
            if ch.consumers or ch.unacked:
                return
        if not self.flow_queues:
            log.debug("connection %s: flow (queue %r has %d ready messages)", self.peer,
                      queue.name, len(queue.ready))
        self.flow_queues.add(queue)
        queue.flow_wait(self, self.flow_low, self.flow_low_bytes)

    def flow_released(self, queue: Queue) -> None:
        """``queue`` drained below its low-water mark (or lost its consumers)."""
        flow = self.flow_queues
        if queue in flow:
            flow.discard(queue)
            if not flow:
                log.debug("connection %s: running", self.peer)
                self.flow_resumed()

    def output_drained(self) -> None:
        if self.delivery_stalled and not self.output_full:
            self.delivery_stalled = False
            for ch in list(self.channels.values()):
                for consumer in list(ch.consumers.values()):
                    consumer.queue.dispatch()

    def consumer_cancelled(self, consumer) -> None:
        consumer.channel.consumer_cancelled_by_broker(consumer)

    def connection_info(self) -> dict:
        """The protocol's own fields of the management API's connection object (every
        connection in ``broker.sessions`` has this: listeners/mqtt_session.py too)."""
        conn = self.conn
        return {"protocol": "AMQP 0-9-1", "auth_mechanism": "PLAIN",
                "channel_max": conn.channel_max, "frame_max": conn.frame_max,
                "timeout": conn.heartbeat, "client_properties": conn.client_properties}

    def close_channel(self, ch: Channel, error: errors.AMQPError) -> None:
        """Close channel ``ch`` from the broker's side, outside any method (a consumer
        timeout): the channel.close goes out, its unacked deliveries are requeued."""
        if self.channels.get(ch.number) is not ch:
            return
        del self.channels[ch.number]
        self._flush_channel_confirms(ch)
        self.conn.close_channel(ch.number, error.code, error.text, error.class_id,
                                error.method_id)
        ch.close()
        self.wake()

    def force_close(self, error: errors.AMQPError) -> None:
        """Close the connection from the broker's side (shutdown, store failure, ...)."""
        self._close_all_channels()
        self.conn.close(error.code, error.text)
        self.wake()

    # ---- teardown ----
    def _close_all_channels(self) -> None:
        if self._confirming:
            self.flush_confirms()
        channels = list(self.channels.values())
        self.channels.clear()
        # All channels stop taking deliveries first: what one channel requeues must not be
        # dispatched to a consumer on a sibling channel that is about to go too.
        for ch in channels:
            ch.stop_deliveries()
        for ch in channels:
            ch.close()

    def connection_lost(self) -> None:
        """Socket gone: release everything (requeue unacked, drop exclusive queues)."""
        if self.closed:
            return
        self.closed = True
        for queue in self.flow_queues:
            queue.flow_forget(self)
        self.flow_queues.clear()
        self._close_all_channels()
        if self.vhost is not None:
            self.vhost.drop_owner(self)
        self.broker.session_closed(self)
