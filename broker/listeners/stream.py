"""The Stream-protocol listener's trio edge: sockets (plain and TLS), one nursery per
connection.

Each connection's nursery holds its reader (the handshake timeout, the client's
heartbeats, resource alarms) and its writer (woken by the session; it also sends the
server's heartbeats when nothing else was written for the negotiated interval).
``install(broker)`` adds the listener to ``broker.background_tasks`` when
``config.stream_port`` or ``config.stream_tls_port`` is set; with
``config.stream_optional`` a port already taken only logs a warning (RabbitMQ's 5552 on
the same machine). The protocol is ``broker.streamproto`` (sans-IO); the broker side is
``stream_session``.
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from ..streamproto.connection import State
from . import ListenError
from .edge import EdgeListener, HeartbeatEdge, listen_host, peer_of, tcp_socket
from .stream_session import StreamService, StreamSession

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.stream")

# a client's heartbeats may be this late (RabbitMQ closes after two missed ones)
HEARTBEAT_TOLERANCE = 2.0


class StreamConnectionHandler(HeartbeatEdge):
    what = "stream connection"
    log = log
    yield_after_read = True

    def __init__(self, listener: StreamListener, stream, sock, tls: bool):
        super().__init__(listener, stream, sock)
        host, self.peer = peer_of(sock)
        try:
            local_host, local_port = sock.getsockname()[:2]
        except OSError:
            local_host, local_port = "localhost", 0
        self.session = StreamSession(listener.service, self.peer, host,
                                     listener.advertised_host or local_host, local_port, tls)
        self.session.wake = self._wake

    def deadline(self) -> float:
        conn = self.session.conn
        if conn.state is State.CLOSING:
            return self._last_received + self.listener.broker.config.handshake_timeout
        if conn.state is not State.OPEN:
            return self._started + self.listener.broker.config.handshake_timeout
        if conn.heartbeat:
            return self._last_received + HEARTBEAT_TOLERANCE * conn.heartbeat
        return math.inf

    def timed_out(self) -> None:
        session = self.session
        if session.conn.state is State.OPEN:
            log.warning("stream connection %s: missed heartbeats", self.peer)
            session.close("missed heartbeats")
        else:
            log.warning("stream connection %s: no handshake in time", self.peer)
            session.finished = True
            session.connection_lost()

    def output(self) -> bytes:
        return b"".join(self.session.conn.buffers_to_send())

    def heartbeat_interval(self) -> float:
        conn = self.session.conn
        return conn.heartbeat if conn.state is State.OPEN else 0

    def send_heartbeat(self) -> None:
        self.session.conn.heartbeat_frame()


class StreamListener(EdgeListener):
    """Plain and TLS listeners of one broker; ``ports`` holds the bound ports once open."""

    log = log

    def __init__(self, broker: Broker):
        super().__init__(broker)
        self.service = StreamService(broker)
        self.advertised_host: str | None = broker.config.stream_advertised_host

    async def open_port(self, name: str, port: int, host: str | None,
                        tls_option: str | None = None, https_compatible: bool = False,
                        label: str | None = None) -> list:
        try:
            return await super().open_port(name, port, host, tls_option, label=name)
        except ListenError as exc:
            if name == "stream" and self.broker.config.stream_optional:
                log.warning("%s; the Stream protocol is not served (--stream-port)", exc)
                return []
            raise

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        listeners = await self.open_pair(
            listen_host(config), ("stream", config.stream_port),
            ("stream-tls", config.stream_tls_port, "--stream-tls-port"))
        self.service.watch_vhosts()
        task_status.started(self.ports)
        await self.serve_ports(listeners)

    async def _handle(self, stream) -> None:
        sock, tls = tcp_socket(stream)
        await self.serve(StreamConnectionHandler(self, stream, sock, tls))


def install(broker: Broker) -> StreamListener | None:
    """Start the Stream-protocol listener(s) with the broker when configured
    (``broker.stream``)."""
    config = broker.config
    if config.stream_port is None and config.stream_tls_port is None:
        return None
    listener = StreamListener(broker)
    broker.background_tasks.append(listener.run)
    return listener
