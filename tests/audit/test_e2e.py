"""End to end: a real broker with the trail on, real pika clients with injected faults, every
Spark job in one local Spark session, exact counts and ids.

Traffic (vhost "/"), producer p1 on ``aud-main`` (DLX ``aud.dlx`` -> ``aud-dlq``):
x-seq 1..5, 7..11 (6 never sent: a gap), then x-seq 3 again with the same message id (a
duplicate publish). A consumer process takes m-1 and m-2 and is killed (they are redelivered);
consumer ``aud-B`` acks everything except m-4, which it rejects to the DLX. ``aud-ttl``
(TTL 150 ms, same DLX) gets 2 messages that expire; ``aud-max`` (max-length 2, no DLX) gets 5,
3 are dropped and 2 stay queued (the unaccounted ones). One message is delayed 300 ms through
an x-delayed-message exchange, one mandatory publish comes back unroutable, and the DLQ is
drained with basic.get.
"""
from __future__ import annotations

import argparse
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pika
import pytest

ROOT = __file__.rsplit("/tests/", 1)[0]
pytestmark = [pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17"),
              pytest.mark.timeout(900)]  # a JVM's start and first jobs on a loaded machine

KILLED_CONSUMER = """
import sys, pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
ch.basic_qos(prefetch_count=2)
def got(ch, method, props, body):
    print(props.message_id, flush=True)
ch.basic_consume("aud-main", got, consumer_tag="aud-A")
ch.start_consuming()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def spark_starting():
    """The Spark session, started in a thread: the JVM starts while the traffic runs."""
    from spark.audit.cli import spark_session
    box: dict = {}

    def start():
        try:
            box["session"] = spark_session("local[2]", "triomq-audit-tests")
        except BaseException as exc:  # re-raised by the spark fixture
            box["error"] = exc

    thread = threading.Thread(target=start, name="spark-start", daemon=True)
    thread.start()
    yield thread, box
    thread.join()
    if "session" in box:
        box["session"].stop()


@pytest.fixture(scope="module")
def trail(tmp_path_factory, spark_starting):
    """Run the broker and the traffic; returns the trail directory."""
    base = tmp_path_factory.mktemp("audit-e2e")
    port = _free_port()
    log = open(base / "broker.log", "w")  # noqa: SIM115 - closed below
    broker = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(base / "data"), "--store", "memory", "--http-port", "0",
         "--audit-dir", str(base / "trail"), "--audit-node", "e2e"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert broker.poll() is None and time.monotonic() < deadline, "broker did not start"
                time.sleep(0.1)
        traffic(port)
        time.sleep(0.3)
    finally:
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)
        log.close()
    return base / "trail"


def _props(mid, producer=None, seq=None, ref=None, **kw):
    headers = {}
    if producer is not None:
        headers["x-producer"] = producer
    if seq is not None:
        headers["x-seq"] = seq
    if ref is not None:
        headers["x-ref-key"] = ref
    return pika.BasicProperties(message_id=mid, headers=headers or None, **kw)


def traffic(port: int) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("aud.dlx", "fanout")
    ch.queue_declare("aud-dlq")
    ch.queue_bind("aud-dlq", "aud.dlx")
    ch.queue_declare("aud-main", arguments={"x-dead-letter-exchange": "aud.dlx"})
    ch.queue_declare("aud-ttl", arguments={"x-dead-letter-exchange": "aud.dlx",
                                           "x-message-ttl": 150})
    ch.queue_declare("aud-max", arguments={"x-max-length": 2})
    ch.queue_declare("aud-delayed-q")
    ch.exchange_declare("aud.delayed", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    ch.queue_bind("aud-delayed-q", "aud.delayed", "d")
    ch.exchange_declare("aud.x", "direct")
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 10, 11):
        ch.basic_publish("", "aud-main", b"order %d" % n,
                         _props(f"m-{n}", "p1", n, "order-42" if n == 1 else None))
    ch.basic_publish("", "aud-main", b"order 3", _props("m-3", "p1", 3))  # duplicate
    for n in (1, 2):
        ch.basic_publish("", "aud-ttl", b"t", _props(f"ttl-{n}", "p2", n))
    for n in range(1, 6):
        ch.basic_publish("", "aud-max", b"x", _props(f"max-{n}", "p3", n))
    ch.basic_publish("aud.delayed", "d", b"later",
                     pika.BasicProperties(message_id="delayed-1", headers={"x-delay": 300}))
    try:
        ch.basic_publish("aud.x", "nowhere", b"lost", _props("ret-1"), mandatory=True)
    except pika.exceptions.UnroutableError:
        pass

    killed = subprocess.Popen([sys.executable, "-c", KILLED_CONSUMER, str(port)],
                              stdout=subprocess.PIPE, text=True)
    got = [killed.stdout.readline().strip() for _ in range(2)]
    assert got == ["m-1", "m-2"]
    killed.kill()
    killed.wait(10)

    seen = []

    def on_message(ch2, method, props, body):
        seen.append(props.message_id)
        if props.message_id == "m-4":
            ch2.basic_reject(method.delivery_tag, requeue=False)
        else:
            ch2.basic_ack(method.delivery_tag)

    c2 = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch2 = c2.channel()
    ch2.basic_qos(prefetch_count=20)
    ch2.basic_consume("aud-main", on_message, consumer_tag="aud-B")
    deadline = time.monotonic() + 20
    while len(seen) < 11 and time.monotonic() < deadline:
        c2.process_data_events(time_limit=0.2)
    assert sorted(seen) == sorted(["m-1", "m-2", "m-3", "m-3", "m-4", "m-5", "m-7", "m-8",
                                   "m-9", "m-10", "m-11"])
    c2.close()

    time.sleep(0.6)  # the TTL runs out, the delayed message fires
    m, _, _ = ch.basic_get("aud-delayed-q")
    assert m is not None
    ch.basic_ack(m.delivery_tag)
    drained = []
    while True:
        m, p, _ = ch.basic_get("aud-dlq")
        if m is None:
            break
        drained.append(p.message_id)
        ch.basic_ack(m.delivery_tag)
    assert sorted(drained) == ["m-4", "ttl-1", "ttl-2"]
    conn.close()


@pytest.fixture(scope="module")
def spark(spark_starting):
    thread, box = spark_starting
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["session"]


def _args(trail, **kw):
    d = dict(input=str(trail), from_us=None, to_us=None, window=60, grace=0.0,
             producer_key="auto", message_id=None, ref_key=None, msg=None, consumer=None)
    d.update(kw)
    return argparse.Namespace(**d)


def test_every_job_end_to_end(trail, spark, tmp_path):
    from spark.audit.cli import run_job
    result, status = run_job(spark, "report", _args(trail), str(tmp_path))
    assert status == 1  # unaccounted messages and a gap
    assert result["problems"] == []

    rec = result["reconcile"]
    assert rec["publishes"] == {"published": 20, "routed": 18, "unroutable": 0, "returned": 1,
                                "nacked": 0, "taken": 1}
    assert rec["queues"] == {"enqueued": 22, "delivered": 15, "acked": 14, "dead_lettered": 1,
                             "expired": 2, "dropped": 3, "rejected": 0, "settled_other": 0,
                             "purged": 0, "deleted": 0, "unaccounted": 2}
    assert [(r["queue"], r["message_id"], r["last_event"])
            for r in rec["unaccounted_messages"]] == [("aud-max", "max-4", "enqueued"),
                                                     ("aud-max", "max-5", "enqueued")]
    (node,) = rec["trail"]["nodes"]
    assert node["node"] == "e2e" and node["missing_seqs"] == 0
    assert (node["starts"], node["clean_stops"]) == (1, 1)
    by_queue = {r["queue"]: r for r in _parquet(spark, tmp_path / "reconcile" / "by_queue")}
    assert by_queue["aud-main"]["deliveries"] == 13  # m-1 and m-2 twice: the killed consumer

    seq = result["sequence"]
    assert [(g["producer"], g["missing_from"], g["missing_to"]) for g in seq["gaps"]] == [
        ("p1", 6, 6)]
    assert [(d["producer"], d["producer_seq"], d["publishes"]) for d in seq["duplicates"]] == [
        ("p1", 3, 2)]
    assert [(a["queue"], a["key"], a["acks"]) for a in seq["acked_more_than_once"]] == [
        ("aud-main", "m-3", 2)]
    assert seq["out_of_order"] == []
    assert {p["producer"]: p["publishes"] for p in seq["producers"]} == {"p1": 11, "p2": 2,
                                                                        "p3": 5}

    lat = {r["metric"]: r for r in result["latency"]["overall"]}
    assert lat["publish_to_ack"]["count"] == 14
    assert lat["publish_to_first_delivery"]["count"] == 15
    assert lat["scheduled_due_to_fire"]["count"] == 1
    assert all(r["p50_ms"] >= 0 for r in lat.values())

    dl = result["deadletters"]
    assert dl["by_reason"] == {"rejected": 1, "expired": 2}
    assert {(r["reason"], r["queue"], r["dead_letters"]) for r in dl["by_reason_queue_hour"]} == {
        ("rejected", "aud-main", 1), ("expired", "aud-ttl", 2)}

    html = (tmp_path / "report.html").read_text()
    assert html.count("<img") == 3 and "max-5" in html
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["exit_status"] == 1


def _parquet(spark, path):
    return [r.asDict() for r in spark.read.parquet(str(path)).collect()]


def test_track_by_ref_key_message_id_and_consumer(trail, spark, tmp_path):
    from spark.audit.cli import run_job
    result, status = run_job(spark, "track", _args(trail, ref_key="order-42"), str(tmp_path))
    history = result["track"]["history"]
    assert status == 0
    assert [(h["event"], h["consumer_tag"], h["redelivered"]) for h in history] == [
        ("published", None, None), ("delivered", "aud-A", False), ("requeued", None, None),
        ("delivered", "aud-B", True), ("acked", "aud-B", None)]

    result, _ = run_job(spark, "track", _args(trail, message_id="m-4"), str(tmp_path))
    assert [(h["event"], h["queue"]) for h in result["track"]["history"]] == [
        ("published", None), ("delivered", "aud-main"), ("rejected", "aud-main"),
        ("enqueued", "aud-dlq"), ("dead_lettered", "aud-main"), ("delivered", "aud-dlq"),
        ("acked", "aud-dlq")]

    result, _ = run_job(spark, "track", _args(trail, consumer="aud-B"), str(tmp_path))
    events = [(h["event"], h["message_id"]) for h in result["track"]["history"]]
    assert events.count(("acked", "m-3")) == 2
    assert ("rejected", "m-4") in events and len(events) == 22  # 11 deliveries, 10 acks, 1 reject
