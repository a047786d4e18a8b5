"""Names and keys with NUL and odd characters, as RabbitMQ takes them.

RabbitMQ accepts any UTF-8 shortstr as a queue or exchange name and a routing key, NUL
included: a durable queue and exchange named with NUL, bound with a NUL routing key, take
a persistent publish (confirmed) and hand it back with the same names. TrioMQ must do
the same on every store (restarts on each backend: tests/persistence/test_store_names.py).
"""
from __future__ import annotations

import pika
import pytest

NAMES = ["\x00", "nul\x00in\x00name", "\uf700\uf7ff", "é\x00😀"]


@pytest.mark.parametrize("odd", NAMES, ids=["nul", "nuls", "escape-block", "mixed"])
def test_durable_names_and_keys_with_nul(ch, uid, cleanup, odd):
    queue = cleanup.queue(f"{uid}-q{odd}")
    exchange = cleanup.exchange(f"{uid}-x{odd}")
    key = f"k{odd}"
    ch.confirm_delivery()
    ch.exchange_declare(exchange, "direct", durable=True)
    assert ch.queue_declare(queue, durable=True).method.queue == queue
    ch.queue_bind(queue, exchange, routing_key=key)
    ch.basic_publish(exchange, key, b"body\x00", pika.BasicProperties(
        delivery_mode=2, headers={"h\x00": "v\x00", "nested": {"n": "\x00"}}), mandatory=True)
    method, props, body = ch.basic_get(queue, auto_ack=True)
    assert method is not None
    assert (method.exchange, method.routing_key, body) == (exchange, key, b"body\x00")
    assert props.headers == {"h\x00": "v\x00", "nested": {"n": "\x00"}}
    assert ch.queue_declare(queue, durable=True, passive=True).method.message_count == 0
