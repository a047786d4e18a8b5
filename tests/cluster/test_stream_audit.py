"""A stream's consumers on the nodes that do not lead it are in those nodes' audit trails,
by offset: an AMQP 0-9-1 consumer reading a follower's copy, one on a node without a copy
(its deliveries come over the link from the leader: the leader's trail has them as
``forwarded`` hops) and a Stream-protocol subscription on the follower (rstream); a real
Spark reconcile over the three nodes' trails counts each consumer's deliveries (real etcd,
three real nodes, pika, rstream)."""
from __future__ import annotations

import asyncio
import shutil

import pika
import pytest
from brokerproc import BrokerProc

from broker.audit.reader import FileReader
from broker.audit.writer import node_files

from ..audit.test_spark_streams import SparkStarting, job_args
from ..audit.test_stream_deliveries import _read
from .test_cluster_nodes import TTL, eventually
from .test_mirroring_more import start_together
from .test_stream_replication import logged

N = 20
PERSISTENT = pika.BasicProperties(delivery_mode=2)

pytestmark = [pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17"),
              pytest.mark.timeout(600)]  # three nodes, a JVM's start on a loaded machine


def _node(tmp_path, etcd, name, secret) -> BrokerProc:
    return BrokerProc(tmp_path / name, http=True, stream=True, extra=[
        "--cluster", etcd.url("c"), "--node-name", name, "--cluster-ttl", TTL,
        "--cluster-secret-file", str(secret), "--audit-dir", str(tmp_path / f"trail-{name}"),
        "--audit-node", name])


def _amqp_read(broker: BrokerProc, tag: str) -> list[int]:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        offsets: list[int] = []
        for method, props, _body in ch.consume("s", arguments={"x-stream-offset": "first"},
                                                inactivity_timeout=30, consumer_tag=tag):
            assert method is not None, (tag, offsets)
            offsets.append(props.headers["x-stream-offset"])
            ch.basic_ack(method.delivery_tag)
            if len(offsets) == N:
                break
        ch.cancel()
        return offsets
    finally:
        conn.close()


def _deliveries(trail: str, node: str) -> dict:
    """(consumer tag, detail) -> offsets delivered, from ``node``'s trail."""
    out: dict = {}
    for f in node_files(trail, node):
        for r in FileReader(f):
            if r["event"] == "delivered" and r["queue"] == "s":
                assert r["msg"] is None and r["stream_offset"] is not None, r
                out.setdefault((r["consumer_tag"], r["detail"]), []).extend(
                    range(r["stream_offset"], r["stream_offset"] + r["stream_count"]))
    return out


def test_stream_reads_on_other_nodes_are_in_their_trails(tmp_path, etcd, secret):
    from spark.audit.cli import run_job
    starting = SparkStarting("triomq-stream-audit")  # the JVM starts while the cluster runs
    a, b, c = nodes = [_node(tmp_path, etcd, n, secret) for n in "abc"]
    try:
        start_together(nodes)
        conn = a.connect()
        ch = conn.channel()
        # two copies: a (the leader) and b; c has none, its consumers go through a
        ch.queue_declare("s", durable=True, arguments={"x-queue-type": "stream",
                                                      "x-initial-cluster-size": 2})
        eventually(lambda: logged(b, "replicating from node 'a'"), timeout=30)
        ch.confirm_delivery()
        for i in range(N - 1):
            ch.basic_publish("", "s", b"m%02d" % i, PERSISTENT)
        conn.close()  # confirmed: in a majority of the copies (a and b)
        # the last one published on c, forwarded to a: c's trail lists no copy of it (a's
        # appended names it; reconcile below finds nothing unaccounted)
        conn = c.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "s", b"m%02d" % (N - 1), PERSISTENT)
        conn.close()
        assert _amqp_read(b, "on-b") == list(range(N))  # b's own copy
        assert _amqp_read(c, "on-c") == list(range(N))  # through the link to a
        assert asyncio.run(_read(b.stream_port, "s", N)) == list(range(N))
    finally:
        for broker in nodes:
            broker.stop()  # a clean stop: each trail converted to the end
        spark = starting.session()
    trails = {n: str(tmp_path / f"trail-{n}") for n in "abc"}
    on_b, on_c, on_a = (_deliveries(trails[n], n) for n in "bca")
    # the follower's trail: its AMQP consumer's and its Stream-protocol subscription's reads
    # (a Stream-protocol delivery's consumer tag is its subscription id)
    assert sorted(on_b) == [("0", None), ("on-b", None)]
    assert [sorted(v) for v in on_b.values()] == [list(range(N))] * 2
    # the node without a copy: its consumer's deliveries, by offset
    assert on_c == {("on-c", None): list(range(N))}
    # the leader: the hop to c's consumer (forwarded), no consumer of its own
    assert {k[1] for k in on_a} == {"forwarded"}
    assert sorted(o for v in on_a.values() for o in v) == list(range(N))

    # one input holding every node's trail, reconciled by Spark: records matched by offset
    merged = tmp_path / "trail"
    for path in trails.values():
        shutil.copytree(path, merged, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".spool"))
    try:
        result, status = run_job(spark, "reconcile", job_args(str(merged)),
                                 str(tmp_path / "out"))
    finally:
        spark.stop()
    rec = result["reconcile"]
    assert status == 0 and rec["unaccounted"] == 0, rec["unaccounted_messages"]
    streams = rec["streams"]
    assert (streams["appended"], streams["delivered"], streams["deliveries"]) == (N, N, 3 * N)
    per = sorted((c["node"], c["consumer_tag"], c["delivered"], c["first_offset"],
                  c["last_offset"]) for c in streams["consumers"])
    # b: its AMQP consumer and its Stream-protocol subscription; c: its AMQP consumer; the
    # leader's hops to c are not consumers
    assert [(p[0], p[2], p[3], p[4]) for p in per] == [("b", N, 0, N - 1)] * 2 + \
        [("c", N, 0, N - 1)]
    assert "on-b" in {p[1] for p in per if p[0] == "b"}
    assert [p[1] for p in per if p[0] == "c"] == ["on-c"]
