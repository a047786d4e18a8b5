"""FrameReader: splitting, batching and framing errors."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.amqp import spec
from broker.amqp.codec import HEARTBEAT_FRAME, FrameError, FrameReader

from .sansio_helpers import body_frame, header_frame, mframe, raw_frame

STREAM_PARTS = [
    mframe(0, spec.Connection.Close(200, "bye", 0, 0)),
    mframe(1, spec.Basic.Publish(0, "ex", "rk", True, False)),
    header_frame(1, 5, {"content_type": "text/plain"}),
    body_frame(1, b"hello"),
    HEARTBEAT_FRAME,
    raw_frame(spec.FRAME_BODY, 65535, b""),
    body_frame(2, bytes(range(256)) * 4),
]
STREAM = b"".join(STREAM_PARTS)
EXPECTED = [FrameReader(frame_max=0).feed(part)[0] for part in STREAM_PARTS]


def test_whole_stream_in_one_feed():
    reader = FrameReader()
    assert reader.feed(STREAM) == EXPECTED
    assert reader.buffered == 0


def test_frame_tuples():
    frames = FrameReader().feed(raw_frame(3, 258, b"abc") + HEARTBEAT_FRAME)
    assert frames == [(3, 258, b"abc"), (8, 0, b"")]
    assert all(type(p) is bytes for _, _, p in frames)


def test_one_byte_at_a_time():
    reader = FrameReader()
    got = []
    for i in range(len(STREAM)):
        got += reader.feed(STREAM[i:i + 1])
    assert got == EXPECTED
    assert reader.buffered == 0


@pytest.mark.parametrize("split", range(len(b"".join(STREAM_PARTS[:4])) + 1))
def test_split_at_every_boundary(split):
    data = b"".join(STREAM_PARTS[:4])
    reader = FrameReader()
    got = reader.feed(data[:split])
    assert reader.buffered == split - sum(len(p) for p in STREAM_PARTS[:len(got)])
    got += reader.feed(data[split:])
    assert got == EXPECTED[:4]
    assert reader.buffered == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, len(STREAM)), max_size=20))
def test_arbitrary_chunking(cuts):
    cuts = sorted(set(cuts))
    reader = FrameReader()
    got = []
    prev = 0
    for cut in [*cuts, len(STREAM)]:
        got += reader.feed(STREAM[prev:cut])
        prev = cut
    assert got == EXPECTED


def test_accepts_bytearray_and_memoryview():
    reader = FrameReader()
    assert reader.feed(bytearray(STREAM[:10])) == []
    assert reader.feed(memoryview(STREAM[10:])) == EXPECTED


def test_empty_feed():
    reader = FrameReader()
    assert reader.feed(b"") == []
    reader.feed(STREAM[:3])
    assert reader.feed(b"") == []
    assert reader.buffered == 3


def test_many_frames_per_feed_with_trailing_partial():
    many = HEARTBEAT_FRAME * 1000 + STREAM[:5]
    reader = FrameReader()
    frames = reader.feed(many)
    assert frames == [(8, 0, b"")] * 1000
    assert reader.buffered == 5
    assert reader.feed(STREAM[5:]) == EXPECTED


@pytest.mark.parametrize("end", [0x00, 0xCD, 0xCF, 0xFF])
def test_wrong_frame_end_octet(end):
    bad = raw_frame(1, 0, b"\x00\x0a\x00\x33", end=end)
    with pytest.raises(FrameError) as info:
        FrameReader().feed(bad)
    assert info.value.explanation == (
        f"type 1, all octets = <<0,10,0,51>>: {{invalid_frame_end_marker,{end}}}")


def test_wrong_frame_end_detected_when_fed_bytewise():
    bad = HEARTBEAT_FRAME + raw_frame(3, 1, b"abc", end=0x00)
    reader = FrameReader()
    got = []
    with pytest.raises(FrameError):
        for i in range(len(bad)):
            got += reader.feed(bad[i:i + 1])
    assert got == [(8, 0, b"")]


def test_frames_before_a_bad_frame_are_kept_on_the_error():
    # The frames that were complete before the violation are still valid input.
    with pytest.raises(FrameError) as info:
        FrameReader().feed(HEARTBEAT_FRAME + raw_frame(3, 1, b"abc") + raw_frame(3, 1, b"x", end=0))
    assert info.value.frames == [(8, 0, b""), (3, 1, b"abc")]


def test_frame_exactly_frame_max_is_accepted():
    reader = FrameReader(frame_max=4096)
    frame = raw_frame(3, 1, b"x" * (4096 - 8))
    assert len(frame) == 4096
    assert reader.feed(frame) == [(3, 1, b"x" * 4088)]


def test_frame_of_frame_max_payload_is_accepted():
    # RabbitMQ's 8-octet allowance: a payload of frame_max octets (a frame of frame_max + 8)
    reader = FrameReader(frame_max=4096)
    assert reader.feed(raw_frame(3, 1, b"x" * 4096)) == [(3, 1, b"x" * 4096)]


def test_frame_larger_than_frame_max():
    reader = FrameReader(frame_max=4096)
    with pytest.raises(FrameError) as info:
        reader.feed(raw_frame(3, 1, b"x" * 4097))
    # as RabbitMQ words it: the limit named is the spec's frame_max - 8
    assert info.value.explanation == "type 3, all octets = <<>>: {frame_too_large,4097,4088}"


def test_oversized_frame_detected_from_its_header_alone():
    # The size check needs only the 7-octet header, not the (huge) payload.
    reader = FrameReader(frame_max=4096)
    with pytest.raises(FrameError):
        reader.feed(struct.pack(">BHI", 3, 1, 2**32 - 1))


def test_frame_max_zero_means_unlimited():
    reader = FrameReader(frame_max=0)
    big = raw_frame(3, 1, b"y" * 300_000)
    assert reader.feed(big) == [(3, 1, b"y" * 300_000)]


def test_frame_max_can_be_lowered_between_feeds():
    reader = FrameReader(frame_max=131072)
    assert reader.feed(body_frame(1, b"z" * 5000))
    reader.frame_max = 4096
    with pytest.raises(FrameError):
        reader.feed(body_frame(1, b"z" * 5000))
