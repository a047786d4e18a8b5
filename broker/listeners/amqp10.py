"""The AMQP 1.0 listener's trio edge: its own ports (``--amqp10-port``, TLS
``--amqps10-port``) and the connections the AMQP 0-9-1 listener hands over when a client
opens with an AMQP 1.0 protocol header (RabbitMQ 4 serves both on 5672 that way).

Each connection's nursery holds its reader (alarms, flow, the handshake timeout) and its
writer (woken by the session, also ticking proton's idle timeouts). The protocol is
``broker.amqp10`` (sans-IO); the broker side is ``amqp10_session``.
"""
from __future__ import annotations

import logging
import math
import socket
import ssl
from typing import TYPE_CHECKING

import trio

from . import ListenError

if TYPE_CHECKING:
    from .amqp10_session import Amqp10Service

log = logging.getLogger("broker.amqp10")

BLOCKED_READ_INTERVAL = 0.1
BLOCKED_READ_SIZE = 4096
# the first octets tell an AMQP 1.0 client (plain or SASL header) from an AMQP 0-9-1 one
AMQP10_PREFIXES = (b"AMQP\x00\x01", b"AMQP\x03\x01")


def is_amqp10(prefix: bytes) -> bool:
    return prefix[:6] in AMQP10_PREFIXES


class Amqp10ConnectionHandler:
    def __init__(self, listener: Amqp10Listener, stream, sock, tls: bool, prefix: bytes = b"",
                 peer_cert_user: str | None = None):
        self.listener = listener
        self.stream = stream
        self.prefix = prefix
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            host, self.peer = None, "?"
        from .amqp10_session import Amqp10Session
        self.session = Amqp10Session(listener.service, self.peer, host, peer_cert_user)
        try:
            self.session.local_port = sock.getsockname()[1]
        except OSError:
            pass
        self.session.tls = tls
        self.session.wake = self._wake
        self.session.flow_resumed = self._flow_resumed
        self._output = trio.Event()
        self._flow_event: trio.Event | None = None
        self._started = trio.current_time()

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
            log.info("amqp 1.0 connection %s: dropped", self.peer)
        finally:
            if trio.current_effective_deadline() == -math.inf:
                self.listener.service.stopping = True
            session.connection_lost()
            session.conn.release()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()

    async def _reader(self) -> None:
        session = self.session
        broker = self.listener.broker
        config = broker.config
        if self.prefix:
            session.data_received(self.prefix)
        while not session.finished:
            size = config.receive_size
            if broker.blocked and session.is_publisher:
                if broker.stops_publishers:
                    # a resource alarm: not read at all until it clears, as for AMQP 0-9-1
                    while broker.stops_publishers and not session.finished:  # noqa: ASYNC110
                        await trio.sleep(BLOCKED_READ_INTERVAL)  # (a poll: alarms are rare)
                    continue
            elif session.flow_queues:
                flow = self._flow_event = trio.Event()
                with trio.move_on_after(BLOCKED_READ_INTERVAL):
                    await flow.wait()
                self._flow_event = None
                if session.flow_queues:
                    size = BLOCKED_READ_SIZE
            deadline = math.inf
            if session.vhost is None:  # not logged in and open yet
                deadline = self._started + config.handshake_timeout
            try:
                with trio.move_on_at(deadline) as scope:
                    data = await self.stream.receive_some(size)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
                data = b""
            if scope.cancelled_caught:
                log.warning("amqp 1.0 connection %s: handshake timeout", self.peer)
                session.close("handshake timeout")
                return
            if not data:
                session.finished = True
                session.connection_lost()
                return
            self.listener.service.bytes_received += len(data)
            session.data_received(data)
            if session.login_wait is not None:
                # an opaque OAuth 2 token: its introspection decides sasl-init (nothing is
                # read meanwhile)
                await self.listener.broker.access.introspect(session.login_wait[0])
                session.resume_login()

    async def _writer(self, nursery: trio.Nursery) -> None:
        session = self.session
        conn = session.conn
        next_tick = 0.0
        while True:
            timeout = math.inf
            if next_tick:
                timeout = next_tick - trio.current_time()
            with trio.move_on_after(max(timeout, 0)):
                await self._output.wait()
            self._output = trio.Event()
            now = trio.current_time()
            if session.vhost is not None or conn.opened:
                next_tick = conn.tick(now)
            if session.output_delay:  # a refused login's outcome is held back
                delay, session.output_delay = session.output_delay, 0.0
                await trio.sleep(delay)
            data = conn.data_to_send()
            if data:
                await self.stream.send_all(data)
                if conn.has_output:
                    self._output.set()  # more frames of a large delivery
            session.output_written()
            if conn.finished and not session.finished:  # an idle timeout (tick)
                log.warning("amqp 1.0 connection %s: %s", self.peer, conn.error)
                session.finished = True
                session.connection_lost()
                continue  # (writes the close frame)
            if session.finished and not conn.has_output:
                nursery.cancel_scope.cancel()
                return


class Amqp10Listener:
    """Plain and TLS ports of one broker (``ports`` once open), and the connections handed
    over by the AMQP 0-9-1 listener (``serve_connection``)."""

    def __init__(self, broker):
        self.broker = broker
        self._service: Amqp10Service | None = None
        self.handlers: set[Amqp10ConnectionHandler] = set()
        self.ports: dict[str, int] = {}

    @property
    def service(self) -> Amqp10Service:
        # the session module (and proton) loads with the first AMQP 1.0 connection, not at
        # every start: it is a large part of the time to listening
        if self._service is None:
            from .amqp10_session import Amqp10Service
            self._service = Amqp10Service(self.broker)
        return self._service

    async def _open(self, name: str, port: int, host: str | None, tls: bool) -> list:
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ListenError(f"cannot listen for {name} on {host or '*'}:{port}: "
                              f"{exc.strerror or exc}") from None
        self.ports[name] = listeners[0].socket.getsockname()[1]
        log.info("%s listening on %s:%s", name.upper(), host or "*", self.ports[name])
        if tls:
            from ..security.tls import TLSConfigError, server_context
            try:
                ctx = server_context(self.broker.config)
            except TLSConfigError as exc:
                raise ListenError(f"--amqps10-port: {exc}") from None
            return [trio.SSLListener(lst, ctx, https_compatible=False) for lst in listeners]
        return listeners

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        host = None if config.host in ("", "*", "0.0.0.0") else config.host
        listeners = []
        if config.amqp10_port is not None:
            listeners += await self._open("amqp10", config.amqp10_port, host, False)
        if config.amqps10_port is not None:
            listeners += await self._open("amqps10", config.amqps10_port, host, True)
        task_status.started(self.ports)
        try:
            if listeners:
                await trio.serve_listeners(self._handle, listeners)
            else:
                await trio.sleep_forever()
        finally:
            if self._service is not None:
                self._service.stopping = True

    async def _handle(self, stream) -> None:
        raw = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        sock = raw.socket
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        except OSError:
            pass
        if raw is not stream:
            # the client certificate (SASL EXTERNAL's user) is known after the handshake
            try:
                with trio.fail_after(self.broker.config.handshake_timeout):
                    await stream.do_handshake()
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                    OSError) as exc:
                log.warning("amqp 1.0: TLS handshake failed: %s",
                            exc.__cause__ or exc or type(exc).__name__)
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()
                return
        await self.serve_connection(stream, sock, raw is not stream)

    async def serve_connection(self, stream, sock, tls: bool, prefix: bytes = b"") -> None:
        """One AMQP 1.0 connection on ``stream`` (a TLS one after its handshake);
        ``prefix``: what was already read from it."""
        cert_user = None
        if isinstance(stream, trio.SSLStream):
            from ..security.tls import peer_cert_user
            cert_user = peer_cert_user(stream)  # SASL EXTERNAL's user
        handler = Amqp10ConnectionHandler(self, stream, sock, tls, prefix, cert_user)
        self.handlers.add(handler)
        try:
            await handler.run()
        except Exception:
            log.exception("amqp 1.0 connection %s: internal error", handler.peer)
        finally:
            self.handlers.discard(handler)


def install(broker) -> Amqp10Listener | None:
    """The AMQP 1.0 listener (``broker.amqp10``): on the AMQP port by protocol header unless
    ``config.amqp10`` is off, and on its own ports when set."""
    config = broker.config
    if not config.amqp10 and config.amqp10_port is None and config.amqps10_port is None:
        return None
    listener = Amqp10Listener(broker)
    if config.amqp10_port is not None or config.amqps10_port is not None:
        broker.background_tasks.append(listener.run)
    return listener
