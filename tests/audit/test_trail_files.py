"""The trail's files without a broker: encoder against fastavro, writer, damaged files."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import fastavro
import pytest

from broker.audit import events
from broker.audit.encoder import BatchEncoder, ContainerFile
from broker.audit.reader import VERSION_KEY, FileReader, UnknownSchemaVersion
from broker.audit.spool import FRAME, Spool, dumps, loads, segments
from broker.audit.writer import RollingWriter, last_state, node_files

T = 1_795_500_000.25
PROPS = {"message_id": "m-1", "correlation_id": b"c", "app_id": "app",
         "headers": {"x-seq": 7, "x-ref-key": b"order-42", "x-producer": "p1"}}
EVERY_KIND = [
    (events.PUB, T, "/", "x", "rk", 1, PROPS, 64, True, "guest", "127.0.0.1:1", 1, 3, ["q"],
     "routed"),
    (events.PUB, T, "/", "", "nowhere", 2, {}, 0, False, "u", "c", 2, 0, [], "unroutable"),
    (events.ENQ, T, "/", "dlq", 3, PROPS),
    (events.ENQ, T, "/", "dlq", 4, {"message_id": "ü"}),
    (events.DEL, T, "/", "q", 1, "ctag", 1, False, 1, "127.0.0.1:1", 1),
    (events.DEL, T, "/", "q", 2 ** 40, None, 2 ** 33, True, 300, "c", 65535),
    (events.ACK, T, "/", "q", 1, "ctag", 1, "127.0.0.1:1", 1),
    (events.REJ, T, "/", "q", 1, None, 3, "c", 1, True, "nacked"),
    (events.LEFT, T, "/", "q", 1, "dead_lettered", "rejected", "dlx"),
    (events.LEFT, T, "/", "q", 1, "settled", None, None),
    (events.SCH, T, "/", "x", "rk", 9, PROPS, T + 5),
    (events.FIRE, T, "/", "x", "rk", 10, {}, T + 5, ["a", "b"]),
    (events.CAN, T, "/", "sid-1"),
    (events.RETRY, T, "/", "q", 1, 2, "delay 5 ms"),
    (events.TRAIL, T, "node_started", None, "first run"),
    (events.TRAIL, T, "audit_dropped", 7, "policy drop"),
    (events.STRA, T, "/", "s", 11, 0),
    (events.STRA, T, "/", "s", 12, 2 ** 40),
    (events.STRD, T, "/", "s", "3", None, 0, 100, "127.0.0.1:2", None, "reader-1"),
    (events.STRD, T, "/", "s", "amq.ctag-1", 7, 2 ** 40, 1, "c", 1, None),
    (events.STRK, T, "/", "s", "amq.ctag-1", 7, 2 ** 40, "c", 1),
    (events.STRT, T, "/", "s", 0, 4096, "retention"),
]
FIELDS = [f["name"] for f in events.load_schema()["fields"]]


def test_every_kind_decodes_with_fastavro_as_the_reference_records():
    schema = fastavro.parse_schema(events.load_schema())
    batch = EVERY_KIND * 3
    data = BatchEncoder("n1", 100).encode(batch)
    bio = io.BytesIO(data)
    for i, ev in enumerate(batch):
        got = fastavro.schemaless_reader(bio, schema)
        want = events.to_record(ev, "n1", 100 + i)
        assert got == {f: want.get(f) for f in FIELDS}, ev
    assert bio.tell() == len(data)


def _write(path, batches, codec="deflate", version=events.SCHEMA_VERSION):
    f = ContainerFile(str(path), json.dumps(events.load_schema()), codec,
                      {VERSION_KEY: str(version)})
    enc = BatchEncoder("n1", 1)
    offsets = []
    for batch in batches:
        offsets.append(f.size)
        f.write_block(len(batch), enc.encode(batch))
    f.close()
    return offsets


@pytest.mark.parametrize("codec", ["deflate", "null"])
def test_container_is_standard_avro(tmp_path, codec):
    path = tmp_path / "part.avro"
    _write(path, [EVERY_KIND, EVERY_KIND[:3]], codec)
    with open(path, "rb") as fo:
        records = list(fastavro.reader(fo))
    assert [r["seq"] for r in records] == list(range(1, len(EVERY_KIND) + 4))
    reader = FileReader(str(path))
    assert reader.fast is not None  # this schema takes the reader's own decoder
    assert list(reader) == records
    assert reader.problems == []


def test_rows_of_chosen_columns_match_the_records(tmp_path):
    path = tmp_path / "part.avro"
    batch = [*EVERY_KIND, *_compact_kinds()]
    _write(path, [batch, batch[:3]])
    records = list(FileReader(str(path)))
    columns = ("ts_us", "queues", "event", "no_such_column", "msg", "persistent", "seq")
    rows = [r for block in FileReader(str(path)).rows_iter(columns) for r in block]
    assert rows == [tuple(r.get(c) for c in columns) for r in records]
    lo, hi = records[1]["ts_us"], records[-1]["ts_us"]
    rows = [r for block in FileReader(str(path)).rows_iter(("seq",), lo, hi) for r in block]
    assert rows == [(r["seq"],) for r in records if lo <= r["ts_us"] < hi]


def _compact_kinds() -> list:
    """The broker's compact tuples (shared channel and queue contexts)."""
    ch = ("/", "guest", "127.0.0.1:1", 3)
    q = ("/", "q")
    return [(events.PUBC, T, ch, "x", "rk", 9, PROPS, 64, True, 5, ["q"], "routed"),
            (events.DELC, T, q, 9, "ctag", 4, False, 1, ch),
            (events.ACKC, T, q, 9, "ctag", 4, ch)]


def test_a_stream_consumers_compact_records_name_the_offset():
    ch = ("/", "guest", "127.0.0.1:1", 3)
    sq = ("/", "s", events.STREAM)
    dl = events.to_record((events.DELC, T, sq, 41, "sc", 7, False, 1, ch), "n", 1)
    ack = events.to_record((events.ACKC, T, sq, 41, "sc", 7, ch), "n", 2)
    assert (dl["event"], dl["queue"], dl.get("msg"), dl["stream_offset"], dl["stream_count"],
            dl["consumer_tag"], dl["delivery_tag"]) == ("delivered", "s", None, 41, 1, "sc", 7)
    assert (ack["event"], ack.get("msg"), ack["stream_offset"], ack["delivery_tag"]) == \
        ("acked", None, 41, 7)


def test_version_1_files_stay_readable(tmp_path):
    """A trail written before the streams' fields (schema version 1, fastavro's own
    writer): every record reads, the new columns as None, by records and by columns."""
    with open(os.path.join(os.path.dirname(events.SCHEMA_PATH), "audit_event_v1.avsc")) as f:
        v1 = json.load(f)
    names = [f["name"] for f in v1["fields"]]
    assert names == FIELDS[:len(names)] and len(FIELDS) == len(names) + 2
    old = [{f: r.get(f) for f in names}
           for r in (events.to_record(ev, "n1", i) for i, ev in enumerate(EVERY_KIND[:16], 1))]
    path = tmp_path / "part-00000000000000000001.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(v1), old, codec="deflate",
                        metadata={VERSION_KEY: "1"})
    reader = FileReader(str(path))
    assert reader.version == 1 and not reader.problems
    got = list(reader)
    assert [{f: r.get(f) for f in names} for r in got] == old
    assert all(r.get("stream_offset") is None for r in got)
    columns = ("seq", "event", "msg", "stream_offset", "stream_count")
    rows = [r for block in FileReader(str(path)).rows_iter(columns) for r in block]
    assert rows == [(r["seq"], r["event"], r["msg"], None, None) for r in old]


def test_compact_kinds_expand_to_the_flat_ones():
    pub, dl, ack = _compact_kinds()
    assert events.to_record(pub, "n", 1) == events.to_record(
        (events.PUB, T, "/", "x", "rk", 9, PROPS, 64, True, "guest", "127.0.0.1:1", 3, 5,
         ["q"], "routed"), "n", 1)
    assert events.to_record(dl, "n", 1) == events.to_record(
        (events.DEL, T, "/", "q", 9, "ctag", 4, False, 1, "127.0.0.1:1", 3), "n", 1)
    assert events.to_record(ack, "n", 1) == events.to_record(
        (events.ACK, T, "/", "q", 9, "ctag", 4, "127.0.0.1:1", 3), "n", 1)


def test_corrupt_block_is_skipped_and_named(tmp_path):
    path = tmp_path / "part.avro"
    offsets = _write(path, [EVERY_KIND[:4], EVERY_KIND[4:8], EVERY_KIND[8:]], "deflate")
    data = bytearray(path.read_bytes())
    data[offsets[1] + 12] ^= 0xFF  # inside the second block's compressed data
    path.write_bytes(bytes(data))
    reader = FileReader(str(path))
    seqs = [r["seq"] for r in reader]
    assert seqs == [1, 2, 3, 4, *list(range(9, len(EVERY_KIND) + 1))]
    assert [(p.offset, p.kind) for p in reader.problems] == [(offsets[1], "corrupt block")]
    assert str(path) in str(reader.problems[0])
    rows = FileReader(str(path))  # the Spark jobs' path: rows of chosen columns
    assert [r[0] for block in rows.rows_iter(("seq",)) for r in block] == seqs
    assert [(p.offset, p.kind) for p in rows.problems] == [(offsets[1], "corrupt block")]


def test_broken_sync_marker_resyncs(tmp_path):
    path = tmp_path / "part.avro"
    offsets = _write(path, [EVERY_KIND[:4], EVERY_KIND[4:8], EVERY_KIND[8:]], "null")
    data = bytearray(path.read_bytes())
    data[offsets[2] - 3] ^= 0xFF  # the second block's trailing sync marker
    path.write_bytes(bytes(data))
    reader = FileReader(str(path))
    assert [r["seq"] for r in reader] == [1, 2, 3, 4, *list(range(9, len(EVERY_KIND) + 1))]
    assert [(p.offset, p.kind) for p in reader.problems] == [(offsets[1], "corrupt block")]


@pytest.mark.parametrize("cut", [1, 10, 17])
def test_torn_tail_is_reported_and_the_rest_read(tmp_path, cut):
    path = tmp_path / "part.avro"
    offsets = _write(path, [EVERY_KIND[:4], EVERY_KIND[4:]], "deflate")
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - cut])
    reader = FileReader(str(path))
    assert [r["seq"] for r in reader] == [1, 2, 3, 4]
    assert [(p.offset, p.kind) for p in reader.problems] == [(offsets[1], "truncated")]


def test_garbage_and_empty_files_are_one_problem_each(tmp_path):
    for name, content in (("empty.avro", b""), ("junk.avro", b"hello world" * 10),
                          ("header.avro", b"Obj\x01\x04")):
        p = tmp_path / name
        p.write_bytes(content)
        reader = FileReader(str(p))
        assert list(reader) == []
        assert [x.kind for x in reader.problems] == ["bad header"], name


def test_newer_schema_version_is_refused_by_name(tmp_path):
    path = tmp_path / "part.avro"
    _write(path, [EVERY_KIND], version=events.SCHEMA_VERSION + 1)
    with pytest.raises(UnknownSchemaVersion,
                       match=rf"part\.avro.*version {events.SCHEMA_VERSION + 1}"):
        FileReader(str(path))


def test_writer_rolls_by_hour_and_size_and_continues_the_sequence(tmp_path):
    w = RollingWriter(str(tmp_path), "n1", 1 << 20, 300.0, "deflate", 1)
    hour = 3600.0
    base = 1_795_500_000 - 1_795_500_000 % 3600  # an hour boundary
    mk = [(events.ENQ, base + hour - 0.5 + i * 0.25, "/", "q", i, {}) for i in range(4)]
    w.write(mk[:2])  # two batches: before the hour, after it
    w.write(mk[2:])
    w.close()
    files = node_files(str(tmp_path), "n1")
    assert len(files) == 2
    assert [os.path.basename(f) for f in files] == ["part-00000000000000000001.avro",
                                                    "part-00000000000000000003.avro"]
    assert "/hour=" in files[0] and "/node=n1/" in files[0]
    assert last_state(str(tmp_path), "n1") == (4, "enqueued")


def _convert(root):
    p = subprocess.run([sys.executable, "-m", "broker.audit.writer", "--dir", str(root),
                        "--node", "n1"], timeout=60)
    assert p.returncode == 0


def test_converter_turns_the_spool_into_avro_once(tmp_path):
    now = time.time()
    sp = Spool(str(tmp_path), segment_bytes=200)  # a segment per frame or two
    seq = 1
    for i in range(6):
        batch = [(events.ENQ, now, "/", "q", i * 10 + k, {}) for k in range(3)]
        sp.append(seq, len(batch), dumps(batch))
        seq += len(batch)
    sp.close(clean=True)
    _convert(tmp_path)
    records = [r for f in node_files(str(tmp_path), "n1") for r in FileReader(f)]
    assert sorted(r["seq"] for r in records) == list(range(1, 19))
    assert segments(str(tmp_path)) == []
    # a converter restarted over frames it already wrote skips them by sequence number
    sp = Spool(str(tmp_path))
    batch = [(events.ENQ, now, "/", "q", 99, {})] * 4
    sp.append(17, 4, dumps(batch))  # 17, 18 are written already; 19, 20 are new
    sp.close(clean=True)
    _convert(tmp_path)
    records = [r for f in node_files(str(tmp_path), "n1") for r in FileReader(f)]
    assert sorted(r["seq"] for r in records) == list(range(1, 21))


def test_torn_frame_of_a_crash_is_skipped(tmp_path):
    now = time.time()
    sp = Spool(str(tmp_path))
    sp.append(1, 1, dumps([(events.ENQ, now, "/", "q", 1, {})]))
    sp.close(clean=False)
    (path,) = segments(str(tmp_path))
    with open(path, "ab") as f:
        f.write(FRAME.pack(2, 5, 1000) + b"half a frame")
    sp2 = Spool(str(tmp_path))  # the next run starts a newer segment
    sp2.append(2, 1, dumps([(events.ENQ, now, "/", "q", 2, {})]))
    sp2.close(clean=True)
    _convert(tmp_path)
    records = [r for f in node_files(str(tmp_path), "n1") for r in FileReader(f)]
    assert sorted(r["msg"] for r in records) == [1, 2]
    assert segments(str(tmp_path)) == []


def test_flat_buffer_of_compact_kinds_encodes_as_the_flat_records():
    """The recorder's flat buffer (padded records, shared contexts, a PUBC ``queues`` slot
    that is None, one name or a list) through the spool's frame format and the encoder's
    compact path, against fastavro; odd values (a None tag, a huge id) take the generic
    path and must give the same records."""
    schema = fastavro.parse_schema(events.load_schema())
    ch = ("/", "guest", "127.0.0.1:1", 3)
    mq = ("v", "mqtt-user", "127.0.0.1:9", None)  # an MQTT session: no channel number
    q = ("/", "q")
    pad = events.WIDTH
    evs = [(events.PUBC, T, ch, "x", "rk", 9, PROPS, 64, True, 5, "q", "routed"),
           (events.PUBC, T, ch, "", "rk", 10, {"delivery_mode": 2}, 0, False, 0, None,
            "unroutable"),
           (events.PUBC, T, mq, "amq.topic", "a.b", 11, {}, 3, False, 0, ["q", "r"], "routed"),
           (events.DELC, T, q, 9, "ctag", 4, False, 1, ch),
           (events.DELC, T, q, 10, "ctag", 5, True, 2, ch),
           (events.ACKC, T + 1, q, 9, "ctag", 4, ch),
           (events.ACKC, T, q, 10, None, 5, ch),
           (events.LEFT, T, "/", "q", 1, "settled", None, None)]
    # an AMQP 0-9-1 stream consumer's: the queue's context says stream, msg is the offset
    sq = ("/", "s", events.STREAM)
    evs += [(events.DELC, T, sq, 40, "sc", 6, False, 1, ch),
            (events.ACKC, T, sq, 40, "sc", 6, ch),
            (events.DACK, T, sq, 41, "sc", 7, False, 1, ch, T + 1)]
    flat = [x for ev in evs for x in ev + (None,) * (pad - len(ev))]
    odd = [x for ev in [(events.DELC, T, q, 2 ** 62, "t", None, False, 1, mq)]
           for x in ev + (None,) * (pad - len(ev))]
    streamed = [x for ev in evs[-3:-1] for x in ev + (None,) * (pad - len(ev))]
    for buf in (flat, flat * 3, odd + flat, streamed):
        batch = loads(dumps(buf))  # as the converter reads it: a DACK is two events
        assert all(len(ev) == pad for ev in batch)
        data = BatchEncoder("n1", 7).encode(batch)
        bio = io.BytesIO(data)
        for i, ev in enumerate(batch):
            got = fastavro.schemaless_reader(bio, schema)
            want = events.to_record(ev, "n1", 7 + i)
            assert got == {f: want.get(f) for f in FIELDS}, ev
        assert bio.tell() == len(data)


def test_converter_joins_frames_but_keeps_a_hole_in_the_sequence(tmp_path):
    now = time.time()
    sp = Spool(str(tmp_path))
    for first in (1, 4, 10):  # 7-9 lost (a failed spool write): the hole stays visible
        batch = [(events.ENQ, now, "/", "q", first + k, {}) for k in range(3)]
        sp.append(first, 3, dumps(batch))
    sp.close(clean=True)
    _convert(tmp_path)
    records = [r for f in node_files(str(tmp_path), "n1") for r in FileReader(f)]
    assert [(r["seq"], r["msg"]) for r in records] == [(s, s) for s in (1, 2, 3, 4, 5, 6, 10,
                                                                        11, 12)]


def test_a_frame_whose_write_ends_with_the_stop_is_converted_not_skipped(tmp_path):
    """The broker's last write and its ``closed`` marker can both land while the converter
    is between reading the segment and deciding it is finished: the frame it saw torn is
    then whole, and must be converted (it was once skipped as a crash's torn tail)."""
    from broker.audit.spool import spool_dir
    from broker.audit.writer import convert

    root = str(tmp_path)
    spool = Spool(root)
    def flat(i: int) -> list:
        return [events.TRAIL, 1.7e9 + i, "mark", None, f"event {i}", *[None] * 7]

    spool.append(1, 1, dumps(flat(1)))
    last = dumps(flat(2))
    whole = FRAME.pack(2, 1, len(last)) + last
    spool.file.write(whole[:10])  # the last frame, half written
    spool.file.flush()
    calls = []

    def stop() -> bool:  # 1st call: after frame 1; 2nd: after the segment's frames were read
        if len(calls) == 1:
            spool.file.write(whole[10:])
            spool.close(True)  # the rest of the frame, then the marker
        calls.append(1)
        return False

    out = RollingWriter(root, "n", 1 << 20, 300.0, "deflate", 1)
    marker = os.path.join(spool_dir(root), "closed")
    assert convert(root, out, 0, stop, lambda: os.path.exists(marker)) == 2
    out.close()
    seqs = [r["seq"] for f in node_files(root, "n") for r in FileReader(f)]
    assert seqs == [1, 2] and segments(root) == []
