"""STOMP over WebSockets (ws and wss), as RabbitMQ's Web STOMP plugin serves it: an HTTP
upgrade on the path ``/ws`` (subprotocols ``v12.stomp``, ``v11.stomp``, ``v10.stomp``,
``stomp``, or none), then STOMP frames in text or binary WebSocket frames; the server
writes binary frames. The WebSocket side is MQTT's (``mqtt_ws``: wsproto, the same
bounded handshake and stream); the STOMP side is the plain listener's handler.
"""
from __future__ import annotations

import logging
import socket
import ssl
from typing import TYPE_CHECKING

import trio
from wsproto.events import Request

from . import ListenError
from .mqtt_ws import handshake
from .stomp_session import StompSession

if TYPE_CHECKING:
    from .stomp import StompListener

log = logging.getLogger("broker.stomp")

PATH = "/ws"  # RabbitMQ's Web STOMP endpoint
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp", "stomp")


def choose(request: Request) -> tuple[int, str | None]:
    """(HTTP status, subprotocol): 404 for another path; a STOMP subprotocol when one is
    offered, else none (RabbitMQ's Web STOMP accepts clients that offer none)."""
    if request.target.split("?", 1)[0] != PATH:
        return 404, None
    offered = [p.lower() for p in request.subprotocols]
    for name in SUBPROTOCOLS:
        if name in offered:
            return 101, request.subprotocols[offered.index(name)]
    if request.subprotocols:
        return 400, None  # only other protocols offered
    return 101, None


class WebStompSession(StompSession):
    """Listed with the protocol 'Web STOMP 1.2' (management API, ctl)."""

    @property
    def protocol(self) -> str:
        return "Web " + super().protocol


class WebStompListeners:
    def __init__(self, listener: StompListener):
        self.listener = listener
        self.config = listener.broker.config

    async def open(self, host: str | None) -> list:
        config = self.config
        out: list = []
        for name, port, tls in (("stomp-ws", config.stomp_ws_port, False),
                                ("stomp-wss", config.stomp_wss_port, True)):
            if port is None:
                continue
            try:
                listeners = await trio.open_tcp_listeners(port, host=host)
            except OSError as exc:
                raise ListenError(f"cannot listen for {name} on {host or '*'}:{port}: "
                                  f"{exc.strerror or exc}") from None
            self.listener.ports[name] = listeners[0].socket.getsockname()[1]
            log.info("%s listening on %s:%s", name.upper(), host or "*",
                     self.listener.ports[name])
            if tls:
                ctx = self.listener.ssl_context("--stomp-wss-port")
                # browsers end TLS without close_notify: not an error here
                out += [trio.SSLListener(lst, ctx, https_compatible=True) for lst in listeners]
            else:
                out += listeners
        return out

    async def handle(self, stream) -> None:
        raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        sock = raw.socket
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
            host, port = sock.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        ws_stream = None
        try:
            with trio.move_on_after(self.config.handshake_timeout) as scope:
                ws_stream = await handshake(stream, peer, choose, text=True)
            if scope.cancelled_caught:
                log.warning("stomp websocket %s: no upgrade request in time", peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            pass
        if ws_stream is None:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            return
        await self.listener.serve_connection(ws_stream, sock, raw is not stream,
                                             WebStompSession)
