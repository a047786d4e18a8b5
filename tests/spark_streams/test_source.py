"""The ``triomq-stream`` Spark data source against a real broker subprocess (Stream protocol
on a free port) and a real local Spark: one broker and one SparkSession for the module.

Queries use Trigger.AvailableNow (they end once they have read what the stream held when
they started), so nothing here waits on a clock."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pika
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "interop-tests"))
from brokerproc import BrokerProc  # noqa: E402

# a hang guard: a JVM's start and Spark's first queries on a loaded machine
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def broker():
    with tempfile.TemporaryDirectory() as d:
        b = BrokerProc(Path(d), stream=True).start()
        try:
            yield b
        finally:
            b.stop()


@pytest.fixture(scope="module")
def spark():
    from spark.audit.cli import spark_session
    from spark.streams.source import register
    s = spark_session("local[2]", "triomq-stream-tests")
    register(s)
    yield s
    s.stop()


def _publish(broker, queue: str, bodies: list[str], exchange: str = "", keys=None) -> None:
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i, body in enumerate(bodies):
            ch.basic_publish(exchange, keys[i] if keys else queue, body.encode(),
                             pika.BasicProperties(message_id=body, headers={"n": body}))
    finally:
        conn.close()


def _declare_stream(broker, name: str) -> None:
    conn = broker.connect()
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    finally:
        conn.close()


def _opts(reader, broker, **extra):
    reader = reader.format("triomq-stream").option("port", broker.stream_port)
    for k, v in extra.items():
        reader = reader.option(k, v)
    return reader


def _run_available_now(spark, broker, out: Path, checkpoint: Path, **options) -> None:
    df = _opts(spark.readStream, broker, **options).load()
    q = (df.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(120), "the query did not end"  # hang guard only
    finally:
        q.stop()
    assert q.exception() is None


def test_restart_from_checkpoint_reads_each_record_once(broker, spark, tmp_path):
    _declare_stream(broker, "orders")
    _publish(broker, "orders", [f"a{i}" for i in range(20)])
    out, cp = tmp_path / "out", tmp_path / "cp"
    _run_available_now(spark, broker, out, cp, stream="orders", startingOffsets="first")
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.offset for r in rows) == list(range(20))
    r5 = next(r for r in rows if r.offset == 5)
    assert (bytes(r5.body), r5.stream, r5.partition, r5.routing_key) == (b"a5", "orders",
                                                                          "orders", "orders")
    assert r5.properties["message_id"] == "a5"
    assert r5.application_properties == {"n": "a5"}

    _publish(broker, "orders", [f"b{i}" for i in range(15)])
    # restarted from its checkpoint (startingOffsets no longer counts), in batches of at most 8
    _run_available_now(spark, broker, out, cp, stream="orders", startingOffsets="first",
                       maxRecordsPerTrigger=8)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.offset for r in rows) == list(range(35))
    assert sorted(bytes(r.body) for r in rows if r.offset >= 20) == sorted(
        f"b{i}".encode() for i in range(15))
    # 15 new records at most 8 a batch: two batches after the first run's one
    batches = [p for p in (cp / "commits").iterdir() if p.name.isdigit()]
    assert len(batches) >= 3


def test_starting_next_reads_only_new_records(broker, spark, tmp_path):
    _declare_stream(broker, "later")
    _publish(broker, "later", ["old1", "old2"])
    out, cp = tmp_path / "out", tmp_path / "cp"
    _run_available_now(spark, broker, out, cp, stream="later", startingOffsets="next")
    _publish(broker, "later", ["new1", "new2", "new3"])
    _run_available_now(spark, broker, out, cp, stream="later")
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(bytes(r.body) for r in rows) == [b"new1", b"new2", b"new3"]


def test_super_stream_partitions(broker, spark, tmp_path):
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.exchange_declare("invoices", "direct", durable=True)
        for i in range(3):
            ch.queue_declare(f"invoices-{i}", durable=True,
                             arguments={"x-queue-type": "stream"})
            ch.queue_bind(f"invoices-{i}", "invoices", str(i),
                          arguments={"x-stream-partition-order": i})
    finally:
        conn.close()
    bodies = [f"inv{i}" for i in range(12)]
    _publish(broker, "", bodies, exchange="invoices", keys=[str(i % 3) for i in range(12)])
    out, cp = tmp_path / "out", tmp_path / "cp"
    _run_available_now(spark, broker, out, cp, superstream="invoices",
                       startingOffsets="first")
    rows = spark.read.parquet(str(out)).collect()
    got = {(r.partition, r.offset): bytes(r.body) for r in rows}
    assert len(rows) == 12
    assert got == {(f"invoices-{i % 3}", i // 3): f"inv{i}".encode() for i in range(12)}
    offsets = sorted((cp / "offsets").iterdir(), key=lambda p: p.name)
    last = offsets[-1].read_text().splitlines()[-1]
    assert '"invoices-0":4' in last.replace(" ", "")


def test_batch_range(broker, spark):
    _declare_stream(broker, "ranged")
    _publish(broker, "ranged", [f"r{i}" for i in range(20)])
    df = _opts(spark.read, broker, stream="ranged", startingOffsets="offset 5",
               endingOffsets="offset 12").load()
    assert sorted(r.offset for r in df.collect()) == list(range(5, 12))
    whole = _opts(spark.read, broker, stream="ranged").load()
    assert whole.count() == 20
    json_range = _opts(spark.read, broker, stream="ranged", startingOffsets='{"ranged": 18}').load()
    assert [bytes(r.body) for r in json_range.orderBy("offset").collect()] == [b"r18", b"r19"]


@pytest.fixture(scope="module")
def audit_broker():
    with tempfile.TemporaryDirectory() as d:
        b = BrokerProc(Path(d), stream=True, extra=[
            "--audit-dir", str(Path(d) / "trail"), "--audit-stream", "audit"]).start()
        try:
            yield b
        finally:
            b.stop()


def test_reconcile_follow_on_a_stream_trail(audit_broker, spark, tmp_path, capsys):
    import json
    import os
    import signal
    import threading
    import time

    from spark.audit.cli import main
    conn = audit_broker.connect()
    try:
        ch = conn.channel()
        ch.queue_declare("work")
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", "work", f"w{i}".encode(),
                             pika.BasicProperties(message_id=f"w{i}"))
        for _ in range(3):
            method, _props, _body = ch.basic_get("work")
            ch.basic_ack(method.delivery_tag)
    finally:
        conn.close()
    out = tmp_path / "follow"
    summary = out / "reconcile.json"
    seen: dict = {}

    def interrupt_when_caught_up():
        deadline = time.monotonic() + 240  # a hang guard, not a timing assertion
        while time.monotonic() < deadline:
            try:
                s = json.loads(summary.read_text())
            except (OSError, ValueError):
                s = {}
            if s.get("queues", {}).get("acked") == 3:
                seen.update(s)
                break
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    watcher = threading.Thread(target=interrupt_when_caught_up, daemon=True)
    watcher.start()
    status = main(["reconcile", "--follow", "audit", "--stream-port",
                   str(audit_broker.stream_port), "--output", str(out), "--grace", "0",
                   "--trigger", "1", "--quiet"], spark=spark)
    watcher.join()
    assert seen, "the follower never saw the three acks"
    assert seen["queues"]["enqueued"] == 5
    assert seen["unaccounted"] == 2  # w3 and w4 are still in the queue, grace 0
    assert {m["message_id"] for m in seen["unaccounted_messages"]} == {"w3", "w4"}
    assert seen["trail"]["missing_seqs"] == 0
    assert status == 1
    printed = capsys.readouterr().out
    assert "reconcile --follow: batch" in printed and "unaccounted: 2" in printed
    # each event once: as many rows as distinct sequence numbers
    ev = spark.read.parquet(str(out / "events"))
    assert ev.count() == ev.select("seq").distinct().count() == seen["events"]
