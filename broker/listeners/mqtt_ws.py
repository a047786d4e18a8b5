"""MQTT over WebSockets (ws and wss), as RabbitMQ's Web MQTT plugin and Mosquitto's
websockets listener serve it: an HTTP upgrade on the path ``/ws`` with the subprotocol
``mqtt``, then MQTT packets in binary frames (MQTT 3.1.1 section 6).

The WebSocket protocol is wsproto's (sans-IO). ``WebSocketStream`` is a trio stream over
the socket (or TLS) stream: it unwraps binary frames into the bytes the MQTT connection
reads, whatever the frame boundaries (a packet may span frames, a frame may hold several
packets), and wraps what the MQTT connection writes into one binary frame per write. The
MQTT side (``mqtt.MQTTConnectionHandler``, the sans-IO ``ServerConnection``) is the one
plain MQTT uses; so are its size limits, keep-alive and CONNECT timeout.

Memory is bounded by what was received, never by what the peer declares: the upgrade
request by h11's 16 KiB limit on an incomplete request (and the handshake timeout); data
frames are handed on as their bytes arrive (wsproto streams them), so a frame's declared
length reserves nothing; control frames are at most 125 bytes. No extension is offered
(no permessage-deflate: nothing is inflated).
"""
from __future__ import annotations

import logging
import socket
import ssl
from typing import TYPE_CHECKING

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from . import ListenError
from .mqtt_session import MQTTSession

if TYPE_CHECKING:
    from .mqtt import MQTTListener

log = logging.getLogger("broker.mqtt")

PATH = "/ws"  # RabbitMQ's Web MQTT endpoint
# 'mqtt' (MQTT-6.0.0-3; all RabbitMQ's Web MQTT accepts) and 'mqttv3.1', which older
# MQTT 3.1 clients offer and Mosquitto's websockets listener accepts too
SUBPROTOCOLS = ("mqtt", "mqttv3.1")
HANDSHAKE_READ = 4096
_CLOSE = [(b"connection", b"close")]


class WebSocketStream(trio.abc.Stream):
    """The MQTT byte stream inside an accepted WebSocket connection. One task receives,
    another may send: frames the receiver answers (pong, close) share the sender's lock."""

    def __init__(self, stream: trio.abc.Stream, ws: WSConnection, peer: str,
                 text: bool = False):
        self.stream = stream
        self.ws = ws
        self.peer = peer
        self.text = text  # text frames carry the protocol too (STOMP's; MQTT's never)
        self._send_lock = trio.Lock()
        self._eof = False

    async def _send_raw(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        ws = self.ws
        while not self._eof:
            out = []
            for event in ws.events():
                if isinstance(event, BytesMessage):
                    if event.data:  # an empty frame is no EOF: b"" would say so
                        out.append(event.data)
                elif isinstance(event, Ping):
                    await self._send_raw(ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    await self._closed_by_peer(event)
                    break
                elif isinstance(event, TextMessage) and self.text:
                    if event.data:
                        out.append(event.data.encode())
                elif isinstance(event, TextMessage):
                    # MQTT-6.0.0-1: only binary frames carry MQTT
                    log.warning("mqtt websocket %s: text frame: closing", self.peer)
                    await self._close(CloseReason.UNSUPPORTED_DATA, "MQTT needs binary frames")
                    break
                # Pong: nothing to do
            if out:
                return b"".join(out)
            if self._eof:
                break
            data = await self.stream.receive_some(max_bytes)
            if not data:  # the TCP connection ended without a close frame
                self._eof = True
                break
            ws.receive_data(bytes(data))
        return b""

    async def _closed_by_peer(self, event: CloseConnection) -> None:
        ws = self.ws
        if ws.state is ConnectionState.REMOTE_CLOSING:
            await self._send_raw(ws.send(event.response()))
            self._eof = True
        else:
            # wsproto reports a malformed frame as a close event with the code to send
            log.warning("mqtt websocket %s: closing: %s", self.peer, event.reason)
            await self._close(event.code, event.reason or "")

    async def _close(self, code: int, reason: str) -> None:
        self._eof = True
        if self.ws.state is ConnectionState.OPEN:
            await self._send_raw(self.ws.send(CloseConnection(code=code, reason=reason)))

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.ws.state is not ConnectionState.OPEN:
            return  # the WebSocket is closing: MQTT output has nowhere to go
        frame = self.ws.send(Message(data=bytes(data)))
        await self._send_raw(frame)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        try:
            if self.ws.state is ConnectionState.OPEN:
                with trio.move_on_after(1):
                    await self._close(CloseReason.NORMAL_CLOSURE, "")
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError,
                OSError, ssl.SSLError):
            pass
        finally:
            await self.stream.aclose()


class WebMQTTSession(MQTTSession):
    """An MQTT session over a WebSocket: listed (management API, ctl) with the protocol
    'Web MQTT 3.1.1', as RabbitMQ lists its Web MQTT connections."""

    __slots__ = ()

    @property
    def protocol(self) -> str:
        return "Web " + super().protocol


def _choose(request: Request) -> tuple[int, str | None]:
    """(HTTP status, subprotocol): 101 to accept, else the refusal RabbitMQ's Web MQTT
    answers (404 for another path, 400 without an MQTT subprotocol)."""
    if request.target.split("?", 1)[0] != PATH:
        return 404, None
    for offered in request.subprotocols:
        if offered.lower() in SUBPROTOCOLS:
            return 101, offered
    return 400, None


async def handshake(stream: trio.abc.Stream, peer: str, choose=_choose,
                    text: bool = False) -> WebSocketStream | None:
    """The HTTP upgrade: a WebSocketStream, or None once a refusal is written (or the
    client went away). The caller bounds its time. ``choose(request)``: (HTTP status,
    subprotocol); ``text``: text frames carry the protocol too."""
    ws = WSConnection(ConnectionType.SERVER)
    while True:
        data = await stream.receive_some(HANDSHAKE_READ)
        if not data:
            return None
        try:
            ws.receive_data(bytes(data))
            for event in ws.events():
                if not isinstance(event, Request):
                    continue
                status, subprotocol = choose(event)
                if status != 101:
                    log.warning("mqtt websocket %s: refused %s %r (subprotocols %s)",
                                peer, status, event.target, event.subprotocols)
                    await stream.send_all(ws.send(RejectConnection(
                        status_code=status, headers=_CLOSE)))
                    return None
                await stream.send_all(ws.send(AcceptConnection(subprotocol=subprotocol)))
                _take_trailing(ws)
                return WebSocketStream(stream, ws, peer, text)
        except RemoteProtocolError as exc:
            # not a WebSocket upgrade, or an HTTP request too large (h11's limit):
            # the status wsproto suggests (400; 426 for another WebSocket version)
            log.warning("mqtt websocket %s: bad upgrade request: %s", peer, exc)
            hint = exc.event_hint
            status = hint.status_code if isinstance(hint, RejectConnection) else 400
            headers = list(hint.headers) if isinstance(hint, RejectConnection) else []
            try:
                answer = ws.send(RejectConnection(status_code=status,
                                                  headers=headers + _CLOSE))
            except Exception:  # h11 may refuse to answer a request it could not parse
                answer = (b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\n"
                          b"content-length: 0\r\n\r\n")
            await stream.send_all(answer)
            return None


def _take_trailing(ws: WSConnection) -> None:
    """Bytes a client sent right behind its upgrade request (before the 101, which RFC 6455
    says it must wait for) stay in h11's buffer, which wsproto does not hand on: fed to
    the WebSocket connection here so they are not lost."""
    h11_conn = getattr(ws.handshake, "_h11_connection", None)
    trailing = getattr(h11_conn, "trailing_data", (b"", False))[0]
    if trailing and ws.connection is not None:
        ws.connection.receive_data(bytes(trailing))


class WebSocketListeners:
    """The ws and wss listeners of the MQTT listener (``listener``): each accepted upgrade
    becomes an MQTT connection of ``listener``, served by the same handler as TCP ones."""

    def __init__(self, listener: MQTTListener):
        self.listener = listener
        self.config = listener.broker.config

    @property
    def configured(self) -> bool:
        return self.config.mqtt_ws_port is not None or self.config.mqtt_wss_port is not None

    async def open(self, host: str | None) -> list:
        config = self.config
        out: list = []
        for name, port, tls in (("mqtt-ws", config.mqtt_ws_port, False),
                                ("mqtt-wss", config.mqtt_wss_port, True)):
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
                ctx = self._ssl_context()
                # browsers end TLS without close_notify: not an error here
                out += [trio.SSLListener(lst, ctx, https_compatible=True) for lst in listeners]
            else:
                out += listeners
        return out

    def _ssl_context(self) -> ssl.SSLContext:
        from ..security.tls import TLSConfigError, server_context
        try:
            return server_context(self.config)
        except TLSConfigError as exc:
            raise ListenError(f"--mqtt-wss-port: {exc}") from None

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
                ws_stream = await handshake(stream, peer)
            if scope.cancelled_caught:
                log.warning("mqtt websocket %s: no upgrade request in time", peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            pass
        if ws_stream is None:
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await stream.aclose()
            return
        await self.listener.serve_connection(ws_stream, sock, raw is not stream, direct=False,
                                             session_class=WebMQTTSession)
