"""Transactional ("half") messages with unmodified pika (docs/transactions.md).

A publish with header ``x-transaction: prepare`` (message_id = transaction id) is held;
a publish to ``amq.triomq.transaction`` with routing key ``commit``/``rollback`` decides;
check-backs go to the half message's ``reply_to``. Covers commit (delivered once),
rollback (never), invisibility while prepared, the unknown-id and missing-id errors, a
check-back answered by another connection after the producer *process* was SIGKILLed,
the default rollback after the check limit, and clean restart / kill -9 of the broker
while messages are prepared, with the journal and ``--store sqlite:///...``.

TrioMQ only: skipped when the suite runs against --broker-url (RabbitMQ has no half
messages); the restart tests start their own brokers.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pika
import pika.exceptions
import pytest
from brokerproc import BrokerProc
from helpers import assert_channel_error, wait_for

CONTROL = "amq.triomq.transaction"


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("half messages are a TrioMQ feature")


def half_props(txid: str, reply_to: str | None = None, persistent: bool = True, **headers):
    return pika.BasicProperties(message_id=txid, reply_to=reply_to,
                                delivery_mode=2 if persistent else 1,
                                headers={"x-transaction": "prepare", **headers})


def decide(ch, decision: str, txid: str) -> None:
    ch.basic_publish(CONTROL, decision, b"", pika.BasicProperties(message_id=txid))


def message_count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def collect(conn, ch, queue: str, seconds: float) -> list[bytes]:
    """Everything a consumer receives on ``queue`` within ``seconds``."""
    got: list[bytes] = []
    tag = ch.basic_consume(queue, lambda c, m, p, b: got.append(b), auto_ack=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    ch.basic_cancel(tag)
    return got


# ----------------------------------------------------------------- one broker for all
def test_commit_is_delivered_once_and_invisible_before(connect, uid, cleanup):
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    q = cleanup.queue(uid)
    ch.queue_declare(q, durable=True)
    ch.basic_publish("", q, b"order-1", half_props(f"{uid}-tx", app="kept"))  # confirmed: held
    assert message_count(ch, q) == 0
    got: list = []
    consumer = connect().channel()
    consumer.basic_consume(q, lambda c, m, p, b: got.append((p, b)), auto_ack=True)
    consumer.connection.process_data_events(time_limit=0.3)
    assert got == []                                   # a consumer sees nothing while prepared
    decide(ch, "commit", f"{uid}-tx")                  # confirmed once durable
    wait_for(lambda: got, conn=consumer.connection, msg="the committed message")
    consumer.connection.process_data_events(time_limit=0.3)
    assert [b for _, b in got] == [b"order-1"]         # once
    props = got[0][0]
    assert props.message_id == f"{uid}-tx" and props.headers == {"app": "kept"}


def test_rollback_is_never_delivered(connect, uid, cleanup):
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.basic_publish("", q, b"order-2", half_props(f"{uid}-tx"))
    decide(ch, "rollback", f"{uid}-tx")
    assert collect(conn, ch, q, 0.5) == []
    assert message_count(ch, q) == 0


def test_unknown_id_is_404_and_changes_nothing(connect, uid, cleanup):
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    ch.basic_publish("", q, b"kept", half_props(f"{uid}-known"))
    assert_channel_error(404, f"NOT_FOUND - no transaction '{uid}-nope' in vhost '/'",
                         decide, ch, "commit", f"{uid}-nope")
    ch2 = conn.channel()
    assert message_count(ch2, q) == 0                  # nothing half-applied
    decide(ch2, "commit", f"{uid}-known")              # the real one is still prepared
    assert wait_for(lambda: message_count(ch2, q) == 1, conn=conn)


def test_missing_message_id_is_406_naming_it(connect, uid, cleanup):
    ch = connect().channel()
    ch.confirm_delivery()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    assert_channel_error(
        406, "PRECONDITION_FAILED - missing property 'message_id' (the transaction id)",
        ch.basic_publish, "", q, b"x",
        pika.BasicProperties(headers={"x-transaction": "prepare"}))


def test_bad_header_and_bad_decision_are_406(connect, uid, cleanup):
    conn = connect()
    q = cleanup.queue(uid)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(q)
    assert_channel_error(406, "PRECONDITION_FAILED - invalid header 'x-transaction-timeout'",
                         ch.basic_publish, "", q, b"x",
                         half_props(f"{uid}-a", **{"x-transaction-timeout": "soon"}))
    ch = conn.channel()
    ch.confirm_delivery()
    assert_channel_error(406, f"PRECONDITION_FAILED - invalid routing key 'abort' for exchange "
                              f"'{CONTROL}'", ch.basic_publish, CONTROL, "abort", b"",
                         pika.BasicProperties(message_id=f"{uid}-a"))


def test_default_rollback_after_the_check_limit(connect, uid, cleanup):
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    q, checks = cleanup.queue(uid), cleanup.queue(f"{uid}.checks")
    ch.queue_declare(q)
    ch.queue_declare(checks)
    ch.basic_publish("", q, b"never", half_props(
        f"{uid}-tx", reply_to=checks, **{"x-transaction-timeout": 200,
                                         "x-transaction-check-max": 2}))
    # check-backs at +0.2 s and +0.6 s, nobody answers; rollback at +1.4 s
    got = []
    tag = ch.basic_consume(checks, lambda c, m, p, b: got.append(p), auto_ack=True)
    wait_for(lambda: len(got) == 2, timeout=5, conn=conn, msg="two check-backs")
    ch.basic_cancel(tag)
    assert [p.headers["x-transaction-check"] for p in got] == [1, 2]
    assert {p.correlation_id for p in got} == {f"{uid}-tx"}
    conn.sleep(1.2)
    assert message_count(ch, q) == 0
    assert_channel_error(406, f"PRECONDITION_FAILED - cannot commit transaction '{uid}-tx' in "
                              f"vhost '/': it was already rolled back by default after 2 "
                              f"check-backs", decide, ch, "commit", f"{uid}-tx")


PRODUCER = textwrap.dedent("""
    import sys, time, pika
    url, queue, checks, txid = sys.argv[1:5]
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue, durable=True)
    ch.queue_declare(checks, durable=True)      # the producer group's check-back queue
    ch.basic_publish("", queue, b"paid order", pika.BasicProperties(
        message_id=txid, reply_to=checks, delivery_mode=2,
        headers={"x-transaction": "prepare", "x-transaction-timeout": 300}))
    print("prepared", flush=True)
    time.sleep(60)                               # the local transaction... never finishes
""")


def test_check_back_after_the_producer_process_crashed(connect, amqp_params, uid, cleanup):
    q, checks = cleanup.queue(uid), cleanup.queue(f"{uid}.checks")
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, amqp_params.url, q, checks,
                                 f"{uid}-tx"], stdout=subprocess.PIPE)
    try:
        assert producer.stdout.readline() == b"prepared\n"
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.wait(10)
    # another process of the producer group answers the check-back from its local state
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    answered = []

    def on_check(c, m, props, body):
        key = props.headers["x-transaction-routing-key"]
        assert (key.decode() if isinstance(key, bytes) else key) == q
        decide(c, "commit", props.correlation_id)  # the local transaction did commit
        answered.append(body)

    ch.basic_consume(checks, on_check, auto_ack=True)
    wait_for(lambda: answered, timeout=10, conn=conn, msg="a check-back")
    assert answered == [b"paid order"]
    got = collect(conn, conn.channel(), q, 0.8)
    assert got == [b"paid order"]


# ----------------------------------------------------------------- restarts (own brokers)
@pytest.fixture(params=["journal", "sqlite"])
def own_broker(request, tmp_path):
    store = None if request.param == "journal" else f"sqlite:///{tmp_path}/tx.db"
    b = BrokerProc(tmp_path / "data", store)
    yield b
    b.stop()


CHECK_MS = 3000  # c's x-transaction-timeout: the first check-back's delay, then doubling


def _check_due(n: int) -> int:
    """ms from the prepare to check-back ``n`` (0: the prepare itself), as in spec.Policy."""
    return sum(min(CHECK_MS << (k - 1), max(CHECK_MS, 60_000)) for k in range(1, n + 1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_prepared_messages_survive_broker_restart(own_broker, how):
    b = own_broker.start()
    conn = b.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("orders", durable=True)
    ch.queue_declare("orders.checks", durable=True)
    ch.basic_publish("", "orders", b"to-commit", half_props("a"))
    ch.basic_publish("", "orders", b"to-rollback", half_props("b"))
    c_sent = time.time()
    ch.basic_publish("", "orders", b"asked-later", half_props(
        "c", reply_to="orders.checks", **{"x-transaction-timeout": CHECK_MS}))
    c_confirmed = time.time()                          # c was prepared in [c_sent, c_confirmed]
    ch.basic_publish("", "orders", b"transient", half_props("d", persistent=False))
    conn.close()
    b.stop(hard=how == "kill9")                       # every prepare was confirmed: stored
    stopped = time.time()
    # down until c's first check-back is due for sure: it must not be replayed after
    time.sleep(max(0.0, c_confirmed + CHECK_MS / 1000 + 0.05 - time.time()))
    b.start()
    conn = b.connect()                                # answered once recovery is over
    started = time.time()
    ch = conn.channel()
    ch.confirm_delivery()
    assert message_count(ch, "orders") == 0            # still held, still invisible
    decide(ch, "commit", "a")
    decide(ch, "rollback", "b")
    assert_channel_error(404, "NOT_FOUND - no transaction 'd' in vhost '/'",  # transient: gone
                         decide, ch, "commit", "d")
    ch = conn.channel()
    ch.confirm_delivery()
    # c's check-back schedule resumed from its prepare time: the first check-back is the
    # first slot of that schedule due after the restart (the one due while the broker was
    # down is not replayed), never sent before its slot. Bounds from the test's clock
    # around the prepare, the stop and the start, so they hold however long those took.
    checks: list = []
    tag = ch.basic_consume("orders.checks", lambda c, m, p, body: checks.append(
        (time.time(), p)), auto_ack=True)
    wait_for(lambda: checks, timeout=60, conn=conn, msg="the check-back after the restart")
    ch.basic_cancel(tag)
    received, props = checks[0]
    n = props.headers["x-transaction-check"]
    assert props.correlation_id == "c" and n >= 1
    assert received >= c_sent + _check_due(n) / 1000, f"check-back {n} came before its slot"
    assert c_sent + _check_due(n - 1) / 1000 <= started, f"check-back {n - 1} was skipped"
    if stopped < c_sent + CHECK_MS / 1000:  # check-back 1 fell due while the broker was down
        assert n >= 2, "a check-back due during the downtime was replayed (or the schedule restarted)"
    decide(ch, "commit", "c")
    got = collect(conn, ch, "orders", 0.5)
    assert sorted(got) == [b"asked-later", b"to-commit"]
    conn.close()
    b.stop(hard=how == "kill9")                       # decisions are durable too
    b.start()
    conn = b.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    assert message_count(ch, "orders") == 0
    # a's half message was removed for good (not prepared again after the restart)
    assert_channel_error(404, "NOT_FOUND - no transaction 'a' in vhost '/'",
                         decide, ch, "rollback", "a")
    conn.close()
