"""Streams replicated across a cluster's nodes (real etcd, real broker processes, pika):
a replica group of x-initial-cluster-size nodes, followers holding the leader's chunks at
the same offsets on their own disks, a publish confirmed only once a majority has it, a
follower that was down catching up from its own last chunk."""
from __future__ import annotations

import threading

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
            eventually(lambda f=follower: "replicating from node 'a'" in full_log(f),
                       timeout=30)
        ch.confirm_delivery()
        for i in range(300):
            ch.basic_publish("", "s", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
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
