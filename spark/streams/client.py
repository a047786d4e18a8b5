"""A small synchronous RabbitMQ Stream protocol client for Spark's driver and executors.

Built on the project's sans-IO frame codec (``broker/streamproto/codec.py``): a blocking
socket, one request at a time, no event loop and no thread, so a Python worker of Spark
uses it as it would a file. It does only what the Spark source needs: log in, Partitions
of a super stream, StreamStats, and reading records from an offset (Subscribe, Credit,
Deliver v1, Unsubscribe). Frames from the server are bounded by the frame_max the client
offers in Tune (``FrameReader``), whatever a frame's size field says.
"""
from __future__ import annotations

import socket
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from broker.streamproto import codec

FRAME_MAX = 1 << 20
# what one compressed sub-entry batch may open to: a server's declared size is not trusted
MAX_SUBENTRY_BYTES = 64 << 20
_SUBENTRY = struct.Struct(">BHII")
_CREDIT = 8  # chunks in flight per subscription (each at most ~1 MiB)


class StreamError(Exception):
    def __init__(self, what: str, code: int):
        super().__init__(f"{what}: response code {code}")
        self.code = code


@dataclass
class Record:
    offset: int
    timestamp_ms: int  # the chunk's, as RabbitMQ's stream clients report it
    data: bytes  # the AMQP 1.0 message


def decode_chunk(chunk) -> tuple[dict, list[bytes]]:
    """``codec.decode_chunk`` with sub-entries opened within ``MAX_SUBENTRY_BYTES`` (a
    batch declaring more is refused before it is decompressed)."""
    header = codec.CHUNK_HEADER.unpack_from(chunk, 0)
    fields = dict(zip(("magic_version", "chunk_type", "num_entries", "num_records",
                       "timestamp", "epoch", "first_offset", "crc", "data_length",
                       "trailer_length", "reserved"), header, strict=True))
    data = codec.Cursor(chunk, codec.CHUNK_HEADER_SIZE).raw(fields["data_length"])
    if zlib.crc32(data) != fields["crc"] & 0xFFFFFFFF:
        raise codec.FrameError(codec.UNKNOWN_FRAME, "chunk CRC mismatch")
    d = codec.Cursor(data)
    messages: list[bytes] = []
    for _ in range(fields["num_entries"]):
        if d.remaining and d.buf[d.pos] & 0x80:
            kind, count, size, clen = _SUBENTRY.unpack_from(d.buf, d.pos)
            d.pos += _SUBENTRY.size
            if size > MAX_SUBENTRY_BYTES:
                raise codec.FrameError(codec.PRECONDITION_FAILED,
                                       f"a sub-entry batch of {size} bytes")
            messages += codec.subentry_records(
                codec.SubEntry((kind & 0x70) >> 4, count, size, d.raw(clen)), size)
        else:
            messages.append(bytes(d.raw(d.u32())))
    return fields, messages


class StreamClient:
    def __init__(self, host: str = "127.0.0.1", port: int = 5552, vhost: str = "/",
                 user: str = "guest", password: str = "guest", timeout: float = 60.0):
        self.timeout = timeout
        self.server_properties: dict[str, str] = {}
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.reader = codec.FrameReader(FRAME_MAX)
        self.frames: list[tuple[int, int, memoryview]] = []
        self.corr = 0
        try:
            self._handshake(vhost, user, password)
        except BaseException:
            self.sock.close()
            raise

    # -- plumbing --
    def _next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def _send(self, cmd: codec.Command) -> None:
        self.sock.sendall(codec.encode(cmd))

    def _frame(self) -> tuple[int, int, memoryview]:
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("stream connection closed by the server")
            self.frames.extend(self.reader.feed(data))
        return self.frames.pop(0)

    def _handle_unsolicited(self, key: int, payload) -> None:
        if key == codec.HEARTBEAT:
            self.sock.sendall(codec.encode(codec.Heartbeat()))
        elif key == codec.CLOSE:
            cur = codec.Cursor(payload)
            corr, code, reason = cur.u32(), cur.u16(), cur.str()
            self._send(codec.CloseResponse(corr, codec.OK))
            raise ConnectionError(f"closed by the server: {code} {reason}")
        # anything else (MetadataUpdate, a stray Deliver of an ended subscription) is of
        # no interest to a one-request-at-a-time reader

    def _response(self, key: int, corr: int) -> codec.Cursor:
        """The payload of the response to request ``corr``, after its code (checked)."""
        while True:
            k, _version, payload = self._frame()
            if k == key | codec.RESPONSE:
                cur = codec.Cursor(payload)
                if cur.u32() != corr:
                    continue
                code = cur.u16()
                if code != codec.OK:
                    raise StreamError(f"command {key}", code)
                return cur
            self._handle_unsolicited(k, payload)

    def _handshake(self, vhost: str, user: str, password: str) -> None:
        c = self._next_corr()
        self._send(codec.PeerProperties(c, {"product": "triomq-spark"}))
        cur = self._response(codec.PEER_PROPERTIES, c)
        props = {}
        for _ in range(cur.count(4)):
            k = cur.str() or ""
            props[k] = cur.str() or ""
        self.server_properties = props
        c = self._next_corr()
        self._send(codec.SaslHandshake(c))
        self._response(codec.SASL_HANDSHAKE, c)
        c = self._next_corr()
        self._send(codec.SaslAuthenticate(c, "PLAIN", f"\0{user}\0{password}".encode()))
        self._response(codec.SASL_AUTHENTICATE, c)
        while True:  # the server's Tune
            k, _v, payload = self._frame()
            if k == codec.TUNE:
                cur = codec.Cursor(payload)
                frame_max, heartbeat = cur.u32(), cur.u32()
                break
        frame_max = min(frame_max, FRAME_MAX) if frame_max else FRAME_MAX
        self._send(codec.Tune(frame_max, heartbeat))
        c = self._next_corr()
        self._send(codec.Open(c, vhost))
        self._response(codec.OPEN, c)

    def close(self) -> None:
        try:
            c = self._next_corr()
            self._send(codec.Close(c, codec.OK, "OK"))
            self._response(codec.CLOSE, c)
        except (OSError, ConnectionError, StreamError, codec.FrameError):
            pass
        finally:
            self.sock.close()

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests --
    def partitions(self, super_stream: str) -> list[str]:
        c = self._next_corr()
        self._send(codec.Partitions(c, super_stream))
        cur = self._response(codec.PARTITIONS, c)
        return [cur.str() or "" for _ in range(cur.count(2))]

    def stats(self, stream: str) -> dict[str, int]:
        c = self._next_corr()
        self._send(codec.StreamStats(c, stream))
        cur = self._response(codec.STREAM_STATS, c)
        out = {}
        for _ in range(cur.count(10)):
            k = cur.str() or ""
            out[k] = cur.i64()
        return out

    def chunks(self, stream: str, spec: tuple[int, int],
               subscription_id: int = 1) -> Iterator[tuple[dict, list[bytes]]]:
        """The chunks of ``stream`` from an offset specification, as ``decode_chunk``
        returns them, for as long as the caller iterates (a chunk not yet written is
        waited for). Unsubscribes when the caller stops."""
        c = self._next_corr()
        self._send(codec.Subscribe(c, subscription_id, stream, spec, _CREDIT))
        self._response(codec.SUBSCRIBE, c)
        try:
            while True:
                k, version, payload = self._frame()
                if k != codec.DELIVER:
                    self._handle_unsolicited(k, payload)
                    continue
                cur = codec.Cursor(payload)
                if cur.u8() != subscription_id:
                    continue
                if version == 2:
                    cur.u64()  # committed chunk id
                header, messages = decode_chunk(cur.raw(cur.remaining))
                self._send(codec.Credit(subscription_id, 1))
                if header["chunk_type"] != 0:  # only user chunks hold records
                    continue
                yield header, messages
        finally:
            c = self._next_corr()
            try:
                self._send(codec.Unsubscribe(c, subscription_id))
                self._response(codec.UNSUBSCRIBE, c)
            except (OSError, ConnectionError, StreamError):
                pass

    def records(self, stream: str, start: int, end: int | None) -> Iterator[Record]:
        """Records ``start <= offset < end`` (``end`` None: for ever). Offsets below the
        stream's first (retention removed them) are skipped; ``end`` must not be past what
        was committed when asked, or this waits for it."""
        if end is not None and start >= end:
            return
        gen = self.chunks(stream, (codec.OFFSET_OFFSET, start))
        try:
            for header, messages in gen:
                first = header["first_offset"]
                for i, data in enumerate(messages):
                    off = first + i
                    if off < start:
                        continue
                    if end is not None and off >= end:
                        return
                    yield Record(off, header["timestamp"], data)
                if end is not None and first + len(messages) >= end:
                    return
        finally:
            gen.close()

    @property
    def has_stats(self) -> bool:
        """StreamStats came with RabbitMQ 3.11 (3.10 closes the connection on it)."""
        if self.server_properties.get("product") != "RabbitMQ":
            return True
        try:
            major, minor = (int(x) for x in self.server_properties["version"].split(".")[:2])
        except (KeyError, ValueError):
            return False
        return (major, minor) >= (3, 11)

    def _probe(self, stream: str, spec: tuple[int, int]):
        """The first chunk from ``spec``, or None when none comes within a second: how an
        empty stream looks to a broker without StreamStats (only there is a clock used)."""
        self.sock.settimeout(1.0)
        gen = self.chunks(stream, spec)
        try:
            return next(gen)
        except TimeoutError:
            return None
        finally:
            self.sock.settimeout(self.timeout)
            gen.close()

    def committed_chunk(self, stream: str) -> int:
        """The first offset of the last committed chunk (-1: the stream is empty)."""
        if self.has_stats:
            return self.stats(stream).get("committed_chunk_id", -1)
        last = self._probe(stream, (codec.OFFSET_LAST, 0))
        return -1 if last is None else last[0]["first_offset"]

    def end_offset(self, stream: str) -> int:
        """The offset after the last committed record (0 for an empty stream)."""
        committed = self.committed_chunk(stream)
        if committed < 0:
            return 0
        gen = self.chunks(stream, (codec.OFFSET_OFFSET, committed))
        try:
            header, messages = next(gen)
        finally:
            gen.close()
        return header["first_offset"] + len(messages)

    def first_offset(self, stream: str) -> int:
        if not self.has_stats:
            first = self._probe(stream, (codec.OFFSET_FIRST, 0))
            return 0 if first is None else first[0]["first_offset"]
        first = self.stats(stream).get("first_chunk_id", -1)
        return max(first, 0)

    def offset_at(self, stream: str, timestamp_ms: int) -> int:
        """The first offset of the first chunk written at or after ``timestamp_ms``; the end
        offset when there is none yet."""
        committed = self.committed_chunk(stream)
        if committed < 0:
            return 0
        gen = self.chunks(stream, (codec.OFFSET_OFFSET, committed))
        try:
            last, messages = next(gen)
        finally:
            gen.close()
        if last["timestamp"] < timestamp_ms:
            return last["first_offset"] + len(messages)
        gen = self.chunks(stream, (codec.OFFSET_TIMESTAMP, timestamp_ms))
        try:
            header, _ = next(gen)
        finally:
            gen.close()
        return header["first_offset"]
