"""Consumer selectors (`x-filter`, JMS-selector syntax) with pika. TrioMQ only: RabbitMQ
ignores unknown consumer arguments, so there is nothing to compare against."""
from __future__ import annotations

import time

import pika
import pytest
from helpers import assert_channel_error


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("x-filter is a TrioMQ consumer argument")


def _consume(ch, queue, selector, got):
    ch.basic_consume(queue, lambda c, m, p, b: got.append(b.decode()), auto_ack=True,
                     arguments={"x-filter": selector})


def test_filtered_consumers_share_a_queue(connect, uid, cleanup):
    conn = connect()
    ch = conn.channel()
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    eu, big = [], []
    _consume(ch, q, "region LIKE 'eu-%' AND amount < 100", eu)
    _consume(ch, q, "amount >= 100", big)
    orders = [("eu-west", 10), ("us-east", 500), ("eu-north", 99), ("us-west", 5), ("eu-west", 250)]
    for i, (region, amount) in enumerate(orders):
        ch.basic_publish("", q, f"o{i}".encode(),
                         pika.BasicProperties(headers={"region": region, "amount": amount}))
    deadline = time.monotonic() + 5
    while len(eu) + len(big) < 4 and time.monotonic() < deadline:
        conn.process_data_events(0.05)
    assert eu == ["o0", "o2"]
    assert big == ["o1", "o4"]
    # o3 (us-west, 5) matches nobody: it waits in the queue
    assert ch.queue_declare(q, passive=True).method.message_count == 1


def test_invalid_filter_is_refused_at_consume(ch, uid, cleanup):
    q = cleanup.queue(uid)
    ch.queue_declare(q)
    text = assert_channel_error(406, "PRECONDITION_FAILED - invalid arg 'x-filter' for consumer: at position 9",
                                ch.basic_consume, q, lambda *a: None,
                                arguments={"x-filter": "amount >> 3"})
    assert "unexpected" in text
