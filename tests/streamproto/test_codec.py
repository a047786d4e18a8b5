"""The Stream protocol's frame codec, sans-IO: round trips, hostile frames, fuzz."""
from __future__ import annotations

import gzip
import struct
import zlib

import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.streamproto import codec as c

SAMPLES = [
    c.DeclarePublisher(1, 7, "ref", "s1"),
    c.DeclarePublisher(1, 7, None, "s1"),
    c.QueryPublisherSequence(2, "ref", "s1"),
    c.DeletePublisher(3, 7),
    c.Subscribe(4, 1, "s1", (c.OFFSET_FIRST, 0), 10, {}),
    c.Subscribe(4, 1, "s1", (c.OFFSET_OFFSET, 2**64 - 1), 10, {"single-active-consumer": "true"}),
    c.Subscribe(4, 1, "s1", (c.OFFSET_TIMESTAMP, -5), 0, {"filter.0": "a"}),
    c.Subscribe(4, 1, "s1", (c.OFFSET_NEXT, 0), 1, {}),
    c.Subscribe(4, 1, "s1", (c.OFFSET_LAST, 0), 1, {}),
    c.Credit(1, 5),
    c.StoreOffset("ref", "s1", 42),
    c.QueryOffset(5, "ref", "s1"),
    c.Unsubscribe(6, 1),
    c.Create(7, "s1", {"max-length-bytes": "1000", "max-age": "1h"}),
    c.Delete(8, "s1"),
    c.Metadata(9, ["a", "b", "é"]),
    c.PeerProperties(10, {"product": "x", "version": "1"}),
    c.SaslHandshake(11),
    c.SaslAuthenticate(12, "PLAIN", b"\0guest\0guest"),
    c.Tune(1048576, 60),
    c.Open(13, "/"),
    c.Close(14, 1, "bye"),
    c.Heartbeat(),
    c.Route(15, "k", "super"),
    c.Partitions(16, "super"),
    c.ExchangeCommandVersions(17, [(2, 1, 2), (8, 1, 2)]),
    c.StreamStats(18, "s1"),
    c.CreateSuperStream(19, "super", ["super-0", "super-1"], ["0", "1"], {"max-age": "1h"}),
    c.DeleteSuperStream(20, "super"),
    c.CloseResponse(21, 1),
    c.ConsumerUpdateResponse(22, 1, (c.OFFSET_OFFSET, 3)),
    c.Publish(3, [c.PublishedMessage(1, b"hello"), c.PublishedMessage(2, b"")]),
    c.Publish(3, [c.PublishedMessage(1, b"hello", "eu"), c.PublishedMessage(2, b"x", None)],
              version=2),
    c.Publish(3, [c.PublishedMessage(9, c.make_subentry([b"a", b"bb"], c.COMPRESSION_GZIP))]),
]


def _norm(cmd):
    if isinstance(cmd, c.Publish):
        return (cmd.publisher_id, cmd.version, [
            (m.publishing_id, m.filter_value,
             (m.data.compression, m.data.count, m.data.uncompressed_size, bytes(m.data.data))
             if isinstance(m.data, c.SubEntry) else bytes(m.data)) for m in cmd.messages])
    return cmd


@pytest.mark.parametrize("cmd", SAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(cmd):
    data = c.encode(cmd)
    frames = c.FrameReader(0).feed(data)
    assert len(frames) == 1
    key, version, payload = frames[0]
    assert (key, version) == (cmd.KEY, cmd.version)
    assert _norm(c.decode(key, version, payload)) == _norm(cmd)


def test_frames_split_at_every_byte():
    data = b"".join(c.encode(cmd) for cmd in SAMPLES[:6])
    for cut in range(len(data) + 1):
        reader = c.FrameReader(0)
        frames = reader.feed(data[:cut]) + reader.feed(data[cut:])
        assert [_norm(c.decode(*f)) for f in frames] == [_norm(x) for x in SAMPLES[:6]]
        assert reader.buffered == 0


def _reframe(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def test_trailing_and_missing_bytes_are_unknown_frames():
    frame = c.encode(c.Delete(8, "s1"))
    with pytest.raises(c.FrameError) as exc:
        c.decode(*c.FrameReader(0).feed(_reframe(frame[4:] + b"zz"))[0])
    assert exc.value.code == c.UNKNOWN_FRAME
    for cut in range(8, len(frame)):  # every truncation of the body, framed as whole
        with pytest.raises(c.FrameError) as exc:
            c.decode(*c.FrameReader(0).feed(_reframe(frame[4:cut]))[0])
        assert exc.value.code == c.UNKNOWN_FRAME


def test_unknown_key_version_and_offset_spec():
    with pytest.raises(c.FrameError, match="unknown key") as exc:
        c.decode(0x63, 1, b"")
    assert exc.value.code == c.UNKNOWN_FRAME
    with pytest.raises(c.FrameError, match="unsupported version"):
        c.decode(c.DELETE, 9, c.encode(c.Delete(8, "s"))[8:])
    with pytest.raises(c.FrameError, match="unsupported version"):
        c.decode(c.PUBLISH, 3, b"")
    body = bytearray(c.encode(c.Subscribe(4, 1, "s", (c.OFFSET_FIRST, 0), 1, {}))[8:])
    body[4 + 1 + 3:4 + 1 + 3 + 2] = b"\x00\x09"  # offset type 9
    with pytest.raises(c.FrameError, match="offset specification"):
        c.decode(c.SUBSCRIBE, 1, bytes(body))


def test_declared_counts_and_lengths_are_checked_against_the_frame():
    # an array of 2**31-1 strings in a frame of a few bytes: refused before any is read
    with pytest.raises(c.FrameError, match="array longer"):
        c.decode(c.METADATA, 1, struct.pack(">Ii", 1, 2**31 - 1))
    with pytest.raises(c.FrameError, match="array longer"):
        c.decode(c.PUBLISH, 1, struct.pack(">Bi", 1, 100_000))
    # a message whose length runs past the frame
    with pytest.raises(c.FrameError, match="beyond the frame"):
        c.decode(c.PUBLISH, 1, struct.pack(">BiQi", 1, 1, 5, 1000) + b"abc")
    with pytest.raises(c.FrameError, match="beyond the frame"):
        c.decode(c.PUBLISH, 1, struct.pack(">BiQBHII", 1, 1, 5, 0x80, 1, 10, 1000) + b"abc")
    with pytest.raises(c.FrameError, match="beyond the frame"):
        c.decode(c.OPEN, 1, struct.pack(">Ih", 1, 300) + b"/")
    with pytest.raises(c.FrameError, match="not UTF-8"):
        c.decode(c.OPEN, 1, struct.pack(">Ih", 1, 1) + b"\xff")


def test_oversized_frame_refused_from_its_size_field():
    reader = c.FrameReader(1000)
    reader.feed(c.encode(c.Heartbeat()))
    with pytest.raises(c.FrameError) as exc:
        reader.feed(struct.pack(">IHH", 1001, c.PUBLISH, 1) + b"x" * 10)
    assert exc.value.code == c.FRAME_TOO_LARGE
    assert reader.buffered <= 18  # nothing sized by the declared 1001
    assert c.FrameReader(1000).feed(struct.pack(">IHH", 1000, 2, 1)) == []
    with pytest.raises(c.FrameError) as exc:
        c.FrameReader(0).feed(struct.pack(">I", 3) + b"abc")
    assert exc.value.code == c.UNKNOWN_FRAME


def test_server_frames():
    r = c.FrameReader(0)
    (key, _v, p), = r.feed(c.encode_response(c.QUERY_OFFSET, 5, c.NO_OFFSET, 0))
    assert key == 0x800B and p == struct.pack(">IHQ", 5, c.NO_OFFSET, 0)
    (key, _v, p), = r.feed(c.encode_response(c.OPEN, 5, c.VIRTUAL_HOST_ACCESS_FAILURE, {"a": "b"}))
    assert key == 0x8015 and p == struct.pack(">IH", 5, 12)  # no properties on an error
    (key, _v, p), = r.feed(c.encode_credit_error(c.SUBSCRIPTION_ID_DOES_NOT_EXIST, 7))
    assert key == 0x8009 and p == b"\x00\x04\x07"  # as RabbitMQ 3.10 answers
    (key, _v, p), = r.feed(c.encode_publish_confirm(3, [1, 2, 3]))
    assert key == c.PUBLISH_CONFIRM and p == struct.pack(">Bi3Q", 3, 3, 1, 2, 3)
    (key, _v, p), = r.feed(c.encode_publish_error(3, [(4, c.PUBLISHER_DOES_NOT_EXIST)]))
    assert p == struct.pack(">BiQH", 3, 1, 4, 18)
    (key, _v, p), = r.feed(c.encode_metadata(9, [], [("nosuch", 2, 0xFFFF, [])]))
    # RabbitMQ 3.10's answer for a stream that does not exist, byte for byte
    assert p == b"\x00\x00\x00\t\x00\x00\x00\x00\x00\x00\x00\x01\x00\x06nosuch\x00\x02\xff\xff\x00\x00\x00\x00"
    assert c.encode_close(1, c.UNKNOWN_FRAME, "unknown frame")[4:] == \
        b"\x00\x16\x00\x01\x00\x00\x00\x01\x00\r\x00\runknown frame"


def test_chunk_and_deliver():
    entries = [c.simple_entry(b"m1"), c.subentry_entry(c.make_subentry([b"a", b"b"],
                                                                       c.COMPRESSION_GZIP))]
    chunk = c.encode_chunk(100, 1234, entries, 3)
    header, messages = c.decode_chunk(chunk)
    assert messages == [b"m1", b"a", b"b"]
    assert header["first_offset"] == 100 and header["num_records"] == 3
    assert header["num_entries"] == 2 and header["magic_version"] == 0x50
    head = c.encode_deliver_header(4, len(chunk), version=2, committed_offset=100)
    key, version, payload = c.FrameReader(0).feed(head + chunk)[0]
    assert (key, version) == (c.DELIVER, 2) and payload[0] == 4 and payload[9:] == chunk
    bad = bytearray(chunk)
    bad[-1] ^= 1
    with pytest.raises(c.FrameError, match="CRC"):
        c.decode_chunk(bytes(bad))


def _raw(records):
    return b"".join(struct.pack(">I", len(r)) + r for r in records)


@pytest.mark.parametrize("kind,compress", [
    (c.COMPRESSION_NONE, lambda b: b),
    (c.COMPRESSION_GZIP, gzip.compress),
    (c.COMPRESSION_ZSTD, lambda b: zstandard.ZstdCompressor().compress(b)),
    (c.COMPRESSION_LZ4, lz4.frame.compress),
])
def test_subentry_records(kind, compress):
    records = [b"one", b"", b"three" * 100]
    raw = _raw(records)
    s = c.SubEntry(kind, 3, len(raw), compress(raw))
    assert c.subentry_records(s, 10_000) == records
    c.check_subentry(s, 10_000)
    with pytest.raises(c.CompressionError, match="too large"):
        c.subentry_records(s, 100)
    with pytest.raises(c.CompressionError, match="too large"):
        c.check_subentry(s, 100)
    wrong = c.SubEntry(kind, 3, len(raw) - 1, compress(raw))
    with pytest.raises(c.CompressionError):
        c.subentry_records(wrong, 10_000)
    for count in (2, 4):
        bad = c.SubEntry(kind, count, len(raw), compress(raw))
        with pytest.raises(c.CompressionError, match="do not add up"):
            c.subentry_records(bad, 10_000)
        with pytest.raises(c.CompressionError, match="do not add up"):
            c.check_subentry(bad, 10_000)


def test_decompression_bomb_stops_at_the_bound():
    bomb = gzip.compress(b"\0" * 50_000_000)
    assert len(bomb) < 100_000
    s = c.SubEntry(c.COMPRESSION_GZIP, 1, 1000, bomb)  # declares 1000
    with pytest.raises(c.CompressionError, match="size mismatch"):
        c.subentry_records(s, 10_000)
    zbomb = zstandard.ZstdCompressor().compress(b"\0" * 50_000_000)
    with pytest.raises(c.CompressionError, match="size mismatch"):
        c.subentry_records(c.SubEntry(c.COMPRESSION_ZSTD, 1, 1000, zbomb), 10_000)


def test_snappy_and_unknown_compression_refused():
    for kind in (c.COMPRESSION_SNAPPY, 5, 7):
        with pytest.raises(c.CompressionError, match="not supported") as exc:
            c.subentry_records(c.SubEntry(kind, 1, 5, b"xxxxx"), 100)
        assert exc.value.code == c.PRECONDITION_FAILED
    assert not c.compression_supported(c.COMPRESSION_SNAPPY)
    assert c.compression_supported(c.COMPRESSION_GZIP)


def test_corrupt_compressed_data_is_the_protocols_error():
    with pytest.raises(c.CompressionError, match="corrupt"):
        c.subentry_records(c.SubEntry(c.COMPRESSION_GZIP, 1, 5, b"not gzip"), 100)
    with pytest.raises(c.CompressionError, match="corrupt"):
        c.subentry_records(c.SubEntry(c.COMPRESSION_ZSTD, 1, 5, b"not zstd"), 100)
    assert zlib  # (zlib's errors are among those mapped)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(0, 200))
def test_fuzz_reader_and_decoder_raise_only_their_own_error(chunks, max_frame):
    reader = c.FrameReader(max_frame)
    received = 0
    for data in chunks:
        received += len(data)
        try:
            frames = reader.feed(data)
        except c.FrameError:
            return
        assert reader.buffered <= received
        for key, version, payload in frames:
            try:
                c.decode(key, version, payload)
            except c.FrameError:
                pass


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(c.CLIENT_COMMANDS)), st.integers(1, 2), st.binary(max_size=80))
def test_fuzz_every_command_body(key, version, payload):
    try:
        c.decode(key, version, payload)
    except c.FrameError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_mutated_valid_frames(cmd, data):
    frame = bytearray(c.encode(cmd))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(4, len(frame) - 1)) if len(frame) > 4 else 0
        frame[i] = data.draw(st.integers(0, 255))
    try:
        for f in c.FrameReader(0).feed(bytes(frame)):
            c.decode(*f)
    except c.FrameError:
        pass


def test_oversized_frame_is_skipped_as_it_arrives():
    reader = c.FrameReader(100)
    big = struct.pack(">IHH", 1000, c.PUBLISH, 1) + b"x" * 996
    with pytest.raises(c.FrameError):
        reader.feed(big[:50])
    assert reader.buffered == 0
    hb = c.encode(c.Heartbeat())
    assert reader.feed(big[50:700]) == [] and reader.buffered == 0
    assert [f[0] for f in reader.feed(big[700:] + hb)] == [c.HEARTBEAT]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.integers(0, 6))
def test_fuzz_check_subentry_agrees_with_splitting(data, count):
    s = c.SubEntry(c.COMPRESSION_NONE, count, len(data), data)
    try:
        c.subentry_records(s, 1000)
        split_ok = True
    except c.CompressionError:
        split_ok = False
    try:
        c.check_subentry(s, 1000)
        check_ok = True
    except c.CompressionError:
        check_ok = False
    assert split_ok == check_ok


def test_consumer_update_answer_may_carry_a_value_after_first_last_next():
    """rstream answers ConsumerUpdate with a u64 after every offset type; RabbitMQ reads
    first/last/next without it (was: an unknown-frame close of the consumer's connection)."""
    for kind in (c.OFFSET_FIRST, c.OFFSET_LAST, c.OFFSET_NEXT):
        body = struct.pack(">IHHQ", 7, c.OK, kind, 0)
        assert c.decode(c.CONSUMER_UPDATE | c.RESPONSE, 1, body) == \
            c.ConsumerUpdateResponse(7, c.OK, (kind, 0))
        assert c.decode(c.CONSUMER_UPDATE | c.RESPONSE, 1, body[:-8]) == \
            c.ConsumerUpdateResponse(7, c.OK, (kind, 0))
    with pytest.raises(c.FrameError):  # a value of another length is still refused
        c.decode(c.CONSUMER_UPDATE | c.RESPONSE, 1, struct.pack(">IHHI", 7, c.OK, 1, 0))


@pytest.mark.parametrize("kind,compress", [
    (c.COMPRESSION_GZIP, gzip.compress),
    (c.COMPRESSION_ZSTD, lambda b: zstandard.ZstdCompressor().compress(b)),
    (c.COMPRESSION_LZ4, lz4.frame.compress),
])
def test_publish_check_inflates_a_window_at_a_time(kind, compress):
    """A bomb that declares its true size (64 MiB from a few KiB) passes the publish path's
    check with a few windows held, not the whole (before: 64 MiB at once; eight in one
    frame took a 256 MiB broker to 248 MiB); records cut across windows still add up."""
    import tracemalloc
    size = 64 << 20
    raw = struct.pack(">I", size - 4) + bytes(size - 4)
    bomb = c.SubEntry(kind, 1, size, compress(raw))
    del raw
    tracemalloc.start()
    try:
        c.check_subentry(bomb, 128 << 20)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * c.CHECK_WINDOW, peak
    records = [bytes([i % 251]) * (c.CHECK_WINDOW - 3 + i) for i in range(7)]
    raw = _raw(records)
    c.check_subentry(c.SubEntry(kind, 7, len(raw), compress(raw)), 1 << 20)
    for count, cut in ((6, 0), (8, 0), (7, 1)):
        bad = c.SubEntry(kind, count, len(raw) - cut, compress(raw[:len(raw) - cut]))
        with pytest.raises(c.CompressionError):
            c.check_subentry(bad, 1 << 20)
