"""Minimal byte-level AMQP 0-9-1 client used by the interop tests.

Only what the tests need: frame encoding/decoding, field tables, the
connection handshake and a few methods.  Deliberately independent from
every client library so that malformed input can be produced at will.
"""
from __future__ import annotations

import socket
import struct
import time

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT = 1, 2, 3, 8

# (class_id, method_id) constants
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_SECURE = (10, 20)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_FLOW = (20, 20)
CHANNEL_FLOW_OK = (20, 21)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_QOS = (60, 10)
BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)
BASIC_PUBLISH = (60, 40)
BASIC_DELIVER = (60, 60)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)
BASIC_ACK = (60, 80)
CONFIRM_SELECT = (85, 10)
CONFIRM_SELECT_OK = (85, 11)


# ---------------------------------------------------------------- encoding
def shortstr(s) -> bytes:
    if isinstance(s, str):
        s = s.encode()
    assert len(s) < 256
    return bytes([len(s)]) + s


def longstr(s) -> bytes:
    if isinstance(s, str):
        s = s.encode()
    return struct.pack(">I", len(s)) + s


def _field_value(v) -> bytes:
    if isinstance(v, bool):
        return b"t" + (b"\x01" if v else b"\x00")
    if isinstance(v, int):
        if -(2**31) <= v < 2**31:
            return b"I" + struct.pack(">i", v)
        return b"l" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"d" + struct.pack(">d", v)
    if isinstance(v, (str, bytes)):
        return b"S" + longstr(v)
    if isinstance(v, dict):
        return b"F" + table(v)
    if isinstance(v, (list, tuple)):
        body = b"".join(_field_value(x) for x in v)
        return b"A" + struct.pack(">I", len(body)) + body
    if v is None:
        return b"V"
    raise TypeError(v)


def table(d: dict | None) -> bytes:
    body = b"".join(shortstr(k) + _field_value(v) for k, v in (d or {}).items())
    return struct.pack(">I", len(body)) + body


def frame(ftype: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def method_payload(cm, args: bytes = b"") -> bytes:
    return struct.pack(">HH", cm[0], cm[1]) + args


def method_frame(channel: int, cm, args: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, method_payload(cm, args))


def content_header(channel: int, body_size: int, class_id: int = 60, props: bytes = b"\x00\x00") -> bytes:
    return frame(FRAME_HEADER, channel, struct.pack(">HHQ", class_id, 0, body_size) + props)


def body_frame(channel: int, data: bytes) -> bytes:
    return frame(FRAME_BODY, channel, data)


def heartbeat_frame() -> bytes:
    return frame(FRAME_HEARTBEAT, 0, b"")


def plain_response(user="guest", password="guest") -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


def amqplain_response(user="guest", password="guest") -> bytes:
    # AMQPLAIN: a field table without its leading length
    return table({"LOGIN": user, "PASSWORD": password})[4:]


# ---------------------------------------------------------------- decoding
class Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n):
        b = self.data[self.pos:self.pos + n]
        if len(b) != n:
            raise ValueError("short read in payload")
        self.pos += n
        return b

    def octet(self):
        return self.take(1)[0]

    def short(self):
        return struct.unpack(">H", self.take(2))[0]

    def long(self):
        return struct.unpack(">I", self.take(4))[0]

    def longlong(self):
        return struct.unpack(">Q", self.take(8))[0]

    def shortstr(self):
        return self.take(self.octet()).decode("utf-8", "replace")

    def longstr(self):
        return self.take(self.long())

    def table(self):
        end_len = self.long()
        end = self.pos + end_len
        out = {}
        while self.pos < end:
            k = self.shortstr()
            out[k] = self.value()
        return out

    def value(self):
        t = self.take(1)
        if t == b"t":
            return bool(self.octet())
        if t == b"b":
            return struct.unpack(">b", self.take(1))[0]
        if t == b"B":
            return self.octet()
        if t in (b"s", b"U"):
            return struct.unpack(">h", self.take(2))[0]
        if t == b"u":
            return self.short()
        if t == b"I":
            return struct.unpack(">i", self.take(4))[0]
        if t == b"i":
            return self.long()
        if t in (b"l", b"L"):
            return struct.unpack(">q", self.take(8))[0]
        if t == b"f":
            return struct.unpack(">f", self.take(4))[0]
        if t == b"d":
            return struct.unpack(">d", self.take(8))[0]
        if t == b"D":
            scale = self.octet()
            return (scale, struct.unpack(">i", self.take(4))[0])
        if t == b"S":
            return self.longstr().decode("utf-8", "replace")
        if t == b"x":
            return self.longstr()
        if t == b"T":
            return self.longlong()
        if t == b"F":
            return self.table()
        if t == b"A":
            n = self.long()
            end = self.pos + n
            out = []
            while self.pos < end:
                out.append(self.value())
            return out
        if t == b"V":
            return None
        raise ValueError(f"unknown field type {t!r}")


class Closed(Exception):
    """The peer closed the TCP connection."""


class RawAMQP:
    """A blocking raw AMQP connection."""

    def __init__(self, host: str, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.timeout = timeout
        self.server_properties = None
        self.mechanisms = None
        self.tune = None

    # -------------------------------------------------------------- io
    def send(self, data: bytes):
        self.sock.sendall(data)

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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out waiting for {n} bytes (have {len(self.buf)})")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise TimeoutError(f"timed out waiting for {n} bytes (have {len(self.buf)})")
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed(f"connection closed by peer (buffered {self.buf!r})")
            self.buf += chunk

    def recv_exact(self, n: int, timeout: float | None = None) -> bytes:
        self._fill(n, timeout)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_until_closed(self, timeout: float | None = None) -> bytes:
        """Read everything until EOF; raise TimeoutError if the socket stays open."""
        try:
            self._fill(len(self.buf) + 10**9, timeout)
        except Closed:
            pass
        out, self.buf = self.buf, b""
        return out

    def read_frame(self, timeout: float | None = None):
        hdr = self.recv_exact(7, timeout)
        if hdr[:4] == b"AMQP":
            rest = self.recv_exact(1, timeout)
            return ("protocol-header", 0, hdr + rest)
        ftype, channel, size = struct.unpack(">BHI", hdr)
        payload = self.recv_exact(size, timeout)
        end = self.recv_exact(1, timeout)
        assert end == FRAME_END, f"bad frame end from server: {end!r}"
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

    def publish(self, ch, exchange, routing_key, body: bytes, mandatory=False, props=b"\x00\x00"):
        bits = mandatory | 0
        data = method_frame(ch, BASIC_PUBLISH, struct.pack(">H", 0) + shortstr(exchange)
                            + shortstr(routing_key) + bytes([bits]))
        data += content_header(ch, len(body), props=props)
        if body:
            data += body_frame(ch, body)
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


# ------------------------------------------------------------ typed decoding
class TypedReader(Reader):
    """Like Reader, but table values come back as (type_char, value) pairs."""

    def value(self):
        t = self.data[self.pos:self.pos + 1].decode()
        if t == "F":
            self.pos += 1
            return (t, self.table())
        if t == "A":
            self.pos += 1
            n = self.long()
            end = self.pos + n
            out = []
            while self.pos < end:
                out.append(self.value())
            return (t, out)
        return (t, Reader.value(self))


def parse_basic_properties(payload: bytes, typed: bool = False) -> dict:
    """Parse a content-header frame payload for class basic."""
    r = (TypedReader if typed else Reader)(payload)
    class_id, weight, body_size = r.short(), r.short(), r.longlong()
    flags = r.short()
    props = {"_body_size": body_size}
    fields = [
        ("content_type", "shortstr"), ("content_encoding", "shortstr"), ("headers", "table"),
        ("delivery_mode", "octet"), ("priority", "octet"), ("correlation_id", "shortstr"),
        ("reply_to", "shortstr"), ("expiration", "shortstr"), ("message_id", "shortstr"),
        ("timestamp", "longlong"), ("type", "shortstr"), ("user_id", "shortstr"),
        ("app_id", "shortstr"), ("cluster_id", "shortstr"),
    ]
    for i, (name, kind) in enumerate(fields):
        if flags & (1 << (15 - i)):
            props[name] = getattr(r, kind)()
    return props
