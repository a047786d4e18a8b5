"""Direct reply-to across a cluster: a requester on one node, an RPC server on another. The
reply name says which node the requester is on; a reply published on the other node goes to
it over the node-to-node link (two TrioMQ nodes on a REAL etcd, driven by pika)."""
from __future__ import annotations

import time

import pika
import pytest

from .test_cluster_nodes import node

REPLY_TO = "amq.rabbitmq.reply-to"


def _wait(conn, pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"{what} not seen within {timeout}s"
        conn.process_data_events(0.05)


@pytest.mark.timeout(90)
def test_reply_published_on_another_node(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        # the requester on a (the request's way to the server does not matter here: the
        # server takes it from a, and answers on b)
        ca = a.connect()
        cha = ca.channel()
        replies: list = []
        cha.basic_consume(REPLY_TO, lambda c, m, p, body: replies.append((m, p, body)),
                          auto_ack=True)
        cha.queue_declare("rpc-requests")
        cha.basic_publish("", "rpc-requests", b"ping",
                          pika.BasicProperties(reply_to=REPLY_TO, correlation_id="1"))
        m, props, body = None, None, None
        deadline = time.monotonic() + 10
        while m is None:
            assert time.monotonic() < deadline
            m, props, body = cha.basic_get("rpc-requests", auto_ack=True)
        name = props.reply_to
        assert name.startswith(REPLY_TO + ".")

        cb = b.connect()
        chb = cb.channel()
        # b knows the name's node: a passive declare answers for it
        ok = chb.queue_declare(name, passive=True).method
        assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 1)
        chb.confirm_delivery()
        returned: list = []
        chb.add_on_return_callback(lambda c, m_, p, b_: returned.append(m_.reply_code))
        for i in range(20):
            chb.basic_publish("", name, f"pong-{i}".encode(),
                              pika.BasicProperties(correlation_id=str(i)))
        _wait(ca, lambda: len(replies) == 20, what="the replies from b")
        assert [r[2] for r in replies] == [f"pong-{i}".encode() for i in range(20)]
        assert all(r[0].routing_key == name and r[0].exchange == "" for r in replies)
        assert returned == []

        # the requester gone: b drops the reply (a mandatory one is returned)
        ca.close()
        with pytest.raises(pika.exceptions.UnroutableError):
            chb.basic_publish("", name, b"late", mandatory=True)
        assert cb.is_open
    finally:
        b.stop()
        a.stop()
