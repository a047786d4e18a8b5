"""``--workers 2``: transient queues (non-durable, exclusive, server-named) are reached from
both processes, as from one broker. Real supervisor, real etcd, real pika."""
from __future__ import annotations

import time

import pika
import pytest

from .test_workers import Workers, _by_process, _connect, _known_on

REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.fixture
def pair(tmp_path):
    """The workers, and one connection on each process: (workers, a, b, every connection)."""
    w = Workers(tmp_path)
    conns = [_connect(w) for _ in range(12)]
    try:
        groups = _by_process(w, conns)
        assert all(groups.values()), {p: len(g) for p, g in groups.items()}
        (a, *_), (b, *_) = groups.values()
        yield w, a, b
    finally:
        for c in conns:
            if c.is_open:
                c.close()
        w.stop()


def _next(ch, queue: str, timeout: float = 30.0):
    for method, props, body in ch.consume(queue, inactivity_timeout=timeout):
        assert method is not None, f"nothing from {queue}"
        return method, props, body
    raise AssertionError("consume ended")


@pytest.mark.timeout(180)
def test_rpc_reply_queue_and_request_queue_across_processes(pair):
    _w, a, b = pair
    # the responder on B: a non-durable request queue, declared there
    server = b.channel()
    server.queue_declare("rpc-req", durable=False)
    _known_on(a, "rpc-req", expect_locked=False)
    # the requester on A: an exclusive, server-named reply queue (pika's RPC tutorial)
    client = a.channel()
    reply = client.queue_declare("", exclusive=True).method.queue
    _known_on(b, reply, expect_locked=True)
    client.basic_publish("", "rpc-req", b"ping",
                         pika.BasicProperties(reply_to=reply, correlation_id="c1"))
    method, props, body = _next(server, "rpc-req")
    assert body == b"ping"
    server.confirm_delivery()
    server.basic_publish("", props.reply_to, b"pong",  # mandatory: returned if not routed
                         pika.BasicProperties(correlation_id=props.correlation_id),
                         mandatory=True)
    server.basic_ack(method.delivery_tag)
    server.cancel()
    _m, rprops, rbody = _next(client, reply)
    assert (rbody, rprops.correlation_id) == (b"pong", "c1")
    client.cancel()
    # exclusive: B's connection may not consume it
    other = b.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        other.basic_consume(reply, lambda *args: None)
    assert refused.value.reply_code == 405
    # the owner's connection closes: the queue is gone on B too
    a.close()
    probe = b.channel()
    deadline = time.monotonic() + 30
    while True:
        try:
            probe.queue_declare(reply, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                break
            assert exc.reply_code == 405, exc
        assert time.monotonic() < deadline, "the reply queue outlived its owner on B"
        time.sleep(0.05)
        probe = b.channel()


@pytest.mark.timeout(180)
def test_direct_reply_to_across_processes(pair):
    _w, a, b = pair
    server = b.channel()
    server.queue_declare("rpc-direct", durable=False)
    _known_on(a, "rpc-direct", expect_locked=False)
    client = a.channel()
    replies: list = []
    client.basic_consume(REPLY_TO, lambda c, m, p, body: replies.append((p, body)),
                         auto_ack=True)
    for i in range(5):
        client.basic_publish("", "rpc-direct", f"ping-{i}".encode(),
                             pika.BasicProperties(reply_to=REPLY_TO, correlation_id=str(i)))
    server.confirm_delivery()
    for _ in range(5):
        method, props, body = _next(server, "rpc-direct")
        assert props.reply_to.startswith(REPLY_TO + ".")
        server.basic_publish("", props.reply_to, body.replace(b"ping", b"pong"),
                             pika.BasicProperties(correlation_id=props.correlation_id))
        server.basic_ack(method.delivery_tag)
    deadline = time.monotonic() + 30
    while len(replies) < 5:
        assert time.monotonic() < deadline, f"replies: {replies}"
        a.process_data_events(0.05)
    assert sorted(body for _p, body in replies) == [f"pong-{i}".encode() for i in range(5)]


@pytest.mark.timeout(180)
def test_fanout_to_an_exclusive_queue_bound_on_the_other_process(pair):
    _w, a, b = pair
    sub = a.channel()
    sub.exchange_declare("news", "fanout", durable=True)
    q = sub.queue_declare("", exclusive=True).method.queue
    sub.queue_bind(q, "news")
    _known_on(b, q, expect_locked=True)
    pub = b.channel()
    pub.confirm_delivery()
    deadline = time.monotonic() + 30
    while True:  # returned (unroutable) until B has the binding: those are not delivered
        try:
            pub.basic_publish("news", "", b"hello", mandatory=True)
            break
        except pika.exceptions.UnroutableError:
            assert time.monotonic() < deadline, "the binding never reached B"
            time.sleep(0.05)
    _m, _p, body = _next(sub, q)
    assert body == b"hello"
    sub.cancel()
    # unbound on A: B routes nothing there any more
    sub.queue_unbind(q, "news")
    deadline = time.monotonic() + 30
    while True:
        try:
            pub.basic_publish("news", "", b"late", mandatory=True)
        except pika.exceptions.UnroutableError:
            break
        assert time.monotonic() < deadline, "the unbind never reached B"
        time.sleep(0.05)
