"""STOMP over WebSockets (ws and wss), as RabbitMQ's Web STOMP plugin serves it: an HTTP
upgrade on the path ``/ws`` (subprotocols ``v12.stomp``, ``v11.stomp``, ``v10.stomp``,
``stomp``, or none), then STOMP frames in text or binary WebSocket frames; the server
writes binary frames. The WebSocket side is MQTT's (``mqtt_ws``: wsproto, the same
bounded handshake and stream); the STOMP side is the plain listener's handler.
"""
from __future__ import annotations

from wsproto.events import Request

from .mqtt_ws import WebSocketPorts, WebSocketStream
from .stomp_session import StompSession

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


class WebStompListeners(WebSocketPorts):
    """The STOMP listener's ws and wss ports."""

    kind = "stomp"
    text = True
    choose = staticmethod(choose)

    def specs(self) -> tuple[tuple[str, int | None, bool, str], ...]:
        config = self.config
        return (("stomp-ws", config.stomp_ws_port, False, "--stomp-wss-port"),
                ("stomp-wss", config.stomp_wss_port, True, "--stomp-wss-port"))

    async def serve(self, ws_stream: WebSocketStream, sock, tls: bool) -> None:
        await self.listener.serve_connection(ws_stream, sock, tls, WebStompSession)
