"""The MQTT listener's trio edge: sockets (plain and TLS), one nursery per connection.

A connection's own task reads (and enforces the CONNECT timeout and the keep-alive); a
writer task runs in the connection's nursery only while output waits for the socket, so
10,000 idle devices cost one task each. ``install(broker)`` adds the listener to
``broker.background_tasks`` when ``config.mqtt_port`` or ``config.mqtts_port`` is set.
The protocol is ``broker.mqtt.connection`` (sans-IO); the broker side is ``mqtt_session``.
"""
from __future__ import annotations

import logging
import math
import os
import ssl
from typing import TYPE_CHECKING

import trio
import trio.lowlevel

from ..mqtt.codec import MAX_UNAUTHENTICATED
from ..mqtt.connection import State
from ..mqtt.properties import KEEP_ALIVE_TIMEOUT, SERVER_SHUTTING_DOWN
from . import mqtt_configured
from .edge import (
    BLOCKED_READ_SIZE,
    DROPPED,
    ConnectionEdge,
    EdgeListener,
    listen_host,
    peer_of,
    tcp_socket,
)
from .mqtt_session import MQTTService, MQTTSession
from .mqtt_sys import SysTopics
from .mqtt_ws import WebSocketListeners

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.mqtt")


class MQTTConnectionHandler(ConnectionEdge):
    """Output goes out two ways, never both at once. A plain-TCP connection with output
    (``wake``) is marked dirty; right after a reader's batch, or else from the listener's
    flusher task, what it has queued is written with one non-blocking write (``send_now``:
    a PUBACK round trip costs no task switch). Whatever the socket does not take
    (``_leftover``), TLS output, and the last bytes of a finished connection go to the
    writer task, started on demand; while it runs it owns the socket. Reading is the
    edge's (``edge.ConnectionEdge.read_loop``)."""

    __slots__ = ("_fd", "_leftover", "_open", "_writer_running", "nursery")

    what = "mqtt connection"
    log = log
    flow_read_size = BLOCKED_READ_SIZE

    def __init__(self, listener: MQTTListener, stream, sock, tls: bool, direct: bool = True,
                 session_class: type[MQTTSession] = MQTTSession):
        super().__init__(listener, stream, sock)
        host, self.peer = peer_of(sock)
        session = session_class(listener.service, self.peer, host)
        # the CONNECT, read before any login, is bounded as RabbitMQ bounds it
        session.conn.reader.max_first = MAX_UNAUTHENTICATED
        self.attach(session, sock, tls)
        # direct writes need the plain socket (not TLS, not a WebSocket's frames)
        self._fd = sock.fileno() if direct and not tls else -1
        self._writer_running = False
        self._open = False  # the nursery is open: a writer can be started
        self._leftover = b""  # what a direct write could not take: the writer's, first

    def _wake(self) -> None:
        session = self.session
        if self._fd < 0 or session.finished or session.output_delay or self._leftover:
            self._start_writer()
        elif not self._writer_running:
            self.listener.mark_dirty(self)
        # a running writer picks up what was queued before it returns

    def _start_writer(self) -> None:
        if not self._writer_running and self._open:
            self._writer_running = True
            self.nursery.start_soon(self._writer)

    def send_now(self) -> None:
        """Write what the session has queued, if the writer is not running; whatever the
        socket does not take is left to a writer."""
        if self._writer_running or self._fd < 0:
            return
        session = self.session
        if session.finished or session.output_delay or self._leftover:
            self._start_writer()
            return
        data = session.conn.data_to_send()
        if not data:
            return
        try:
            n = os.write(self._fd, data)
        except BlockingIOError:
            n = 0
        except OSError:
            n = 0  # the writer's send_all meets the same error and ends the connection
        self.listener.service.bytes_sent += n
        if n < len(data):
            self._leftover = data[n:]
            self._start_writer()
            return
        if session.delivery_stalled:
            session.output_drained()
        if self._drained is not None:
            self._drained.set()

    async def run(self) -> None:
        session = self.session
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                self._open = True
                try:
                    await self.read_loop()
                    # the reader is done (finished, EOF, timeout): the writer writes what
                    # is left and ends the nursery
                    self._start_writer()
                finally:
                    # the nursery closes as soon as no writer runs, before this task resumes
                    # to leave it: a session closed from elsewhere in that window (a takeover)
                    # must not start a writer in it
                    self._open = False
        except* DROPPED:
            log.info("mqtt connection %s: dropped", self.peer)
        finally:
            last = b""
            # cancelled from outside: an MQTT 5 client is told (DISCONNECT 0x8B), no will
            # published
            if self.stopping() and session.conn.v5 and not session.ended:
                session.close("server shutting down", SERVER_SHUTTING_DOWN)
                last = self._leftover + session.conn.data_to_send()
            session.connection_lost()  # will, requeue, consumers leave (idempotent)
            self._fd = -1  # never written directly again: the number may be reused
            self.listener.dirty.pop(self, None)
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    if last:
                        try:
                            await self.stream.send_all(last)
                        except (trio.BrokenResourceError, trio.ClosedResourceError,
                                trio.BusyResourceError, OSError, ssl.SSLError):
                            pass
                    await self.stream.aclose()

    def timed_out(self) -> None:
        session = self.session
        if session.conn.state in (State.AWAIT_CONNECT, State.CONNECTING):
            log.warning("mqtt connection %s: no CONNECT in time", self.peer)
            session.close("connect timeout")
        else:
            log.warning("mqtt client %r: keep-alive of %ss expired", session.client_id,
                        session.conn.keep_alive)
            session.close("keep-alive timeout", KEEP_ALIVE_TIMEOUT)  # will published

    def after_read(self) -> None:
        listener = self.listener
        if listener.dirty:
            listener.flush_dirty()

    async def read_loop(self) -> None:
        """The edge's read loop (``edge.ConnectionEdge.read_loop``: the same alarms, flow,
        bounded output, deadlines and login wait), on a plain socket with less per read:
        ``os.read`` on the non-blocking descriptor, trio only when it would block
        (``wait_readable``, under a deadline scope only when there is a deadline), and a
        read that did not wait yields to the other tasks first (as trio's ``receive_some``
        does after every read). TLS and WebSocket connections take the edge's."""
        fd = self._fd
        if fd < 0:
            await super().read_loop()
            return
        session = self.session
        conn = session.conn
        listener = self.listener
        broker = listener.broker
        config = broker.config
        read = os.read
        received = self.received
        wait_readable = trio.lowlevel.wait_readable
        yield_shielded = trio.lowlevel.cancel_shielded_checkpoint
        high_water = session.output_high_water * 4
        while not session.finished:
            if conn.pending_output > high_water:
                while conn.pending_output > high_water and not session.finished:
                    drained = self._drained = trio.Event()
                    await drained.wait()
                    self._drained = None
                continue
            size = config.receive_size
            if broker.stops_publishers and session.is_publisher:
                await self.publishers_stopped()
                continue
            if session.input_held:
                await self.input_released()
                continue
            if session.flow_queues:
                size = await self.in_flow(size)
            try:
                data = read(fd, size)
                # read without waiting: the others' turn first, as trio's receive_some
                # gives it (a read that waited has given it already)
                await yield_shielded()
            except BlockingIOError:
                deadline = self.deadline()
                if deadline == math.inf:
                    await wait_readable(fd)
                else:
                    with trio.move_on_at(deadline) as scope:
                        await wait_readable(fd)
                    if scope.cancelled_caught:
                        self.timed_out()
                        return
                try:  # what woke the wait is read, whatever happened meanwhile (an alarm)
                    data = read(fd, size)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
            except OSError:
                data = b""
            if not received(data):
                return
            if session.login_wait is not None:
                await self.login_decided()
            if listener.dirty:
                listener.flush_dirty()

    async def _writer(self) -> None:
        """Write until nothing is queued, then end; a finished connection's last writer
        also ends the connection's nursery (and so its reader)."""
        session = self.session
        conn = session.conn
        stream = self.stream
        try:
            if session.output_delay:
                delay, session.output_delay = session.output_delay, 0.0
                await trio.sleep(delay)
            while True:
                data = conn.data_to_send()
                if self._leftover:
                    data, self._leftover = self._leftover + data, b""
                if not data:
                    break
                await stream.send_all(data)
                self.listener.service.bytes_sent += len(data)
                if session.delivery_stalled:
                    session.output_drained()
        finally:
            self._writer_running = False
        if self._drained is not None:
            self._drained.set()
        if session.finished:
            self.nursery.cancel_scope.cancel()

    def deadline(self) -> float:
        """When the reader gives up waiting (trio clock): the CONNECT timeout, then one and a
        half keep-alive periods after the last packet (section 3.1.2.10); none without one."""
        conn = self.session.conn
        if conn.state in (State.AWAIT_CONNECT, State.CONNECTING):
            return self._started + self.listener.broker.config.handshake_timeout
        if conn.keep_alive:
            return self._last_received + 1.5 * conn.keep_alive
        return math.inf


class MQTTListener(EdgeListener):
    """Plain and TLS listeners of one broker; ``ports`` holds the bound ports once open."""

    log = log

    def __init__(self, broker: Broker):
        super().__init__(broker)
        self.service = MQTTService(broker)
        # plain-TCP connections with output queued since the last flush (send_now)
        self.dirty: dict[MQTTConnectionHandler, None] = {}
        self._flush_wanted: trio.Event | None = None
        self.websockets = WebSocketListeners(self)
        interval = broker.config.mqtt_sys_interval
        self.sys_topics = SysTopics(self.service, interval) if interval > 0 else None

    def mark_dirty(self, handler: MQTTConnectionHandler) -> None:
        if not self.dirty and self._flush_wanted is not None:
            self._flush_wanted.set()  # the flusher, unless a reader's batch flushes first
        self.dirty[handler] = None

    def flush_dirty(self) -> None:
        dirty, self.dirty = self.dirty, {}
        for handler in dirty:
            handler.send_now()

    async def _flusher(self) -> None:
        """Writes output that no reader's batch produced (deliveries caused by AMQP
        publishers, timers, the store's durability callbacks)."""
        while True:
            self._flush_wanted = trio.Event()
            if not self.dirty:
                await self._flush_wanted.wait()
            self.flush_dirty()
            await trio.lowlevel.checkpoint()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        config = self.broker.config
        host = listen_host(config)
        listeners = await self.open_pair(host, ("mqtt", config.mqtt_port),
                                         ("mqtts", config.mqtts_port, "--mqtts-port"))
        ws_listeners = await self.websockets.open(host)
        task_status.started(self.ports)
        tasks = (self._flusher,) if self.sys_topics is None else (self._flusher,
                                                                   self.sys_topics.run)
        await self.serve_ports(listeners, ws_listeners, self.websockets.handle, tasks)

    async def _handle(self, stream) -> None:
        sock, tls = tcp_socket(stream)
        await self.serve_connection(stream, sock, tls)

    async def serve_connection(self, stream, sock, tls: bool, direct: bool = True,
                               session_class: type[MQTTSession] = MQTTSession) -> None:
        """One MQTT connection on ``stream`` (``sock`` its socket; ``direct``: the socket
        may be written directly, not through ``stream``)."""
        self.service.sockets_opened += 1
        await self.serve(MQTTConnectionHandler(self, stream, sock, tls, direct, session_class))


def install(broker: Broker) -> MQTTListener | None:
    """Start the MQTT listener(s) with the broker when configured (``broker.mqtt``)."""
    if not mqtt_configured(broker.config):
        return None
    listener = MQTTListener(broker)
    broker.background_tasks.append(listener.run)
    return listener
