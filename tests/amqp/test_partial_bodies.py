"""A content's declared body size decides nothing about memory: a body is held as it
arrives (at most twice what the peer sent), partial bodies of a connection are bounded, a
multi-frame content is announced before its body (so that the broker may refuse it), and
an ended connection drops what it held."""
from __future__ import annotations

import struct

from broker.amqp import spec
from broker.amqp.codec import FRAME_BODY
from broker.amqp.events import ContentReceived, ContentStarted

from .sansio_helpers import (
    body_frame,
    drain_methods,
    header_frame,
    mframe,
    open_connection,
    publish,
)

FRAME_MAX = 131072
MiB = 1 << 20


def _publish_head(channel: int, size: int, exchange: str = "") -> bytes:
    return mframe(channel, spec.Basic.Publish(0, exchange, "k", False, False)) + \
        header_frame(channel, size)


def _held(conn) -> int:
    """Octets of body buffers the connection holds for contents in progress."""
    return sum(len(ch.body) for ch in conn.channels.values() if ch.body is not None)


def _receive(conn, data: bytes, read: int) -> list:
    """As the edge: receive through get_buffer / buffer_updated in reads of ``read``."""
    events, pos = [], 0
    while pos < len(data):
        buf = conn.get_buffer(read)
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos:pos + n]
        buf.release()
        conn.buffer_updated(n)
        pos += n
        events += conn.receive_data()
        while conn.input_pending:
            events += conn.receive_data()
    return events


def test_a_declared_size_allocates_nothing_until_bytes_arrive():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.receive_data(_publish_head(1, 100 * MiB) + body_frame(1, b"x"))
    assert _held(conn) <= 2
    assert conn.partial_bytes == _held(conn)


def test_every_channel_of_a_connection_holds_only_what_it_received():
    conn = open_connection(channels=range(1, 101), frame_max=FRAME_MAX)
    sent = 0
    for ch in range(1, 101):
        data = _publish_head(ch, 100 * MiB) + body_frame(ch, b"y" * 10)
        sent += len(data)
        conn.receive_data(data)
    assert _held(conn) <= 2 * 100 * 10 < sent


def test_a_body_frame_received_straight_into_the_body_grows_it_by_what_arrived():
    """The rest of a large frame goes straight into the body (get_buffer): the buffer handed
    out is bounded by what arrived, not by the declared size or the frame's length."""
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    head = _publish_head(1, 100 * MiB) + struct.pack(">BHI", FRAME_BODY, 1, FRAME_MAX - 8)
    _receive(conn, head + b"z" * 20_000, 1 << 18)  # a frame's first 20,000 octets
    received = conn.channels[1].received
    assert received == 20_000
    buf = conn.get_buffer(1 << 18)
    assert len(buf) <= received  # at most doubles the body
    buf.release()
    conn.buffer_updated(0)
    for _ in range(3):  # a trickle straight into the body
        buf = conn.get_buffer(1 << 18)
        buf[:1] = b"z"
        buf.release()
        conn.buffer_updated(1)
    assert conn.channels[1].received == 20_003
    assert _held(conn) <= 2 * 20_003


def test_bodies_still_intact_after_growing_in_steps():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    body = bytes(range(256)) * 4000 + b"end"
    data = publish(1, body, chunks=20) + publish(1, body[:300_000], chunks=3)
    for read in (7, 4096, 100_000, 1 << 18):
        events = _receive(conn, data, read)
        assert [e.body for e in events if isinstance(e, ContentReceived)] == [
            body, body[:300_000]], read
        assert conn.partial_bytes == 0 and _held(conn) == 0


def test_partial_bodies_of_a_connection_are_bounded():
    conn = open_connection(channels=[1, 2, 3], frame_max=FRAME_MAX, max_partial_bodies=MiB)
    chunk = b"a" * (FRAME_MAX - 8)
    conn.receive_data(_publish_head(1, 10 * MiB) + body_frame(1, chunk) * 4)  # 512 KiB
    conn.receive_data(_publish_head(2, 10 * MiB) + body_frame(2, chunk) * 8)  # 1 MiB more
    closes = [(ch, m) for ch, m in drain_methods(conn) if isinstance(m, spec.Channel.Close)]
    assert [(ch, m.reply_code, m.class_id, m.method_id) for ch, m in closes] == [(2, 406, 60, 40)]
    assert "exceed the limit of 1048576 bytes" in closes[0][1].reply_text
    assert conn.partial_bytes <= MiB
    # the other channel carries on, and a publish on a third completes
    events = conn.receive_data(publish(3, b"ok"))
    assert [e.body for e in events if isinstance(e, ContentReceived)] == [b"ok"]
    assert conn.channel_is_open(1)


def test_multi_frame_content_is_announced_before_its_body():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    events = conn.receive_data(_publish_head(1, FRAME_MAX, exchange="x"))
    assert events == [ContentStarted(1, "x", FRAME_MAX)]
    # a body that fits one frame is not announced (the publish hot path)
    conn2 = open_connection(channels=[1], frame_max=FRAME_MAX)
    assert conn2.receive_data(_publish_head(1, FRAME_MAX - 8)) == []


def test_a_refused_content_holds_nothing():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.receive_data(_publish_head(1, 10 * MiB) + body_frame(1, b"b" * 50_000))
    assert conn.partial_bytes >= 50_000
    conn.close_channel(1, 403, "ACCESS_REFUSED", 60, 40)
    assert conn.partial_bytes == 0 and _held(conn) == 0
    conn.receive_data(body_frame(1, b"b" * 50_000))  # the rest is dropped unread
    assert conn.partial_bytes == 0


def test_an_ended_connection_drops_what_it_held():
    conn = open_connection(channels=[1, 2], frame_max=FRAME_MAX)
    conn.receive_data(_publish_head(1, 10 * MiB) + body_frame(1, b"c" * 90_000)
                      + _publish_head(2, 10 * MiB) + body_frame(2, b"d" * 90_000))
    assert _held(conn) >= 180_000
    conn.release_input()
    assert conn.partial_bytes == 0 and _held(conn) == 0
