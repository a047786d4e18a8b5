"""The STOMP listener's trio edge: sockets (plain and TLS), one nursery per connection.

Each connection's nursery holds its reader (the CONNECT timeout, the client's heart-beats,
resource alarms), its writer (woken by ``wake``) and, when heart-beats were negotiated,
the task sending the server's; all of it is ``edge``'s. ``install(broker)`` adds the
listener to ``broker.background_tasks`` when ``config.stomp_port`` or
``config.stomps_port`` is set. The protocol is ``broker.stomp`` (sans-IO); the broker side
is ``stomp_session``.
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import trio

from ..stomp.connection import State
from . import stomp_configured
from .edge import EdgeListener, HeartbeatEdge, listen_host, peer_of, tcp_socket
from .stomp_session import StompService, StompSession
from .stomp_ws import WebStompListeners

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.stomp")

# the client's heart-beats may be this late (RabbitMQ's plugin allows twice the interval)
HEARTBEAT_TOLERANCE = 2.0


class StompConnectionHandler(HeartbeatEdge):
    what = "stomp connection"
    log = log

    def __init__(self, listener: StompListener, stream, sock, tls: bool,
                 session_class: type[StompSession] = StompSession):
        super().__init__(listener, stream, sock)
        host, self.peer = peer_of(sock)
        self.attach(session_class(listener.service, self.peer, host), sock, tls)

    def deadline(self) -> float:
        conn = self.session.conn
        if conn.state is State.AWAIT_CONNECT:
            return self._started + self.listener.broker.config.handshake_timeout
        if conn.heartbeat_receive:
            return self._last_received + HEARTBEAT_TOLERANCE * conn.heartbeat_receive / 1000
        return math.inf

    def timed_out(self) -> None:
        if self.session.conn.state is State.AWAIT_CONNECT:
            log.warning("stomp connection %s: no CONNECT in time", self.peer)
        else:
            log.warning("stomp connection %s: missed heart-beats", self.peer)
        self.session.close("heart-beat timeout")

    def heartbeat_interval(self) -> float:
        conn = self.session.conn
        return conn.heartbeat_send / 1000 if conn.state is State.OPEN else 0.0

    def send_heartbeat(self) -> None:
        self.session.conn.heartbeat()  # an EOL


class StompListener(EdgeListener):
    """Plain and TLS listeners of one broker; ``ports`` holds the bound ports once open."""

    log = log

    def __init__(self, broker: Broker):
        super().__init__(broker)
        self.service = StompService(broker)
        self.websockets = WebStompListeners(self)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        host = listen_host(config)
        listeners = await self.open_pair(host, ("stomp", config.stomp_port),
                                         ("stomps", config.stomps_port, "--stomps-port"))
        ws_listeners = await self.websockets.open(host)
        task_status.started(self.ports)
        await self.serve_ports(listeners, ws_listeners, self.websockets.handle)

    async def _handle(self, stream) -> None:
        sock, tls = tcp_socket(stream)
        await self.serve_connection(stream, sock, tls)

    async def serve_connection(self, stream, sock, tls: bool,
                               session_class: type[StompSession] = StompSession) -> None:
        """One STOMP connection on ``stream`` (TCP, TLS or a WebSocket's)."""
        await self.serve(StompConnectionHandler(self, stream, sock, tls, session_class))


def install(broker: Broker) -> StompListener | None:
    """Start the STOMP listener(s) with the broker when configured (``broker.stomp``)."""
    if not stomp_configured(broker.config):
        return None
    listener = StompListener(broker)
    broker.background_tasks.append(listener.run)
    return listener
