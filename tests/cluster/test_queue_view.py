"""The same queue view from every node: ``/api/queues`` (list and one queue) and ``ctl
list_queues`` asked on the master, on its mirror and on a node that is neither show the
master's counts (ready and unacknowledged), its node, members, online nodes, in-sync
mirrors and term. Real etcd, real nodes, pika, the management HTTP API."""
from __future__ import annotations

import json

import httpx
import pika
import pytest

from .test_cluster_nodes import cli, eventually, node
from .test_mirroring import AUTH, queue_view
from .test_mirroring_more import put_policy, start_together, wait_in_sync

FIELDS = ("messages", "messages_ready", "messages_unacknowledged", "node", "leader",
          "members", "online", "slave_nodes", "synchronised_slave_nodes", "term", "state")


@pytest.mark.timeout(120)
def test_every_node_shows_the_masters_view_of_a_queue(tmp_path, etcd, secret):
    nodes = [node(tmp_path, etcd, n, secret) for n in ("a", "b", "c")]
    a, b, c = nodes
    start_together(nodes)
    try:
        put_policy(a, "ex", "^ex\\.", {"ha-mode": "exactly", "ha-params": 2})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("ex.q", durable=True)
        ch.confirm_delivery()
        for body in (b"one", b"two"):
            ch.basic_publish("", "ex.q", body, pika.BasicProperties(delivery_mode=2))
        wait_in_sync(etcd, "ex.q", ["b"], timeout=30)
        epoch = queue_view(etcd, "ex.q")["epoch"]
        # one of the two delivered and not acknowledged, to a consumer on c
        cc = c.connect()
        chc = cc.channel()
        chc.basic_qos(prefetch_count=1)
        method, _, _ = next(chc.consume("ex.q", inactivity_timeout=10))
        assert method is not None

        want = {"messages": 2, "messages_ready": 1, "messages_unacknowledged": 1,
                "node": "a", "leader": "a", "members": ["a", "b"], "online": ["a", "b"],
                "slave_nodes": ["b"], "synchronised_slave_nodes": ["b"], "term": epoch,
                "state": "running"}

        def seen_on(broker) -> tuple[dict, dict, dict]:
            listed = httpx.get(f"{broker.http_url}/api/queues/%2F", auth=AUTH).json()
            one = httpx.get(f"{broker.http_url}/api/queues/%2F/ex.q", auth=AUTH).json()
            p = cli("ctl", "--url", broker.http_url, "--formatter", "json", "list_queues",
                    "name", "messages", "messages_ready", "messages_unacknowledged", "node",
                    "leader", "members", "online", "slave_nodes", "synchronised_slave_nodes",
                    "term", "state")
            assert p.returncode == 0, p.stderr
            ctl = next(r for r in json.loads(p.stdout) if r["name"] == "ex.q")
            row = next(q for q in listed if q["name"] == "ex.q")
            return ({k: row.get(k) for k in FIELDS}, {k: one.get(k) for k in FIELDS},
                    {k: ctl.get(k) for k in FIELDS})

        for broker in (a, b, c):
            def check(broker=broker):
                listed, one, ctl = seen_on(broker)
                assert listed == want, (broker.port, listed)
                assert one == want, (broker.port, one)
                assert ctl == want, (broker.port, ctl)
            eventually(check, timeout=10)
        cc.close()
        conn.close()
    finally:
        for n in nodes:
            n.stop()
