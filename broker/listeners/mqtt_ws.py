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
import ssl

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

from .edge import DROPPED, close_stream, peer_of, tcp_socket
from .mqtt_session import MQTTSession

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
    # wsproto's private h11 connection: absent in a version that does not keep one
    h11_conn = getattr(ws.handshake, "_h11_connection", None)
    trailing = getattr(h11_conn, "trailing_data", (b"", False))[0]
    if trailing and ws.connection is not None:
        ws.connection.receive_data(bytes(trailing))


class WebSocketPorts:
    """The ws and wss ports of a listener (``listener``, an ``edge.EdgeListener``): each
    accepted upgrade becomes a connection of ``listener``, served by the handler its TCP
    connections have."""

    kind = "mqtt"  # the log lines' "<kind> websocket"
    text = False  # text frames carry the protocol too
    choose = staticmethod(_choose)

    def __init__(self, listener):
        self.listener = listener
        self.config = listener.broker.config

    def specs(self) -> tuple[tuple[str, int | None, bool, str], ...]:
        """(name, port, TLS, the TLS setting's option) of each port."""
        raise NotImplementedError

    async def serve(self, ws_stream: WebSocketStream, sock, tls: bool) -> None:
        raise NotImplementedError

    async def open(self, host: str | None) -> list:
        out: list = []
        for name, port, tls, option in self.specs():
            if port is not None:
                # browsers end TLS without close_notify: not an error here
                out += await self.listener.open_port(name, port, host, option if tls else None,
                                                     https_compatible=True)
        return out

    async def handle(self, stream) -> None:
        sock, tls = tcp_socket(stream)
        _, peer = peer_of(sock)
        ws_stream = None
        try:
            with trio.move_on_after(self.config.handshake_timeout) as scope:
                ws_stream = await handshake(stream, peer, self.choose, self.text)
            if scope.cancelled_caught:
                self.listener.log.warning("%s websocket %s: no upgrade request in time",
                                          self.kind, peer)
        except DROPPED:
            pass
        if ws_stream is None:
            await close_stream(stream)
            return
        await self.serve(ws_stream, sock, tls)


class WebSocketListeners(WebSocketPorts):
    """The MQTT listener's ws and wss ports."""

    @property
    def configured(self) -> bool:
        return self.config.mqtt_ws_port is not None or self.config.mqtt_wss_port is not None

    def specs(self) -> tuple[tuple[str, int | None, bool, str], ...]:
        config = self.config
        return (("mqtt-ws", config.mqtt_ws_port, False, "--mqtt-wss-port"),
                ("mqtt-wss", config.mqtt_wss_port, True, "--mqtt-wss-port"))

    async def serve(self, ws_stream: WebSocketStream, sock, tls: bool) -> None:
        await self.listener.serve_connection(ws_stream, sock, tls, direct=False,
                                             session_class=WebMQTTSession)
