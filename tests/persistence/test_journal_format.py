"""Unit tests of the journal's on-disk format (broker/persistence/journal_format.py)."""
from __future__ import annotations

import os

import pytest

from broker.message import Message
from broker.persistence import journal_format as jf
from broker.persistence.base import StoreUnavailable
from broker.persistence.journal import JournalStore, load_state
from broker.persistence.records import ExchangeDef, QueueDef, encode_message


def _msg(i: int) -> Message:
    return Message("", "q", b"\x10\x00\x02", {"delivery_mode": 2}, b"body-%d" % i, msg_id=1000 + i)


def _write_journal(tmp_path, n=10, segment_size=jf.SEGMENT_SIZE):
    """Write a small journal with the store's own appender (no broker needed)."""
    store = JournalStore(str(tmp_path), segment_size=segment_size)
    os.makedirs(store.jdir, exist_ok=True)
    store._append(jf.T_EXCHANGE, jf.pack_exchange(ExchangeDef("/", "x", "topic", True, False, False,
                                                              {"alternate-exchange": "ae"})))
    store._append(jf.T_QUEUE, jf.pack_queue(QueueDef("/", "q", True, False, {"x-max-length": 5}), 1))
    locs = []
    for i in range(n):
        m = _msg(i)
        locs.append(store._append(jf.T_ENQ, jf.pack_enq(1, i + 1, None, 0, len(m.body), 0)
                                  + encode_message(m)))
    store._write_chunks(store._pending)
    store._pending = []
    for fd in store._fds.values():
        os.close(fd)
    return store, locs


def test_record_roundtrip_and_scan():
    recs = [jf.pack_record(jf.T_REMOVE, jf.QSEQ.pack(1, i)) for i in range(5)]
    buf = b"".join(recs) + bytes(100)
    out = []
    res = jf.scan(buf, "mem", records=out)
    assert [jf.QSEQ.unpack_from(p, 0) for _o, _t, p in out] == [(1, i) for i in range(5)]
    assert res.end == sum(map(len, recs)) and res.torn_at is None and res.corrupt_at is None


def test_torn_tail_detected():
    recs = [jf.pack_record(jf.T_REMOVE, jf.QSEQ.pack(1, i)) for i in range(3)]
    buf = b"".join(recs)[:-4]  # last record cut short
    res = jf.scan(buf, "mem", records=[])
    assert res.torn_at == len(recs[0]) * 2
    assert res.corrupt_at is None


def test_corrupt_record_in_the_middle():
    recs = [jf.pack_record(jf.T_REMOVE, jf.QSEQ.pack(1, i)) for i in range(3)]
    buf = bytearray(b"".join(recs))
    buf[len(recs[0]) + jf.HDR_SIZE + 2] ^= 0xFF  # payload of the second record
    res = jf.scan(bytes(buf), "mem", records=[])
    assert res.corrupt_at == len(recs[0])
    salvaged = []
    res = jf.scan(bytes(buf), "mem", records=salvaged, salvage=True)
    assert len(salvaged) == 2 and res.skipped and res.skipped[0][0] == len(recs[0])


def test_definitions_roundtrip():
    xd = ExchangeDef("/v", "x\udcff", "direct", True, True, False, {"a": 1, "b": True})
    assert jf.unpack_exchange(jf.pack_exchange(xd)) == xd
    qd = QueueDef("/", "q", True, False, {"x-message-ttl": 10})
    assert jf.unpack_queue(jf.pack_queue(qd, 7)) == (qd, 7)


def test_enq_roundtrip():
    p = jf.pack_enq(3, 42, 1.5e9, 7, 64, 123)
    assert jf.unpack_enq(p) == (3, 42, 1.5e9, 7, 64, 123)
    assert jf.unpack_enq(jf.pack_enq(3, 42, None, 0, 64, 0))[2] is None


def test_load_state_and_read_back(tmp_path):
    store, locs = _write_journal(tmp_path)
    state = load_state(store.jdir)
    assert [qs.count() for qs in state.queues.values()] == [10]
    assert ("/", "x") in state.exchanges
    assert state.max_msg_id == 1009
    reader = JournalStore(str(tmp_path))
    m = reader.read_message(locs[3])
    assert m.body == b"body-3" and m.id == 1003 and m.properties["delivery_mode"] == 2


def test_load_state_refuses_corruption_naming_file_and_offset(tmp_path):
    store, locs = _write_journal(tmp_path)
    path = os.path.join(store.jdir, jf.seg_name(1))
    off = locs[4] & 0xFFFFFFFF
    with open(path, "r+b") as f:
        f.seek(off + jf.HDR_SIZE + 5)
        b = f.read(1)
        f.seek(off + jf.HDR_SIZE + 5)
        f.write(bytes((b[0] ^ 0x55,)))
    with pytest.raises(StoreUnavailable) as ei:
        load_state(store.jdir)
    assert path in str(ei.value) and f"offset {off}" in str(ei.value)
    state = load_state(store.jdir, salvage=True)
    assert [qs.count() for qs in state.queues.values()] == [9]


def test_torn_tail_is_tolerated(tmp_path):
    store, locs = _write_journal(tmp_path)
    path = os.path.join(store.jdir, jf.seg_name(1))
    state = load_state(store.jdir)
    end = state.last_end
    os.truncate(path, end - 3)
    state = load_state(store.jdir)
    torn = [res for _s, res, _c in state.segments if res.torn_at is not None]
    assert torn and torn[0].torn_at == (locs[-1] & 0xFFFFFFFF)
    assert [qs.count() for qs in state.queues.values()] == [9]


def test_segment_rotation(tmp_path):
    store, locs = _write_journal(tmp_path, n=50, segment_size=2048)
    assert len(jf.list_segments(store.jdir)) > 1
    assert len({loc >> 32 for loc in locs}) > 1
    state = load_state(store.jdir)
    assert [qs.count() for qs in state.queues.values()] == [50]
    reader = JournalStore(str(tmp_path))
    assert reader.read_message(locs[-1]).body == b"body-49"


def test_one_flush_spanning_many_segments_syncs_every_segment(tmp_path):
    """A group commit larger than two segments used to fsync a descriptor it had closed."""
    store, locs = _write_journal(tmp_path, n=200, segment_size=1024)
    segments = {loc >> 32 for loc in locs}
    assert len(segments) > 3
    for loc in locs[::17]:
        assert store.read_message(loc).body.startswith(b"body-")
