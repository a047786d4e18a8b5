"""ha-mode exactly: a node that comes back never takes the mirror slot of a mirror that is
in sync (the in-sync set would be empty until the newcomer synced, and the queue's
confirmed messages on one node only). Real etcd, real nodes, pika."""
from __future__ import annotations

import time

import pika
import pytest

from .test_cluster_nodes import node
from .test_mirroring_more import isr_record, put_policy, start_together, wait_in_sync

N = 5000


@pytest.mark.timeout(180)
def test_a_returning_node_does_not_evict_an_in_sync_mirror(tmp_path, etcd, secret):
    nodes = [node(tmp_path, etcd, n, secret) for n in ("a", "b", "c")]
    a, b, c = nodes
    start_together(nodes)
    try:
        put_policy(a, "ex", "^ex\\.", {"ha-mode": "exactly", "ha-params": 2})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("ex.q", durable=True)
        for i in range(N):
            ch.basic_publish("", "ex.q", b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
        wait_in_sync(etcd, "ex.q", ["b"], timeout=30)
        b.stop()
        view = wait_in_sync(etcd, "ex.q", ["c"], timeout=30)  # c took b's place and synced
        assert view["mirrors"] == ["c"]

        b.start()
        # b is back: c keeps its slot, in sync all along (polled; a resync of 5,000
        # messages to b would leave the in-sync set empty for a while)
        seen = set()
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            record = isr_record(etcd, "ex.q")
            seen.add((tuple(record.get("mirrors", [])), tuple(record.get("in_sync", []))))
            time.sleep(0.05)
        assert seen == {(("c",), ("c",))}, seen
    finally:
        for n in nodes:
            n.stop()
