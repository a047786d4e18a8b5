"""One client connection as the broker sees it: channels, exclusive queues, flow state.

Synchronous: the trio edge (server.py) feeds it bytes and writes out what the
sans-IO connection has queued whenever ``wake`` is called.
"""
from __future__ import annotations

import logging

from .amqp import spec
from .amqp.connection import (
    AuthenticationFailed,
    ChannelClosedByPeer,
    ChannelException,
    ChannelOpened,
    ConnectionCloseCompleted,
    ConnectionClosedByPeer,
    ConnectionException,
    ConnectionOpened,
    ContentReceived,
    MethodReceived,
    ProtocolError,
    ServerConnection,
    State,
)
from .auth import make_authenticator
from .channel import Channel

log = logging.getLogger("broker.connection")

OUTPUT_HIGH_WATER = 1 << 20  # bytes queued for the socket before deliveries pause


class Session:
    def __init__(self, broker, peer: str, peer_host: str | None):
        self.broker = broker
        self.peer = peer
        self.conn = ServerConnection(
            make_authenticator(broker.users, peer_host), broker.vhosts.__contains__,
            frame_max=broker.config.frame_max, channel_max=broker.config.channel_max,
            heartbeat=broker.config.heartbeat)
        self.vhost = None
        self.channels: dict[int, Channel] = {}
        self._confirming: set = set()
        self.wake = lambda: None  # set by the edge: "there is output to write"
        self.delivery_stalled = False
        self.is_publisher = False
        self.blocked_sent = False
        self.finished = False  # the socket should be closed once output is flushed
        self.closed = False

    @property
    def output_full(self) -> bool:
        if self.conn.pending_output > OUTPUT_HIGH_WATER:
            self.delivery_stalled = True
            return True
        return False

    # ---- input ----
    def data_received(self, data: bytes) -> None:
        events = self.conn.receive_data(data)
        if events:
            self._handle_events(events)
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
                elif kind is ChannelOpened:
                    channels[ev.channel] = Channel(self, ev.channel)
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
            except ConnectionException as exc:
                log.warning("connection %s: closing: %s", self.peer, exc.text)
                self.flush_confirms()
                self.conn.close(exc.code, exc.text, exc.class_id, exc.method_id)
                self._close_all_channels()
            except ChannelException as exc:
                number = getattr(ev, "channel", 0)
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
    def output_drained(self) -> None:
        if self.delivery_stalled and not self.output_full:
            self.delivery_stalled = False
            for ch in list(self.channels.values()):
                for consumer in list(ch.consumers.values()):
                    consumer.queue.dispatch()

    def consumer_cancelled(self, consumer) -> None:
        consumer.channel.consumer_cancelled_by_broker(consumer)

    def force_close(self, code: int, text: str) -> None:
        self._close_all_channels()
        self.conn.close(code, text)
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
        self._close_all_channels()
        if self.vhost is not None:
            self.vhost.drop_owner(self)
        self.broker.session_closed(self)
