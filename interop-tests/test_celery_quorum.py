"""Celery on quorum queues, with its native delayed delivery, against a real worker.

With ``task_default_queue_type = "quorum"`` Celery (5.5+) declares its task queue with
``x-queue-type: quorum``, detects it (``worker_detect_quorum_queues``: per-consumer QoS,
since a quorum queue refuses a channel's global QoS) and switches on native delayed
delivery: the worker declares 28 quorum queues ``celery_delayed_0`` .. ``celery_delayed_27``
(``x-message-ttl`` 2^level s, ``x-overflow: reject-publish``, ``x-dead-letter-strategy:
at-least-once``, each dead-lettering into the next level's topic exchange) and the topic
exchange ``celery_delayed_delivery``; a countdown/ETA task is published to
``celery_delayed_27`` with a routing key spelling its delay in binary and reaches the task
queue only when due, instead of being held unacknowledged by the worker.

The delay queues have fixed names, so they are deleted when the module is done (on a
shared RabbitMQ as well: nothing else on this machine uses them).
"""
from __future__ import annotations

import itertools
import os
import signal
import time
from datetime import UTC, datetime, timedelta

import celery_app
import pika
import pytest
from kombu import Connection, Exchange, Queue
from test_celery import CeleryRun, Worker, _get, _wait

QUORUM_CONF = {
    "task_default_queue_type": "quorum",
    # native delayed delivery forwards into the task's exchange by topic routing keys
    "task_default_exchange_type": "topic",
}
DELAY_QUEUES = [f"celery_delayed_{level}" for level in range(28)]


@pytest.fixture(scope="module")
def delay_topology(amqp_params):
    yield
    conn = pika.BlockingConnection(amqp_params.pika_params())
    try:
        for name in DELAY_QUEUES:
            ch = conn.channel()
            ch.queue_delete(name)
            ch.exchange_delete(name)
            ch.close()
        conn.channel().exchange_delete("celery_delayed_delivery")
    finally:
        conn.close()


@pytest.fixture
def quorum_run(request, broker_url, uid, tmp_path, cleanup, monkeypatch, delay_topology):
    for k in [k for k in os.environ if k.startswith("CELERY_")]:
        monkeypatch.delenv(k)
    cleanup.queue(uid)
    for ex in (uid, f"{uid}.pidbox", f"reply.{uid}.pidbox", f"{uid}.ev"):
        cleanup.exchange(ex)
    run = CeleryRun(broker_url, uid, tmp_path, "file")
    run.app.close()
    run.config.update(QUORUM_CONF)
    run.app = celery_app.make_app(**run.config)
    try:
        yield run
    finally:
        run.close()


def _queue_type(amqp_params, name) -> bool:
    """Whether ``name`` exists and is a quorum queue: a redeclare as quorum is equivalent."""
    conn = pika.BlockingConnection(amqp_params.pika_params())
    try:
        conn.channel().queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_worker_declares_quorum_and_delay_queues(quorum_run, amqp_params):
    run = quorum_run
    w = run.start_worker()
    assert "Failed to" not in w.log() and "global qos" not in w.log(), run.logs()
    assert "Global QoS is disabled" in w.log(), run.logs()  # Celery's quorum detection
    assert _queue_type(amqp_params, run.queue)
    conn = pika.BlockingConnection(amqp_params.pika_params())
    try:  # a redeclare with Celery's arguments, the quorum type included, is equivalent
        for level in (0, 27):
            conn.channel().queue_declare(DELAY_QUEUES[level], durable=True, arguments={
                "x-queue-type": "quorum", "x-overflow": "reject-publish",
                "x-message-ttl": 2**level * 1000, "x-dead-letter-strategy": "at-least-once",
                "x-dead-letter-exchange": DELAY_QUEUES[level - 1] if level else
                "celery_delayed_delivery"})
    finally:
        conn.close()
    assert _get(run.add.delay(2, 3), run) == 5


def test_countdown_and_eta_through_the_delay_queues(quorum_run):
    run = quorum_run
    w = run.start_worker()
    sent = time.time()
    by_countdown = run.record.apply_async((str(run.runs_dir), "countdown"), countdown=3)
    by_eta = run.record.apply_async((str(run.runs_dir), "eta"),
                                    eta=datetime.now(UTC) + timedelta(seconds=3))
    now = run.record.delay(str(run.runs_dir), "now")
    assert _get(now, run)["time"] - sent < 2.5, run.logs()
    # not held by the worker: it gets them only when they come out of the delay queues
    while time.time() - sent < 2.0:
        assert not w.received(by_countdown.id) and not w.received(by_eta.id), run.logs()
        time.sleep(0.05)
    for r in (by_countdown, by_eta):
        delay = _get(r, run)["time"] - sent
        print(f"native delayed delivery: a 3 s task ran {delay:.2f} s after sending")
        assert 2.0 <= delay <= 8.0, f"{r.id} ran {delay:.2f}s after sending (expected ~3s)"
    assert len(run.runs("countdown")) == 1 and len(run.runs("eta")) == 1


def test_retry_with_countdown(quorum_run):
    run = quorum_run
    run.start_worker()
    r = run.flaky.delay(str(run.runs_dir), "flaky", 2)
    assert _get(r, run, timeout=30)["retries"] == 2
    recs = run.runs("flaky")
    assert [x["retries"] for x in recs] == [0, 1, 2]
    for a, b in itertools.pairwise(recs):
        assert b["time"] - a["time"] >= 0.9, recs  # each retry waited its countdown


def test_killed_worker_holding_tasks(quorum_run):
    """SIGKILL a worker that is busy with one task and holds the others (delivered,
    unacknowledged, from the quorum queue): a second worker runs every one it had not
    started, redelivered."""
    run = quorum_run
    d = str(run.runs_dir)
    first = run.start_worker(name="first", concurrency=1, prefetch_multiplier=4)
    tasks = [run.task("slow").apply_async((d, f"job-{i}", 30), countdown=1) for i in range(4)]
    ids = {r.id for r in tasks}
    _wait(lambda: all(first.received(i) for i in ids), run, "the first worker to receive them all",
          20)
    _wait(lambda: len(run.runs("job-*")) == 1, run, "the first worker to start one", 10)
    started = {r["task_id"] for r in run.runs("job-*")}
    first.killpg(signal.SIGKILL)
    first.proc.wait(5)
    second = run.start_worker(name="second", concurrency=4)
    held = ids - started
    _wait(lambda: {r["task_id"] for r in run.runs("job-*") if r["hostname"] == second.nodename}
          >= held, run, "the held tasks to run on the second worker", 30)
    for r in run.runs("job-*"):
        if r["task_id"] in held:
            assert r["hostname"] == second.nodename and r["redelivered"] is True, r


def test_kombu_queue_arguments(amqp_params, uid, cleanup):
    """kombu's ``queue_arguments`` declare a quorum queue; a message goes round trip."""
    cleanup.queue(uid)
    cleanup.exchange(uid)
    exchange = Exchange(uid, type="direct", durable=True)
    queue = Queue(uid, exchange, routing_key=uid, durable=True,
                  queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": 3})
    with Connection(amqp_params.url) as conn:
        producer = conn.Producer()
        producer.publish({"n": 1}, exchange=exchange, routing_key=uid, declare=[queue],
                         serializer="json")
        bound = queue(conn.default_channel)
        deadline = time.monotonic() + 10
        message = None
        while message is None and time.monotonic() < deadline:
            message = bound.get(no_ack=False)
            if message is None:
                time.sleep(0.02)
        assert message is not None and message.payload == {"n": 1}
        message.requeue()
        again = None
        while again is None and time.monotonic() < deadline:
            again = bound.get(no_ack=False)
            if again is None:
                time.sleep(0.02)
        assert again is not None and again.headers.get("x-delivery-count") == 1
        again.ack()


def test_without_quorum_detection(quorum_run, external_broker, monkeypatch):
    """``worker_detect_quorum_queues = False``: kombu picks the QoS flag from the server's
    product and version. RabbitMQ 3.x gets ``global=true`` and refuses the consume on a
    quorum queue (540 "does not support global qos"); TrioMQ gets ``global=false``
    (as RabbitMQ 4 would) and the worker runs."""
    run = quorum_run
    run.config["worker_detect_quorum_queues"] = False
    if external_broker:
        monkeypatch.setattr(Worker, "wait_ready", lambda self, timeout=0: None)
        w = run.start_worker()
        _wait(lambda: "does not support global qos" in w.log(), run,
              "RabbitMQ 3.x to refuse the global QoS consume", 30)
        return
    w = run.start_worker()
    assert "Global QoS is disabled" not in w.log()
    assert _get(run.add.delay(1, 2), run) == 3
