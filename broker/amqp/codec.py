"""Frame-level codec: splitting a byte stream into frames, and building frames.

``FrameReader`` parses every complete frame in what it has buffered, so one
socket read yields a batch of frames; the network edge receives straight into its
buffer (or, for the rest of a large body frame, into the message body), and body
payloads are handed on as views, not copies. Content is built as a list of parts
so that a large body is written from the message itself (a gathering send), not
joined.
"""
from __future__ import annotations

import struct
from typing import Final, TypeAlias

from .fields import ReadableBuffer
from .spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, Method

_FRAME_HEAD = struct.Struct(">BHI")
_HEADER_PREFIX = struct.Struct(">HHQ")
# (frame type, channel, payload) as split by ``FrameReader``: ``feed`` gives bytes,
# ``parse`` gives body payloads as memoryviews into its buffer.
Frame: TypeAlias = tuple[int, int, "bytes | memoryview"]
# What content building returns: frame heads and small parts as bytes, body parts as
# slices of the body.
OutPart: TypeAlias = "bytes | memoryview"
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


# Body frames at least this large are handed on in parts as they arrive (FRAME_BODY_PART)
# rather than waiting in the frame buffer for their last byte, so that the rest of such a
# frame can be received straight into the message body.
STREAM_BODY_MIN: Final = 16 * 1024
# Output parts at least this large (body slices) are handed to the edge as they are, for a
# gathering send; smaller ones are joined (fewer, larger iovecs for small messages).
GATHER_MIN: Final = 16 * 1024
# Not a wire frame type: the leading part of a body frame whose rest has not arrived. The
# frame's last part comes as a FRAME_BODY (possibly empty) once its frame-end octet is seen.
FRAME_BODY_PART: Final = -FRAME_BODY
# A frame buffer that took less than this share of its space in a read, and is empty
# after parsing, is released (an idle connection holds no receive buffer).
_MIN_BUFFER = 4096


class FrameReader:
    """Splits a byte stream into frames (type, channel, payload).

    Two ways to give it bytes: ``feed(data)`` (copies, parses everything, bytes payloads),
    or the buffer protocol used by the network edge: ``get_buffer(size)`` for writable
    space, ``buffer_updated(n)`` once n bytes are in it, then ``parse(budget)``. The
    latter's body payloads are memoryviews into the buffer, valid until the next
    ``get_buffer``: the caller copies them out at once.
    """

    __slots__ = ("_buf", "_end", "_last_fill", "_mv", "_part_channel", "_part_left", "_start",
                 "frame_max", "stopped")

    def __init__(self, frame_max: int = 131072) -> None:
        self._buf = bytearray()
        self._mv = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._last_fill = 0  # octets the last read brought
        self.frame_max = frame_max
        # channel and payload octets still to come of the body frame being streamed in
        # parts; -1: not inside one (0: only its frame-end octet is missing)
        self._part_channel = 0
        self._part_left = -1
        self.stopped = False  # the last parse stopped at its budget with frames left

    @property
    def buffered(self) -> int:
        return self._end - self._start

    @property
    def body_remaining(self) -> tuple[int, int]:
        """(channel, octets): the payload still to come of a body frame being streamed in
        parts, when nothing else is buffered before it; octets 0 otherwise. The caller may
        receive those octets elsewhere and report them with ``body_received``."""
        if self._part_left > 0 and self._start == self._end:
            return self._part_channel, self._part_left
        return 0, 0

    def body_received(self, nbytes: int) -> None:
        self._part_left -= nbytes

    @property
    def part_left(self) -> int:
        """Payload octets still to come of the body frame being streamed (0: its end octet
        only; -1: at a frame boundary)."""
        return self._part_left

    @property
    def part_channel(self) -> int:
        return self._part_channel

    def set_part(self, channel: int, left: int) -> None:
        """A body frame of ``channel`` was read up to its last ``left`` payload octets (then
        its end octet) elsewhere: the buffer continues inside it (a scattering read)."""
        self._part_channel = channel
        self._part_left = left

    @property
    def free_at(self) -> int:
        """Where the octets of the next ``buffer_updated`` go in the buffer."""
        return self._end

    def peek_at(self, offset: int, n: int) -> bytes:
        """A copy of ``n`` octets of the buffer from ``offset`` (received but not reported)."""
        return bytes(self._mv[offset:offset + n])

    def get_buffer(self, size: int) -> memoryview:
        """Writable space for up to ``size`` octets (at least one, and at least half of
        ``size`` unless that means growing a buffer that has room)."""
        start, end = self._start, self._end
        if start == end:
            self._start = self._end = start = end = 0
        cap = len(self._buf)
        if cap - end < size and start:
            # move the unparsed tail (a partial frame) to the front
            mv = self._mv
            mv[0:end - start] = mv[start:end]
            self._start, self._end = 0, end - start
            end -= start
        if cap - end <= size // 2:
            want = size
            if not cap:
                # a new buffer (the connection was idle): twice what the last read brought, so
                # that a trickle of small reads does not allocate and clear receive_size each
                want = min(size, max(_MIN_BUFFER, 2 * self._last_fill))
            new = bytearray(max(end + want, _MIN_BUFFER))
            new[:end] = self._mv[:end]
            self._buf = new
            self._mv = memoryview(new)
            cap = len(new)
        return self._mv[end:end + min(size, cap - end)]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        self._last_fill = nbytes

    def release_if_idle(self, last_read: int) -> bool:
        """Drop an empty buffer that the last read (``last_read`` octets) filled less than a
        quarter of, so that idle connections do not each keep one. True if it was dropped."""
        if self._start == self._end and last_read * 4 < len(self._buf):
            self._buf = bytearray()
            self._mv = memoryview(self._buf)
            self._start = self._end = 0
            return True
        return False

    def append(self, data: ReadableBuffer) -> None:
        """Copy ``data`` into the buffer."""
        view = memoryview(data).cast("B")
        pos, total = 0, len(view)
        while pos < total:
            buf = self.get_buffer(total - pos)
            n = len(buf)
            buf[:] = view[pos:pos + n]
            self.buffer_updated(n)
            pos += n

    def peek(self, n: int) -> bytes:
        """Up to ``n`` buffered octets, left in the buffer."""
        return bytes(self._mv[self._start:min(self._end, self._start + n)])

    def skip(self, n: int) -> None:
        self._start = min(self._end, self._start + n)

    def feed(self, data: ReadableBuffer) -> list[Frame]:
        """Add ``data`` and return every complete frame in what is buffered (bytes payloads,
        body frames whole)."""
        self.append(data)
        try:
            frames = self.parse(streaming=False)
        except FrameError as exc:
            exc.frames = [(t, c, bytes(p)) for t, c, p in exc.frames]
            raise
        return [(t, c, p if type(p) is bytes else bytes(p)) for t, c, p in frames]

    def parse(self, budget: int = 0, streaming: bool = True) -> list[Frame]:
        """The complete frames buffered, stopping (``stopped``) once the frames other than
        body frames add up to ``budget`` octets (0: no limit). ``streaming``: large body
        frames come in parts as they arrive (``FRAME_BODY_PART``)."""
        buf, mv = self._buf, self._mv
        pos, end = self._start, self._end
        frames: list[Frame] = []
        spent = 0
        frame_max = self.frame_max
        unpack = _FRAME_HEAD.unpack_from
        self.stopped = False
        try:
            while True:
                left = self._part_left
                if left >= 0:
                    channel = self._part_channel
                    if left:
                        take = min(left, end - pos)
                        if not take:
                            break
                        frames.append((FRAME_BODY_PART, channel, mv[pos:pos + take]))
                        pos += take
                        left -= take
                        self._part_left = left
                        if left:
                            break
                    if pos == end:
                        break
                    if buf[pos] != FRAME_END:
                        raise FrameError(f"type {FRAME_BODY}, all octets = <<>>: "
                                         f"{{invalid_frame_end_marker,{buf[pos]}}}", frames)
                    pos += 1
                    self._part_left = -1
                    frames.append((FRAME_BODY, channel, b""))  # its last octet: complete
                    continue
                if end - pos < 7:
                    break
                ftype, channel, size = unpack(buf, pos)
                # RabbitMQ's allowance (rabbit_reader's FRAME_SIZE_FUDGE): a payload of up to
                # frame_max octets, 8 more than the spec's letter, because many clients fill
                # a frame with frame_max octets of body; the error still names frame_max - 8.
                if size > frame_max and frame_max:
                    raise FrameError(
                        f"type {ftype}, all octets = <<>>: "
                        f"{{frame_too_large,{size},{frame_max - 8}}}", frames)
                stop = pos + 7 + size
                if stop >= end:
                    if streaming and ftype == FRAME_BODY and size >= STREAM_BODY_MIN:
                        self._part_channel = channel
                        self._part_left = size
                        pos += 7
                        continue
                    break
                if buf[stop] != FRAME_END:
                    raise FrameError(
                        f"type {ftype}, all octets = {erlang_binary(mv[pos + 7:stop])}: "
                        f"{{invalid_frame_end_marker,{buf[stop]}}}", frames)
                if ftype == FRAME_BODY:
                    frames.append((ftype, channel, mv[pos + 7:stop]))
                else:
                    frames.append((ftype, channel, bytes(mv[pos + 7:stop])))
                    spent += size + 8
                pos = stop + 1
                if budget and spent >= budget:
                    self.stopped = end - pos >= 7
                    break
        finally:
            self._start = pos
        return frames


def method_frame(channel: int, method: Method) -> bytes:
    payload = method.encode()
    return _FRAME_HEAD.pack(FRAME_METHOD, channel, len(payload)) + payload + b"\xce"


def content_frames(channel: int, props_raw: bytes, body: bytes, frame_max: int) -> list[bytes]:
    """Header frame plus body frames for a content of ``body`` (all bytes; the broker's own
    output uses ``content_parts``, which does not copy the body)."""
    return [part if type(part) is bytes else bytes(part)
            for part in content_parts(channel, props_raw, body, frame_max)]


def content_parts(channel: int, props_raw: bytes, body: bytes,
                  frame_max: int) -> list[OutPart]:
    """Header frame plus body frames for a content of ``body``. A body of at least
    ``GATHER_MIN`` octets is cut in memoryview slices of itself (not copied), each a part of
    its own for a gathering send, with the small parts between them already joined."""
    header = _HEADER_PREFIX.pack(60, 0, len(body)) + props_raw
    head = _FRAME_HEAD.pack(FRAME_HEADER, channel, len(header))
    size = len(body)
    chunk = frame_max - 8
    if size < GATHER_MIN and size <= chunk:
        if not body:
            return [head, header, b"\xce"]
        return [head, header, b"\xce", _FRAME_HEAD.pack(FRAME_BODY, channel, size), body, b"\xce"]
    if size <= chunk:
        return [b"".join((head, header, b"\xce", _FRAME_HEAD.pack(FRAME_BODY, channel, size))),
                body, b"\xce"]
    view = memoryview(body)
    out: list[OutPart] = []
    glue = [head, header, b"\xce"]
    for start in range(0, size, chunk):
        piece = view[start:start + chunk]
        glue.append(_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)))
        out.append(b"".join(glue))
        out.append(piece)
        glue = [b"\xce"]
    out.append(b"\xce")
    return out


_DELIVER_HEAD = struct.Struct(">BHIHH")


def deliver_frames(channel: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                   exchange_raw: bytes, routing_key_raw: bytes, props_raw: bytes,
                   body: bytes, frame_max: int) -> list[OutPart]:
    """basic.deliver + content, built without going through the generic encoder.

    ``*_raw`` arguments are already length-prefixed shortstrs.
    """
    args = b"".join((consumer_tag_raw, struct.pack(">QB", delivery_tag, 1 if redelivered else 0),
                     exchange_raw, routing_key_raw))
    method = _DELIVER_HEAD.pack(FRAME_METHOD, channel, len(args) + 4, 60, 60)
    content = content_parts(channel, props_raw, body, frame_max)
    if len(body) >= GATHER_MIN or len(body) > frame_max - 8:  # content_parts joined its head
        content[0] = b"".join((method, args, b"\xce", content[0]))
        return content
    return [method, args, b"\xce", *content]


_SHORTSTRS: dict[str, bytes] = {}  # exchange names and routing keys repeat: encode each once


def shortstr(value: str) -> bytes:
    raw = _SHORTSTRS.get(value)
    if raw is None:
        encoded = value.encode("utf-8", "surrogateescape")
        raw = bytes((len(encoded),)) + encoded
        if len(_SHORTSTRS) >= 8192:  # unique keys must not grow it without bound
            _SHORTSTRS.clear()
        _SHORTSTRS[value] = raw
    return raw


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
    "FRAME_BODY_PART",
    "FRAME_HEADER",
    "FRAME_HEARTBEAT",
    "FRAME_METHOD",
    "GATHER_MIN",
    "HEARTBEAT_FRAME",
    "STREAM_BODY_MIN",
    "FrameError",
    "FrameReader",
    "ack_frame",
    "content_frames",
    "content_parts",
    "deliver_frames",
    "method_frame",
    "nack_frame",
    "parse_content_header",
    "parse_publish",
    "shortstr",
]
