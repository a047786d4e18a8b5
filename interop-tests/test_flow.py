"""Flow control: publishers that outrun a slow consumer.

Two publishers with confirms publish as fast as they can into a queue whose one consumer
(prefetch 10, manual acks) takes a couple of milliseconds per message. TrioMQ slows the
publishers (it stops reading their sockets) once the queue grows past its flow threshold, so
the queue stays bounded. RabbitMQ's credit flow throttles publishers only relative to how fast
the queue *process* keeps up, not to how fast consumers ack, so its queue may keep growing:
the bound is asserted where the broker meets it by design (TrioMQ), and every message must
be confirmed on both.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest

PUBLISH_SECONDS = 3.0
BOUND = 5000


def _publisher(connect, queue, stop, counts, errors):
    try:
        conn = connect()
        ch = conn.channel()
        ch.confirm_delivery()
        n = 0
        while not stop.is_set():
            ch.basic_publish("", queue, b"x" * 64)
            n += 1
        counts.append(n)
        conn.close()
    except Exception as exc:  # reported by the test
        errors.append(exc)


def _consumer(connect, queue, stop, consumed, errors):
    try:
        conn = connect()
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        for method, _props, _body in ch.consume(queue, inactivity_timeout=0.05):
            if method is not None:
                time.sleep(0.002)  # a slow consumer
                ch.basic_ack(method.delivery_tag)
                consumed[0] += 1
            elif stop.is_set():
                break
        ch.cancel()
        conn.close()
    except Exception as exc:
        errors.append(exc)


@pytest.mark.timeout(120)
def test_two_confirmed_publishers_and_a_slow_consumer(connect, external_broker):
    queue = f"flow-{uuid.uuid4().hex[:8]}"
    admin = connect()
    ach = admin.channel()
    ach.queue_declare(queue)
    stop_pub, stop_cons = threading.Event(), threading.Event()
    counts: list[int] = []
    consumed = [0]
    errors: list[Exception] = []
    cons = threading.Thread(target=_consumer, args=(connect, queue, stop_cons, consumed, errors))
    cons.start()
    # flow holds publishers only while the queue has a consumer (without one nothing could
    # release them): publish once the consumer is there (it started late under load)
    guard = time.monotonic() + 30
    while ach.queue_declare(queue, passive=True).method.consumer_count < 1:
        assert not errors and time.monotonic() < guard, errors
        admin.sleep(0.05)
    pubs = [threading.Thread(target=_publisher, args=(connect, queue, stop_pub, counts, errors))
            for _ in range(2)]
    for t in pubs:
        t.start()
    longest = 0
    deadline = time.monotonic() + PUBLISH_SECONDS
    while time.monotonic() < deadline:
        longest = max(longest, ach.queue_declare(queue, passive=True).method.message_count)
        admin.sleep(0.1)
    stop_pub.set()
    for t in pubs:
        t.join(30)
    published = sum(counts)
    ach.queue_purge(queue)  # the consumer need not work through a backlog
    stop_cons.set()
    cons.join(30)
    assert not errors, errors
    assert len(counts) == 2 and published > 0
    assert consumed[0] > 0
    ach.queue_delete(queue)
    admin.close()
    if external_broker and longest >= BOUND:
        pytest.skip(f"the reference broker let the queue grow to {longest} messages "
                    f"({published} published): its credit flow does not follow consumers")
    assert longest < BOUND, (longest, published)
    print(f"longest queue: {longest} messages, {published} published")
