"""A quorum queue in a cluster: its x-queue-leader-locator places it (as the classic
queue's x-queue-master-locator does), and the node it goes to creates it as a quorum
queue (the cluster's forwarded declare names the type's own locator argument, which a
quorum queue accepts; x-queue-master-locator it refuses)."""
from __future__ import annotations

import pika
import pytest

from .test_cluster_nodes import eventually, node, status


def _has_queue(broker, name):
    def check():
        c = broker.connect()
        try:
            c.channel().queue_declare(name, durable=True, passive=True)
        finally:
            if c.is_open:
                c.close()
    return check


@pytest.mark.timeout(90)
def test_leader_locator_places_a_quorum_queue(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        ca = a.connect()
        cha = ca.channel()
        cb = b.connect()
        cb.channel().queue_declare("on-b", durable=True)
        eventually(_has_queue(a, "on-b"))  # a knows b (and its queues)
        for name in ("on-a1", "on-a2"):  # a masters two queues, b one
            cha.queue_declare(name, durable=True)
            eventually(_has_queue(b, name))  # their records went round the cluster
        cha.queue_declare("qq", durable=True, arguments={
            "x-queue-type": "quorum", "x-queue-leader-locator": "balanced",
            "x-quorum-initial-group-size": 2})
        def placed():
            masters = {q["name"]: q["master"] for q in status(etcd)["queues"]}
            assert masters.get("qq") == "b", masters
        eventually(placed, timeout=15)
        cha.confirm_delivery()
        cha.basic_publish("", "qq", b"to b", pika.BasicProperties(delivery_mode=2),
                          mandatory=True)
        chb = cb.channel()
        # a redeclare without the locator (and without the type) is equivalent on b
        assert chb.queue_declare("qq", durable=True, arguments={
            "x-quorum-initial-group-size": 2}).method.message_count == 1
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            cb.channel().queue_declare("qq", durable=True,
                                       arguments={"x-queue-type": "classic"})
        assert "inequivalent arg 'x-queue-type'" in refused.value.reply_text
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ca.channel().queue_declare("bad", durable=True, arguments={
                "x-queue-type": "quorum", "x-queue-leader-locator": "nearest"})
        assert refused.value.reply_text.endswith("invalid_queue_locator_arg")
    finally:
        a.stop()
        b.stop()
