"""Streams replicated across a cluster's nodes (real etcd, real broker processes, pika):
a replica group of x-initial-cluster-size nodes, followers holding the leader's chunks at
the same offsets on their own disks, a publish confirmed only once a majority has it, a
follower that was down catching up from its own last chunk."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import httpx
import pika
import pytest
from brokerproc import BrokerProc

from broker.streams.log import StreamLog, stream_dir

from .test_cluster_nodes import TTL, eventually
from .test_mirroring_more import start_together

STREAM = {"x-queue-type": "stream"}


def stream_node(tmp_path, etcd, name, secret) -> BrokerProc:
    return BrokerProc(tmp_path / name, http=True, stream=True, extra=[
        "--cluster", etcd.url("c"), "--node-name", name, "--cluster-ttl", TTL,
        "--cluster-secret-file", str(secret)])


def full_log(broker: BrokerProc) -> str:
    return broker.log_path.read_text(errors="replace")


def logged(broker: BrokerProc, text: str) -> None:
    assert text in full_log(broker), text


def chunks(broker: BrokerProc, name: str) -> list[tuple[int, list[tuple[int, bytes]]]]:
    """(chunk id, records) of a stopped node's copy of the stream."""
    lg = StreamLog(stream_dir(str(broker.data_dir), "/", name))
    try:
        reader = lg.reader("first")
        out = []
        while (c := reader.next_chunk()) is not None:
            out.append((c.first_offset, list(c.records())))
        return out
    finally:
        lg.close()


class Publisher(threading.Thread):
    def __init__(self, broker, queue, bodies):
        super().__init__(daemon=True)
        self.broker, self.queue, self.bodies = broker, queue, bodies
        self.confirmed: list[bytes] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = self.broker.connect()
            ch = conn.channel()
            ch.confirm_delivery()
            for body in self.bodies:
                ch.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2))
                self.confirmed.append(body)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.timeout(180)
def test_stream_replicas_majority_confirms_and_catch_up(tmp_path, etcd, secret):
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("s", durable=True, arguments=STREAM)
        for follower in (b, c):
            eventually(lambda f=follower: logged(f, "replicating from node 'a'"), timeout=30)
        ch.confirm_delivery()
        for i in range(300):
            ch.basic_publish("", "s", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        # a stream deleted on the leader: its copies go from the followers' disks too
        ch.queue_declare("gone", durable=True, arguments=STREAM)
        ch.basic_publish("", "gone", b"x", pika.BasicProperties(delivery_mode=2))
        copies = [Path(stream_dir(str(f.data_dir), "/", "gone")) for f in (b, c)]
        assert any(p.is_dir() for p in copies)  # confirmed: a replica has it

        def copies_made() -> None:
            assert all(p.is_dir() for p in copies)
        eventually(copies_made, timeout=30)
        ch.queue_delete("gone")
        def copies_gone() -> None:
            assert [p for p in copies if p.exists()] == []
        eventually(copies_gone, timeout=30)
        conn.close()

        # both followers down: one replica of three, nothing is confirmed ...
        b.kill()
        c.kill()
        p = Publisher(a, "s", [b"lonely"])
        p.start()
        p.join(5)
        assert p.confirmed == [], "confirmed with one replica of three"
        assert p.is_alive(), p.error
        # ... until a follower is back and caught up from its own last chunk
        c.start()
        p.join(60)
        assert p.confirmed == [b"lonely"], p.error
        text = full_log(c)
        at = int(text.rsplit("replicating from node 'a', from offset ", 1)[1].split()[0])
        assert at > 0, text[-3000:]  # its own tail, not from nothing

        # a consumer on a follower's node reads every confirmed message (through the leader)
        conn = c.connect()
        ch = conn.channel()
        ch.basic_qos(prefetch_count=100)
        got = []
        for method, _props, body in ch.consume("s", arguments={"x-stream-offset": "first"},
                                               inactivity_timeout=30):
            assert method is not None, got
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == 301:
                break
        assert got == [b"m%d" % i for i in range(300)] + [b"lonely"]
        conn.close()
    finally:
        for broker in (a, b, c):
            broker.stop()
    # each replica on its own disk: the leader's chunks, same ids, same records
    leader = chunks(a, "s")
    assert sum(len(r) for _id, r in leader) == 301
    assert chunks(c, "s") == leader
    assert chunks(b, "s") == [x for x in leader if x[0] < 300]  # down since


def rstream_bodies(port: int, stream: str, want: set) -> list[bytes]:
    """Bodies read over the Stream protocol (rstream) from the first offset until every
    one of ``want`` came (or 60 s passed)."""
    import asyncio

    from rstream import (
        Consumer,
        ConsumerOffsetSpecification,
        MessageContext,
        OffsetType,
        amqp_decoder,
    )

    async def go() -> list[bytes]:
        got: list[bytes] = []
        done = asyncio.Event()

        async def on_message(msg, ctx: MessageContext):
            got.append(bytes(msg.body))
            if want <= set(got):
                done.set()

        consumer = Consumer("127.0.0.1", port=port, username="guest", password="guest")
        await consumer.start()
        try:
            await consumer.subscribe(stream, on_message, decoder=amqp_decoder,
                                     offset_specification=ConsumerOffsetSpecification(
                                         OffsetType.FIRST, None))
            await asyncio.wait_for(done.wait(), 60)
        finally:
            await consumer.close()
        return got
    return asyncio.run(go())


def rstream_publish(port: int, stream: str, body: bytes) -> None:
    import asyncio

    from rstream import AMQPMessage, Producer

    async def go() -> None:
        async with Producer("127.0.0.1", port=port, username="guest",
                            password="guest") as p:
            await asyncio.wait_for(p.send_wait(stream, AMQPMessage(body=body)), 60)
    asyncio.run(go())


def pika_bodies(broker: BrokerProc, stream: str, want: set) -> list[bytes]:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        got: list[bytes] = []
        for method, _props, body in ch.consume(stream, arguments={"x-stream-offset": "first"},
                                               inactivity_timeout=30):
            assert method is not None, (len(got), len(want))
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if want <= set(got):
                return got
    finally:
        conn.close()
    return got


@pytest.mark.timeout(240)
def test_stream_leader_killed_the_longest_replica_takes_over(tmp_path, etcd, secret):
    """kill -9 of the leader while a pika client publishes with confirms: a follower
    with the longest log becomes the leader through etcd; every confirmed message is read
    from the surviving nodes, by pika on the other follower (through the new leader) and
    by rstream on the new leader; publishes are confirmed again (2 of 3)."""
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        conn.channel().queue_declare("s", durable=True, arguments=STREAM)
        conn.close()
        for follower in (b, c):
            eventually(lambda f=follower: logged(f, "replicating from node 'a'"), timeout=30)
        bodies = [b"k%05d" % i for i in range(3000)]
        p = Publisher(a, "s", bodies)
        p.start()
        def enough() -> None:
            assert len(p.confirmed) >= 300 or p.error is not None, len(p.confirmed)
        eventually(enough, timeout=60)
        assert p.error is None, p.error
        a.kill()
        p.join(30)
        confirmed = list(p.confirmed)
        assert 300 <= len(confirmed) < len(bodies)

        def promoted() -> tuple[BrokerProc, BrokerProc]:
            for new, other in ((b, c), (c, b)):
                if "leader on this node now" in full_log(new):
                    return new, other
            raise AssertionError("no new leader yet")
        # the longer log wins (a chunk in flight at the kill may have reached one only)
        leader, other = eventually(promoted, timeout=60)

        got = pika_bodies(other, "s", set(confirmed))
        assert got == bodies[:len(got)]  # in order, nothing unconfirmed-then-lost reordered
        got = rstream_bodies(leader.stream_port, "s", set(confirmed))
        assert got == bodies[:len(got)]
        # and by rstream on the other survivor, from its own replica
        got = rstream_bodies(other.stream_port, "s", set(confirmed))
        assert got == bodies[:len(got)]

        p = Publisher(other, "s", [b"after"])
        p.start()
        p.join(60)
        assert p.confirmed == [b"after"], p.error
        # an rstream publisher connected to a follower's node: Metadata sends it on to the
        # leader, where its publish is confirmed
        rstream_publish(other.stream_port, "s", b"via-stream")

        # the deposed leader comes back: its copy (it may hold chunks never confirmed)
        # is cut back to where the new leader's own chunks start, and it copies only
        # what it lacks from there
        a.start()
        new_name = "b" if leader is b else "c"
        took = re.search(r"leader on this node now \(epoch \d+, log up to offset (\d+)",
                         full_log(leader))
        assert took is not None
        start = int(took.group(1)) + 1  # where the new leader's own chunks start
        assert start >= len(confirmed)
        eventually(lambda: logged(
            a, f"replicating from node '{new_name}', from offset {start}"), timeout=60)
        assert f"replicating from node '{new_name}', from offset 0" not in full_log(a)
        tail = len(got) + 2  # at least: what was read, "after" and "via-stream"
        view = {}

        def caught_up() -> None:
            view.update(api_stream(leader, "s"))
            offsets = view.get("log_index") or {}
            assert all(offsets.get(n, -1) >= tail - 1 for n in "abc"), view
        eventually(caught_up, timeout=60)
        # the group, its leader and each member's log from the management API
        assert view["members"] == ["a", "b", "c"] and view["leader"] == new_name, view
        assert view["commit_index"] == view["log_index"][new_name], view
    finally:
        for broker in (a, b, c):
            broker.stop()
    assert chunks(a, "s") == chunks(b, "s") == chunks(c, "s")


def api_stream(broker: BrokerProc, name: str) -> dict:
    r = httpx.get(f"{broker.http_url}/api/queues/%2F/{name}", auth=("guest", "guest"),
                  timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_replica_placement_and_initial_cluster_size():
    from broker.cluster.stream_replicas import initial_cluster_size, place

    class Stream:
        def __init__(self, arguments):
            self.arguments = arguments
    assert place("b", ["a", "b", "c", "d"], 3) == ["b", "c", "d"]
    assert place("c", ["a", "b", "c", "d"], 3) == ["c", "d", "a"]  # after it, wrapping
    assert place("a", ["a"], 3) == ["a"]
    assert initial_cluster_size(Stream({}), 5) == 3  # RabbitMQ's default
    assert initial_cluster_size(Stream({}), 2) == 2  # at most the live nodes
    assert initial_cluster_size(Stream({"x-initial-cluster-size": 5}), 4) == 4
    assert initial_cluster_size(Stream({"x-initial-cluster-size": "1"}), 3) == 1
    assert initial_cluster_size(Stream({"x-initial-cluster-size": 0}), 3) == 3


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_copy_behind_the_leaders_retention_starts_again_from_its_first_chunk(
        tmp_path, etcd, secret):
    """A follower down while the leader's retention removes what it lacks: back, its tail
    is behind the leader's first chunk, and it copies from that chunk on (as osiris) rather
    than stopping with a gap (fast version: tests/streams/test_log.py)."""
    a, b, c = (stream_node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("kept", durable=True, arguments={
            **STREAM, "x-stream-max-segment-size-bytes": 2000, "x-max-length-bytes": 4000})
        for follower in (b, c):
            eventually(lambda f=follower: logged(f, "replicating from node 'a'"), timeout=30)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "kept", b"early%d" % i, pika.BasicProperties(delivery_mode=2))
        c.kill()
        for i in range(200):  # confirmed by a and b
            ch.basic_publish("", "kept", b"m%03d" % i + bytes(100),
                             pika.BasicProperties(delivery_mode=2))
        conn.close()
        c.start()
        eventually(lambda: logged(c, "starting again from it"), timeout=60)
        last = b"m199" + bytes(100)
        assert last in rstream_bodies(c.stream_port, "kept", {last})
        assert "ReplicaGap" not in full_log(c)
    finally:
        for broker in (a, b, c):
            broker.stop()
    leader, copy = chunks(a, "kept"), chunks(c, "kept")
    assert leader[0][0] > 5  # retention removed the start
    assert copy == leader
