"""The scattering read (get_buffers) and the plain one (get_buffer) must be indistinguishable:
for any sequence of frames, hostile ones included (a wrong end octet, a frame over frame_max,
channel 0 or another channel's frames between body frames, a size field that lies, a body
longer than declared, zero-length frames, heartbeats, a header declaring 2^63, a client that
stops mid-frame), split at any read boundaries, both give the same events, the same replies
and the same state, and the scattering one holds no more body than twice what arrived."""
from __future__ import annotations

import dataclasses
import os
import struct

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from broker.amqp import spec
from broker.amqp.codec import FRAME_BODY

from .sansio_helpers import (
    HEADER,
    body_frame,
    conn_open,
    header_frame,
    heartbeat_frame,
    make_conn,
    mframe,
    raw_frame,
    start_ok,
    tune_ok,
)

FRAME_MAX = 8192
CHUNK = FRAME_MAX - 8
EXAMPLES = settings(max_examples=int(os.environ.get("SANSIO_FUZZ_EXAMPLES", "50")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


def _open():
    conn = make_conn(frame_max=FRAME_MAX)
    for data in (HEADER, start_ok(), tune_ok(frame_max=FRAME_MAX), conn_open(),
                 mframe(1, spec.Channel.Open()), mframe(2, spec.Channel.Open())):
        conn.receive_data(data)
    conn.data_to_send()
    return conn


def _norm(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return value


def _events(events) -> list:
    out = []
    for e in events:
        if dataclasses.is_dataclass(e):
            out.append((type(e).__name__,
                        tuple((f.name, _norm(getattr(e, f.name))) for f in dataclasses.fields(e))))
        else:
            out.append((type(e).__name__, repr(e)))
    return out


def _held(conn) -> int:
    return sum(len(ch.body) for ch in conn.channels.values() if ch.body is not None)


def _run(data: bytes, reads: list[int], scatter: bool):
    """As the edge does: reads of the sizes given (cycled), recvmsg_into filling the buffers
    in order; what the connection made of it."""
    conn = _open()
    events, written, pos, i, held = [], bytearray(), 0, 0, 0
    while pos < len(data) and conn.state.name == "OPEN":
        size = reads[i % len(reads)]
        i += 1
        bufs = conn.get_buffers(size) if scatter else [conn.get_buffer(size)]
        n = 0
        for buf in bufs:
            take = min(len(buf), len(data) - pos - n)
            buf[:take] = data[pos + n:pos + n + take]
            n += take
            buf.release()
        conn.buffer_updated(n)
        pos += n
        events += _events(conn.receive_data())
        while conn.input_pending:
            events += _events(conn.receive_data())
        written += conn.data_to_send()
        received = sum(ch.received for ch in conn.channels.values() if ch.body is not None)
        held = max(held, _held(conn) - 2 * received)
    return events, bytes(written), conn.state, held


def _publish_head(channel: int, size: int) -> bytes:
    return mframe(channel, spec.Basic.Publish(0, "", "k", False, False)) + header_frame(channel, size)


ODDITIES = [None, "heartbeat", "other_channel_body", "other_publish", "ch0_method", "bad_end",
            "too_big", "size_lies_short", "size_lies_long", "longer_body", "zero_frame",
            "huge_header", "channel_close", "short_frames"]
CONTENT = st.tuples(st.sampled_from([1, 2]), st.integers(CHUNK + 1, 6 * CHUNK),
                    st.sampled_from(ODDITIES), st.integers(0, 5), st.integers(0, CHUNK))


def _content(spec_: tuple) -> bytes:
    """A multi-frame publish, possibly with one oddity among its frames."""
    channel, size, odd, at, other_size = spec_
    body = bytes((i * 7) & 0xFF for i in range(size))
    frames = [body_frame(channel, body[i:i + CHUNK]) for i in range(0, size, CHUNK)]
    at = at % len(frames)
    head = _publish_head(channel, size)
    other = 3 - channel
    if odd == "heartbeat":
        frames.insert(at, heartbeat_frame())
    elif odd == "other_channel_body":
        frames.insert(at, body_frame(other, b"x" * other_size))
    elif odd == "other_publish":
        frames.insert(at, _publish_head(other, 3) + body_frame(other, b"abc"))
    elif odd == "ch0_method":
        frames.insert(at, mframe(0, spec.Connection.Blocked("x")))
    elif odd == "bad_end":
        frames[at] = frames[at][:-1] + b"\x00"
    elif odd == "too_big":
        frames[at] = raw_frame(FRAME_BODY, channel, b"y" * (FRAME_MAX + 1))
    elif odd == "size_lies_short":
        f = frames[at]
        frames[at] = f[:3] + struct.pack(">I", max(0, len(f) - 9)) + f[7:]
    elif odd == "size_lies_long":
        f = frames[at]
        frames[at] = f[:3] + struct.pack(">I", len(f) - 7) + f[7:]
    elif odd == "longer_body":
        frames[-1] = body_frame(channel, body[(len(frames) - 1) * CHUNK:] + b"extra")
    elif odd == "zero_frame":
        frames.insert(at, body_frame(channel, b""))
    elif odd == "huge_header":
        head = _publish_head(channel, 1 << 63)
    elif odd == "channel_close":
        frames.insert(at, mframe(channel, spec.Channel.Close(200, "bye", 0, 0)))
    elif odd == "short_frames":
        frames = [body_frame(channel, body[i:i + 1000]) for i in range(0, size, 1000)]
    return head + b"".join(frames)


@EXAMPLES
@given(contents=st.lists(CONTENT, min_size=1, max_size=3),
       reads=st.lists(st.one_of(st.integers(1, 2000), st.integers(4097, 70_000)),
                      min_size=1, max_size=8),
       cut=st.one_of(st.none(), st.integers(0, 1 << 20)))
def test_scatter_and_plain_reads_agree(contents, reads, cut):
    data = b"".join(map(_content, contents))
    if cut is not None:
        data = data[:cut % (len(data) + 1)]  # the client stops, maybe mid-frame
    plain = _run(data, reads, scatter=False)
    scattered = _run(data, reads, scatter=True)
    assert scattered[0] == plain[0]
    assert scattered[1] == plain[1]
    assert scattered[2] == plain[2]
    # a body held past twice what arrived: no more than the plain reads hold
    assert scattered[3] <= max(plain[3], FRAME_MAX)
