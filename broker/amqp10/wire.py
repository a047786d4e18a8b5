"""The AMQP 1.0 type system's encoding (spec part 1) for the values a message's sections
hold, written and read without proton (its Message costs ~45 us a message). Not
messages: ``mapping`` puts these values in sections; a value outside these types raises
``Unencodable`` and is left to proton.
"""
from __future__ import annotations

import struct
import uuid
from typing import Any

from proton import symbol, timestamp, ulong


class Unencodable(Exception):
    pass


def encode_string(tag8: int, tag32: int, raw: bytes) -> bytes:
    n = len(raw)
    if n < 256:
        return bytes((tag8, n)) + raw
    return bytes((tag32,)) + n.to_bytes(4, "big") + raw


def utf8(s: str) -> bytes:
    return encode_string(0xA1, 0xB1, s.encode("utf-8", "surrogatepass"))


def sym(s: str) -> bytes:
    return encode_string(0xA3, 0xB3, s.encode("ascii"))


def binary(b: bytes) -> bytes:
    return encode_string(0xA0, 0xB0, b)


def encode_value(v: Any) -> bytes:
    """One AMQP 1.0 value (the types the 0-9-1 mapping produces)."""
    if v is None:
        return b"\x40"
    if v is True:
        return b"\x41"
    if v is False:
        return b"\x42"
    if isinstance(v, timestamp):
        return b"\x83" + int(v).to_bytes(8, "big", signed=True)
    if isinstance(v, ulong):
        return b"\x80" + int(v).to_bytes(8, "big")
    if isinstance(v, symbol):
        return sym(v)
    if isinstance(v, str):
        return utf8(v)
    if isinstance(v, int):
        if -128 <= v < 128:
            return b"\x54" + v.to_bytes(1, "big", signed=True)  # smallint
        if -(1 << 31) <= v < 1 << 31:
            return b"\x71" + v.to_bytes(4, "big", signed=True)
        if -(1 << 63) <= v < 1 << 63:
            return b"\x81" + v.to_bytes(8, "big", signed=True)
        raise Unencodable
    if isinstance(v, float):
        return b"\x82" + struct.pack(">d", v)
    if isinstance(v, bytes):
        return binary(v)
    if isinstance(v, uuid.UUID):
        return b"\x98" + v.bytes
    raise Unencodable


def encode_map(pairs: list[bytes]) -> bytes:
    body = b"".join(pairs)
    count = len(pairs)  # each item is key and value already: 2 entries
    return b"\xd1" + (len(body) + 4).to_bytes(4, "big") + (count * 2).to_bytes(4, "big") + body


def encode_list(fields: list[bytes | None]) -> bytes:
    while fields and fields[-1] is None:
        fields.pop()
    body = b"".join(b"\x40" if f is None else f for f in fields)
    return b"\xd0" + (len(body) + 4).to_bytes(4, "big") + len(fields).to_bytes(4, "big") + body


FIXED = {0x50: 1, 0x51: 1, 0x60: 2, 0x61: 2, 0x70: 4, 0x71: 4, 0x80: 8, 0x81: 8, 0x83: 8,
          0x52: 1, 0x53: 1, 0x54: 1, 0x55: 1, 0x72: 4, 0x82: 8, 0x98: 16}
SIGNED = frozenset({0x51, 0x61, 0x71, 0x81, 0x54, 0x55, 0x83})


def decode_value(buf: bytes, pos: int) -> tuple[Any, int]:
    """One value at ``pos``: (value, position after it). Raises ``Unencodable`` for a
    type left to proton (arrays, decimals, chars, described values) or a truncation."""
    try:
        code = buf[pos]
    except IndexError:
        raise Unencodable from None
    pos += 1
    if code == 0x40:
        return None, pos
    if code == 0x41:
        return True, pos
    if code == 0x42:
        return False, pos
    if code in (0x43, 0x44):
        return 0, pos
    if code == 0x45:
        return [], pos
    size = FIXED.get(code)
    if size is not None:
        end = pos + size
        if end > len(buf):
            raise Unencodable
        raw = buf[pos:end]
        if code == 0x72:
            return struct.unpack(">f", raw)[0], end
        if code == 0x82:
            return struct.unpack(">d", raw)[0], end
        if code == 0x98:
            return uuid.UUID(bytes=bytes(raw)), end
        n = int.from_bytes(raw, "big", signed=code in SIGNED)
        if code == 0x83:
            return timestamp(n), end
        if code in (0x80, 0x53):
            return ulong(n), end
        return n, end
    if code in (0xA0, 0xA1, 0xA3, 0xB0, 0xB1, 0xB3):
        if code < 0xB0:
            if pos >= len(buf):
                raise Unencodable
            n = buf[pos]
            pos += 1
        else:
            if pos + 4 > len(buf):
                raise Unencodable
            n = int.from_bytes(buf[pos:pos + 4], "big")
            pos += 4
        end = pos + n
        if end > len(buf):
            raise Unencodable
        raw = bytes(buf[pos:end])
        if code in (0xA0, 0xB0):
            return raw, end
        try:
            text = raw.decode("utf-8" if code in (0xA1, 0xB1) else "ascii")
        except UnicodeDecodeError:
            raise Unencodable from None
        return (text if code in (0xA1, 0xB1) else symbol(text)), end
    if code in (0xC0, 0xC1, 0xD0, 0xD1):
        if code < 0xD0:
            if pos + 2 > len(buf):
                raise Unencodable
            size, count = buf[pos], buf[pos + 1]
            start = pos + 1
            pos += 2
        else:
            if pos + 8 > len(buf):
                raise Unencodable
            size = int.from_bytes(buf[pos:pos + 4], "big")
            count = int.from_bytes(buf[pos + 4:pos + 8], "big")
            start = pos + 4
            pos += 8
        end = start + size
        if end > len(buf) or count > size:
            raise Unencodable
        items = []
        for _ in range(count):
            v, pos = decode_value(buf, pos)
            items.append(v)
        if pos != end:
            raise Unencodable
        if code in (0xC0, 0xD0):
            return items, end
        if count % 2:
            raise Unencodable
        return dict(zip(items[::2], items[1::2], strict=True)), end
    raise Unencodable
