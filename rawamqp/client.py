"""RawAMQP: a blocking, permissive byte-level AMQP connection for the interop tests.

Nothing is sent behind the caller's back: every step of the handshake is its own method
and any bytes can be written with ``send`` (malformed input on purpose), so that tests
can check how a broker reacts to exactly what they wrote.
"""
from __future__ import annotations

import socket
import struct
import time

from .codec import (
    BASIC_CONSUME,
    BASIC_CONSUME_OK,
    BASIC_PUBLISH,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_OPEN,
    CHANNEL_OPEN_OK,
    CONFIRM_SELECT,
    CONFIRM_SELECT_OK,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_OPEN,
    CONNECTION_OPEN_OK,
    CONNECTION_START,
    CONNECTION_START_OK,
    CONNECTION_TUNE,
    CONNECTION_TUNE_OK,
    FRAME_END_OCTET,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    QUEUE_DECLARE,
    QUEUE_DECLARE_OK,
    Reader,
    amqplain_response,
    body_frames,
    content_header,
    longstr,
    method_frame,
    plain_response,
    shortstr,
    table,
)

_FH = struct.Struct(">BHI")


class Closed(Exception):
    """The peer closed the TCP connection."""


class SocketClient:
    """A TCP connection (TCP_NODELAY) with a receive buffer; base of both clients."""

    recv_size = 65536

    def __init__(self, host: str, port: int, timeout: float):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = bytearray()

    def send(self, data) -> None:
        self.sock.sendall(data)

    def _recv_some(self, deadline: float) -> bool:
        """Append one read to ``buf``; False at EOF (or RST), TimeoutError at ``deadline``."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(self.recv_size)
        except ConnectionResetError:
            chunk = b""
        finally:
            try:
                self.sock.settimeout(self.timeout)
            except OSError:
                pass
        if not chunk:
            return False
        self.buf += chunk
        return True


class RawAMQP(SocketClient):
    """A blocking raw AMQP connection (not handshaken: see ``handshake``)."""

    def __init__(self, host: str, port: int, timeout: float = 5.0):
        super().__init__(host, port, timeout)
        self.server_properties = None
        self.mechanisms = None
        self.locales = None
        self.tune = None

    # -------------------------------------------------------------- io
    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _fill(self, n: int, timeout: float | None):
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < n:
            try:
                more = self._recv_some(deadline)
            except TimeoutError:
                raise TimeoutError(f"timed out waiting for {n} bytes (have {len(self.buf)})") from None
            if not more:
                raise Closed(f"connection closed by peer (buffered {bytes(self.buf)!r})")

    def recv_exact(self, n: int, timeout: float | None = None) -> bytes:
        self._fill(n, timeout)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_until_closed(self, timeout: float | None = None) -> bytes:
        """Read everything until EOF; raise TimeoutError if the socket stays open."""
        try:
            self._fill(len(self.buf) + 10**9, timeout)
        except Closed:
            pass
        out = bytes(self.buf)
        self.buf.clear()
        return out

    def read_frame(self, timeout: float | None = None):
        """(type, channel, payload); ("protocol-header", 0, the 8 octets) if the server
        answers with a protocol header."""
        self._fill(7, timeout)
        if self.buf[:4] == b"AMQP":
            return ("protocol-header", 0, self.recv_exact(8, timeout))
        ftype, channel, size = _FH.unpack_from(self.buf, 0)
        self._fill(8 + size, timeout)
        end = self.buf[7 + size]
        assert end == FRAME_END_OCTET, f"bad frame end from server: {bytes([end])!r}"
        payload = bytes(self.buf[7:7 + size])
        del self.buf[:8 + size]
        return (ftype, channel, payload)

    def read_method(self, timeout: float | None = None, skip_heartbeats: bool = True):
        """Return (channel, (class, method), Reader over the arguments)."""
        while True:
            ftype, channel, payload = self.read_frame(timeout)
            if ftype == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            if ftype != FRAME_METHOD:
                raise AssertionError(f"expected method frame, got type {ftype} {payload!r}")
            r = Reader(payload)
            cm = (r.short(), r.short())
            return channel, cm, r

    def expect(self, cm, channel=None, timeout=None):
        ch, got, r = self.read_method(timeout)
        if got != cm:
            extra = ""
            if got in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                extra = f" {r.short()} {r.shortstr()!r}"
            raise AssertionError(f"expected {cm}, got {got} on channel {ch}{extra}")
        if channel is not None:
            assert ch == channel, (ch, channel)
        return r

    # -------------------------------------------------------------- handshake
    def send_method(self, channel, cm, args=b""):
        self.send(method_frame(channel, cm, args))

    def start(self):
        """Send the protocol header and read connection.start."""
        self.send(PROTOCOL_HEADER)
        r = self.expect(CONNECTION_START, 0)
        major, minor = r.octet(), r.octet()
        self.server_properties = r.table()
        self.mechanisms = r.longstr().decode().split()
        self.locales = r.longstr().decode().split()
        return (major, minor)

    def start_ok(self, mechanism="PLAIN", response=None, client_properties=None):
        if response is None:
            response = plain_response() if mechanism == "PLAIN" else amqplain_response()
        props = client_properties or {
            "product": "triomq-interop-raw",
            "capabilities": {
                "authentication_failure_close": True,
                "consumer_cancel_notify": True,
                "publisher_confirms": True,
                "basic.nack": True,
                "exchange_exchange_bindings": True,
                "connection.blocked": True,
                "per_consumer_qos": True,
            },
        }
        args = table(props) + shortstr(mechanism) + longstr(response) + shortstr("en_US")
        self.send_method(0, CONNECTION_START_OK, args)

    def read_tune(self):
        r = self.expect(CONNECTION_TUNE, 0)
        self.tune = (r.short(), r.long(), r.short())  # channel_max, frame_max, heartbeat
        return self.tune

    def tune_ok(self, channel_max=2047, frame_max=131072, heartbeat=0):
        self.send_method(0, CONNECTION_TUNE_OK, struct.pack(">HIH", channel_max, frame_max, heartbeat))

    def open(self, vhost="/"):
        self.send_method(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + b"\x00")

    def handshake(self, vhost="/", heartbeat=0, frame_max=131072, channel_max=2047,
                  mechanism="PLAIN", response=None):
        self.start()
        self.start_ok(mechanism, response)
        self.read_tune()
        self.tune_ok(channel_max, frame_max, heartbeat)
        self.open(vhost)
        self.expect(CONNECTION_OPEN_OK, 0)
        return self

    def channel_open(self, ch=1):
        self.send_method(ch, CHANNEL_OPEN, shortstr(""))
        self.expect(CHANNEL_OPEN_OK, ch)

    # -------------------------------------------------------------- methods
    def queue_declare(self, ch, name="", passive=False, durable=False, exclusive=False,
                      auto_delete=False, args=None, nowait=False):
        bits = passive | durable << 1 | exclusive << 2 | auto_delete << 3 | nowait << 4
        self.send_method(ch, QUEUE_DECLARE, struct.pack(">H", 0) + shortstr(name)
                         + bytes([bits]) + table(args))
        if nowait:
            return None
        r = self.expect(QUEUE_DECLARE_OK, ch)
        return r.shortstr(), r.long(), r.long()

    def publish(self, ch, exchange, routing_key, body: bytes, mandatory=False, props=b"\x00\x00",
                frame_max: int = 0):
        """basic.publish + header + body in one write; ``props`` as from ``basic_properties``,
        the body cut in frames of at most ``frame_max - 8`` octets (0: one frame)."""
        data = method_frame(ch, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr(exchange)
                            + shortstr(routing_key) + bytes([mandatory | 0]))
        data += content_header(ch, len(body), props=props)
        data += b"".join(body_frames(ch, body, frame_max))
        self.send(data)

    def confirm_select(self, ch):
        self.send_method(ch, CONFIRM_SELECT, b"\x00")
        self.expect(CONFIRM_SELECT_OK, ch)

    def basic_consume(self, ch, queue, tag="", no_ack=False):
        bits = 0 | (no_ack << 1)
        self.send_method(ch, BASIC_CONSUME, struct.pack(">H", 0) + shortstr(queue) + shortstr(tag)
                         + bytes([bits]) + table({}))
        r = self.expect(BASIC_CONSUME_OK, ch)
        return r.shortstr()

    def expect_close(self, timeout=None):
        """Read until a connection.close or channel.close arrives.

        Returns (kind, channel, code, text, class_id, method_id) where kind is
        "connection" or "channel".  Other frames are skipped.
        """
        while True:
            ftype, channel, payload = self.read_frame(timeout)
            if ftype != FRAME_METHOD:
                continue
            r = Reader(payload)
            cm = (r.short(), r.short())
            if cm in (CONNECTION_CLOSE, CHANNEL_CLOSE):
                code, text, cid, mid = r.short(), r.shortstr(), r.short(), r.short()
                kind = "connection" if cm == CONNECTION_CLOSE else "channel"
                return kind, channel, code, text, cid, mid

    def expect_connection_close(self, timeout=None, close_ok=True):
        kind, channel, code, text, cid, mid = self.expect_close(timeout)
        assert kind == "connection", (kind, channel, code, text)
        if close_ok:
            try:
                self.send_method(0, CONNECTION_CLOSE_OK)
            except OSError:
                pass
        return code, text, cid, mid

    def expect_channel_close(self, timeout=None, close_ok=True):
        kind, channel, code, text, cid, mid = self.expect_close(timeout)
        assert kind == "channel", (kind, channel, code, text)
        if close_ok:
            self.send_method(channel, CHANNEL_CLOSE_OK)
        return channel, code, text, cid, mid

    def assert_eof(self, timeout=5.0):
        """Assert the server closes the socket within timeout (ignoring any data)."""
        self.read_until_closed(timeout)
