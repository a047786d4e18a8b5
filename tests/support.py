"""Helpers for white-box tests of the broker core: a fake clock, message and method
builders, an error matcher, and two clients that speak AMQP to the broker without pika:

- ``SessionClient`` drives a ``broker.listeners.amqp_session.Session`` synchronously (bytes in, frames
  out): the whole channel layer without sockets or trio.
- ``TrioClient`` talks to an in-process server (``inprocess_broker`` fixture) over a real
  TCP stream from inside the test's trio run.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import trio

from broker.amqp import spec
from broker.amqp.codec import FrameReader, content_frames, method_frame, parse_content_header
from broker.amqp.fields import decode_properties, encode_properties
from broker.listeners.amqp_session import Session
from broker.message import Message

from .amqp.sansio_helpers import GUEST_PLAIN, HEADER, conn_open, start_ok, tune_ok


# ---- time ---------------------------------------------------------------------------
class FakeClock:
    """A clock for ``TimerQueue(clock)``; ``advance`` moves time and runs due timers."""

    def __init__(self, start: float = 1000.0):
        self.t = start
        self.timers = None  # set by whoever builds the TimerQueue on this clock

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> int:
        self.t += seconds
        return self.timers.run_due(self.t) if self.timers is not None else 0


# ---- builders -------------------------------------------------------------------------
def make_message(body: bytes = b"m", exchange: str = "", routing_key: str = "",
                 **properties) -> Message:
    """A message as a publish would make it (properties encoded once, as on the wire)."""
    return Message(exchange, routing_key, encode_properties(properties), properties, body)


def declare_queue(vhost, name: str = "", owner=None, **fields):
    """``vhost.declare_queue`` with ``fields`` (durable, exclusive, arguments...)."""
    return vhost.declare_queue(name, owner, **fields)


def declare_exchange(vhost, name: str, type: str = "direct", **fields):
    return vhost.declare_exchange(name, type, **fields)


def bind(vhost, source: str, destination, routing_key: str = "", arguments: dict | None = None):
    return vhost.bind(source, destination, routing_key, arguments or {})


def unbind(vhost, source: str, destination, routing_key: str = "", arguments: dict | None = None,
           owner=None):
    return vhost.unbind(source, destination, routing_key, arguments or {}, owner)


@contextlib.contextmanager
def amqp_error(code: int, contains: str | None = None):
    """Expect the broker core to raise an AMQP error with ``code`` (and ``contains`` in its text).

    Matches any exception carrying ``code``/``text``, whatever class the core uses for it.
    """
    try:
        yield
    except Exception as exc:
        got = getattr(exc, "code", None)
        if got is None:
            raise
        text = getattr(exc, "text", str(exc))
        assert got == code, f"expected reply code {code}, got {got}: {text}"
        assert text.startswith(spec.REPLY_NAMES[code] + " - "), text
        if contains is not None:
            assert contains in text, text
    else:
        raise AssertionError(f"no AMQP error {code} raised")


# ---- decoding what the broker wrote -------------------------------------------------------
@dataclass
class Written:
    """One method the broker wrote, with its content (deliver/get-ok/return) when it has one."""
    channel: int
    method: spec.Method
    properties: dict = field(default_factory=dict)
    body: bytes | None = None

    @property
    def headers(self) -> dict:
        return self.properties.get("headers") or {}


class FrameParser:
    """Frames -> ``Written`` items; keeps partial content between ``feed`` calls."""

    def __init__(self):
        self.reader = FrameReader(frame_max=0)
        self._pending: dict[int, list] = {}  # channel -> [Written, remaining body size]

    def feed(self, data: bytes) -> list[Written]:
        out = []
        for ftype, channel, payload in self.reader.feed(data):
            if ftype == spec.FRAME_METHOD:
                item = Written(channel, spec.decode_method(payload))
                if item.method.HAS_CONTENT:
                    self._pending[channel] = [item, None]
                else:
                    out.append(item)
            elif ftype == spec.FRAME_HEADER:
                pending = self._pending[channel]
                _cls, size, raw = parse_content_header(payload)
                pending[0].properties = decode_properties(raw)
                pending[0].body = b""
                pending[1] = size
                if size == 0:
                    out.append(self._pending.pop(channel)[0])
            elif ftype == spec.FRAME_BODY:
                pending = self._pending[channel]
                pending[0].body += payload
                if len(pending[0].body) >= pending[1]:
                    out.append(self._pending.pop(channel)[0])
        return out


def publish_frames(channel: int, body: bytes, exchange: str = "", routing_key: str = "",
                   mandatory: bool = False, properties: dict | None = None,
                   frame_max: int = 131072) -> bytes:
    head = method_frame(channel, spec.Basic.Publish(0, exchange, routing_key, mandatory, False))
    return head + b"".join(content_frames(channel, encode_properties(properties or {}), body,
                                          frame_max))


# ---- a client for a sans-IO Session ---------------------------------------------------------
class SessionClient:
    """Speaks AMQP to a ``Session`` of ``broker`` directly: every call returns what the broker
    wrote in answer, decoded. No sockets, no trio; timers only run when the test says so."""

    def __init__(self, broker, capabilities: dict | None = None, vhost: str = "/",
                 peer: str = "127.0.0.1:50000"):
        self.broker = broker
        self.session = Session(broker, peer, peer.rsplit(":", 1)[0])
        self.wakes = 0

        def wake():
            self.wakes += 1

        self.session.wake = wake
        self.parser = FrameParser()
        caps = {"consumer_cancel_notify": True, "publisher_confirms": True,
                "basic.nack": True} if capabilities is None else capabilities
        self.send(HEADER)
        self.send(start_ok("PLAIN", GUEST_PLAIN, caps))
        self.send(tune_ok())
        opened = self.send(conn_open(vhost))
        assert [type(w.method) for w in opened] == [spec.Connection.OpenOk], opened

    @property
    def conn(self):
        return self.session.conn

    def send(self, data: bytes) -> list[Written]:
        self.session.data_received(data)
        return self.output()

    def output(self) -> list[Written]:
        """Everything written since the last call (deliveries caused by other clients too)."""
        return self.parser.feed(self.conn.data_to_send())

    def call(self, channel: int, method: spec.Method) -> list[Written]:
        return self.send(method_frame(channel, method))

    def ok(self, channel: int, method: spec.Method, reply: type | None = None) -> spec.Method:
        """Send ``method`` and return its one reply, failing on anything else (e.g. a close)."""
        written = self.call(channel, method)
        replies = [w.method for w in written]
        assert len(replies) == 1, replies
        if reply is not None:
            assert isinstance(replies[0], reply), replies
        return replies[0]

    def open_channel(self, channel: int = 1) -> int:
        self.ok(channel, spec.Channel.Open(), spec.Channel.OpenOk)
        return channel

    def publish(self, channel: int, body: bytes, exchange: str = "", routing_key: str = "",
                mandatory: bool = False, **properties) -> list[Written]:
        return self.send(publish_frames(channel, body, exchange, routing_key, mandatory,
                                        properties, self.conn.frame_max))

    def declare_queue(self, channel: int, name: str = "", **fields) -> spec.Method:
        return self.ok(channel, spec.Queue.Declare(queue=name, **fields), spec.Queue.DeclareOk)

    def consume(self, channel: int, queue: str, tag: str = "", **fields) -> list[Written]:
        """basic.consume; returns consume-ok followed by any deliveries it triggered."""
        written = self.call(channel, spec.Basic.Consume(queue=queue, consumer_tag=tag, **fields))
        assert written and isinstance(written[0].method, spec.Basic.ConsumeOk), written
        return written

    def close_connection(self) -> list[Written]:
        return self.call(0, spec.Connection.Close(200, "bye", 0, 0))

    def drop(self) -> None:
        """The socket went away without a close (what the server's edge does on EOF)."""
        self.session.connection_lost()


def methods(written: list[Written], kind: type | None = None) -> list:
    return [w.method for w in written if kind is None or isinstance(w.method, kind)]


def channel_close(written: list[Written]) -> spec.Channel.Close:
    closes = methods(written, spec.Channel.Close)
    assert len(closes) == 1, written
    return closes[0]


def connection_close(written: list[Written]) -> spec.Connection.Close:
    closes = methods(written, spec.Connection.Close)
    assert len(closes) == 1, written
    return closes[0]


# ---- a client over TCP for the in-process server ----------------------------------------------
class TrioClient:
    """A minimal AMQP client on ``trio.open_tcp_stream`` for tests that need the real edge
    (server tasks, sockets): handshake, channels, methods, publishes, reading frames."""

    def __init__(self, stream: trio.SocketStream):
        self.stream = stream
        self.parser = FrameParser()
        self.received: list[Written] = []

    @classmethod
    async def connect(cls, port: int, host: str = "127.0.0.1", handshake: bool = True) -> TrioClient:
        client = cls(await trio.open_tcp_stream(host, port))
        if handshake:
            await client.handshake()
        return client

    async def handshake(self, vhost: str = "/", heartbeat: int = 0) -> None:
        await self.stream.send_all(HEADER)
        await self.expect(spec.Connection.Start)
        await self.stream.send_all(start_ok("PLAIN", GUEST_PLAIN,
                                            {"consumer_cancel_notify": True}))
        await self.expect(spec.Connection.Tune)
        await self.stream.send_all(tune_ok(heartbeat=heartbeat) + conn_open(vhost))
        await self.expect(spec.Connection.OpenOk)

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def call(self, channel: int, method: spec.Method, reply: type | None = None):
        await self.send(method_frame(channel, method))
        if reply is not None:
            return (await self.expect(reply)).method
        return None

    async def publish(self, channel: int, body: bytes, exchange: str = "", routing_key: str = "",
                      mandatory: bool = False, **properties) -> None:
        await self.send(publish_frames(channel, body, exchange, routing_key, mandatory, properties))

    async def next(self, within: float = 5.0) -> Written | None:
        """The next method (with content) the broker wrote; None at EOF."""
        with trio.fail_after(within):
            while not self.received:
                data = await self.stream.receive_some(65536)
                if not data:
                    return None
                self.received.extend(self.parser.feed(data))
        return self.received.pop(0)

    async def expect(self, kind: type, within: float = 5.0) -> Written:
        item = await self.next(within)
        assert item is not None, f"connection closed while waiting for {kind.NAME}"
        assert isinstance(item.method, kind), f"expected {kind.NAME}, got {item.method!r}"
        return item

    async def eof(self, within: float = 5.0) -> bool:
        """Read until the broker closes the stream; True if it did within ``within`` seconds."""
        with trio.move_on_after(within):
            while True:
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return True
                if not data:
                    return True
                self.received.extend(self.parser.feed(data))
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()


def broker_life(url: str, data_dir, body) -> None:
    """One broker life on the store at ``url``: open, recover, ``body(vhost '/')``, close
    (for tests that check what survives a restart)."""
    async def main():
        from broker.broker import Broker
        from broker.config import Config
        from broker.persistence import open_store
        store = open_store(url, str(data_dir))
        await store.open()
        broker = Broker(Config(data_dir=str(data_dir)), store)
        broker.recover()
        body(broker.vhosts["/"])
        await store.close()
    trio.run(main)
