"""Consumer timeouts: a delivery left unacknowledged longer than the consumer timeout closes
its channel with 406 PRECONDITION_FAILED and is requeued (RabbitMQ's consumer_timeout).

The per-queue ``x-consumer-timeout`` argument is RabbitMQ 3.12+: against an older RabbitMQ
that part is skipped. The broker-wide timeout is a server setting: checked on a TrioMQ
started here with ``--consumer-timeout``.
"""
from __future__ import annotations

import time

import pika
import pytest

TEXT = ("PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
        "used: {ms} ms. This timeout value can be configured, see consumers doc guide to learn more")


def _version(conn) -> tuple[int, ...]:
    raw = conn._impl.server_properties.get("version", b"0")
    raw = raw.decode() if isinstance(raw, bytes) else str(raw)
    return tuple(int(p) for p in raw.split(".")[:2] if p.isdigit())


def _is_old_rabbitmq(conn) -> bool:
    product = conn._impl.server_properties.get("product", b"")
    product = product.decode() if isinstance(product, bytes) else str(product)
    return product == "RabbitMQ" and _version(conn) < (3, 12)


def _hold_until_closed(conn, ch, queue, timeout=30.0):
    """Consume ``queue`` without acking; returns (delivery bodies, the channel's close)."""
    got: list = []
    closes: list = []
    ch._impl.add_on_close_callback(lambda c, reason: closes.append(reason))
    ch.basic_consume(queue, lambda c, m, p, b: got.append(b), auto_ack=False)
    deadline = time.monotonic() + timeout
    while not closes:
        assert time.monotonic() < deadline, f"the channel was not closed within {timeout}s"
        conn.process_data_events(0.1)
    assert isinstance(closes[0], pika.exceptions.ChannelClosedByBroker), closes
    return got, closes[0]


def _redelivered(connect, queue, timeout=10.0):
    ch = connect().channel()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m, _, body = ch.basic_get(queue, auto_ack=True)
        if m is not None:
            return m.redelivered, body
        time.sleep(0.05)
    raise AssertionError("the message was not requeued")


def test_queue_argument_closes_the_channel_and_requeues(connect, uid, cleanup):
    conn = connect()
    if _is_old_rabbitmq(conn):
        pytest.skip("x-consumer-timeout is RabbitMQ 3.12+")
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, arguments={"x-consumer-timeout": 1000})
    ch.basic_publish("", q, b"held")
    started = time.monotonic()
    got, close = _hold_until_closed(conn, ch, q)
    assert got == [b"held"]
    assert (close.reply_code, close.reply_text) == (406, TEXT.format(ms=1000))
    assert time.monotonic() - started >= 1.0
    assert conn.is_open  # only the channel
    assert _redelivered(connect, q) == (True, b"held")


def test_acked_in_time_keeps_the_channel(connect, uid, cleanup):
    conn = connect()
    if _is_old_rabbitmq(conn):
        pytest.skip("x-consumer-timeout is RabbitMQ 3.12+")
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, arguments={"x-consumer-timeout": 3000})  # a client stalled by load
    acked: list = []

    def on_message(c, m, p, b):
        c.basic_ack(m.delivery_tag)
        acked.append(b)

    ch.basic_consume(q, on_message)
    deadline = time.monotonic() + 8.0  # a few timeouts' worth of prompt acks
    i = 0
    while time.monotonic() < deadline:
        ch.basic_publish("", q, str(i).encode())
        i += 1
        conn.process_data_events(0.2)
    assert ch.is_open and len(acked) > 0


def test_invalid_queue_argument(connect, uid):
    conn = connect()
    if _is_old_rabbitmq(conn):
        pytest.skip("x-consumer-timeout is RabbitMQ 3.12+")
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(uid, arguments={"x-consumer-timeout": -1})
    assert ei.value.reply_code == 406
    assert "invalid arg 'x-consumer-timeout'" in ei.value.reply_text


def test_broker_wide_timeout(tmp_path, external_broker):
    if external_broker:
        pytest.skip("starts a TrioMQ with --consumer-timeout (a server setting on RabbitMQ)")
    from brokerproc import BrokerProc
    b = BrokerProc(tmp_path / "data", "memory", extra=["--consumer-timeout", "1000"]).start()
    try:
        conn = b.connect()
        ch = conn.channel()
        ch.queue_declare("work")
        ch.basic_publish("", "work", b"job")
        got, close = _hold_until_closed(conn, ch, "work")
        assert got == [b"job"]
        assert (close.reply_code, close.reply_text) == (406, TEXT.format(ms=1000))
        assert _redelivered(b.connect, "work") == (True, b"job")
    finally:
        b.stop()
