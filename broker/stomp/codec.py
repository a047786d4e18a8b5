"""STOMP frames: bytes in, ``Frame`` objects out, and the way back. No I/O.

The reader keeps only what arrived: a ``content-length`` is checked against the limit and
never allocated ahead, a frame without one ends at its first NUL. Heart-beats (EOLs
between frames) are skipped. Header values are unescaped for STOMP 1.1 and 1.2 (not in
CONNECT/CONNECTED frames, not in 1.0); the first of repeated headers wins (1.2, 2.6).
"""
from __future__ import annotations

from dataclasses import dataclass, field

MAX_HEADER_BYTES = 64 * 1024  # the command and all headers of one frame
MAX_HEADERS = 1000

COMMANDS = frozenset({"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK",
                      "BEGIN", "COMMIT", "ABORT", "DISCONNECT"})

_UNESCAPE = {"\\\\": "\\", "\\n": "\n", "\\c": ":", "\\r": "\r"}


class FrameError(Exception):
    """A malformed frame: ``message`` is the ERROR frame's header, ``detail`` its body."""

    def __init__(self, message: str, detail: str):
        super().__init__(f"{message}: {detail}")
        self.message = message
        self.detail = detail


@dataclass
class Frame:
    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def unescape(value: str) -> str:
    if "\\" not in value:
        return value
    out = []
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if c == "\\":
            pair = value[i:i + 2]
            rep = _UNESCAPE.get(pair)
            if rep is None:
                raise FrameError("Invalid header", f"undefined escape sequence {pair!r}")
            out.append(rep)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def escape(value: str, version: str) -> str:
    if "\\" not in value and "\n" not in value and ":" not in value and "\r" not in value:
        return value  # the common case: nothing to escape
    if version == "1.0":
        return value.replace("\n", " ")  # 1.0 has no escapes: a value cannot hold an EOL
    value = value.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\c")
    if version == "1.2":
        value = value.replace("\r", "\\r")
    return value


def encode(frame: Frame, version: str = "1.2") -> bytes:
    """One frame, NUL-terminated and followed by an EOL as RabbitMQ writes them; the body
    always with a ``content-length``."""
    plain = frame.command in ("CONNECTED", "CONNECT")
    lines = [frame.command]
    for k, v in frame.headers.items():
        if plain:
            lines.append(f"{k}:{v}")
        else:
            lines.append(f"{escape(k, version)}:{escape(v, version)}")
    if frame.body or frame.command in ("MESSAGE", "ERROR", "SEND"):
        lines.append(f"content-length:{len(frame.body)}")
    head = ("\n".join(lines) + "\n\n").encode("utf-8", "surrogateescape")
    return head + frame.body + b"\x00\n"


class FrameReader:
    """Splits a byte stream into frames. ``version`` (set once negotiated) decides whether
    header values are unescaped; ``max_body`` bounds a body (``content-length`` or not)."""

    def __init__(self, max_body: int):
        self.max_body = max_body
        self.version = "1.0"
        self._buf = bytearray()
        self._head: tuple[str, dict[str, str], int | None] | None = None
        self.heartbeats = 0  # EOLs received between frames (counted for the tests)

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        while True:
            if self._head is None:
                # skip heart-beats / the EOL RabbitMQ-style writers put after a NUL
                i = 0
                n = len(buf)
                while i < n and buf[i] in (10, 13):
                    i += 1
                if i:
                    self.heartbeats += i
                    del buf[:i]
                # the blank line ending the headers, found line by line: a search for it
                # over the whole buffer would cost the buffer's length per frame
                end = skip = -1
                pos = 0
                while True:
                    nl = buf.find(b"\n", pos)
                    if nl < 0 or nl > MAX_HEADER_BYTES:
                        break
                    if nl == pos or (nl == pos + 1 and buf[pos] == 13):
                        end, skip = pos, nl + 1
                        break
                    pos = nl + 1
                if end < 0:
                    if len(buf) > MAX_HEADER_BYTES:
                        raise FrameError("Frame too large",
                                         f"headers longer than {MAX_HEADER_BYTES} bytes")
                    return frames
                head_bytes = bytes(buf[:end])
                del buf[:skip]
                self._head = self._parse_head(head_bytes)
            command, headers, length = self._head
            if length is not None:
                if len(buf) < length + 1:
                    return frames
                if buf[length] != 0:
                    raise FrameError("Invalid frame",
                                     "frame body not terminated by NUL after content-length")
                body = bytes(buf[:length])
                del buf[:length + 1]
            else:
                nul = buf.find(b"\x00")
                if nul < 0:
                    if len(buf) > self.max_body:
                        raise FrameError("Frame too large",
                                         f"body larger than {self.max_body} bytes")
                    return frames
                body = bytes(buf[:nul])
                del buf[:nul + 1]
            self._head = None
            frames.append(Frame(command, headers, body))

    def _parse_head(self, head: bytes) -> tuple[str, dict[str, str], int | None]:
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("Invalid frame", "headers are not UTF-8") from None
        lines = text.split("\n")
        command = lines[0].rstrip("\r")
        escaped = self.version != "1.0" and command not in ("CONNECT", "STOMP")
        headers: dict[str, str] = {}
        if len(lines) > MAX_HEADERS + 1:
            raise FrameError("Frame too large", f"more than {MAX_HEADERS} headers")
        for line in lines[1:]:
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                continue
            key, sep, value = line.partition(":")
            if not sep:
                raise FrameError("Invalid header", f"header line without ':' {line[:50]!r}")
            if escaped:
                key, value = unescape(key), unescape(value)
            elif self.version == "1.0":
                value = value.strip()  # 1.0 clients pad values (no escapes there)
            headers.setdefault(key, value)
        length = None
        cl = headers.get("content-length")
        if cl is not None:
            try:
                length = int(cl)
                if length < 0:
                    raise ValueError
            except ValueError:
                raise FrameError("Invalid header",
                                 f"invalid content-length {cl[:30]!r}") from None
            if length > self.max_body:
                raise FrameError("Frame too large", f"body larger than {self.max_body} bytes")
        return command, headers, length
