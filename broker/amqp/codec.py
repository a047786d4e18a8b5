"""Frame-level codec: splitting a byte stream into frames, and building frames.

``FrameReader.feed`` parses every complete frame in what it has buffered, so
one socket read yields a batch of frames without per-frame allocations beyond
the payload slice.
"""
from __future__ import annotations

import struct
from typing import Final, TypeAlias

from .fields import ReadableBuffer
from .spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, Method

_FRAME_HEAD = struct.Struct(">BHI")
_HEADER_PREFIX = struct.Struct(">HHQ")
# (frame type, channel, payload) as split by ``FrameReader.feed``.
Frame: TypeAlias = tuple[int, int, bytes]
# basic.publish arguments: (exchange, routing_key, mandatory, immediate).
PublishArgs: TypeAlias = tuple[str, str, bool, bool]

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"


def erlang_binary(data: ReadableBuffer) -> str:
    """Render bytes as Erlang prints a binary, as RabbitMQ's error texts do."""
    data = bytes(data)
    if data and all(32 <= b < 127 for b in data):
        text = data.decode("ascii").replace("\\", "\\\\").replace('"', '\\"')
        return f'<<"{text}">>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


class FrameError(Exception):
    """A framing violation (501 FRAME_ERROR); ``explanation`` is RabbitMQ's wording."""

    def __init__(self, explanation: str, frames: list[Frame] | None = None) -> None:
        super().__init__(explanation)
        self.explanation = explanation
        self.frames = frames if frames is not None else []  # complete frames before the error


class FrameReader:
    """Accumulates bytes and returns complete frames as (type, channel, payload)."""

    __slots__ = ("_buf", "frame_max")

    def __init__(self, frame_max: int = 131072) -> None:
        self._buf = bytearray()
        self.frame_max = frame_max

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        view: bytes | bytearray
        if buf:
            buf += data
            view = buf
        else:
            view = data
        frames: list[Frame] = []
        pos = 0
        end = len(view)
        frame_max = self.frame_max
        unpack = _FRAME_HEAD.unpack_from
        while end - pos >= 7:
            ftype, channel, size = unpack(view, pos)
            if size + 8 > frame_max and frame_max:
                raise FrameError(
                    f"type {ftype}, all octets = <<>>: "
                    f"{{frame_too_large,{size},{frame_max - 8}}}", frames)
            stop = pos + 7 + size
            if stop >= end:
                break
            if view[stop] != FRAME_END:
                raise FrameError(
                    f"type {ftype}, all octets = {erlang_binary(view[pos + 7:stop])}: "
                    f"{{invalid_frame_end_marker,{view[stop]}}}", frames)
            frames.append((ftype, channel, bytes(view[pos + 7:stop])))
            pos = stop + 1
        if view is buf:
            del buf[:pos]
        elif pos < end:
            buf += view[pos:]
        return frames


def method_frame(channel: int, method: Method) -> bytes:
    payload = method.encode()
    return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def content_frames(channel: int, props_raw: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Header frame plus body frames for a content of ``body``."""
    header = _HEADER_PREFIX.pack(60, 0, len(body)) + props_raw
    out = [_FRAME_HEAD.pack(FRAME_HEADER, channel, len(header)), header, b"\xce"]
    if body:
        chunk = frame_max - 8
        if len(body) <= chunk:
            out.append(_FRAME_HEAD.pack(FRAME_BODY, channel, len(body)))
            out.append(body)
            out.append(b"\xce")
        else:
            for start in range(0, len(body), chunk):
                piece = body[start:start + chunk]
                out.append(_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)))
                out.append(piece)
                out.append(b"\xce")
    return out


_DELIVER_HEAD = struct.Struct(">BHIHH")


def deliver_frames(channel: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                   exchange_raw: bytes, routing_key_raw: bytes, props_raw: bytes,
                   body: bytes, frame_max: int) -> list[bytes]:
    """basic.deliver + content, built without going through the generic encoder.

    ``*_raw`` arguments are already length-prefixed shortstrs.
    """
    args = b"".join((consumer_tag_raw, struct.pack(">QB", delivery_tag, 1 if redelivered else 0),
                     exchange_raw, routing_key_raw))
    out = [_DELIVER_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, 60, 60), args, b"\xce"]
    out.extend(content_frames(channel, props_raw, body, frame_max))
    return out


def shortstr(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogateescape")
    return bytes((len(raw),)) + raw


_ACK = struct.Struct(">BHIHHQB")


def ack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _ACK.pack(FRAME_METHOD, channel, 13, 60, 80, delivery_tag, 1 if multiple else 0) + b"\xce"


_NACK = struct.Struct(">BHIHHQB")


def nack_frame(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    return _NACK.pack(FRAME_METHOD, channel, 13, 60, 120, delivery_tag, 1 if multiple else 0) + b"\xce"


def parse_publish(payload: bytes) -> PublishArgs:
    """Fast path for basic.publish arguments: (exchange, routing_key, mandatory, immediate)."""
    pos = 6  # class, method, ticket
    n = payload[pos]
    exchange = payload[pos + 1:pos + 1 + n]
    pos += 1 + n
    n = payload[pos]
    routing_key = payload[pos + 1:pos + 1 + n]
    pos += 1 + n
    if len(routing_key) != n:
        raise IndexError
    bits = payload[pos]
    return (exchange.decode("utf-8", "surrogateescape"), routing_key.decode("utf-8", "surrogateescape"),
            bool(bits & 1), bool(bits & 2))


def parse_content_header(payload: bytes) -> tuple[int, int, bytes]:
    """(class_id, body_size, props_raw) from a content header payload."""
    class_id, _weight, body_size = _HEADER_PREFIX.unpack_from(payload, 0)
    return class_id, body_size, payload[12:]


__all__ = [
    "FRAME_BODY",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "HEARTBEAT_FRAME",
    "FrameError",
    "FrameReader",
    "ack_frame",
    "content_frames",
    "deliver_frames",
    "method_frame",
    "nack_frame",
    "parse_content_header",
    "parse_publish",
    "shortstr",
]
