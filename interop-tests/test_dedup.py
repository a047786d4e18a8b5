"""x-message-deduplication exchange (RabbitMQ's message-deduplication plugin contract).

Skipped against a broker without the type (the reference RabbitMQ runs without the plugin)."""
from __future__ import annotations

import pika
import pika.exceptions
import pytest
from helpers import drain


def _declare(ch, name, **args):
    try:
        ch.exchange_declare(name, "x-message-deduplication", arguments=args)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-message-deduplication exchange type")
        raise


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
        ch.basic_publish(x, "", b"%d" % i,
                         pika.BasicProperties(headers={"x-deduplication-header": f"order-{i}"}))
    ch.connection.close()  # the producer "lost" its confirms and retries every publish
    ch = connect().channel()
    ch.confirm_delivery()
    for i in range(300):  # each is confirmed (acked), none is routed again
        ch.basic_publish(x, "", b"%d" % i,
                         pika.BasicProperties(headers={"x-deduplication-header": f"order-{i}"}))
    got = [int(b) for _m, _p, b in drain(ch, q)]
    assert got == list(range(300))


def test_missing_cache_size_is_406(connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-bad")
    try:
        ch.exchange_declare(x, "x-message-deduplication", arguments={"x-cache-size": 5})
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-message-deduplication exchange type")
        raise
    ch.exchange_delete(x)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.exchange_declare(x, "x-message-deduplication")
    assert info.value.reply_code == 406
    assert "x-cache-size must be a positive integer" in info.value.reply_text
