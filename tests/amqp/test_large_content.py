"""Large contents: bodies over many frames received through the buffer protocol (parts of
a frame as they arrive, the rest of a frame straight into the body), and output handed
out as buffers for a gathering send, written with partial sends over a real socket."""
from __future__ import annotations

import random
import socket

import pytest
import trio

from broker.amqp import spec
from broker.amqp.codec import FRAME_BODY, FRAME_BODY_PART, FrameReader, content_parts
from broker.amqp.events import ConnectionCloseCompleted, ContentReceived, ProtocolError
from broker.listeners.amqp_send import THREAD_IO_MIN, THREAD_SEND_WAIT, send_buffers

from .sansio_helpers import body_frame, header_frame, mframe, open_connection, parse_frames, publish

FRAME_MAX = 131072
MiB = 1 << 20


def _body(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def _receive(conn, data: bytes, sizes) -> list:
    """Push ``data`` through get_buffer/buffer_updated in reads of the given sizes (cycled),
    handling the input with the connection's budget as the edge does."""
    events, pos, k = [], 0, 0
    while pos < len(data):
        buf = conn.get_buffer(sizes[k % len(sizes)])
        k += 1
        n = min(len(buf), len(data) - pos)
        buf[:n] = data[pos:pos + n]
        conn.buffer_updated(n)
        pos += n
        events += conn.receive_data()
        while conn.input_pending:
            events += conn.receive_data()
    return events


@pytest.mark.parametrize("sizes", [[1 << 18], [65536, 7], [4096], [131072 + 8], [1, 300000, 13]])
@pytest.mark.parametrize("size", [64 * 1024, MiB, MiB + 5])
def test_body_over_many_frames_through_the_buffer_protocol(size, sizes):
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    conn.input_budget = 65536
    body = _body(size)
    data = publish(1, body, chunks=-(-size // (FRAME_MAX - 8))) * 2 + mframe(
        1, spec.Basic.Qos(0, 5, False))
    events = _receive(conn, data, sizes)
    contents = [e for e in events if isinstance(e, ContentReceived)]
    assert [len(c.body) for c in contents] == [size, size]
    assert all(type(c.body) is bytes and c.body == body for c in contents)
    assert not [e for e in events if isinstance(e, ProtocolError)]
    assert events[-1].method == spec.Basic.Qos(0, 5, False)


def test_two_channels_interleave_large_bodies():
    conn = open_connection(channels=[1, 2], frame_max=FRAME_MAX)
    a, b = _body(300_000), _body(300_001)
    chunk = FRAME_MAX - 8
    data = (mframe(1, spec.Basic.Publish(0, "", "a", False, False)) + header_frame(1, len(a))
            + mframe(2, spec.Basic.Publish(0, "", "b", False, False)) + header_frame(2, len(b)))
    for i in range(0, 300_001, chunk):
        data += body_frame(1, a[i:i + chunk]) if i < len(a) else b""
        data += body_frame(2, b[i:i + chunk])
    events = _receive(conn, data, [50_000])
    got = {e.routing_key: e.body for e in events if isinstance(e, ContentReceived)}
    assert got == {"a": a, "b": b}


def test_streamed_body_frame_with_bad_frame_end_completes_nothing():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    body = _body(100_000)
    data = publish(1, body)
    data = data[:-1] + b"\x00"  # the body frame's end marker
    events = _receive(conn, data, [4096])
    assert not [e for e in events if isinstance(e, ContentReceived)]
    assert any(isinstance(e, ConnectionCloseCompleted) for e in events)


def test_body_longer_than_declared_in_a_streamed_frame_is_505():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    data = (mframe(1, spec.Basic.Publish(0, "", "rk", False, False)) + header_frame(1, 50_000)
            + body_frame(1, _body(60_000)))
    events = _receive(conn, data, [1000])
    assert not [e for e in events if isinstance(e, ContentReceived)]
    errors = [e for e in events if isinstance(e, ProtocolError)]
    assert errors and errors[0].reply_code == 505


def test_reader_streams_large_body_frames_in_parts():
    reader = FrameReader(frame_max=FRAME_MAX)
    payload = _body(100_000)
    frame = body_frame(3, payload)
    got = []
    for i in range(0, len(frame), 30_000):
        reader.append(frame[i:i + 30_000])
        got += [(t, c, bytes(p)) for t, c, p in reader.parse()]
    assert {t for t, _, _ in got} == {FRAME_BODY_PART, FRAME_BODY}
    assert got[-1][0] == FRAME_BODY and all(c == 3 for _, c, _ in got)
    assert b"".join(p for _, _, p in got) == payload
    # feed() (whole frames, bytes) is unchanged
    assert FrameReader(frame_max=FRAME_MAX).feed(frame) == [(FRAME_BODY, 3, payload)]


def test_reader_buffer_grows_with_reads_and_is_given_back_when_idle():
    reader = FrameReader()
    heartbeat = b"\x08\x00\x00\x00\x00\x00\x00\xce"
    buf = reader.get_buffer(1 << 18)
    assert len(buf) == 4096  # a new buffer starts small
    buf[:] = heartbeat * 512
    reader.buffer_updated(4096)  # a full read: more is probably waiting
    assert len(reader.parse()) == 512
    assert not reader.release_if_idle(4096)
    buf = reader.get_buffer(1 << 18)
    assert len(buf) == 1 << 18  # grown to what the edge asks for
    buf[:8] = heartbeat
    reader.buffer_updated(8)
    assert reader.parse() == [(8, 0, b"")]
    assert reader.release_if_idle(8)  # a small read and nothing left: give it back
    assert reader.buffered == 0 and len(reader.get_buffer(1 << 18)) == 4096


def test_buffers_to_send_keep_large_bodies_as_slices():
    conn = open_connection(channels=[1], frame_max=FRAME_MAX)
    body = _body(MiB)
    conn.deliver(1, b"\x03tag", 1, False, "", "rk", b"\x00\x00", body)
    conn.deliver(1, b"\x03tag", 2, False, "", "rk", b"\x00\x00", b"small")
    bufs = conn.buffers_to_send()
    assert not conn.has_output and conn.pending_output == 0
    slices = [b for b in bufs if isinstance(b, memoryview)]
    # 8 full frames as slices of the body itself (not copies); the 64-octet rest is joined
    assert len(slices) == 8 and all(s.obj is body for s in slices)
    frames = parse_frames(b"".join(bufs))
    assert b"".join(p for t, _, p in frames if t == FRAME_BODY) == body + b"small"
    # small output only: one joined buffer
    conn.deliver(1, b"\x03tag", 3, False, "", "rk", b"\x00\x00", b"x")
    assert len(conn.buffers_to_send()) == 1


async def test_send_buffers_survives_partial_sends():
    """A gathering send over a socket with small buffers takes part of what it is given
    (often ending inside a buffer); every octet arrives once and in order."""
    a, b = trio.socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        body = _body(3 * MiB + 17)
        bufs = [b"head", *content_parts(1, b"\x00\x00", body, FRAME_MAX), b"tail"]
        bufs += [b"x%d" % i for i in range(1500)]  # more than one sendmsg's worth of iovecs
        expected = b"".join(bufs)
        received = bytearray()

        async def read_all():
            while len(received) < len(expected):
                chunk = await b.recv(5000)
                assert chunk
                received.extend(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await send_buffers(a, bufs)
        assert bytes(received) == expected


async def test_large_send_to_a_peer_that_stops_reading_is_cancellable():
    """A large write runs in a worker thread; with the peer no longer reading, cancelling the
    writer ends it within the thread's bounded wait (the socket is not written from a thread
    after send_buffers returned), and what arrived is an in-order prefix of the stream."""
    a, b = trio.socket.socketpair()
    with a, b:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        body = _body(4 * MiB)
        bufs = [b"head", *content_parts(1, b"\x00\x00", body, FRAME_MAX)]
        assert sum(map(len, bufs)) >= THREAD_IO_MIN
        expected = b"".join(bufs)
        started = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            await send_buffers(a, bufs)
        assert scope.cancelled_caught
        assert trio.current_time() - started < 0.3 + THREAD_SEND_WAIT + 1.0
        received = bytearray()
        while True:
            try:
                chunk = b._sock.recv(65536)
            except BlockingIOError:
                break
            received.extend(chunk)
        assert 0 < len(received) < len(expected)
        assert expected.startswith(received)


@pytest.mark.parametrize("frame_max", [4096, FRAME_MAX])
@pytest.mark.parametrize("size", [0, 100, 16383, 16384, 4089, 131064, 131065, MiB + 1])
def test_delivered_content_decodes_whatever_the_size(size, frame_max):
    conn = open_connection(channels=[1])
    conn.frame_max = frame_max  # as negotiated by a client's tune-ok
    body = _body(size)
    conn.deliver(1, b"\x03tag", 7, False, "ex", "rk", b"\x00\x00", body)
    frames = parse_frames(b"".join(conn.buffers_to_send()))
    assert spec.decode_method(frames[0][2]) == spec.Basic.Deliver("tag", 7, False, "ex", "rk")
    assert frames[1][0] == spec.FRAME_HEADER
    bodies = frames[2:]
    assert all(t == FRAME_BODY and len(p) <= frame_max - 8 for t, _, p in bodies)
    assert b"".join(p for _, _, p in bodies) == body
    assert len(bodies) == -(-size // (frame_max - 8))
