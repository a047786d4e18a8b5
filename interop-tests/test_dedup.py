"""Publisher deduplication (RabbitMQ's message-deduplication plugin contract) with pika.

The exchange (``x-message-deduplication``) runs against any broker that has the type (the
reference RabbitMQ here runs without the plugin: skipped there on 503). Queue-level
deduplication and the cache on disk across a restart and a kill -9 are TrioMQ-only (a
RabbitMQ without the plugin ignores the queue argument); those tests start their own brokers.
"""
from __future__ import annotations

import socket
import time

import pika
import pika.exceptions
import pytest
from brokerproc import BrokerProc
from helpers import drain

HEADER = "x-deduplication-header"


def _declare(ch, name, **args):
    try:
        ch.exchange_declare(name, "x-message-deduplication", arguments=args)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-message-deduplication exchange type")
        raise


def _props(i: int) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, headers={HEADER: f"order-{i}"})


def retrying_producer(connect, exchange: str, routing_key: str, n: int, cut_at: int,
                      in_flight: int = 20, probe_queue: str | None = None) -> int:
    """Publish 0..n-1 with confirms; at ``cut_at`` send ``in_flight`` publishes without
    waiting, then shut the socket down (no connection.close): their confirms are lost.
    Reconnect and republish everything not confirmed, as an at-least-once producer does.
    Returns how many messages ``probe_queue`` held before the retry (the first copies)."""
    conn = connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(cut_at):
        ch.basic_publish(exchange, routing_key, b"%d" % i, _props(i))
    for i in range(cut_at, cut_at + in_flight):  # written, confirms never read
        ch._impl.basic_publish(exchange, routing_key, b"%d" % i, _props(i))
    conn.process_data_events(0)
    conn._impl._transport._sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(pika.exceptions.AMQPError):
        for _ in range(50):
            conn.process_data_events(0.05)
    conn = connect()
    ch = conn.channel()
    held = 0
    if probe_queue is not None:
        deadline = time.monotonic() + 5
        while held < cut_at + in_flight and time.monotonic() < deadline:
            held = ch.queue_declare(probe_queue, passive=True).method.message_count
            time.sleep(0.05)
    ch.confirm_delivery()
    for i in range(cut_at, n):  # each is confirmed; the in-flight ones are not routed again
        ch.basic_publish(exchange, routing_key, b"%d" % i, _props(i))
    conn.close()
    return held


def test_a_producer_that_retries_after_its_socket_is_cut_is_not_duplicated(connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-dx")
    q = cleanup.queue(uid)
    _declare(ch, x, **{"x-cache-size": 10_000})
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    held = retrying_producer(connect, x, "", 300, cut_at=100, probe_queue=q)
    assert held == 120  # the in-flight publishes were routed: the retry repeats them
    got = [int(b) for _m, _p, b in drain(ch, q)]
    assert got == list(range(300))


def test_a_producer_that_retries_everything_after_a_reconnect_is_not_duplicated(
        connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-dx")
    q = cleanup.queue(uid)
    _declare(ch, x, **{"x-cache-size": 10_000})
    ch.queue_declare(q)
    ch.queue_bind(q, x)
    ch.confirm_delivery()
    for i in range(300):
        ch.basic_publish(x, "", b"%d" % i, _props(i))
    ch.connection.close()  # the producer "lost" its confirms and retries every publish
    ch = connect().channel()
    ch.confirm_delivery()
    for i in range(300):  # each is confirmed (acked), none is routed again
        ch.basic_publish(x, "", b"%d" % i, _props(i))
    got = [int(b) for _m, _p, b in drain(ch, q)]
    assert got == list(range(300))


def test_queue_level_dedup_with_a_retrying_producer(connect, uid, cleanup, external_broker):
    if external_broker:
        pytest.skip("queue-level deduplication needs the plugin (TrioMQ-only here)")
    ch = connect().channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q, arguments={"x-message-deduplication": True})
    held = retrying_producer(connect, "", q, 200, cut_at=50, probe_queue=q)
    assert held == 70
    got = [int(b) for _m, _p, b in drain(ch, q)]
    assert got == list(range(200))
    # consumed (acked): the values are free again
    ch.basic_publish("", q, b"again", _props(0))
    assert [b for _m, _p, b in drain(ch, q)] == [b"again"]


def test_missing_cache_size_is_406(connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-bad")
    _declare(ch, x, **{"x-cache-size": 5})
    ch.exchange_delete(x)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, "x-message-deduplication")
    assert info.value.reply_code == 406
    assert "'x-cache-size' must be an integer greater than 0" in info.value.reply_text


@pytest.mark.parametrize(("args", "text"), [
    ({"x-cache-size": 5, "x-cache-ttl": 0}, "'x-cache-ttl' must be an integer greater than 0"),
    ({"x-cache-size": 5, "x-cache-persistence": "tape"},
     "'x-cache-persistence' must be either 'disk' or 'memory'"),
])
def test_bad_exchange_arguments_are_406_and_nothing_is_declared(connect, uid, cleanup, args, text):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-bad")
    _declare(ch, x, **{"x-cache-size": 5})
    ch.exchange_delete(x)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, "x-message-deduplication", arguments=args)
    assert info.value.reply_code == 406 and text in info.value.reply_text
    ch = connect().channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, "x-message-deduplication", passive=True)
    assert info.value.reply_code == 404


def test_a_non_boolean_queue_argument_is_406_naming_it(connect, uid, cleanup, external_broker):
    if external_broker:
        pytest.skip("TrioMQ-only: RabbitMQ without the plugin ignores the argument")
    ch = connect().channel()
    q = cleanup.queue(uid)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare(q, arguments={"x-message-deduplication": "yes"})
    assert info.value.reply_code == 406
    assert info.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-message-deduplication' "
                                     f"for queue '{q}' in vhost '/': {{unacceptable_type,longstr}}")


# ------------------------------------------------------------------ restarts (TrioMQ-only)
@pytest.fixture(params=["journal", "sqlite"])
def store_url(request, tmp_path, external_broker):
    if external_broker:
        pytest.skip("starts its own TrioMQ brokers")
    return "journal" if request.param == "journal" else f"sqlite:///{tmp_path}/store.db"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hard", [False, True], ids=["restart", "kill9"])
def test_no_duplicate_gets_through_a_broker_restart(tmp_path, store_url, hard):
    b = BrokerProc(tmp_path / "data", store_url).start()
    try:
        ch = b.connect().channel()
        ch.exchange_declare("dx", "x-message-deduplication", durable=True,
                            arguments={"x-cache-size": 1000, "x-cache-persistence": "disk"})
        ch.queue_declare("via-exchange", durable=True)
        ch.queue_bind("via-exchange", "dx")
        ch.queue_declare("dedup-queue", durable=True, arguments={"x-message-deduplication": True})
        ch.confirm_delivery()
        for i in range(200):
            ch.basic_publish("dx", "", b"%d" % i, _props(i))
            ch.basic_publish("", "dedup-queue", b"%d" % i, _props(i))
        # consumed and acked from the exchange's queue: only the exchange's cache remembers
        assert [int(body) for _m, _p, body in drain(ch, "via-exchange")] == list(range(200))
        # a confirmed publish covers the acks above too: none of them comes back after a kill
        ch.queue_declare("fence", durable=True)
        ch.basic_publish("", "fence", b"", pika.BasicProperties(delivery_mode=2))
        b.stop(hard=hard)
        b.start()
        ch = b.connect().channel()
        ch.confirm_delivery()
        for i in range(200):  # the producer retries everything after the broker came back
            ch.basic_publish("dx", "", b"%d" % i, _props(i))
            ch.basic_publish("", "dedup-queue", b"%d" % i, _props(i))
        ch.basic_publish("dx", "", b"new", _props(200))
        assert [body for _m, _p, body in drain(ch, "via-exchange")] == [b"new"]
        assert [int(body) for _m, _p, body in drain(ch, "dedup-queue")] == list(range(200))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:  # internal: hidden
            ch.queue_declare("amq.triomq.dedup.dx", passive=True)
        assert info.value.reply_code == 404
    finally:
        b.stop()
