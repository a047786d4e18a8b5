"""The AMQP 0-9-1 listener (the trio edge): listening socket, one nursery per connection, timers, signals.

Each connection owns exactly three tasks in its own nursery (reader, writer,
heartbeat); all of them end when the connection does. Broker-wide tasks
(timers, resource monitor, store) live in the server's nursery.
"""
from __future__ import annotations

import errno
import gc
import logging
import math
import signal
import socket
import ssl
import time
from functools import partial
from typing import Any

import trio
import trio.lowlevel

from .. import errors
from ..amqp import builds as amqp_builds
from ..amqp.events import State
from ..broker import Broker
from ..malloc import keep_free_heap
from ..persistence import StoreUnavailable
from ..security import tls
from . import amqp10 as amqp10_listener
from .amqp_receive import arrived_ago, release_all, stamp_arrivals
from .amqp_send import send_buffers
from .amqp_session import Session
from .reuseport import open_amqp_listeners

log = logging.getLogger("broker.server")

# A connection in flow is read in slices of this size, one per interval (close, acks get in)
BLOCKED_READ_SIZE = 4096
BLOCKED_READ_INTERVAL = 0.1
# A connection blocked by an alarm is not read; it checks its state this often (a close)
BLOCKED_CHECK_INTERVAL = 1.0
SHUTDOWN_REASON = "broker forced connection closure with reason 'shutdown'"


class ConnectionHandler:
    def __init__(self, server: Server, stream: trio.SocketStream | trio.SSLStream,
                 peer_cert_user: str | None = None, prefix: bytes = b""):
        self.server = server
        self.prefix = prefix  # what the protocol sniffing read already
        # Any: an SSLStream is typed to receive bytearray; both give bytes here
        self.stream: Any = stream
        # plain TCP: read with recv_into and write with sendmsg on the socket itself
        self.sock: Any = stream.socket if isinstance(stream, trio.SocketStream) else None
        self.anc_size = 0 if self.sock is None else stamp_arrivals(self.sock)
        tls = isinstance(stream, trio.SSLStream)
        raw: Any = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        try:
            host, port = raw.socket.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            host, self.peer = None, "?"
        self.session = Session(server.broker, self.peer, host, peer_cert_user=peer_cert_user,
                               tls=tls)
        self.session.wake = self._wake
        self.session.flow_resumed = self._flow_resumed
        self._flow_event = trio.Event()
        self._wake_event = trio.Event()
        self._drained = trio.Event()
        self._writer_done = trio.Event()
        self.closing = False
        self.alarm_blocked = False  # not read while a resource alarm holds (see _reader)
        self._read_scope: trio.CancelScope | None = None  # around a plain socket's receive
        self.last_received = self.last_sent = time.monotonic()
        self.read_at = 0.0  # broker.timers.now() of the last read (its input may wait in slices)
        self.drained_at = server.broker.timers.now()  # of the last read that emptied the socket

    def _wake(self) -> None:
        self._wake_event.set()

    def stop_reading(self) -> None:
        """A resource alarm: end a receive in progress (nothing was read by it), so that a
        publisher is blocked now, not after its next read. Plain sockets only: a TLS
        stream's receive is not cancelled (it blocks after that read)."""
        if self._read_scope is not None:
            self._read_scope.cancel()

    def _flow_resumed(self) -> None:
        self._flow_event.set()

    async def _flow_pause(self) -> None:
        """In flow: wait until the queues that throttle this connection drain, at most
        ``BLOCKED_READ_INTERVAL`` (then the caller reads a small slice, so that close,
        heartbeats and a stuck consumer never hold the connection forever)."""
        self._flow_event = trio.Event()
        with trio.move_on_after(BLOCKED_READ_INTERVAL):
            await self._flow_event.wait()

    async def run(self) -> None:
        session = self.session
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self._writer)
                nursery.start_soon(self._watchdog)
                await self._reader()
                # Reader finished: let the writer flush what is left (close-ok, close).
                self.closing = True
                self._wake()
                with trio.move_on_after(self.server.broker.config.close_timeout):
                    await self._writer_done.wait()
                    await self._discard_until_eof()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as group:
            # A failed write surfaces from the writer task wrapped in the nursery's group.
            log.info("connection %s: dropped (%s)", self.peer,
                     ", ".join(sorted({type(e).__name__ for e in group.exceptions})))
        finally:
            # The one clean-up for every way a connection ends (close handshake, EOF, reset,
            # write error, heartbeat or handshake timeout, shutdown): requeue, drop exclusives,
            # and free the bodies still being received at once.
            session.connection_lost()
            session.conn.release_input()
            with trio.CancelScope(shield=True):
                with trio.move_on_after(1):
                    await self.stream.aclose()

    async def _reader(self) -> None:
        session = self.session
        conn = session.conn
        broker = self.server.broker
        stream = self.stream
        sock = self.sock
        timers = broker.timers
        # Frames other than body frames handled per go, a yield to others between goes.
        conn.input_budget = broker.config.flow_read_slice
        ready = False  # the last read filled its buffer: more is probably waiting
        if self.prefix:
            session.data_received(self.prefix)
        while not session.finished:
            # Back-pressure: do not read while our own output piles up
            # (a client that does not read) or publishers are blocked by an alarm.
            while conn.pending_output > session.output_high_water * 4 and not session.finished:
                self._drained = trio.Event()
                await self._drained.wait()
            size = broker.config.receive_size
            if broker.stops_publishers and session.is_publisher and conn.state is State.OPEN:
                await self._blocked_by_alarm()
                continue
            if session.flow_queues:
                await self._flow_pause()
                if session.flow_queues:
                    size = BLOCKED_READ_SIZE
            data, anc = b"", []
            try:
                if sock is None:
                    data = await stream.receive_some(size)
                    n = len(data)
                elif ready:
                    # more is waiting: receive into the frame buffer or a body's frames
                    bufs = conn.get_buffers(size)
                    n, anc, _flags, _addr = await sock.recvmsg_into(bufs, self.anc_size)
                    ready = n == sum(map(len, bufs))
                    release_all(bufs)
                else:
                    # an idle or trickling connection: the kernel allocates what arrives (no
                    # buffer held while waiting); an alarm can end the wait (stop_reading)
                    with trio.CancelScope() as scope:
                        self._read_scope = scope
                        data, anc, _flags, _addr = await sock.recvmsg(size, self.anc_size)
                    self._read_scope = None
                    if scope.cancelled_caught:
                        continue  # nothing was read: blocked before the next read
                    n = len(data)
                    ready = n == size
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if not n:
                log.info("connection %s: closed by peer without connection.close", self.peer)
                return
            self.last_received = time.monotonic()
            if not data:
                conn.buffer_updated(n)
            now = timers.now()  # arrived (kernel's time) after the last read that emptied it
            timers.received_at = self.read_at = now - arrived_ago(anc, now - self.drained_at)
            self.drained_at = self.drained_at if ready else now
            try:
                session.data_received(data)
            finally:
                timers.received_at = None
            if session.login_wait is not None:
                await self._login()
            if conn.input_pending:
                await self._feed_slices()

    async def _blocked_by_alarm(self) -> None:
        """A publisher while a resource alarm holds: as RabbitMQ, its socket is not read at
        all (connection.blocked sent) until the alarm clears, or the connection is closed
        from our side (then its close-ok must be read). The client's heartbeats are not
        read meanwhile, so the watchdog does not count them (``alarm_blocked``)."""
        session = self.session
        conn = session.conn
        broker = self.server.broker
        broker.notify_blocked(session)
        self.alarm_blocked = True
        try:
            while broker.stops_publishers and conn.state is State.OPEN and not session.finished:
                with trio.move_on_after(BLOCKED_CHECK_INTERVAL):
                    await self.server.unblocked_event().wait()
        finally:
            self.alarm_blocked = False
            self.last_received = time.monotonic()

    async def _feed_slices(self) -> None:
        """Handle the rest of what was read a budget at a time, yielding between goes so that
        other connections (consumers' acks, writers) get the loop; stop between goes while
        the connection is in flow (the rest waits in the frame buffer, bounded by
        receive_size)."""
        session = self.session
        conn = session.conn
        timers = self.server.broker.timers
        budget = conn.input_budget
        while conn.input_pending and not session.finished:
            if session.flow_queues:
                await self._flow_pause()
                conn.input_budget = BLOCKED_READ_SIZE if session.flow_queues else budget
            else:
                await trio.lowlevel.checkpoint()
            timers.received_at = self.read_at  # the rest of the same read
            try:
                session.data_received(b"")
            finally:
                timers.received_at = None
            if session.login_wait is not None:
                await self._login()
        conn.input_budget = budget

    async def _login(self) -> None:
        """An opaque OAuth 2 token in start-ok: its introspection decides the login (the
        connection reads nothing meanwhile)."""
        session = self.session
        assert session.login_wait is not None
        await self.server.broker.access.introspect(session.login_wait)
        session.resume_login()

    async def _discard_until_eof(self) -> None:
        """After answering the peer's close, read and drop until the peer closes its end (as
        RabbitMQ does): closing our socket while the client still writes would reset the
        connection, and a client that sent close with publishes in flight would never see
        its close-ok. Bounded by the caller's close timeout."""
        if not self.session.conn.linger_for_eof:
            return  # the peer is done (its close-ok), or a stream dropped for a framing error
        try:
            while await self.stream.receive_some(self.server.broker.config.receive_size):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    async def _writer(self) -> None:
        session = self.session
        conn = session.conn
        stream = self.stream
        sock = self.sock
        while True:
            await self._wake_event.wait()
            self._wake_event = trio.Event()
            while True:
                if session.output_delay:
                    # a failed login is answered late; only this connection waits
                    delay, session.output_delay = session.output_delay, 0.0
                    await trio.sleep(delay)
                if sock is None:
                    data = conn.data_to_send()
                    if not data:
                        break
                    await stream.send_all(data)
                else:
                    bufs = conn.buffers_to_send()
                    if not bufs:
                        break
                    await send_buffers(sock, bufs)
                self.last_sent = time.monotonic()
                if session.delivery_stalled:
                    session.output_drained()
            self._drained.set()
            if self.closing:
                self._writer_done.set()
                return

    async def _watchdog(self) -> None:
        """Handshake timeout, heartbeats both ways, and the close-ok timeout."""
        session = self.session
        conn = session.conn
        config = self.server.broker.config
        started = time.monotonic()
        closing_since = None
        while True:
            now = time.monotonic()
            state = conn.state
            if state not in (State.OPEN, State.CLOSING, State.CLOSED) \
                    and now - started > config.handshake_timeout:
                log.warning("connection %s: handshake timeout", self.peer)
                await self._abort()
                return
            if state is State.CLOSING:
                closing_since = closing_since or now
                if now - closing_since > config.close_timeout:
                    await self._abort()
                    return
            hb = conn.heartbeat
            if hb and state in (State.OPEN, State.CLOSING):
                if now - self.last_received > 2 * hb and not self.alarm_blocked:
                    log.warning("connection %s: missed heartbeats from client, timeout: %ss", self.peer, hb)
                    await self._abort()
                    return
                if now - self.last_sent >= hb / 2:
                    conn.send_heartbeat()
                    self._wake()
                await trio.sleep(max(0.05, min(hb / 4, 1.0)))
            else:
                await trio.sleep(0.5)

    async def _abort(self) -> None:
        self.session.finished = True
        self.nursery.cancel_scope.cancel()


class Server:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.handlers: set[ConnectionHandler] = set()
        self._unblocked = trio.Event()
        broker.alarms_changed.append(self._alarms_changed)
        self.listeners: list[trio.SocketListener] = []
        self.port: int | None = None
        self._accept_scope = trio.CancelScope()
        self.fatal: BaseException | None = None  # why the server stopped by itself
        self.tls_port: int | None = None  # the amqps port once open (config.tls_port)
        self.tls_context: ssl.SSLContext | None = None
        # set once the store is read back: accepted connections wait for it (serve)
        self._recovered = trio.Event()
        self._store_open = False  # a standby store is opened before the listeners

    def _alarms_changed(self) -> None:
        if not self.broker.blocked:
            self._unblocked.set()
        elif self.broker.stops_publishers:
            for handler in self.handlers:
                if handler.session.is_publisher:
                    handler.stop_reading()

    def unblocked_event(self) -> trio.Event:
        if not self.broker.blocked:
            ev = trio.Event()
            ev.set()
            return ev
        if self._unblocked.is_set():
            self._unblocked = trio.Event()
        return self._unblocked

    async def _handle(self, stream: trio.SocketStream) -> None:
        await self._recovered.wait()
        if self.broker.fenced:
            # a standby may own the store by now: refuse before the handshake
            await stream.aclose()
            return
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        except OSError:
            pass
        await self._serve_connection(stream)

    async def _handle_tls(self, stream: trio.SocketStream) -> None:
        """amqps: the TLS handshake first, bounded by the handshake timeout; a client that
        fails it (wrong CA, expired certificate, plain AMQP) is logged and dropped alone."""
        if self.broker.fenced:
            await stream.aclose()
            return
        try:
            stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        except OSError:
            pass
        assert self.tls_context is not None  # built by _open_tls before accepting
        await self._recovered.wait()
        tls_stream = trio.SSLStream(stream, self.tls_context, server_side=True)
        try:
            with trio.fail_after(self.broker.config.handshake_timeout):
                await tls_stream.do_handshake()
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError,
                OSError) as exc:
            try:
                peer = "{}:{}".format(*stream.socket.getpeername()[:2])
            except OSError:
                peer = "?"
            log.warning("connection %s: TLS handshake failed: %s", peer,
                        exc.__cause__ or exc or type(exc).__name__)
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()
            return
        await self._serve_connection(tls_stream, tls.peer_cert_user(tls_stream))

    async def _serve_connection(self, stream, peer_cert_user: str | None = None) -> None:
        prefix = b""
        amqp10 = self.broker.amqp10
        if amqp10 is not None and self.broker.config.amqp10:
            # RabbitMQ 4 serves AMQP 1.0 on the AMQP port: its protocol header says which
            sniffed = await self._sniff(stream)
            if sniffed is None:  # nothing within the handshake timeout
                with trio.move_on_after(1) as cleanup:
                    cleanup.shield = True
                    await stream.aclose()
                return
            prefix = sniffed
            if amqp10_listener.is_amqp10(prefix):
                tls_stream = isinstance(stream, trio.SSLStream)
                raw = stream.transport_stream if tls_stream else stream
                await amqp10.serve_connection(stream, raw.socket, tls_stream, prefix)
                return
        handler = ConnectionHandler(self, stream, peer_cert_user, prefix)
        self.handlers.add(handler)
        try:
            await handler.run()
        except Exception:
            log.exception("connection %s: internal error", handler.peer)
        finally:
            self.handlers.discard(handler)

    async def _sniff(self, stream) -> bytes | None:
        """The first octets of a connection, up to the six that tell AMQP 1.0's headers
        from 0-9-1's (fewer when they cannot be an AMQP header, the peer ends, or the
        handshake timeout passes: the 0-9-1 handler answers those); None when nothing
        came within the handshake timeout."""
        buf = b""
        with trio.move_on_after(self.broker.config.handshake_timeout) as scope:
            while len(buf) < 6 and b"AMQP".startswith(buf[:4]):
                try:
                    data = await stream.receive_some(6 - len(buf))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    break
                if not data:
                    break
                buf += data
        if scope.cancelled_caught and not buf:
            log.warning("connection: handshake timeout (nothing received)")
            return None
        return buf

    async def _run_timers(self) -> None:
        timers = self.broker.timers
        scope_holder: dict[str, trio.CancelScope | None] = {}

        def earlier(when: float) -> None:
            scope = scope_holder.get("scope")
            if scope is not None:
                scope.deadline = min(scope.deadline, trio.current_time() + (when - timers.now()))

        timers.on_earlier_deadline = earlier
        while True:
            timers.run_due()
            nxt = timers.next_deadline()
            deadline = math.inf if nxt is None else trio.current_time() + (nxt - timers.now())
            with trio.CancelScope(deadline=deadline) as scope:
                scope_holder["scope"] = scope
                await trio.sleep_forever()
            scope_holder["scope"] = None
            # Let connection tasks run between batches of due timers.
            await trio.lowlevel.checkpoint()

    async def _monitor_resources(self) -> None:
        while True:
            self.broker.check_resources()  # alarms set or cleared: see _alarms_changed
            await trio.sleep(1.0)

    async def serve(self, host: str, port: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        broker = self.broker
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            # Listen before recovery: a client connecting while the store is read back is
            # accepted and waits (nothing read from it) until recovery ends, and the HTTP
            # API (an early task) reports the progress meanwhile (docs/durability.md).
            # A standby listens only once it holds the store (it may wait for hours); a
            # cluster node only once the cluster took it in.
            await broker.store.prepare()
            if broker.store.standby:
                await self._open_store()
            self.listeners = listeners = await open_amqp_listeners(broker.config, port, host)
            self.port = listeners[0].socket.getsockname()[1]
            tls_listeners = await self._open_tls(host)
            broker.on_amqp_listening(self.port)  # management: its HTTP port binds after AMQP's
            for task in broker.early_tasks:
                nursery.start_soon(task)
            with trio.CancelScope() as self._accept_scope:
                async with trio.open_nursery() as accepting:
                    if tls_listeners:
                        accepting.start_soon(partial(trio.serve_listeners, self._handle_tls,
                                                     tls_listeners, handler_nursery=nursery))
                    accepting.start_soon(partial(trio.serve_listeners, self._handle, listeners,
                                                 handler_nursery=nursery))
                    await nursery.start(self._run_store)
                    nursery.start_soon(self._run_timers)
                    for task in broker.background_tasks:
                        nursery.start_soon(task)
                    nursery.start_soon(self._monitor_resources)
                    broker.recovery.listening()
                    self._recovered.set()
                    log.info("TrioMQ listening on %s:%s (store: %s; %s)", host, self.port,
                             broker.store.name, amqp_builds.describe())
                    task_status.started(self.port)
            for listener in listeners + tls_listeners:
                await listener.aclose()

    async def _open_tls(self, host: str) -> list:
        """The amqps listeners of ``config.tls_port`` (none when it is None)."""
        config = self.broker.config
        port = config.tls_port
        if port is None:
            return []
        self.tls_context = tls.server_context(config)
        try:
            listeners = await trio.open_tcp_listeners(port, host=None if host in ("", "*") else host)
        except OSError as exc:
            from . import ListenError
            raise ListenError(f"amqps: {describe_listen_error(exc, host, port)}") from None
        self.tls_port = listeners[0].socket.getsockname()[1]
        log.info("TrioMQ listening for amqps on %s:%s", host, self.tls_port)
        return listeners

    async def _open_store(self) -> None:
        store = self.broker.store
        store.progress = self.broker.recovery
        await store.open()
        self._store_open = True

    async def _run_store(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        store = self.broker.store
        if not self._store_open:
            await self._open_store()
        self.broker.recover()
        task_status.started()
        try:
            await store.run()
            # stores without background work return at once
            await trio.sleep_forever()
        except StoreUnavailable as exc:
            # the store can no longer be served from (another broker took it over): close
            # every connection with 320, then stop with the store's one-line reason
            self.fatal = exc
            await self.shutdown()
        finally:
            with trio.CancelScope(shield=True):
                await store.close()

    async def shutdown(self) -> None:
        """Close every connection with 320 CONNECTION_FORCED, then stop."""
        self._accept_scope.cancel()
        for handler in list(self.handlers):
            handler.session.force_close(errors.connection_forced(SHUTDOWN_REASON))
        with trio.move_on_after(2):
            while self.handlers:  # noqa: ASYNC110 - a short poll, once, at shutdown
                await trio.sleep(0.05)
        for drain in self.broker.drain_hooks:
            await drain()  # work that must settle while the store is still open
        self.nursery.cancel_scope.cancel()


async def run_server(broker: Broker, host: str, port: int) -> None:
    server = Server(broker)
    async with trio.open_nursery() as nursery:

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            await server.serve(host, port, task_status=task_status)
            nursery.cancel_scope.cancel()  # stopped by itself (server.fatal): stop the rest

        await nursery.start(serve)
        # What exists once started (modules, recovered definitions and messages) lives as long
        # as the broker: out of the cyclic GC's scans (a full collection under load: a few ms,
        # not ~70 ms at 1,000 HTTP publishes/s). Large bodies reuse the heap's freed pages.
        gc.freeze()
        keep_free_heap(broker.config.free_heap_kept)

        async def on_signals():
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("received %s, shutting down", signal.Signals(signum).name)
                    await server.shutdown()
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(on_signals)
    if server.fatal is not None:
        raise server.fatal


def describe_listen_error(exc: OSError, host: str, port: int) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"cannot listen on {host}:{port}: address already in use"
    if exc.errno == errno.EACCES:
        return f"cannot listen on {host}:{port}: permission denied"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
