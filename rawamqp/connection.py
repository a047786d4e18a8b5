"""Connection: a strict, allocation-light blocking client for load generation.

Handshakes on construction (PLAIN), then offers slow-path RPCs (declare, bind, qos,
consume, ...).  Hot paths do not go through it: the benchmark's workers take ``sock`` (and
whatever is left in ``buf``) and write pre-encoded frames / parse with ``struct`` directly.
"""
from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from .client import SocketClient
from .codec import (
    _CM,
    _FH,
    BASIC_CONSUME_OK,
    BASIC_QOS_OK,
    CHANNEL_CLOSE,
    CHANNEL_OPEN_OK,
    CONFIRM_SELECT_OK,
    CONNECTION_BLOCKED,
    CONNECTION_CLOSE,
    CONNECTION_CLOSE_OK,
    CONNECTION_OPEN_OK,
    CONNECTION_START,
    CONNECTION_TUNE,
    CONNECTION_UNBLOCKED,
    EXCHANGE_DECLARE_OK,
    EXCHANGE_DELETE_OK,
    FRAME_END_OCTET,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    QUEUE_BIND_OK,
    QUEUE_DECLARE_OK,
    QUEUE_DELETE_OK,
    QUEUE_PURGE_OK,
    Reader,
    bits,
    longstr,
    method_frame,
    plain_response,
    shortstr,
    table,
)


class AMQPError(Exception):
    pass


class ChannelClosed(AMQPError):
    def __init__(self, code, text, cls_id=0, meth_id=0, what="channel"):
        super().__init__(f"{what} closed by broker: {code} {text} (method {cls_id}.{meth_id})")
        self.code = code
        self.text = text


@dataclass
class Method:
    channel: int
    cls: int
    meth: int
    payload: bytes  # arguments only

    @property
    def key(self):
        return (self.cls, self.meth)

    def reader(self):
        return Reader(self.payload)


def parse_url(url: str):
    """amqp://user:password@host:port/vhost -> (host, port, user, password, vhost)."""
    u = urlparse(url)
    if u.scheme not in ("amqp", ""):
        raise ValueError(f"only amqp:// URLs are supported, got {url!r}")
    host = u.hostname or "127.0.0.1"
    port = u.port or 5672
    user = unquote(u.username) if u.username else "guest"
    password = unquote(u.password) if u.password else "guest"
    path = u.path or "/"
    vhost = "/" if path in ("", "/") else unquote(path[1:])
    return host, port, user, password, vhost


class Connection(SocketClient):
    """Blocking AMQP connection. Slow-path RPCs use `rpc`; hot paths use the
    socket directly (see bench.workers)."""

    recv_size = 1 << 20

    def __init__(self, url: str, timeout: float = 10.0, frame_max: int = 131072,
                 name: str = "triomq-bench"):
        host, port, user, password, vhost = parse_url(url)
        super().__init__(host, port, timeout)
        for opt, val in ((socket.SO_RCVBUF, 4 << 20), (socket.SO_SNDBUF, 4 << 20)):
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, opt, val)
            except OSError:
                pass
        self.pending: list[Method] = []
        self.closed = False
        self.blocked = False
        self._handshake(user, password, vhost, frame_max, name)

    # ---- low level ------------------------------------------------------
    def _recv_more(self, deadline: float) -> None:
        try:
            more = self._recv_some(deadline)
        except TimeoutError:
            raise TimeoutError("timed out waiting for broker") from None
        if not more:
            raise ConnectionError("connection closed by broker")

    def _next_frame(self, deadline: float):
        while True:
            if len(self.buf) >= 7:
                ftype, ch, size = _FH.unpack_from(self.buf, 0)
                end = 7 + size
                if len(self.buf) >= end + 1:
                    if self.buf[end] != FRAME_END_OCTET:
                        raise AMQPError("bad frame end")
                    payload = bytes(self.buf[7:end])
                    del self.buf[:end + 1]
                    return ftype, ch, payload
            self._recv_more(deadline)

    def read_method(self, timeout: float | None = None) -> Method:
        """Next method frame; content frames and heartbeats are skipped."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            ftype, ch, payload = self._next_frame(deadline)
            if ftype != FRAME_METHOD:
                continue
            cls, meth = _CM.unpack_from(payload, 0)
            m = Method(ch, cls, meth, payload[4:])
            if m.key == CONNECTION_CLOSE:
                r = m.reader()
                code, text = r.short(), r.shortstr()
                c, mm = r.short(), r.short()
                try:
                    self.send(method_frame(0, CONNECTION_CLOSE_OK))
                except OSError:
                    pass
                self.closed = True
                raise ChannelClosed(code, text, c, mm, what="connection")
            if m.key == CONNECTION_BLOCKED:
                self.blocked = True
                continue
            if m.key == CONNECTION_UNBLOCKED:
                self.blocked = False
                continue
            return m

    def rpc(self, channel: int, cls: int, meth: int, args: bytes, expect: tuple,
            timeout: float | None = None) -> Method:
        self.send(method_frame(channel, cls, meth, args))
        return self.wait(channel, expect, timeout)

    def wait(self, channel: int, expect: tuple, timeout: float | None = None) -> Method:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            m = self.read_method(max(0.001, deadline - time.monotonic()))
            if m.channel == channel and m.key == expect:
                return m
            if m.key == CHANNEL_CLOSE:
                r = m.reader()
                code, text = r.short(), r.shortstr()
                c, mm = r.short(), r.short()
                try:
                    self.send(method_frame(m.channel, 20, 41))
                except OSError:
                    pass
                raise ChannelClosed(code, text, c, mm)
            # anything else (deliveries, confirms) is ignored on the slow path

    # ---- handshake ------------------------------------------------------
    def _handshake(self, user, password, vhost, frame_max, name):
        self.send(PROTOCOL_HEADER)
        deadline = time.monotonic() + self.timeout
        while True:
            if self.buf[:4] == b"AMQP" and len(self.buf) >= 8:
                raise AMQPError(f"broker rejected protocol header: {bytes(self.buf[:8])!r}")
            try:
                ftype, ch, payload = self._next_frame(deadline)
            except ConnectionError:
                if self.buf[:4] == b"AMQP":
                    raise AMQPError(f"broker rejected protocol header: {bytes(self.buf[:8])!r}") from None
                raise
            if ftype == FRAME_METHOD and _CM.unpack_from(payload, 0) == CONNECTION_START:
                break
        r = Reader(payload, 4)
        r.octet()
        r.octet()
        r.skip_table()  # server properties (ignored)
        mechanisms = r.longstr().decode()
        if "PLAIN" not in mechanisms.split():
            raise AMQPError(f"broker does not offer PLAIN: {mechanisms}")
        client_props = table({
            "product": name,
            "platform": "Python",
            "capabilities": {"publisher_confirms": True, "basic.nack": True,
                             "consumer_cancel_notify": True},
        })
        self.send(method_frame(0, 10, 11, client_props + shortstr("PLAIN")
                               + longstr(plain_response(user, password)) + shortstr("en_US")))
        m = self.read_method()
        if m.key != CONNECTION_TUNE:
            raise AMQPError(f"expected connection.tune, got {m.key}")
        r = m.reader()
        ch_max, srv_frame_max, _hb = r.short(), r.long(), r.short()
        self.channel_max = ch_max or 65535
        limits = [x for x in (srv_frame_max, frame_max) if x]
        self.frame_max = min(limits) if limits else 131072
        self.send(method_frame(0, 10, 31, struct.pack(">HIH", self.channel_max, self.frame_max, 0)))
        self.rpc(0, 10, 40, shortstr(vhost) + shortstr("") + b"\x00", CONNECTION_OPEN_OK)

    # ---- channel level API -----------------------------------------------
    def channel_open(self, ch: int = 1):
        self.rpc(ch, 20, 10, shortstr(""), CHANNEL_OPEN_OK)

    def exchange_declare(self, ch, name, etype, durable=False, auto_delete=False, arguments=None):
        self.rpc(ch, 40, 10, b"\x00\x00" + shortstr(name) + shortstr(etype)
                 + bits(False, durable, auto_delete, False, False) + table(arguments), EXCHANGE_DECLARE_OK)

    def exchange_delete(self, ch, name):
        self.rpc(ch, 40, 20, b"\x00\x00" + shortstr(name) + bits(False, False), EXCHANGE_DELETE_OK)

    def queue_declare(self, ch, name, durable=False, exclusive=False, auto_delete=False,
                      arguments=None):
        m = self.rpc(ch, 50, 10, b"\x00\x00" + shortstr(name)
                     + bits(False, durable, exclusive, auto_delete, False) + table(arguments),
                     QUEUE_DECLARE_OK)
        r = m.reader()
        return r.shortstr(), r.long(), r.long()

    def queue_bind(self, ch, queue, exchange, routing_key):
        self.rpc(ch, 50, 20, self._bind_args(queue, exchange, routing_key), QUEUE_BIND_OK)

    @staticmethod
    def _bind_args(queue, exchange, routing_key):
        return (b"\x00\x00" + shortstr(queue) + shortstr(exchange) + shortstr(routing_key)
                + b"\x00" + table(None))

    def queue_bind_many(self, ch, items, window: int = 500, timeout: float = 120.0,
                        progress=None):
        """Pipeline many queue.bind (each waits for bind-ok, `window` in flight)."""
        items = list(items)
        sent = done = 0
        deadline = time.monotonic() + timeout
        while done < len(items):
            if sent < len(items) and sent - done < window:
                n = min(len(items) - sent, window - (sent - done))
                self.send(b"".join(method_frame(ch, 50, 20, self._bind_args(*it))
                                   for it in items[sent:sent + n]))
                sent += n
            self.wait(ch, QUEUE_BIND_OK, max(0.001, deadline - time.monotonic()))
            done += 1
            if progress and done % 10000 == 0:
                progress(done)

    def queue_purge(self, ch, name):
        m = self.rpc(ch, 50, 30, b"\x00\x00" + shortstr(name) + b"\x00", QUEUE_PURGE_OK)
        return m.reader().long()

    def queue_delete(self, ch, name, timeout=None):
        m = self.rpc(ch, 50, 40, b"\x00\x00" + shortstr(name) + bits(False, False, False),
                     QUEUE_DELETE_OK, timeout)
        return m.reader().long()

    def basic_qos(self, ch, prefetch_count, global_=False):
        self.rpc(ch, 60, 10, struct.pack(">IH", 0, prefetch_count) + bits(global_), BASIC_QOS_OK)

    def confirm_select(self, ch):
        self.rpc(ch, 85, 10, b"\x00", CONFIRM_SELECT_OK)

    def basic_consume(self, ch, queue, tag="", no_ack=False, exclusive=False):
        m = self.rpc(ch, 60, 20, b"\x00\x00" + shortstr(queue) + shortstr(tag)
                     + bits(False, no_ack, exclusive, False) + table(None), BASIC_CONSUME_OK)
        return m.reader().shortstr()

    def close(self, timeout: float = 5.0):
        """Polite connection.close; waits (discarding traffic) for close-ok."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.settimeout(timeout)
            self.send(method_frame(0, 10, 50, struct.pack(">H", 200) + shortstr("bye")
                                   + struct.pack(">HH", 0, 0)))
            deadline = time.monotonic() + timeout
            self.buf.clear()
            # discard everything until close-ok (deliveries may still be in flight)
            while time.monotonic() < deadline:
                r, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
                if not r:
                    break
                data = self.sock.recv(1 << 20)
                if not data:
                    break
                self.buf += data
                # scan whole frames for close-ok, drop the rest
                p = 0
                n = len(self.buf)
                found = False
                while p + 7 <= n:
                    ftype, ch, size = _FH.unpack_from(self.buf, p)
                    if p + 8 + size > n:
                        break
                    if ftype == FRAME_METHOD and ch == 0 and \
                            _CM.unpack_from(self.buf, p + 7) in (CONNECTION_CLOSE_OK, CONNECTION_CLOSE):
                        found = True
                        break
                    p += 8 + size
                del self.buf[:p]
                if found:
                    break
        except OSError:
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass

    def abort(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
