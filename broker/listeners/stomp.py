"""The STOMP listener's trio edge: sockets (plain and TLS), one nursery per connection.

Each connection's nursery holds its reader (the CONNECT timeout, the client's heart-beats,
resource alarms), its writer (woken by ``wake``) and, when heart-beats were negotiated,
the task sending the server's. ``install(broker)`` adds the listener to
``broker.background_tasks`` when ``config.stomp_port`` or ``config.stomps_port`` is set.
The protocol is ``broker.stomp`` (sans-IO); the broker side is ``stomp_session``.
"""
from __future__ import annotations

import logging
import math
import socket
import ssl

import trio

from ..stomp.connection import State
from . import ListenError
from .stomp_session import StompService, StompSession
from .stomp_ws import WebStompListeners

log = logging.getLogger("broker.stomp")

BLOCKED_READ_INTERVAL = 0.1
# the client's heart-beats may be this late (RabbitMQ's plugin allows twice the interval)
HEARTBEAT_TOLERANCE = 2.0


class StompConnectionHandler:
    def __init__(self, listener: StompListener, stream, sock, tls: bool,
                 session_class: type[StompSession] = StompSession):
        self.listener = listener
        self.stream = stream
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            host, self.peer = None, "?"
        self.session = session_class(listener.service, self.peer, host)
        try:
            self.session.local_port = sock.getsockname()[1]
        except OSError:
            pass
        self.session.tls = tls
        self.session.wake = self._wake
        self.session.flow_resumed = self._flow_resumed
        self._output = trio.Event()
        self._drained: trio.Event | None = None
        self._flow_event: trio.Event | None = None
        self._started = self._last_received = self._last_sent = trio.current_time()

    def _wake(self) -> None:
        self._output.set()

    def _flow_resumed(self) -> None:
        if self._flow_event is not None:
            self._flow_event.set()

    async def run(self) -> None:
        session = self.session
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, nursery)
                await self._reader()
                self._wake()  # the writer writes what is left, then ends the nursery
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            log.info("stomp connection %s: dropped", self.peer)
        finally:
            if trio.current_effective_deadline() == -math.inf:
                self.listener.service.stopping = True
            session.connection_lost()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()

    async def _reader(self) -> None:
        session = self.session
        conn = session.conn
        broker = self.listener.broker
        while not session.finished:
            while conn.pending_output > session.output_high_water * 4 and not session.finished:
                drained = self._drained = trio.Event()
                await drained.wait()
                self._drained = None
            if broker.blocked and session.is_publisher:
                broker.notify_blocked(session)
                if broker.stops_publishers:
                    # a resource alarm: not read at all until it clears, as for AMQP/MQTT
                    while broker.stops_publishers and not session.finished:  # noqa: ASYNC110
                        await trio.sleep(BLOCKED_READ_INTERVAL)  # (a poll: alarms are rare)
                    self._last_received = trio.current_time()
                    continue
            elif session.flow_queues:
                flow = self._flow_event = trio.Event()
                with trio.move_on_after(BLOCKED_READ_INTERVAL):
                    await flow.wait()
                self._flow_event = None
            try:
                with trio.move_on_at(self._deadline()) as scope:
                    data = await self.stream.receive_some(broker.config.receive_size)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
                data = b""
            if scope.cancelled_caught:
                if conn.state is State.AWAIT_CONNECT:
                    log.warning("stomp connection %s: no CONNECT in time", self.peer)
                else:
                    log.warning("stomp connection %s: missed heart-beats", self.peer)
                session.close("heart-beat timeout")
                return
            if not data:
                session.finished = True
                session.connection_lost()
                return
            self._last_received = trio.current_time()
            self.listener.service.bytes_received += len(data)
            session.data_received(data)
            if session.login_wait is not None:
                # an opaque OAuth 2 token: its introspection decides the CONNECT (nothing
                # is read meanwhile)
                await broker.access.introspect(session.login_wait[0])
                session.resume_login()

    def _deadline(self) -> float:
        conn = self.session.conn
        if conn.state is State.AWAIT_CONNECT:
            return self._started + self.listener.broker.config.handshake_timeout
        if conn.heartbeat_receive:
            return self._last_received + HEARTBEAT_TOLERANCE * conn.heartbeat_receive / 1000
        return math.inf

    async def _writer(self, nursery: trio.Nursery) -> None:
        session = self.session
        conn = session.conn
        heartbeats = False
        while True:
            await self._output.wait()
            self._output = trio.Event()
            if session.output_delay:  # a refused login's ERROR is held back
                delay, session.output_delay = session.output_delay, 0.0
                await trio.sleep(delay)
            data = conn.data_to_send()
            if data:
                await self.stream.send_all(data)
                self._last_sent = trio.current_time()
                if session.delivery_stalled:
                    session.output_drained()
                if self._drained is not None:
                    self._drained.set()
            if session.finished and not conn.has_output:
                nursery.cancel_scope.cancel()
                return
            if not heartbeats and conn.state is State.OPEN and conn.heartbeat_send:
                heartbeats = True  # CONNECTED is written: the server's heart-beats start
                nursery.start_soon(self._heartbeats)

    async def _heartbeats(self) -> None:
        """The server's heart-beats: an EOL whenever nothing else was written for the
        negotiated interval."""
        conn = self.session.conn
        interval = conn.heartbeat_send / 1000
        while not self.session.finished:
            due = self._last_sent + interval
            now = trio.current_time()
            if now >= due:
                conn.heartbeat()
                self._last_sent = now
                self._wake()
                due = now + interval
            await trio.sleep_until(due)


class StompListener:
    """Plain and TLS listeners of one broker; ``ports`` holds the bound ports once open."""

    def __init__(self, broker):
        self.broker = broker
        self.service = StompService(broker)
        self.handlers: set[StompConnectionHandler] = set()
        self.ports: dict[str, int] = {}
        self.websockets = WebStompListeners(self)

    def ssl_context(self, option: str = "--stomps-port") -> ssl.SSLContext:
        from ..security.tls import TLSConfigError, server_context
        try:
            return server_context(self.broker.config)
        except TLSConfigError as exc:
            raise ListenError(f"{option}: {exc}") from None

    async def _open(self, name: str, port: int, host: str | None, tls: bool) -> list:
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ListenError(f"cannot listen for {name} on {host or '*'}:{port}: "
                              f"{exc.strerror or exc}") from None
        self.ports[name] = listeners[0].socket.getsockname()[1]
        log.info("%s listening on %s:%s", name.upper(), host or "*", self.ports[name])
        if tls:
            ctx = self.ssl_context()
            return [trio.SSLListener(lst, ctx, https_compatible=False) for lst in listeners]
        return listeners

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        host = None if config.host in ("", "*", "0.0.0.0") else config.host
        listeners = []
        if config.stomp_port is not None:
            listeners += await self._open("stomp", config.stomp_port, host, False)
        if config.stomps_port is not None:
            listeners += await self._open("stomps", config.stomps_port, host, True)
        ws_listeners = await self.websockets.open(host)
        task_status.started(self.ports)
        try:
            async with trio.open_nursery() as nursery:
                if ws_listeners:
                    nursery.start_soon(trio.serve_listeners, self.websockets.handle, ws_listeners)
                if listeners:
                    await trio.serve_listeners(self._handle, listeners)
        finally:
            self.service.stopping = True

    async def _handle(self, stream) -> None:
        raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        sock = raw.socket
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        except OSError:
            pass
        await self.serve_connection(stream, sock, raw is not stream)

    async def serve_connection(self, stream, sock, tls: bool,
                               session_class: type[StompSession] = StompSession) -> None:
        """One STOMP connection on ``stream`` (TCP, TLS or a WebSocket's)."""
        handler = StompConnectionHandler(self, stream, sock, tls, session_class)
        self.handlers.add(handler)
        try:
            await handler.run()
        except Exception:
            log.exception("stomp connection %s: internal error", handler.peer)
        finally:
            self.handlers.discard(handler)


def install(broker) -> StompListener | None:
    """Start the STOMP listener(s) with the broker when configured (``broker.stomp``)."""
    config = broker.config
    if all(port is None for port in (config.stomp_port, config.stomps_port,
                                      config.stomp_ws_port, config.stomp_wss_port)):
        return None
    listener = StompListener(broker)
    broker.background_tasks.append(listener.run)
    return listener
