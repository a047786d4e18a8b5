"""A mirror keeps its copy on disk and, restarted, catches up from it: the master sends only
what entered while it was away and tells it what left, instead of every message again. The
caught-up copy is exact (checked by promoting it). Real etcd, real nodes, pika."""
from __future__ import annotations

import re

import pika
import pytest

from .test_cluster_nodes import node
from .test_mirroring_more import put_policy, wait_in_sync, wait_master

N = 20000


def publish(broker, bodies) -> None:
    conn = broker.connect()
    ch = conn.channel()
    for body in bodies:
        ch.basic_publish("", "ha.c", body, pika.BasicProperties(delivery_mode=2))
    ch.confirm_delivery()  # one confirmed after them: every earlier one was routed
    ch.basic_publish("", "ha.c", b"fence", pika.BasicProperties(delivery_mode=2))
    conn.close()


@pytest.mark.timeout(240)
@pytest.mark.slow  # mirrored queues (deprecated): make test-slow
def test_a_restarted_mirror_catches_up_from_its_own_copy(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
        conn = a.connect()
        conn.channel().queue_declare("ha.c", durable=True)
        conn.close()
        wait_in_sync(etcd, "ha.c", ["b"])
        publish(a, [b"m%d" % i for i in range(N)])
        wait_in_sync(etcd, "ha.c", ["b"])

        b.kill()
        wait_in_sync(etcd, "ha.c", [], timeout=30)
        # while b is away: 1,000 consumed from the head, 500 more published
        conn = a.connect()
        ch = conn.channel()
        for _ in range(1000):
            method, _, _ = ch.basic_get("ha.c")
            ch.basic_ack(method.delivery_tag)
        conn.close()
        publish(a, [b"n%d" % i for i in range(500)])

        b.start()
        wait_in_sync(etcd, "ha.c", ["b"], timeout=60)
        found = re.findall(r"mirror 'b' catches up from its own copy \((\d+) messages kept, "
                           r"(\d+) to send\)", a.log())
        # kept: what b had and the queue still holds; sent: only the 500 (and a fence)
        assert found and found[-1] == (str(N + 1 - 1000), "501"), (found, a.log()[-2000:])
        assert "read from disk (20001 messages, complete)" in b.log(), b.log()[-2000:]

        # the caught-up copy is exact: promote it
        a.kill()
        wait_master(etcd, "ha.c", "b", timeout=30)
        conn = b.connect()
        ch = conn.channel()
        got = []
        while True:
            method, _, body = ch.basic_get("ha.c", auto_ack=True)
            if method is None:
                break
            got.append(body)
        conn.close()
        want = [b"m%d" % i for i in range(1000, N)] + [b"fence"] + \
            [b"n%d" % i for i in range(500)] + [b"fence"]
        assert got == want, (len(got), len(want), got[:3], got[-3:])
    finally:
        b.stop()
        a.stop()
