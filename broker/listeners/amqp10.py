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
from typing import TYPE_CHECKING

import trio

from .edge import (
    BLOCKED_READ_SIZE,
    ConnectionEdge,
    EdgeListener,
    close_stream,
    listen_host,
    peer_of,
    tcp_socket,
)

if TYPE_CHECKING:
    from ..broker import Broker
    from .amqp10_session import Amqp10Service

log = logging.getLogger("broker.amqp10")

# the first octets tell an AMQP 1.0 client (plain or SASL header) from an AMQP 0-9-1 one
AMQP10_PREFIXES = (b"AMQP\x00\x01", b"AMQP\x03\x01")


def is_amqp10(prefix: bytes) -> bool:
    return prefix[:6] in AMQP10_PREFIXES


class Amqp10ConnectionHandler(ConnectionEdge):
    what = "amqp 1.0 connection"
    log = log
    flow_read_size = BLOCKED_READ_SIZE
    tells_blocked = False  # AMQP 1.0 has no frame for it: the publisher's credit stops
    bounded_output = False  # a delivery waits for link credit, not the socket

    def __init__(self, listener: Amqp10Listener, stream, sock, tls: bool, prefix: bytes = b"",
                 peer_cert_user: str | None = None):
        super().__init__(listener, stream, sock)
        self.prefix = prefix
        # reading resumed after the session held its input, and nothing read since: proton's
        # idle timeout (counted from the last input it saw, before the hold) is not checked
        self._resumed = False
        host, self.peer = peer_of(sock)
        from .amqp10_session import Amqp10Session
        self.attach(Amqp10Session(listener.service, self.peer, host, peer_cert_user), sock, tls)

    def deadline(self) -> float:
        if self.session.vhost is None:  # not logged in and open yet
            return self._started + self.listener.broker.config.handshake_timeout
        return math.inf

    def timed_out(self) -> None:
        log.warning("amqp 1.0 connection %s: handshake timeout", self.peer)
        self.session.close("handshake timeout")

    def closed(self) -> None:
        self.session.conn.release()

    def _input_unread(self, now: float) -> bool:
        """The client's frames are not read (the session holds its input), or not read yet
        since then (for at most one idle timeout): not idle, as RabbitMQ does not time out
        a connection it blocked."""
        if self.session.input_held:
            return True
        if self._resumed and now < self._last_received + self.session.conn.transport.idle_timeout:
            return True
        self._resumed = False
        return False

    async def input_released(self) -> None:
        await super().input_released()
        self._resumed = True

    def after_read(self) -> None:
        self._resumed = False

    async def read_loop(self) -> None:
        if self.prefix:
            self.session.data_received(self.prefix)
        await super().read_loop()

    async def write_loop(self, nursery: trio.Nursery) -> None:
        """Also ticks proton's idle timeouts."""
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
            if (session.vhost is not None or conn.opened) and not self._input_unread(now):
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


class Amqp10Listener(EdgeListener):
    """Plain and TLS ports of one broker (``ports`` once open), and the connections handed
    over by the AMQP 0-9-1 listener (``serve_connection``)."""

    log = log

    def __init__(self, broker: Broker):
        super().__init__(broker)
        self._service: Amqp10Service | None = None

    @property
    def service(self) -> Amqp10Service:
        # the session module (and proton) loads with the first AMQP 1.0 connection, not at
        # every start: it is a large part of the time to listening
        if self._service is None:
            from .amqp10_session import Amqp10Service
            self._service = Amqp10Service(self.broker)
        return self._service

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        host = listen_host(config)
        listeners = await self.open_pair(host, ("amqp10", config.amqp10_port),
                                         ("amqps10", config.amqps10_port, "--amqps10-port"))
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
        sock, tls = tcp_socket(stream)
        if tls:
            # the client certificate (SASL EXTERNAL's user) is known after the handshake
            try:
                with trio.fail_after(self.broker.config.handshake_timeout):
                    await stream.do_handshake()
            except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                    OSError) as exc:
                log.warning("amqp 1.0: TLS handshake failed: %s",
                            exc.__cause__ or exc or type(exc).__name__)
                await close_stream(stream)
                return
        await self.serve_connection(stream, sock, tls)

    async def serve_connection(self, stream, sock, tls: bool, prefix: bytes = b"") -> None:
        """One AMQP 1.0 connection on ``stream`` (a TLS one after its handshake);
        ``prefix``: what was already read from it."""
        cert_user = None
        if isinstance(stream, trio.SSLStream):
            from ..security.tls import peer_cert_user
            cert_user = peer_cert_user(stream)  # SASL EXTERNAL's user
        await self.serve(Amqp10ConnectionHandler(self, stream, sock, tls, prefix, cert_user))


def install(broker: Broker) -> Amqp10Listener | None:
    """The AMQP 1.0 listener (``broker.amqp10``): on the AMQP port by protocol header unless
    ``config.amqp10`` is off, and on its own ports when set."""
    config = broker.config
    if not config.amqp10 and config.amqp10_port is None and config.amqps10_port is None:
        return None
    listener = Amqp10Listener(broker)
    if config.amqp10_port is not None or config.amqps10_port is not None:
        broker.background_tasks.append(listener.run)
    return listener
