"""A stream's replica group changed at run time (real etcd, real broker processes, pika,
rstream, the ctl command): add_replica copies the leader's log onto the new member from
its first chunk, kill -9 of that member in the middle of its catch-up loses nothing
confirmed, delete_replica removes a member and its copy; RabbitMQ's refusals."""
from __future__ import annotations

import threading
from pathlib import Path

import pika
import pytest

from broker.streams.log import stream_dir

from .test_cluster_nodes import eventually
from .test_mirroring_more import start_together
from .test_quorum_replication import ctl
from .test_stream_replication import (
    STREAM,
    api_stream,
    chunks,
    full_log,
    logged,
    rstream_bodies,
    stream_node,
)

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def out(p) -> str:
    return p.stdout + p.stderr


@pytest.mark.timeout(240)
def test_add_replica_catches_up_through_a_kill_and_delete_replica_removes_it(
        tmp_path, etcd, secret):
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("s", durable=True, arguments={**STREAM, "x-initial-cluster-size": 2})
        ch.queue_declare("solo", durable=True,
                         arguments={**STREAM, "x-initial-cluster-size": 1})
        ch.queue_declare("classic", durable=True)
        eventually(lambda: logged(b, "replicating from node 'a'"), timeout=30)
        ch.confirm_delivery()
        bodies = [b"m%05d" % i + bytes(200) for i in range(3000)]
        for body in bodies[:2000]:
            ch.basic_publish("", "s", body, PERSISTENT)
        assert api_stream(a, "s")["members"] == ["a", "b"]

        # asked on the node to add, which holds no copy yet
        p = ctl(c, "add_replica", "s", "c")
        assert p.returncode == 0, out(p)
        assert "Adding a replica for queue s on node c..." in p.stdout
        eventually(lambda: logged(c, "replicating from node 'a', from offset 0"), timeout=30)
        c.kill()  # kill -9 in its catch-up (or just after): its log is cut at a whole chunk
        # meanwhile a majority of the group (a and b) confirms on
        for body in bodies[2000:2500]:
            ch.basic_publish("", "s", body, PERSISTENT)
        c.start()
        confirmed = set(bodies[:2500])
        got = rstream_bodies(c.stream_port, "s", confirmed)  # c's own copy, over rstream
        assert got[:2500] == bodies[:2500]

        def caught_up() -> dict:
            view = api_stream(b, "s")
            assert view["members"] == ["a", "b", "c"], view
            assert (view.get("log_index") or {}).get("c", -1) == 2499, view
            return view
        eventually(caught_up, timeout=60)
        for body in bodies[2500:]:  # a group of three: any two confirm
            ch.basic_publish("", "s", body, PERSISTENT)

        # refusals, with rabbitmq-streams' texts
        p = ctl(b, "delete_replica", "solo", "a")
        assert p.returncode != 0 and "Cannot delete the last member of a stream" in out(p), \
            out(p)
        p = ctl(b, "delete_replica", "classic", "a")
        assert p.returncode != 0 and "Cannot delete replicas from a classic queue" in out(p)
        p = ctl(b, "add_replica", "classic", "b")
        assert p.returncode != 0 and "Cannot add replicas to a classic queue" in out(p)
        p = ctl(b, "add_replica", "s", "zz")
        assert p.returncode != 0 and "node_not_running" in out(p), out(p)
        p = ctl(b, "delete_replica", "nosuch", "a")
        assert p.returncode != 0 and "not_found" in out(p), out(p)
        p = ctl(b, "add_replica", "s", "c")  # a member already: nothing to do
        assert p.returncode == 0, out(p)

        # b leaves the group: its copy leaves its disk, the other two confirm on
        copy_b = Path(stream_dir(str(b.data_dir), "/", "s"))
        assert copy_b.is_dir()
        p = ctl(c, "delete_replica", "s", "b")
        assert p.returncode == 0, out(p)

        def b_gone() -> None:
            assert api_stream(a, "s")["members"] == ["a", "c"]
            assert not copy_b.exists()
        eventually(b_gone, timeout=30)
        b.kill()  # not a member: a and c alone confirm
        done = threading.Event()

        def publish_one() -> None:
            ch.basic_publish("", "s", b"last", PERSISTENT)
            done.set()
        publish_one()
        assert done.is_set()
        conn.close()
        assert "ReplicaGap" not in full_log(c)
    finally:
        for broker in (a, b, c):
            broker.stop()
    leader = chunks(a, "s")
    assert sum(len(r) for _i, r in leader) == 3001
    assert chunks(c, "s") == leader
