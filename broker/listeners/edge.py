"""The trio edge every protocol listener but AMQP 0-9-1's shares (MQTT, STOMP, AMQP 1.0,
RabbitMQ Stream, and their WebSocket and TLS variants): opening ports (plain, TLS,
WebSocket), accepting a socket, one nursery per connection, the read loop (handshake and
heartbeat deadlines, not reading while a resource alarm holds, slowed reading while a
queue's flow holds the publisher, bounded output, the OAuth 2 login wait), the writer
woken by the session, and the close. Not here: any protocol (sans-IO, under
``broker.<protocol>``) nor what a connection means to the broker (``*_session``).

A protocol's handler subclasses ``ConnectionEdge`` and sets its knobs (``what``, ``log``,
``flow_read_size``, ``tells_blocked``, ``bounded_output``), its deadline and timeout
(``deadline``, ``timed_out``) and, for an event-woken writer, ``output`` and ``written``;
its listener subclasses ``EdgeListener``.
"""
from __future__ import annotations

import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import trio
import trio.lowlevel

from . import ListenError

if TYPE_CHECKING:
    from ..broker import Broker
    from ..config import Config

BLOCKED_READ_INTERVAL = 0.1  # the alarm poll, and the longest wait on a flow release
BLOCKED_READ_SIZE = 4096
# what a broken connection raises on the socket (or its TLS)
DROPPED = (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError)


def listen_host(config: Config) -> str | None:
    return None if config.host in ("", "*", "0.0.0.0") else config.host


def tcp_socket(stream: trio.abc.Stream) -> tuple[trio.socket.SocketType, bool]:
    """The socket under an accepted stream (TLS or not), and whether it is TLS; Nagle off."""
    # a trio.SocketStream (its ``socket``), plain or under TLS
    raw: Any = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    sock = raw.socket
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
    except OSError:
        pass
    return sock, raw is not stream


def peer_of(sock: trio.socket.SocketType) -> tuple[str | None, str]:
    """(host, "host:port") of the socket's peer; (None, "?") once it is gone."""
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return None, "?"
    return host, f"{host}:{port}"


async def close_stream(stream: trio.abc.AsyncResource) -> None:
    """Close, shielded and bounded: a peer that stopped reading holds nothing up."""
    with trio.CancelScope(shield=True), trio.move_on_after(1):
        await stream.aclose()


class EdgeListener:
    """One protocol's ports of one broker (``ports`` once open) and its connections'
    handlers."""

    log: logging.Logger
    service: Any  # the protocol's broker-wide settings (``stopping``, counters)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.handlers: set[ConnectionEdge[Any]] = set()
        self.ports: dict[str, int] = {}

    def ssl_context(self, option: str) -> ssl.SSLContext:
        """The amqps listener's context (its certificate and client verification); a bad
        setting is an error of ``option``."""
        from ..security.tls import TLSConfigError, server_context
        try:
            return server_context(self.broker.config)
        except TLSConfigError as exc:
            raise ListenError(f"{option}: {exc}") from None

    def cannot_listen(self, name: str, port: int, host: str | None, exc: OSError) -> str:
        return f"cannot listen for {name} on {host or '*'}:{port}: {exc.strerror or exc}"

    async def open_port(self, name: str, port: int, host: str | None,
                        tls_option: str | None = None, https_compatible: bool = False,
                        label: str | None = None) -> list[trio.abc.Listener[Any]]:
        """Listen on ``port`` (TLS when ``tls_option`` names the setting that asked for it;
        ``https_compatible``: peers may end TLS without close_notify, as browsers do)."""
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise ListenError(self.cannot_listen(name, port, host, exc)) from None
        self.ports[name] = listeners[0].socket.getsockname()[1]
        self.log.info("%s listening on %s:%s", label or name.upper(), host or "*",
                      self.ports[name])
        if tls_option is not None:
            ctx = self.ssl_context(tls_option)
            return [trio.SSLListener(lst, ctx, https_compatible=https_compatible)
                    for lst in listeners]
        return list(listeners)

    async def open_pair(self, host: str | None, plain: tuple[str, int | None],
                        tls: tuple[str, int | None, str]) -> list[trio.abc.Listener[Any]]:
        """A protocol's plain port and its TLS port (``tls``: name, port, the option that
        asked for it), each where configured."""
        listeners: list[trio.abc.Listener[Any]] = []
        if plain[1] is not None:
            listeners += await self.open_port(plain[0], plain[1], host)
        if tls[1] is not None:
            listeners += await self.open_port(tls[0], tls[1], host, tls[2])
        return listeners

    async def serve_ports(self, listeners: list[trio.abc.Listener[Any]],
                          ws_listeners: list[trio.abc.Listener[Any]] | None = None,
                          ws_handle: Callable[[Any], Awaitable[None]] | None = None,
                          tasks: tuple[Callable[[], Awaitable[None]], ...] = ()) -> None:
        """Serve what ``listeners`` accept (``_handle``) and the WebSocket upgrades of
        ``ws_listeners`` (``ws_handle``), beside the listener's own ``tasks``; the service
        is stopping once this ends."""
        try:
            async with trio.open_nursery() as nursery:
                for task in tasks:
                    nursery.start_soon(task)
                if ws_listeners:
                    assert ws_handle is not None, "WebSocket listeners without their handler"
                    nursery.start_soon(trio.serve_listeners, ws_handle, ws_listeners)
                if listeners:
                    await trio.serve_listeners(self._handle, listeners)
        finally:
            self.service.stopping = True

    async def _handle(self, stream: trio.abc.Stream) -> None:
        raise NotImplementedError

    async def serve(self, handler: ConnectionEdge[Any]) -> None:
        """Run one connection's handler; it is in ``handlers`` meanwhile."""
        self.handlers.add(handler)
        try:
            await handler.run()
        except Exception:
            handler.log.exception("%s %s: internal error", handler.what, handler.peer)
        finally:
            self.handlers.discard(handler)


ListenerT = TypeVar("ListenerT", bound=EdgeListener)


class ConnectionEdge(Generic[ListenerT]):
    """One connection's trio side: its reader in the connection's task, its writer in the
    connection's nursery. The session is synchronous: the edge feeds it what it reads
    (``data_received``) and writes what its connection queued when it calls ``wake``.
    ``ListenerT``: the protocol's listener class (what ``self.listener`` is)."""

    # __slots__ for MQTT's handler (one per device, thousands idle); the others add a dict
    __slots__ = ("_drained", "_flow_event", "_last_received", "_output", "_started",
                 "listener", "peer", "session", "stream")

    what = "connection"  # "<protocol> connection": the log lines' subject
    log = logging.getLogger("broker")
    # while a queue's flow holds the publisher, read this much at a time (None: as usual)
    flow_read_size: int | None = None
    # an alarm is told to the client (a frame saying it is blocked), not only felt
    tells_blocked = True
    # stop reading while more than four times the output high-water mark waits unwritten
    bounded_output = True
    # a schedule point after each read, whether or not the socket made one
    yield_after_read = False

    def __init__(self, listener: ListenerT, stream: trio.abc.Stream,
                 sock: trio.socket.SocketType) -> None:
        self.listener = listener
        self.stream = stream
        self.peer = "?"
        self.session: Any = None
        # created only while the reader waits on them: idle connections are many
        self._drained: trio.Event | None = None
        self._flow_event: trio.Event | None = None
        self._started = self._last_received = trio.current_time()

    def attach(self, session: Any, sock: trio.socket.SocketType, tls: bool) -> None:
        """The session this edge serves, on ``sock``."""
        self.session = session
        try:
            session.local_port = sock.getsockname()[1]
        except OSError:
            pass
        session.tls = tls
        session.wake = self._wake
        session.flow_resumed = self._flow_resumed

    # ---- hooks ----
    def deadline(self) -> float:
        """When the reader gives up waiting (trio clock): handshake, heartbeats."""
        return math.inf

    def timed_out(self) -> None:
        """``deadline`` passed: log why and close the session."""

    def after_read(self) -> None:
        """After each read was handled."""

    def output(self) -> bytes:
        """What the session's connection queued (the event-woken writer's)."""
        data: bytes = self.session.conn.data_to_send()
        return data

    def written(self, nursery: trio.Nursery) -> None:
        """The writer wrote ``output`` (or found none)."""

    # ---- the connection ----
    def _wake(self) -> None:
        self._output.set()

    def _flow_resumed(self) -> None:
        if self._flow_event is not None:
            self._flow_event.set()

    def stopping(self) -> bool:
        """In ``run``'s finally: cancelled from outside means the broker is stopping (its
        clients did nothing wrong); the service is told."""
        if trio.current_effective_deadline() == -math.inf:
            self.listener.service.stopping = True
            return True
        return False

    async def run(self) -> None:
        session = self.session
        self._output = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.write_loop, nursery)
                await self.read_loop()
                self._wake()  # the writer writes what is left, then ends the nursery
        except* DROPPED:
            self.log.info("%s %s: dropped", self.what, self.peer)
        finally:
            self.stopping()
            session.connection_lost()
            self.closed()
            await close_stream(self.stream)

    def closed(self) -> None:
        """The session ended; the socket is closed next."""

    async def read_loop(self) -> None:
        session = self.session
        conn = session.conn
        listener = self.listener
        broker = listener.broker
        stream = self.stream
        while not session.finished:
            if self.bounded_output:
                while (conn.pending_output > session.output_high_water * 4
                       and not session.finished):
                    drained = self._drained = trio.Event()
                    await drained.wait()
                    self._drained = None
            size = broker.config.receive_size
            if broker.stops_publishers and session.is_publisher:
                await self.publishers_stopped()
                continue
            if session.input_held:
                await self.input_released()
                continue
            if session.flow_queues:
                size = await self.in_flow(size)
            try:
                with trio.move_on_at(self.deadline()) as scope:
                    data = await stream.receive_some(size)
            except DROPPED:
                data = b""
            if scope.cancelled_caught:
                self.timed_out()
                return
            if not self.received(data):
                return
            if session.login_wait is not None:
                await self.login_decided()
            self.after_read()
            if self.yield_after_read:
                await trio.lowlevel.checkpoint()

    # ---- the read loop's steps (shared with a protocol's own read loop: MQTT's) ----
    async def publishers_stopped(self) -> None:
        """A resource alarm stops publishers: this one's connection is not read at all until
        it clears, as for AMQP 0-9-1 (heartbeats count again from then: they were not read)."""
        session = self.session
        broker = self.listener.broker
        if self.tells_blocked:
            broker.notify_blocked(session)
        while broker.stops_publishers and not session.finished:  # noqa: ASYNC110
            await trio.sleep(BLOCKED_READ_INTERVAL)  # (a poll: alarms are rare)
        self._last_received = trio.current_time()

    async def input_released(self) -> None:
        """The session holds more input than it may behind an answer waiting for the store
        (a full disk: until the retry writes): nothing is read until it lets go, so a
        flooding client's bytes wait in its socket, not in the broker. The keep-alive
        counts from then, as after an alarm: the client's packets were not read."""
        session = self.session
        while session.input_held and not session.finished:
            released = self._flow_event = trio.Event()
            await released.wait()
            self._flow_event = None
        self._last_received = trio.current_time()

    async def in_flow(self, size: int) -> int:
        """The session is in flow: wait for its release, at most ``BLOCKED_READ_INTERVAL``;
        the size of the next read (``flow_read_size`` while still in flow)."""
        flow = self._flow_event = trio.Event()
        with trio.move_on_after(BLOCKED_READ_INTERVAL):
            await flow.wait()
        self._flow_event = None
        if self.session.flow_queues and self.flow_read_size is not None:
            return self.flow_read_size
        return size

    def received(self, data: bytes | bytearray) -> bool:
        """A read's bytes to the session; False at the end of the stream (``b""``: the
        session is finished)."""
        session = self.session
        if not data:
            session.finished = True
            session.connection_lost()
            return False
        self._last_received = trio.current_time()
        self.listener.service.bytes_received += len(data)
        session.data_received(data)
        return True

    async def login_decided(self) -> None:
        """An opaque OAuth 2 token: its introspection decides the login (nothing is read
        meanwhile)."""
        session = self.session
        await self.listener.broker.access.introspect(session.login_wait[0])
        session.resume_login()

    async def write_loop(self, nursery: trio.Nursery) -> None:
        """Write whenever the session wakes the edge; end the nursery once the session is
        finished and everything is written."""
        session = self.session
        conn = session.conn
        while True:
            await self._output.wait()
            self._output = trio.Event()
            if session.output_delay:  # a refused login's answer is held back
                delay, session.output_delay = session.output_delay, 0.0
                await trio.sleep(delay)
            data = self.output()
            if data:
                await self.stream.send_all(data)
                self._sent()
            if session.finished and not conn.has_output:
                nursery.cancel_scope.cancel()
                return
            self.written(nursery)

    def _sent(self) -> None:
        if self.session.delivery_stalled:
            self.session.output_drained()
        if self._drained is not None:
            self._drained.set()


class HeartbeatEdge(ConnectionEdge[ListenerT]):
    """An edge that sends the server's heartbeats whenever nothing else was written for the
    negotiated interval, and reads the client's."""

    __slots__ = ("_heartbeats_started", "_last_sent")

    def __init__(self, listener: ListenerT, stream: trio.abc.Stream,
                 sock: trio.socket.SocketType) -> None:
        super().__init__(listener, stream, sock)
        self._last_sent = self._started
        self._heartbeats_started = False

    def heartbeat_interval(self) -> float:
        """Seconds between the server's heartbeats once open (0: none)."""
        return 0.0

    def send_heartbeat(self) -> None:
        raise NotImplementedError

    def _sent(self) -> None:
        self._last_sent = trio.current_time()
        super()._sent()

    def written(self, nursery: trio.Nursery) -> None:
        if not self._heartbeats_started and self.heartbeat_interval():
            self._heartbeats_started = True  # the open is written: heartbeats start
            nursery.start_soon(self._heartbeats)

    async def _heartbeats(self) -> None:
        interval = self.heartbeat_interval()
        while not self.session.finished:
            due = self._last_sent + interval
            now = trio.current_time()
            if now >= due:
                self.send_heartbeat()
                self._last_sent = now
                self._wake()
                due = now + interval
            await trio.sleep_until(due)
