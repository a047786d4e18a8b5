"""The timer index on disk (scheduler/checkpoint.py): a restart rebuilds the pending
messages it describes without reading them back, reads only the rest, and a missing,
torn or stale index costs time, never a message or a schedule."""
import os

import pytest
import trio

from broker.scheduler import INTERNAL_QUEUE, checkpoint, indexlog
from broker.scheduler.spec import Schedule

from .test_compact import Clock, drain, msg, open_broker


def _index_path(store):
    return store.sidecar_path(checkpoint.FILE_NAME)


def _write_index(b, store):
    """As the index task does: the snapshot, then the log generations it covers go."""
    snap = b.scheduler.take_index()
    checkpoint.write(_index_path(store), snap)
    b.scheduler.index_written(snap)


def _crash(store):
    """As a kill -9 leaves it: what was written is on disk, no journal checkpoint, no
    snapshot of the timer index (the index log's buffer was written by the group commit's
    callback)."""
    trio.run(store._flush_once)
    store.broker = None  # close() writes no checkpoint then
    trio.run(store.close)


def _schedule_mix(s, v, n, tag=b"m", base_delay=1000):
    ids = []
    for i in range(n):
        ids.append(s.schedule(v, msg(tag + b"%04d" % i, {"x-delay": base_delay + i}),
                              Schedule("delay", delay=base_delay + i)).sid)
    return ids


def _fire_all(b, clock, v, seconds):
    clock.t += seconds
    while b.scheduler.run_due():
        pass
    return [m.body for m in drain(v.queues["out"])]


def test_clean_index_rebuilds_everything_without_reads(tmp_path):
    clock = Clock()
    b, store, v = open_broker(tmp_path, clock)
    s = b.scheduler
    ids = _schedule_mix(s, v, 300)
    per = s.schedule(v, msg(b"periodic", {"AMQ_SCHEDULED_DELAY": 500}),
                     Schedule("amq", delay=500, period=100, repeat=3))
    cron = s.schedule(v, msg(b"cron", {"AMQ_SCHEDULED_CRON": "0 0 1 1 *"}),
                      Schedule("amq", cron="0 0 1 1 *"))
    s.remove(ids[7])  # slot 7 becomes free and is reused out of seq order
    ids[7] = s.schedule(v, msg(b"m0007", {"x-delay": 1007}), Schedule("delay", delay=1007)).sid
    trio.run(store._flush_once)
    before = {sid: (s.items[sid].left, s.items[sid].due) for sid in [*ids, per.sid, cron.sid]}
    _write_index(b, store)
    trio.run(store.close)

    b2, store2, v2 = open_broker(tmp_path, clock)
    s2 = b2.scheduler
    assert s2.recovery_reads == 0
    assert s2.stats()["pending"] == 302
    assert {sid: (s2.items[sid].left, s2.items[sid].due) for sid in before} == before
    assert not v2.queues[INTERNAL_QUEUE].ready.held
    bodies = _fire_all(b2, clock, v2, 1.5)
    assert sorted(bb for bb in bodies if bb.startswith(b"m")) == [b"m%04d" % i for i in range(300)]
    assert bodies.count(b"periodic") == 4 and per.sid not in s2.items
    assert cron.sid in s2.items  # next New Year: still pending
    trio.run(store2.close)


@pytest.mark.parametrize("logged", [True, False])
def test_tail_after_the_index_is_logged_or_read_back_and_removed_entries_stay_gone(
        tmp_path, logged):
    clock = Clock()
    b, store, v = open_broker(tmp_path, clock)
    s = b.scheduler
    ids = _schedule_mix(s, v, 200)
    trio.run(store._flush_once)
    _write_index(b, store)
    # after the snapshot: some removed, some fired, some new (the tail a kill -9 leaves)
    for sid in ids[:20]:
        assert s.remove(sid)
    tail = _schedule_mix(s, v, 50, tag=b"t", base_delay=5000)
    trio.run(store._flush_once)
    trio.run(store.close)  # the index is not rewritten: the old one, as after a kill -9

    directory = os.path.dirname(_index_path(store))
    if not logged:  # the log lost (a machine crash before the page cache was written)
        for _gen, path in indexlog.generations(directory):
            os.unlink(path)

    b2, store2, v2 = open_broker(tmp_path, clock)
    s2 = b2.scheduler
    # the tail is in the index log: rebuilt without a read; without it, read back
    assert s2.recovery_reads == (0 if logged else 50)
    assert s2.index_log_records == (50 if logged else 0)
    assert s2.stats()["pending"] == 230
    assert not any(sid in s2.items for sid in ids[:20])
    assert all(sid in s2.items for sid in ids[20:] + tail)
    bodies = _fire_all(b2, clock, v2, 10)
    assert sorted(bodies) == sorted([b"m%04d" % i for i in range(20, 200)] + [b"t%04d" % i for i in range(50)])
    trio.run(store2.close)


def test_torn_or_foreign_index_is_ignored(tmp_path, caplog):
    clock = Clock()
    b, store, v = open_broker(tmp_path, clock)
    ids = _schedule_mix(b.scheduler, v, 100)
    trio.run(store._flush_once)
    _write_index(b, store)
    path = _index_path(store)
    trio.run(store.close)
    with open(path, "r+b") as f:  # a torn write: the tail of the file is gone
        f.truncate(os.path.getsize(path) - 37)
    b2, store2, v2 = open_broker(tmp_path, clock)
    assert b2.scheduler.recovery_reads == 100
    assert all(sid in b2.scheduler.items for sid in ids)
    assert "ignoring the timer index" in caplog.text
    trio.run(store2.close)
    with open(path, "wb") as f:
        f.write(b"not an index at all")
    b3, store3, v3 = open_broker(tmp_path, clock)
    assert b3.scheduler.stats()["pending"] == 100
    assert len(_fire_all(b3, clock, v3, 2)) == 100
    trio.run(store3.close)


def test_index_of_another_journal_never_changes_a_schedule(tmp_path):
    """An index copied from elsewhere: same seqs, other locations or sizes -> read back."""
    clock = Clock()
    other, ostore, ov = open_broker(tmp_path / "other", clock)
    _schedule_mix(other.scheduler, ov, 30, tag=b"x", base_delay=99_000)
    trio.run(ostore._flush_once)
    _write_index(other, ostore)
    trio.run(ostore.close)
    b, store, v = open_broker(tmp_path / "mine", clock)
    _schedule_mix(b.scheduler, v, 30, tag=b"mine", base_delay=1000)
    trio.run(store.close)
    os.replace(_index_path(ostore), _index_path(store))
    b2, store2, v2 = open_broker(tmp_path / "mine", clock)
    assert b2.scheduler.recovery_reads == 30
    bodies = _fire_all(b2, clock, v2, 1.1)
    assert sorted(bodies) == [b"mine%04d" % i for i in range(30)]
    trio.run(store2.close)


@pytest.mark.parametrize("crash", ["before the snapshot is written", "before the log it covers goes"])
def test_kill_mid_snapshot_reads_nothing_back(tmp_path, crash):
    """A snapshot is taken (the log moves to a new generation) and the process dies before
    it is on disk, or before the generations it covers are deleted: snapshot + log still
    describe every pending entry."""
    clock = Clock()
    b, store, v = open_broker(tmp_path, clock)
    s = b.scheduler
    ids = _schedule_mix(s, v, 120)
    trio.run(store._flush_once)
    _write_index(b, store)  # an older snapshot
    ids += _schedule_mix(s, v, 80, tag=b"n", base_delay=3000)
    trio.run(store._flush_once)
    snap = s.take_index()  # the log's generation moves on
    ids += _schedule_mix(s, v, 40, tag=b"l", base_delay=6000)  # logged in the new generation
    trio.run(store._flush_once)
    if crash == "before the log it covers goes":
        checkpoint.write(_index_path(store), snap)
    directory = os.path.dirname(_index_path(store))
    _crash(store)

    b2, store2, v2 = open_broker(tmp_path, clock)
    s2 = b2.scheduler
    assert s2.recovery_reads == 0
    assert s2.stats()["pending"] == 240 and all(sid in s2.items for sid in ids)
    assert s2.index_log_records == (40 if crash == "before the log it covers goes" else 120)
    if crash == "before the log it covers goes":  # the covered generation went at start-up
        assert [g for g, _p in indexlog.generations(directory)] == [snap.log_gen + 1]
    bodies = _fire_all(b2, clock, v2, 10)
    assert len(bodies) == 240
    trio.run(store2.close)


def test_stored_seqs_pass_the_entries_rebuilt_from_the_index(tmp_path):
    """Entries rebuilt in bulk bypass ``enqueue``: a new occurrence must not reuse one of
    their seqs (the journal's replay keeps one entry per seq: the older would be lost)."""
    clock = Clock()
    b, store, v = open_broker(tmp_path, clock)
    _schedule_mix(b.scheduler, v, 50)
    trio.run(store._flush_once)
    _write_index(b, store)
    trio.run(store.close)
    b2, store2, v2 = open_broker(tmp_path, clock)
    assert b2.scheduler.recovery_reads == 0
    _schedule_mix(b2.scheduler, v2, 30, tag=b"x", base_delay=2000)
    _crash(store2)
    b3, store3, v3 = open_broker(tmp_path, clock)
    assert b3.scheduler.stats()["pending"] == 80
    assert len(_fire_all(b3, clock, v3, 5)) == 80
    trio.run(store3.close)


def test_torn_index_log_costs_read_backs_only(tmp_path):
    """A machine crash can leave the log's last batch torn: the records before it are
    used, the rest of the entries are read back; nothing is lost or changed."""
    clock = Clock()
    b, store, v = open_broker(tmp_path, clock)
    s = b.scheduler
    ids = _schedule_mix(s, v, 60)
    trio.run(store._flush_once)  # batch 1: 60 records
    ids += _schedule_mix(s, v, 40, tag=b"t", base_delay=4000)
    directory = os.path.dirname(_index_path(store))
    _crash(store)  # batch 2: 40 records
    ((_gen, path),) = indexlog.generations(directory)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 100)
    b2, store2, v2 = open_broker(tmp_path, clock)
    s2 = b2.scheduler
    assert (s2.index_log_records, s2.recovery_reads) == (60, 40)
    assert {sid: s2.items[sid].due for sid in ids} == {sid: s.items[sid].due for sid in ids}
    assert len(_fire_all(b2, clock, v2, 5)) == 100
    trio.run(store2.close)
