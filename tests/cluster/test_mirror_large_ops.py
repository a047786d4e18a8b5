"""Operations on a mirrored queue that touch tens of thousands of messages at once (a purge,
one basic.ack multiple) reach the mirror as several link messages, each in frames of the
negotiated size: the link stays up, the mirror stays in sync (no resync), and the mirror's
copy is what the master holds (checked by promoting it). Real etcd, real nodes, pika."""
from __future__ import annotations

import pika
import pytest

from .test_cluster_nodes import eventually, node
from .test_mirroring_more import put_policy, wait_in_sync, wait_master

N = 30001


def publish_many(broker, queue: str, n: int) -> None:
    conn = broker.connect()
    ch = conn.channel()
    for i in range(n):
        ch.basic_publish("", queue, b"m%d" % i)
    ch.confirm_delivery()  # the confirm of one more: every earlier publish was routed
    ch.basic_publish("", queue, b"fence")
    conn.close()


def depth(broker, queue: str) -> int:
    conn = broker.connect()
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def assert_link_intact(*brokers) -> None:
    for b in brokers:
        log = b.log()
        assert "fell out of sync" not in log, log[-3000:]
        assert "FRAME_ERROR" not in log and "frame_too_large" not in log, log[-3000:]


@pytest.mark.timeout(300)
def test_purge_and_ack_multiple_of_30001_keep_the_mirror_in_sync(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
        conn = a.connect()
        conn.channel().queue_declare("ha.big", durable=True)
        conn.close()
        wait_in_sync(etcd, "ha.big", ["b"])

        # a purge of 30,001 messages: one leaving op per message
        publish_many(a, "ha.big", N - 1)
        assert depth(a, "ha.big") == N
        conn = a.connect()
        assert conn.channel().queue_purge("ha.big").method.message_count == N
        conn.close()

        # one basic.ack(multiple=true) over 30,001 deliveries
        publish_many(a, "ha.big", N - 1)
        conn = a.connect()
        ch = conn.channel()
        ch.basic_qos(prefetch_count=0)
        tags: list[int] = []
        for method, _, _body in ch.consume("ha.big", inactivity_timeout=30):
            assert method is not None, f"only {len(tags)} delivered"
            tags.append(method.delivery_tag)
            if len(tags) == N:
                break
        ch.basic_ack(tags[-1], multiple=True)
        conn.close()
        eventually(lambda: depth(a, "ha.big") == 0 or (_ for _ in ()).throw(AssertionError()),
                   timeout=30)

        # one more, confirmed: it is on the mirror too
        conn = a.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", "ha.big", b"last", pika.BasicProperties(delivery_mode=2),
                         mandatory=True)
        conn.close()
        assert_link_intact(a, b)
        wait_in_sync(etcd, "ha.big", ["b"], timeout=5)

        # the mirror's copy holds exactly what the master held: promote it
        a.kill()
        wait_master(etcd, "ha.big", "b", timeout=30)
        conn = b.connect()
        ch = conn.channel()
        got = []
        for method, _, body in ch.consume("ha.big", inactivity_timeout=3):
            if method is None:
                break
            got.append(body)
            ch.basic_ack(method.delivery_tag)
        conn.close()
        assert got == [b"last"], (len(got), got[:5])
    finally:
        b.stop()
        a.stop()
