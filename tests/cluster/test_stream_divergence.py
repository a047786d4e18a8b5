"""The rule that cuts a diverged stream copy back (broker/cluster/stream_divergence.py):
where to cut, which leader's start counts, and the cut itself on a real log's files
(segments rolled, a chunk holding the cut point, every chunk gone)."""
from __future__ import annotations

import pika
import pytest
from brokerproc import BrokerProc

from broker.cluster.stream_divergence import (
    leader_start,
    read_label,
    truncate_log_files,
    truncation_point,
    write_label,
)
from broker.streams.log import StreamLog

from .test_cluster_nodes import eventually
from .test_mirroring_more import start_together
from .test_stream_replication import (
    STREAM,
    Publisher,
    api_stream,
    chunks,
    full_log,
    logged,
    rstream_bodies,
    stream_node,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def test_truncation_point_takes_the_least_start_of_every_later_leader():
    history = [[10, 100], [20, 90], [30, 150]]
    # labelled with the first leader (epoch 0): every promotion since counts
    assert truncation_point(120, 0, history) == 90
    # labelled 10: leaders 20 and 30 count (20 kept less of 10's log than 10 wrote)
    assert truncation_point(200, 10, history) == 90
    # labelled 20: only 30, whose start is past this copy's tail: nothing to cut
    assert truncation_point(140, 20, history) == 140
    assert truncation_point(160, 20, history) == 150
    # the current leader's copy: nothing after it
    assert truncation_point(500, 30, history) == 500
    # a copy whose label is unknown: every leader counts
    assert truncation_point(500, None, history) == 90
    assert truncation_point(0, None, history) == 0  # an empty copy: nothing to cut
    assert truncation_point(70, 0, []) == 70  # no failover ever


def test_leader_start():
    history = [[10, 100], [20, 90]]
    assert leader_start(history, 0) == 0
    assert leader_start(history, 20) == 90
    assert leader_start(history, 30) is None  # not recorded yet: wait


def test_label_round_trip(tmp_path):
    assert read_label(str(tmp_path)) is None
    write_label(str(tmp_path), 42)
    assert read_label(str(tmp_path)) == 42


def _records(lg: StreamLog) -> list[tuple[int, bytes]]:
    reader = lg.reader("first")
    out = []
    while (chunk := reader.next_chunk()) is not None:
        out.extend(chunk.records())
    reader.close()
    return out


def _log(path: str) -> StreamLog:
    lg = StreamLog(path, max_segment_size=300)
    for i in range(0, 40, 4):  # chunks of 4 records at 0, 4, 8, ... over several segments
        lg.append([b"r%02d" % j + bytes(20) for j in range(i, i + 4)])
    lg.commit()
    assert lg.segment_count > 3
    lg.close()
    return StreamLog(path, max_segment_size=300)


def test_truncate_log_files_cuts_whole_chunks(tmp_path):
    path = str(tmp_path / "s")
    _log(path).close()
    # at a chunk boundary in a middle segment: what follows goes, segments after it too
    assert truncate_log_files(path, 20) is False
    lg = StreamLog(path, max_segment_size=300)
    assert lg.next_offset == 20 and lg.committed_offset == 19
    assert [o for o, _r in _records(lg)] == list(range(20))
    # the log goes on from the cut, as a copy appends the leader's chunks
    lg.append([b"new"])
    lg.commit()
    assert _records(lg)[-1] == (20, b"new")
    lg.close()
    # inside a chunk: that chunk goes too (whole chunks only)
    assert truncate_log_files(path, 6) is False
    lg = StreamLog(path, max_segment_size=300)
    assert lg.next_offset == 4
    lg.close()
    # before every chunk: nothing left (the caller restarts the log at the cut)
    assert truncate_log_files(path, 0) is True
    lg = StreamLog(path, max_segment_size=300)
    assert lg.next_offset == 0 and _records(lg) == []
    lg.close()


# ---- five real nodes -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stale_member_is_cut_back_to_what_the_new_leader_kept(tmp_path, etcd, secret):
    """Five members. Three are killed (-9) while the leader publishes: its chunks reach
    the leader and one follower (d) only, never a majority, never confirmed. The leader
    and d are killed too; the three come back and elect a leader among them (their copies
    opened at restart for it), which confirms other messages at the same offsets. d comes
    back holding the old leader's chunks past the new leader's start: it cuts them and
    copies the new log; so does the deposed leader (a), which holds the same stale chunks;
    every node ends with the same chunks, nothing confirmed lost,
    nothing unconfirmed kept. Before the cut d stopped on a ReplicaGap (or, had the chunk
    bounds matched, kept a log that differs from the leader's at the same offsets)."""
    nodes = {n: stream_node(tmp_path, etcd, n, secret) for n in "abcde"}
    a, b, c, d, e = nodes.values()
    start_together(list(nodes.values()))
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("s", durable=True, arguments={**STREAM, "x-initial-cluster-size": 5})
        for f in (b, c, d, e):
            eventually(lambda f=f: logged(f, "replicating from node 'a'"), timeout=60)
        ch.confirm_delivery()
        early = [b"m%03d" % i for i in range(100)]
        for body in early:
            ch.basic_publish("", "s", body, PERSISTENT)
        conn.close()
        for n in (b, c, e):
            n.kill()
        p = Publisher(a, "s", [b"stale-confirmed?"])  # with confirms: waits for three
        p.start()
        conn = a.connect()
        ch = conn.channel()  # and three more without
        for i in range(3):
            ch.basic_publish("", "s", b"stale%d" % i, PERSISTENT)

        def d_has_them() -> None:
            assert api_stream(a, "s")["log_index"]["d"] >= 103
        eventually(d_has_them, timeout=30)
        assert p.confirmed == []  # two of five
        a.kill()
        d.kill()
        start_together([b, c, e])

        def promoted() -> BrokerProc:
            for n in (b, c, e):
                if "leader on this node now" in full_log(n):
                    return n
            raise AssertionError("no new leader yet")
        leader = eventually(promoted, timeout=90)
        name = next(k for k, v in nodes.items() if v is leader)
        later = [b"n%03d" % i for i in range(5)]
        p = Publisher(c, "s", later)  # pika, forwarded to the leader unless c leads
        p.start()
        p.join(60)
        assert p.confirmed == later, p.error

        d.start()
        eventually(lambda: logged(d, "cut back to offset 100"), timeout=60)
        got = rstream_bodies(d.stream_port, "s", set(early + later))  # d's own copy
        assert got == early + later
        a.start()  # the deposed leader: cut back as d, it copies only what it lacks
        eventually(lambda: logged(a, f"replicating from node '{name}', from offset 100"),
                   timeout=60)
        logged(a, "cut back to offset 100")

        def caught_up() -> None:
            offsets = api_stream(leader, "s").get("log_index") or {}
            assert all(offsets.get(n, -1) == 104 for n in "abcde"), offsets
        eventually(caught_up, timeout=60)
        assert "ReplicaGap" not in full_log(d)
    finally:
        for n in nodes.values():
            n.stop()
    logs = [chunks(n, "s") for n in nodes.values()]
    assert all(x == logs[0] for x in logs), logs
    # records are AMQP messages whose body section ends each one (4-byte bodies here)
    assert [r[-4:] for _i, rs in logs[0] for _o, r in rs] == early + later
