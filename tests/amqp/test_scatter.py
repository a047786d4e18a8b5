"""A large content's body frames are received straight into its body (one scattering read
for several frames: their boundaries apart, their payloads in place), and whatever else comes
between them is parsed as usual: bodies intact, memory bounded by what arrived."""
from __future__ import annotations

import struct

import pytest

from broker.amqp import spec
from broker.amqp.codec import FRAME_BODY
from broker.amqp.events import ContentReceived

from .sansio_helpers import (
    body_frame,
    header_frame,
    heartbeat_frame,
    mframe,
    open_connection,
    publish,
)

FRAME_MAX = 131072
MiB = 1 << 20


def _receive(conn, data: bytes, read: int, into_body: list | None = None) -> list:
    """As the edge: reads of ``read`` octets through ``get_buffers`` (recvmsg_into fills
    them in order); ``into_body`` gets the octets that landed in a content's own body."""
    events, pos = [], 0
    while pos < len(data):
        bufs = conn.get_buffers(read)
        bodies = {id(ch.body) for ch in conn.channels.values() if ch.body is not None}
        n = 0
        for buf in bufs:
            take = min(len(buf), len(data) - pos - n)
            buf[:take] = data[pos + n:pos + n + take]
            if into_body is not None and id(buf.obj) in bodies:
                into_body.append(take)
            n += take
            buf.release()
        conn.buffer_updated(n)
        pos += n
        events += conn.receive_data()
        while conn.input_pending:
            events += conn.receive_data()
    return events


def _full_frames(channel: int, body: bytes) -> bytes:
    """A publish whose body frames are as long as the frame size allows (what clients send)."""
    chunk = FRAME_MAX - 8
    return (mframe(channel, spec.Basic.Publish(0, "", "k", False, False))
            + header_frame(channel, len(body))
            + b"".join(body_frame(channel, body[i:i + chunk]) for i in range(0, len(body), chunk)))


def _bodies(events) -> list[bytes]:
    return [e.body for e in events if isinstance(e, ContentReceived)]


def test_body_frames_are_received_into_the_body_itself():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    body = bytes(range(256)) * 4096  # 1 MiB: 9 frames
    into_body: list[int] = []
    events = _receive(conn, _full_frames(1, body) * 3, 256 * 1024, into_body)
    assert _bodies(events) == [body] * 3
    # the first frame's start comes with the publish; nearly all the rest straight in
    assert sum(into_body) > 0.8 * 3 * len(body)
    assert conn.partial_bytes == 0


@pytest.mark.parametrize("read", [7, 4096, 100_000, 256 * 1024, 1 << 20])
def test_bodies_intact_whatever_the_reads(read):
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    body = bytes(range(256)) * 2000 + b"end"
    data = (_full_frames(1, body) + publish(1, body[:300_000], chunks=3) + publish(1, b"small")
            + _full_frames(1, body[:FRAME_MAX * 2]))
    assert _bodies(_receive(conn, data, read)) == [body, body[:300_000], b"small",
                                                   body[:FRAME_MAX * 2]]
    assert conn.partial_bytes == 0


def test_what_comes_between_body_frames_is_parsed_as_usual():
    """A heartbeat, another channel's publish and a short body frame between the frames the
    read expected: put back in order, each handled as it would be frame by frame."""
    conn = open_connection(channels=[1, 2], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    chunk = FRAME_MAX - 8
    a = b"a" * (3 * chunk + 10)
    data = (mframe(1, spec.Basic.Publish(0, "", "k", False, False)) + header_frame(1, len(a))
            + body_frame(1, a[:chunk]) + heartbeat_frame()
            + body_frame(1, a[chunk:2 * chunk]) + publish(2, b"other")
            + body_frame(1, a[2 * chunk:2 * chunk + 5])  # shorter than a full frame
            + body_frame(1, a[2 * chunk + 5:]))
    for read in (100_000, 256 * 1024, 1 << 20):
        conn = open_connection(channels=[1, 2], frame_max=FRAME_MAX)
        conn.input_budget = 65536
        events = _receive(conn, data, read)
        assert sorted(_bodies(events)) == sorted([a, b"other"]), read
        assert conn.partial_bytes == 0


def test_a_declared_size_still_costs_only_what_arrived():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    head = (mframe(1, spec.Basic.Publish(0, "", "k", False, False)) + header_frame(1, 100 * MiB)
            + struct.pack(">BHI", FRAME_BODY, 1, FRAME_MAX - 8))
    _receive(conn, head + b"z" * (FRAME_MAX - 8) + b"\xce", 256 * 1024)
    ch = conn.channels[1]
    assert ch.received == FRAME_MAX - 8
    bufs = conn.get_buffers(1 << 20)  # the next frames expected
    held = sum(len(c.body) for c in conn.channels.values() if c.body is not None)
    assert held <= 2 * ch.received
    assert sum(len(b) for b in bufs if b.obj is ch.body) <= ch.received
    for b in bufs:
        b.release()
    conn.buffer_updated(0)
