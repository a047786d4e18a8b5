"""Header tables nested as deep as a frame holds: RabbitMQ accepts 18,000 levels in a
128 KiB frame (its codec does not limit depth); TrioMQ closed the connection with 502
FRAME_ERROR past 100 levels. The message comes back with its header bytes unchanged."""
from __future__ import annotations

import struct

import pytest

from rawamqp import BASIC_GET, BASIC_GET_OK, shortstr

LEVELS = 18_000


def deep_headers(tag: bytes, levels: int) -> bytes:
    """Content-header properties: headers only, {"k": <levels nested tables or arrays>}."""
    inner = struct.pack(">I", 0)
    for _ in range(levels - 1):
        body = (b"\x01k" if tag == b"F" else b"") + tag + inner
        inner = struct.pack(">I", len(body)) + body
    body = b"\x01k" + tag + inner
    return struct.pack(">H", 1 << 13) + struct.pack(">I", len(body)) + body


@pytest.mark.parametrize("tag", [b"F", b"A"], ids=["tables", "arrays"])
def test_headers_nested_18000_deep_are_delivered(raw_socket, uid, cleanup, tag):
    r = raw_socket(timeout=30)
    r.handshake(frame_max=131072)
    r.channel_open(1)
    cleanup.queue(uid)
    r.queue_declare(1, uid)
    props = deep_headers(tag, LEVELS)
    assert len(props) < 131072 - 8 - 12  # one content-header frame
    r.publish(1, "", uid, b"deep", props=props)
    r.send_method(1, BASIC_GET, struct.pack(">H", 0) + shortstr(uid) + b"\x01")
    r.expect(BASIC_GET_OK, 1)
    ftype, channel, payload = r.read_frame(timeout=30)
    assert (ftype, channel) == (2, 1)
    assert payload[12:] == props  # class, weight, body size, then the same properties
    ftype, channel, payload = r.read_frame(timeout=30)
    assert (ftype, payload) == (3, b"deep")
