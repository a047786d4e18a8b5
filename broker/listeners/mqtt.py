"""The MQTT listener's trio edge: sockets (plain and TLS), one nursery per connection with a
reader (which also enforces the CONNECT timeout and the keep-alive) and a writer, both ending
with it. Two tasks, not three: 10,000 idle devices cost memory per task.

``install(broker)`` adds the listener to ``broker.background_tasks`` when
``config.mqtt_port`` or ``config.mqtts_port`` is set. The protocol is
``broker.mqtt.connection`` (sans-IO); the broker side is ``mqtt_session``.
"""
from __future__ import annotations

import logging
import math
import os
import socket
import ssl

import trio

from ..mqtt.connection import State
from . import ListenError
from .mqtt_session import MQTTService, MQTTSession

log = logging.getLogger("broker.mqtt")

BLOCKED_READ_SIZE = 4096
BLOCKED_READ_INTERVAL = 0.1


class MQTTConnectionHandler:
    """Output goes out two ways, never both at once: right after a reader's batch, with a
    non-blocking write of what that batch produced for any plain-TCP connection
    (``MQTTListener.flush_dirty``: a PUBACK round trip then costs no task switch), and by
    the writer task, which owns the socket while it has anything to send (a partial direct
    write leaves the rest to it, ``_leftover``) and serves TLS connections, deliveries
    caused by AMQP publishers and timers."""

    __slots__ = ("_drained", "_fd", "_flow_event", "_last_received", "_leftover", "_started",
                 "_wake_event", "_writing", "listener", "nursery", "peer", "session", "stream")

    def __init__(self, listener: MQTTListener, stream, sock, tls: bool):
        self.listener = listener
        self.stream = stream
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            host, self.peer = None, "?"
        self.session = MQTTSession(listener.service, self.peer, host)
        self.session.wake = self._wake
        self.session.flow_resumed = self._flow_resumed
        self._wake_event = trio.Event()
        # created only while the reader waits on them: idle connections are many
        self._drained: trio.Event | None = None
        self._flow_event: trio.Event | None = None
        self._started = self._last_received = trio.current_time()
        self._fd = -1 if tls else sock.fileno()
        self._writing = False  # the writer task is in send_all
        self._leftover = b""  # what a direct write could not take: the writer's, first

    def _wake(self) -> None:
        self._wake_event.set()
        if self._fd >= 0:
            self.listener.dirty[self] = None

    def send_now(self) -> None:
        """Write what the session has queued without waiting for the writer task, if the
        writer holds nothing; whatever the socket does not take is left to the writer."""
        session = self.session
        if self._writing or self._leftover or self._fd < 0 or session.finished \
                or session.output_delay:
            return
        data = self.session.conn.data_to_send()
        if not data:
            return
        try:
            n = os.write(self._fd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            n = 0  # the writer's send_all meets the same error and ends the connection
        if n < len(data):
            self._leftover = data[n:]
            self._wake_event.set()
        elif self.session.delivery_stalled:
            self.session.output_drained()

    def _flow_resumed(self) -> None:
        if self._flow_event is not None:
            self._flow_event.set()

    async def run(self) -> None:
        session = self.session
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._reader)
                await self._writer()  # returns once the session is finished and flushed
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
            log.info("mqtt connection %s: dropped", self.peer)
        finally:
            if trio.current_effective_deadline() == -math.inf:
                # cancelled from outside: the broker is stopping, devices did nothing wrong
                self.listener.service.stopping = True
            session.connection_lost()  # will, requeue, consumers leave (idempotent)
            self._fd = -1  # never written directly again: the number may be reused
            self.listener.dirty.pop(self, None)
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()

    async def _reader(self) -> None:
        session = self.session
        conn = session.conn
        broker = self.listener.broker
        stream = self.stream
        while not session.finished:
            while conn.pending_output > session.output_high_water * 4 and not session.finished:
                drained = self._drained = trio.Event()
                await drained.wait()
                self._drained = None
            size = broker.config.receive_size
            if broker.blocked and session.is_publisher:
                # resource alarm: trickle-read (PINGREQ, PUBACKs still pass), as for AMQP
                with trio.move_on_after(BLOCKED_READ_INTERVAL):
                    await self.listener.server_unblocked()
                size = BLOCKED_READ_SIZE
            elif session.flow_queues:
                flow = self._flow_event = trio.Event()
                with trio.move_on_after(BLOCKED_READ_INTERVAL):
                    await flow.wait()
                self._flow_event = None
                if session.flow_queues:
                    size = BLOCKED_READ_SIZE
            try:
                with trio.move_on_at(self._deadline()) as scope:
                    data = await stream.receive_some(size)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError):
                data = b""
            if scope.cancelled_caught:
                if conn.state in (State.AWAIT_CONNECT, State.CONNECTING):
                    log.warning("mqtt connection %s: no CONNECT in time", self.peer)
                    session.close("connect timeout")
                else:
                    log.warning("mqtt client %r: keep-alive of %ss expired", session.client_id,
                                conn.keep_alive)
                    session.close("keep-alive timeout")  # the will is published
                return
            if not data:
                # EOF without DISCONNECT: an abnormal end, the will is published
                session.finished = True
                session.connection_lost()
                self._wake()
                return
            self._last_received = trio.current_time()
            session.data_received(data)
            if self.listener.dirty:
                self.listener.flush_dirty()

    async def _writer(self) -> None:
        session = self.session
        conn = session.conn
        stream = self.stream
        while True:
            await self._wake_event.wait()
            self._wake_event = trio.Event()
            if session.output_delay:
                delay, session.output_delay = session.output_delay, 0.0
                await trio.sleep(delay)
            while True:
                data = conn.data_to_send()
                if self._leftover:
                    data, self._leftover = self._leftover + data, b""
                if not data:
                    break
                self._writing = True
                await stream.send_all(data)
                self._writing = False
                if session.delivery_stalled:
                    session.output_drained()
            if self._drained is not None:
                self._drained.set()
            if session.finished:
                return

    def _deadline(self) -> float:
        """When the reader gives up waiting (trio clock): the CONNECT timeout, then one and a
        half keep-alive periods after the last packet (section 3.1.2.10); none without one."""
        conn = self.session.conn
        if conn.state in (State.AWAIT_CONNECT, State.CONNECTING):
            return self._started + self.listener.broker.config.handshake_timeout
        if conn.keep_alive:
            return self._last_received + 1.5 * conn.keep_alive
        return math.inf


class MQTTListener:
    """Plain and TLS listeners of one broker; ``ports`` holds the bound ports once open."""

    def __init__(self, broker):
        self.broker = broker
        self.service = MQTTService(broker)
        self.handlers: set[MQTTConnectionHandler] = set()
        # plain-TCP connections with output queued by the batch being handled (send_now)
        self.dirty: dict[MQTTConnectionHandler, None] = {}
        self.ports: dict[str, int] = {}

    def flush_dirty(self) -> None:
        dirty, self.dirty = self.dirty, {}
        for handler in dirty:
            handler.send_now()

    async def server_unblocked(self) -> None:
        while self.broker.blocked:  # noqa: ASYNC110 - a bounded poll under a resource alarm
            await trio.sleep(BLOCKED_READ_INTERVAL)

    def ssl_context(self) -> ssl.SSLContext:
        config = self.broker.config
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(config.tls_cert, config.tls_key)
        if config.tls_ca:
            ctx.load_verify_locations(config.tls_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

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
        if config.mqtt_port is not None:
            listeners += await self._open("mqtt", config.mqtt_port, host, False)
        if config.mqtts_port is not None:
            listeners += await self._open("mqtts", config.mqtts_port, host, True)
        task_status.started(self.ports)
        try:
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
        handler = MQTTConnectionHandler(self, stream, sock, raw is not stream)
        self.handlers.add(handler)
        try:
            await handler.run()
        except Exception:
            log.exception("mqtt connection %s: internal error", handler.peer)
        finally:
            self.handlers.discard(handler)


def install(broker) -> MQTTListener | None:
    """Start the MQTT listener(s) with the broker when configured (``broker.mqtt``)."""
    config = broker.config
    if config.mqtt_port is None and config.mqtts_port is None:
        return None
    listener = MQTTListener(broker)
    broker.background_tasks.append(listener.run)
    return listener
