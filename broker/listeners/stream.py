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
import socket
import ssl

import trio

from ..streamproto.connection import State
from . import ListenError
from .stream_session import StreamService, StreamSession

log = logging.getLogger("broker.stream")

BLOCKED_READ_INTERVAL = 0.1
# a client's heartbeats may be this late (RabbitMQ closes after two missed ones)
HEARTBEAT_TOLERANCE = 2.0


class StreamConnectionHandler:
    def __init__(self, listener: StreamListener, stream, sock, tls: bool):
        self.listener = listener
        self.stream = stream
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            host, self.peer = None, "?"
        try:
            local_host, local_port = sock.getsockname()[:2]
        except OSError:
            local_host, local_port = "localhost", 0
        self.session = StreamSession(listener.service, self.peer, host,
                                     listener.advertised_host or local_host, local_port, tls)
        self.session.wake = self._wake
        self._output = trio.Event()
        self._drained: trio.Event | None = None
        self._started = self._last_received = self._last_sent = trio.current_time()

    def _wake(self) -> None:
        self._output.set()

    async def run(self) -> None:
        session = self.session
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, nursery)
                await self._reader()
                self._wake()  # the writer writes what is left, then ends the nursery
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            log.info("stream connection %s: dropped", self.peer)
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
        config = broker.config
        while not session.finished:
            while conn.pending_output > session.output_high_water * 4 and not session.finished:
                drained = self._drained = trio.Event()
                await drained.wait()
                self._drained = None
            if broker.blocked and session.is_publisher:
                broker.notify_blocked(session)
                if broker.stops_publishers:
                    # a resource alarm: not read at all until it clears, as for AMQP
                    while broker.stops_publishers and not session.finished:  # noqa: ASYNC110
                        await trio.sleep(BLOCKED_READ_INTERVAL)  # (a poll: alarms are rare)
                    self._last_received = trio.current_time()
                    continue
            try:
                with trio.move_on_at(self._deadline()) as scope:
                    data = await self.stream.receive_some(config.receive_size)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
                data = b""
            if scope.cancelled_caught:
                if conn.state is State.OPEN:
                    log.warning("stream connection %s: missed heartbeats", self.peer)
                    session.close("missed heartbeats")
                else:
                    log.warning("stream connection %s: no handshake in time", self.peer)
                    session.finished = True
                    session.connection_lost()
                return
            if not data:
                session.finished = True
                session.connection_lost()
                return
            self._last_received = trio.current_time()
            self.listener.service.bytes_received += len(data)
            session.data_received(data)
            if session.login_wait is not None:
                # an opaque OAuth 2 token: its introspection decides SaslAuthenticate
                # (nothing is read meanwhile)
                await self.listener.broker.access.introspect(session.login_wait[0])
                session.resume_login()
            await trio.lowlevel.checkpoint()

    def _deadline(self) -> float:
        conn = self.session.conn
        if conn.state is State.CLOSING:
            return self._last_received + self.listener.broker.config.handshake_timeout
        if conn.state is not State.OPEN:
            return self._started + self.listener.broker.config.handshake_timeout
        if conn.heartbeat:
            return self._last_received + HEARTBEAT_TOLERANCE * conn.heartbeat
        return math.inf

    async def _writer(self, nursery: trio.Nursery) -> None:
        session = self.session
        conn = session.conn
        heartbeats = False
        while True:
            await self._output.wait()
            self._output = trio.Event()
            if session.output_delay:  # a refused login's answer is held back
                delay, session.output_delay = session.output_delay, 0.0
                await trio.sleep(delay)
            buffers = conn.buffers_to_send()
            if buffers:
                await self.stream.send_all(b"".join(buffers))
                self._last_sent = trio.current_time()
                if session.delivery_stalled:
                    session.output_drained()
                if self._drained is not None:
                    self._drained.set()
            if session.finished and not conn.has_output:
                nursery.cancel_scope.cancel()
                return
            if not heartbeats and conn.state is State.OPEN and conn.heartbeat:
                heartbeats = True
                nursery.start_soon(self._heartbeats)

    async def _heartbeats(self) -> None:
        """The server's heartbeats: one whenever nothing else was written for the interval."""
        conn = self.session.conn
        interval = conn.heartbeat
        while not self.session.finished:
            due = self._last_sent + interval
            now = trio.current_time()
            if now >= due:
                conn.heartbeat_frame()
                self._last_sent = now
                self._wake()
                due = now + interval
            await trio.sleep_until(due)


class StreamListener:
    """Plain and TLS listeners of one broker; ``ports`` holds the bound ports once open."""

    def __init__(self, broker):
        self.broker = broker
        self.service = StreamService(broker)
        self.handlers: set[StreamConnectionHandler] = set()
        self.ports: dict[str, int] = {}
        self.advertised_host: str | None = broker.config.stream_advertised_host

    def ssl_context(self) -> ssl.SSLContext:
        from ..security.tls import TLSConfigError, server_context
        try:
            return server_context(self.broker.config)
        except TLSConfigError as exc:
            raise ListenError(f"--stream-tls-port: {exc}") from None

    async def _open(self, name: str, port: int, host: str | None, tls: bool) -> list:
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            text = (f"cannot listen for {name} on {host or '*'}:{port}: "
                    f"{exc.strerror or exc}")
            if name == "stream" and self.broker.config.stream_optional:
                log.warning("%s; the Stream protocol is not served (--stream-port)", text)
                return []
            raise ListenError(text) from None
        self.ports[name] = listeners[0].socket.getsockname()[1]
        log.info("%s listening on %s:%s", name, host or "*", self.ports[name])
        if tls:
            ctx = self.ssl_context()
            return [trio.SSLListener(lst, ctx, https_compatible=False) for lst in listeners]
        return listeners

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        host = None if config.host in ("", "*", "0.0.0.0") else config.host
        listeners = []
        if config.stream_port is not None:
            listeners += await self._open("stream", config.stream_port, host, False)
        if config.stream_tls_port is not None:
            listeners += await self._open("stream-tls", config.stream_tls_port, host, True)
        self.service.watch_vhosts()
        task_status.started(self.ports)
        try:
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
        handler = StreamConnectionHandler(self, stream, sock, raw is not stream)
        self.handlers.add(handler)
        try:
            await handler.run()
        except Exception:
            log.exception("stream connection %s: internal error", handler.peer)
        finally:
            self.handlers.discard(handler)


def install(broker) -> StreamListener | None:
    """Start the Stream-protocol listener(s) with the broker when configured
    (``broker.stream``)."""
    config = broker.config
    if config.stream_port is None and config.stream_tls_port is None:
        return None
    listener = StreamListener(broker)
    broker.background_tasks.append(listener.run)
    return listener
