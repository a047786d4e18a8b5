"""The stream log on disk: append, read, seek by offset and timestamp, retention, torn
tails and CRC, named offsets, the group commit, and a kill -9 in a subprocess."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import trio

from broker.streams.log import (
    CHUNK_HEADER,
    FILE_HEADER,
    INDEX_ENTRY,
    ReplicaGap,
    StreamLog,
    StreamStore,
    Timestamp,
    bloom_accepts,
    encode_entries,
    iter_entries,
)


def _all(lg: StreamLog, start="first") -> list[tuple[int, bytes]]:
    reader = lg.reader(start)
    out = []
    while (chunk := reader.next_chunk()) is not None:
        out.extend(chunk.records())
    reader.close()
    return out


def test_append_commit_read(tmp_path):
    lg = StreamLog(str(tmp_path))
    assert lg.append([b"a", b"b"]) == (0, 1)
    assert lg.append([b"c"]) == (2, 2)
    # nothing is visible before the commit
    assert lg.committed_offset == -1 and _all(lg) == []
    confirmed = []
    lg.when_durable(2, lambda: confirmed.append(2))
    lg.commit()
    assert confirmed == [2]
    assert _all(lg) == [(0, b"a"), (1, b"b"), (2, b"c")]
    # offset 1 is inside the first chunk: the whole chunk is read (callers skip)
    assert _all(lg, 1) == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert _all(lg, "last") == [(2, b"c")]
    assert _all(lg, "next") == []
    assert lg.message_count == 3
    lg.close()
    lg = StreamLog(str(tmp_path))
    assert lg.next_offset == 3 and lg.committed_offset == 2 and lg.last_chunk_offset == 2
    assert [r for _o, r in _all(lg)] == [b"a", b"b", b"c"]
    lg.close()


def test_chunk_wire_layout(tmp_path):
    lg = StreamLog(str(tmp_path))
    lg.append([b"xyz"], timestamp=1234, filter_values=["f"])
    lg.commit()
    chunk = lg.reader("first").next_chunk()
    fields = CHUNK_HEADER.unpack(chunk.header)
    assert fields[0] == 0x50 and fields[2] == 1 and fields[3] == 1 and fields[4] == 1234
    assert fields[10] == 0  # the wire header carries no filter
    assert chunk.bloom and chunk.wire() == chunk.header + encode_entries([b"xyz"])
    assert chunk.may_contain(["f"]) and not chunk.may_contain([], match_unfiltered=True)
    lg.close()


def test_sub_batch_entries(tmp_path):
    import gzip
    import struct
    inner = encode_entries([b"one", b"two"])
    plain = bytes([0x80]) + struct.pack(">HII", 2, len(inner), len(inner)) + inner
    packed = gzip.compress(inner)
    gz = bytes([0x90]) + struct.pack(">HII", 2, len(inner), len(packed)) + packed
    lg = StreamLog(str(tmp_path))
    assert lg.append_encoded(plain + gz + encode_entries([b"three"]), 3, 5) == (0, 4)
    lg.commit()
    assert _all(lg) == [(0, b"one"), (1, b"two"), (2, b"one"), (3, b"two"), (4, b"three")]
    assert list(iter_entries(encode_entries([b""]))) == [b""]
    lg.close()


def test_segments_roll_and_seek(tmp_path):
    lg = StreamLog(str(tmp_path), max_segment_size=4096)
    for i in range(300):
        lg.append([b"%05d" % i + b"x" * 100], timestamp=1000 + i)
    lg.commit()
    assert lg.segment_count > 5
    assert [int(r[:5]) for _o, r in _all(lg)] == list(range(300))
    assert _all(lg, 250)[0] == (250, b"%05d" % 250 + b"x" * 100)
    assert _all(lg, Timestamp(1000 + 123))[0][0] == 123
    assert _all(lg, Timestamp(0))[0][0] == 0
    assert _all(lg, Timestamp(10**12)) == []
    assert _all(lg, 10**9) == []  # past the end: attaches at the next offset
    lg.close()
    lg = StreamLog(str(tmp_path), max_segment_size=4096)
    assert lg.next_offset == 300 and _all(lg, 299) == [(299, b"%05d" % 299 + b"x" * 100)]
    lg.close()


def test_index_seek_reads_little(tmp_path):
    """Attaching at an offset reads the index by binary search, not the segment."""
    lg = StreamLog(str(tmp_path))
    for i in range(2000):
        lg.append([b"m%d" % i])
    lg.commit()
    calls = []
    real = os.pread

    def counting(fd, n, pos):
        calls.append(n)
        return real(fd, n, pos)
    os.pread = counting
    try:
        reader = lg.reader(1500)
        chunk = reader.next_chunk()
    finally:
        os.pread = real
    assert chunk.first_offset == 1500
    assert len(calls) < 20
    reader.close()
    lg.close()


def test_retention_by_bytes_and_age(tmp_path):
    lg = StreamLog(str(tmp_path / "b"), max_segment_size=2048, max_bytes=6000)
    for i in range(200):
        lg.append([b"y" * 100], timestamp=1000 + i)
    lg.commit()
    assert lg.size_bytes <= 6000 + 2048
    assert lg.first_offset > 0
    records = _all(lg)
    assert records[0][0] == lg.first_offset and records[-1][0] == 199
    lg.close()

    lg = StreamLog(str(tmp_path / "a"), max_segment_size=2048)
    for i in range(100):
        lg.append([b"z" * 100], timestamp=1000 * i)  # 1 s apart, in 1970
    lg.commit()
    lg.max_age = 3600.0
    removed = lg.apply_retention(now=50.0 + 3600)  # everything older than 50 s goes
    assert removed > 0
    assert 0 < lg.first_offset <= 51
    assert lg.segment_count >= 1 and _all(lg)[-1][0] == 99
    lg.close()


def test_reader_behind_retention_continues(tmp_path):
    lg = StreamLog(str(tmp_path), max_segment_size=2048, max_bytes=4000)
    lg.append([b"q" * 100])
    lg.commit()
    reader = lg.reader("first")
    for _ in range(100):
        lg.append([b"q" * 100])
    lg.commit()
    chunk = reader.next_chunk()
    assert chunk.first_offset == lg.first_offset > 0
    reader.close()
    lg.close()


def _last_segment(path):
    return sorted(p for p in os.listdir(path) if p.endswith(".segment"))[-1]


def test_torn_tail_truncated(tmp_path, caplog):
    lg = StreamLog(str(tmp_path))
    lg.append([b"keep"])
    lg.append([b"torn" * 50])
    lg.commit()
    lg.close()
    seg = tmp_path / _last_segment(tmp_path)
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 30)
    lg = StreamLog(str(tmp_path))
    assert "torn tail" in caplog.text
    assert _all(lg) == [(0, b"keep")] and lg.next_offset == 1
    assert seg.stat().st_size == FILE_HEADER + CHUNK_HEADER.size + 8
    lg.append([b"after"])
    lg.commit()
    assert _all(lg) == [(0, b"keep"), (1, b"after")]
    lg.close()


def test_crc_mismatch_truncates_tail(tmp_path, caplog):
    lg = StreamLog(str(tmp_path))
    lg.append([b"good"])
    lg.append([b"bad!"])
    lg.commit()
    lg.close()
    seg = tmp_path / _last_segment(tmp_path)
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0xFF
    seg.write_bytes(bytes(data))
    lg = StreamLog(str(tmp_path))
    assert "fails its CRC" in caplog.text
    assert _all(lg) == [(0, b"good")]
    lg.close()


def test_unindexed_chunk_is_reindexed(tmp_path):
    """A crash between the segment write and the index write: the whole chunk stays."""
    lg = StreamLog(str(tmp_path))
    lg.append([b"a"])
    lg.append([b"b"])
    lg.commit()
    lg.close()
    idx = tmp_path / _last_segment(tmp_path).replace(".segment", ".index")
    with open(idx, "r+b") as f:
        f.truncate(FILE_HEADER + INDEX_ENTRY.size + 5)  # second entry torn
    lg = StreamLog(str(tmp_path))
    assert _all(lg) == [(0, b"a"), (1, b"b")]
    assert idx.stat().st_size == FILE_HEADER + 2 * INDEX_ENTRY.size
    lg.close()


def test_offsets_persisted(tmp_path):
    lg = StreamLog(str(tmp_path))
    assert lg.query_offset("app") is None
    lg.store_offset("app", 41)
    lg.commit()
    lg.close()
    lg = StreamLog(str(tmp_path))
    assert lg.query_offset("app") == 41
    lg.close()


def test_group_commit_task(tmp_path):
    async def main():
        store = StreamStore(str(tmp_path))
        lg = store.open("/", "s")
        confirmed = []
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            lg.append([b"1"])
            lg.when_durable(0, lambda: confirmed.append(0))
            assert confirmed == []  # appended, not yet durable
            with trio.fail_after(30):
                await lg.wait_committed(0)
            assert confirmed == [0]
            reader = lg.reader("next")
            assert reader.next_chunk() is None

            async def later():
                lg.append([b"2"])
            nursery.start_soon(later)
            with trio.fail_after(30):
                await lg.wait_committed(1)
            assert [r for _o, r in reader.next_chunk().records()] == [b"2"]
            reader.close()
            nursery.cancel_scope.cancel()
        lg.close()
    trio.run(main)


@pytest.mark.timeout(120)
def test_kill_9_keeps_committed(tmp_path):
    """A writer killed mid-append: every chunk it reported durable is there after
    reopening, in order, and the log takes appends again."""
    script = textwrap.dedent(f"""
        import sys
        from broker.streams.log import StreamLog
        lg = StreamLog({str(tmp_path)!r}, max_segment_size=100000)
        i = 0
        while True:
            lg.append([b"%08d" % i + b"p" * 200, b"%08d" % (i + 1) + b"p" * 200])
            i += 2
            if i % 20 == 0:
                lg.commit()
                print(i - 1, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            cwd=os.getcwd(), text=True)
    try:
        durable = -1
        while durable < 3000:
            line = proc.stdout.readline()
            assert line, "writer died"
            durable = int(line)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    lg = StreamLog(str(tmp_path), max_segment_size=100000)
    records = _all(lg)
    assert len(records) >= durable + 1
    assert [int(r[:8]) for _o, r in records] == list(range(len(records)))
    assert [o for o, _r in records] == list(range(len(records)))
    first, _ = lg.append([b"again"])
    assert first == len(records)
    lg.close()


def test_failed_write_is_retried_in_place(tmp_path, monkeypatch):
    """A write that fails (disk full) leaves the batch; the retry writes the chunk at the
    same place, and a confirm comes only for what was written."""
    import errno

    import broker.streams.log as logmod
    lg = StreamLog(str(tmp_path))
    lg.append_record(b"a")
    confirmed = []
    lg.when_durable(0, lambda: confirmed.append(0))
    real = os.pwrite

    def full(fd, data, pos):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(logmod.os, "pwrite", full)
    with pytest.raises(OSError):
        lg.commit()
    assert confirmed == [] and lg.committed_offset == -1 and lg.next_offset == 1
    monkeypatch.setattr(logmod.os, "pwrite", real)
    lg.append_record(b"b")
    lg.commit()
    assert confirmed == [0]
    assert _all(lg) == [(0, b"a"), (1, b"b")]
    lg.close()
    lg = StreamLog(str(tmp_path))
    assert _all(lg) == [(0, b"a"), (1, b"b")]
    lg.close()


def test_store_task_survives_a_failed_write(tmp_path, monkeypatch):
    import errno

    import broker.streams.log as logmod

    async def main():
        store = StreamStore(str(tmp_path))
        lg = store.open("/", "s")
        real = os.pwrite
        calls = []

        def flaky(fd, data, pos):
            if not calls:
                calls.append(1)
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, pos)
        monkeypatch.setattr(logmod.os, "pwrite", flaky)
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            lg.append_record(b"x")
            with trio.fail_after(60):
                await lg.wait_committed(0)  # after the retry
            nursery.cancel_scope.cancel()
        assert _all(lg) == [(0, b"x")]
        lg.close()
    trio.run(main)


def test_a_replica_has_the_leaders_chunks_byte_for_byte(tmp_path):
    """Chunks read from a leader and appended to a replica: same offsets, chunk ids,
    timestamps and Bloom filters, files identical; a chunk not at the replica's tail
    (a gap, or one it has) and a corrupt chunk are refused; a reopened replica goes on
    from its own tail."""
    leader = StreamLog(str(tmp_path / "leader"), max_segment_size=4096)
    for i in range(30):
        leader.append([b"r%d-" % i + b"x" * 200, b"s%d" % i], timestamp=1000 + i,
                      filter_values=["a" if i % 2 else "b", None])
        leader.commit()
    replica = StreamLog(str(tmp_path / "replica"), max_segment_size=4096)
    reader = leader.reader("first")
    chunks = []
    while (chunk := reader.next_chunk()) is not None:
        chunks.append(b"".join(chunk.raw()))
    with pytest.raises(ReplicaGap):
        replica.append_replica_chunk(chunks[1])
    for raw in chunks[:10]:
        replica.append_replica_chunk(raw)
    with pytest.raises(ReplicaGap):
        replica.append_replica_chunk(chunks[9])  # one it has
    bad = bytearray(chunks[10])
    bad[-1] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        replica.append_replica_chunk(bytes(bad))
    replica.commit()
    replica.close()
    replica = StreamLog(str(tmp_path / "replica"), max_segment_size=4096)
    assert replica.next_offset == 20
    for raw in chunks[10:]:
        replica.append_replica_chunk(raw)
    replica.commit()
    assert replica.committed_chunk_id == leader.committed_chunk_id
    assert _all(replica) == _all(leader)
    names = sorted(n for n in os.listdir(tmp_path / "leader") if n.endswith((".segment",
                                                                            ".index")))
    assert len(names) > 2 and names == sorted(
        n for n in os.listdir(tmp_path / "replica") if n.endswith((".segment", ".index")))
    for n in names:
        assert (tmp_path / "leader" / n).read_bytes() == (tmp_path / "replica" / n).read_bytes()
    # Bloom filters came along: a filtered reader skips the same chunks on both
    def filtered(lg):
        r = lg.reader("first")
        got = []
        while (c := r.next_chunk(lambda bloom: bloom_accepts(bloom, ["a"]))) is not None:
            got.append(c.first_offset)
        return got
    assert filtered(replica) == filtered(leader) and 0 < len(filtered(leader)) < 30


def test_confirms_wait_for_a_majority_of_the_replica_group(tmp_path):
    lg = StreamLog(str(tmp_path / "s"))
    lg.set_replicas(["b", "c"], 3)
    confirmed: list = []
    lg.append([b"one"])
    lg.when_durable(0, lambda: confirmed.append(0))
    lg.commit()
    assert confirmed == [] and lg.durable_offset == -1  # the leader alone: 1 of 3
    lg.replica_acked("c", 0)
    assert confirmed == [0] and lg.durable_offset == 0  # 2 of 3
    lg.append([b"two"])
    lg.when_durable(1, lambda: confirmed.append(1))
    lg.replica_acked("b", 1)  # a replica ahead of the leader's own commit: not yet
    assert confirmed == [0]
    lg.commit()
    assert confirmed == [0, 1]
    lg.replica_acked("zz", 5)  # not a member: ignored
    lg.set_replicas(["b", "c", "d", "e"], 5)  # b kept its report; 2 of 5 is no majority
    lg.append([b"three"])
    lg.when_durable(2, lambda: confirmed.append(2))
    lg.commit()
    lg.replica_acked("b", 2)
    assert confirmed == [0, 1]
    lg.replica_acked("d", 2)
    assert confirmed == [0, 1, 2]
    lg.set_replicas(None)  # alone again: its own commit
    lg.append([b"four"])
    lg.commit()
    lg.when_durable(3, lambda: confirmed.append(3))
    assert confirmed == [0, 1, 2, 3]


def test_a_new_segment_is_not_fsynced_on_the_loop_but_by_the_next_commit(tmp_path,
                                                                         monkeypatch):
    """Creating a log (a stream declared, each partition of a super stream) fsyncs nothing
    on the caller's thread (the event loop); the directory entry is fsynced by the commit that makes the segment's first chunk durable (in the store's worker thread),
    once per new segment, and again after a failed attempt."""
    real_fsync = os.fsync
    synced: list[str] = []

    def fsync(fd):
        synced.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    lg = StreamLog(str(tmp_path / "s"))
    assert synced == []
    lg.append([b"a"])
    state = lg.begin_commit()
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(OSError):
        lg.sync_files(state)  # failed: the next commit fsyncs the directory again
    monkeypatch.setattr(os, "fsync", fsync)
    lg.commit()
    assert synced.count("dir") == 1
    synced.clear()
    lg.append([b"b"])
    lg.commit()
    assert synced.count("dir") == 0
    lg.close()


def test_a_leaders_readers_stop_at_the_majority_and_replicas_read_its_commit(tmp_path):
    lg = StreamLog(str(tmp_path / "s"))
    lg.set_replicas(["b", "c"], 3)
    woken: list = []
    lg.listeners.append(lambda: woken.append(lg.readable_offset))
    consumer, copier = lg.reader("first"), lg.reader("first", replica=True)
    lg.append([b"one", b"two"])
    lg.commit()
    assert consumer.next_chunk() is None and not consumer.more  # on 1 of 3 only
    assert [r for _o, r in copier.next_chunk().records()] == [b"one", b"two"]
    lg.replica_acked("b", 1)
    assert woken[-1] == 1  # told: more to read
    assert [r for _o, r in consumer.next_chunk().records()] == [b"one", b"two"]
    lg.set_replicas(None)
    lg.append([b"three"])
    lg.commit()
    assert [r for _o, r in consumer.next_chunk().records()] == [b"three"]


def test_a_replica_behind_the_leaders_retention_starts_again_from_its_first_chunk(tmp_path):
    """The leader's reader starts at its first chunk when the copy's tail was removed by
    retention: the copy drops what it had and goes on from there (before: ReplicaGap, the
    copy stopped for good)."""
    from broker.cluster.stream_replicas import append_from_leader
    leader = StreamLog(str(tmp_path / "leader"), max_segment_size=2000, max_bytes=4000)
    copy = StreamLog(str(tmp_path / "copy"))
    for i in range(5):
        leader.append([b"early-%d" % i])
    leader.commit()
    reader = leader.reader(0, replica=True)
    while (chunk := reader.next_chunk()) is not None:
        append_from_leader(copy, b"".join(chunk.raw()))
    copy.commit()
    assert copy.next_offset == 5
    for i in range(100):
        leader.append([b"m%03d" % i + bytes(80)])
    leader.commit()
    assert leader.first_offset > copy.next_offset
    reader = leader.reader(copy.next_offset, replica=True)
    while (chunk := reader.next_chunk()) is not None:
        append_from_leader(copy, b"".join(chunk.raw()))
    copy.commit()
    assert (copy.first_offset, copy.next_offset) == (leader.first_offset, leader.next_offset)
    assert _all(copy) == _all(leader)
    copy.close()
    reopened = StreamLog(str(tmp_path / "copy"))  # what is on disk says the same
    assert _all(reopened) == _all(leader)
    reopened.close()
    leader.close()


def test_a_log_deleted_while_the_commit_thread_writes_its_offsets(tmp_path, monkeypatch):
    """The group commit writes ``offsets`` in a worker thread while the loop may delete the
    stream (a Stream client's StoreOffset, then Delete): the delete waits for that write and
    removes the whole directory, never failing on a file the thread added or renamed after it
    listed the directory (the session answered that with an internal error and closed the
    connection under the client's Close)."""
    import threading

    directory = str(tmp_path / "s")
    lg = StreamLog(directory)
    lg.append([b"a"])
    lg.commit()
    lg.store_offset("app", 0)
    state = lg.begin_commit()
    in_replace, listed = threading.Event(), threading.Event()
    real_replace, real_listdir = os.replace, os.listdir
    errors: list[BaseException] = []

    def replace(src, dst):  # the thread, its offsets.tmp written: waits for delete's listdir
        if threading.current_thread() is worker:
            in_replace.set()
            listed.wait(0.3)  # (fixed: delete waits for this write, so only the timeout ends it)
        real_replace(src, dst)

    def listdir(path):
        names = real_listdir(path)
        if path == directory:
            listed.set()
            worker.join(2)
        return names

    def sync():
        try:
            lg.sync_files(state)
        except BaseException as exc:  # (reported by the assert below)
            errors.append(exc)

    monkeypatch.setattr(os, "replace", replace)
    worker = threading.Thread(target=sync)
    worker.start()
    assert in_replace.wait(2)
    monkeypatch.setattr(os, "listdir", listdir)
    lg.delete()
    worker.join(2)
    assert errors == []
    assert not os.path.exists(directory)
