"""Mirrored queues by policy on a REAL etcd: a queue mirrored on a second node keeps every
confirmed message when its master is killed (kill -9); the in-sync mirror is promoted, the
messages that were not acknowledged come back with redelivered=true; a bad ha-* policy is
refused naming the key."""
from __future__ import annotations

import time

import httpx
import pika
import pytest

from .test_cluster_nodes import eventually, node, status

AUTH = ("guest", "guest")


def queue_view(etcd, name):
    for q in status(etcd)["queues"]:
        if q["name"] == name:
            return q
    raise AssertionError(f"queue {name!r} not in cluster status")


@pytest.mark.timeout(120)
def test_mirrored_queue_survives_kill9_of_its_master(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        # a bad policy is refused with the key named
        r = httpx.put(f"{a.http_url}/api/policies/%2F/bad", auth=AUTH, json={
            "pattern": "^ha\\.", "definition": {"ha-mode": "exactly", "ha-params": 0},
            "apply-to": "queues"})
        assert r.status_code == 400 and "takes an integer" in r.text, r.text
        r = httpx.put(f"{a.http_url}/api/policies/%2F/ha", auth=AUTH, json={
            "pattern": "^ha\\.", "definition": {"ha-mode": "all"}, "apply-to": "queues"})
        assert r.status_code in (201, 204), r.text
        # deprecated as in RabbitMQ 4 (docs/cluster.md), said once in the node's log
        eventually(lambda: "policy 'ha': classic queue mirroring (ha-mode) is deprecated"
                   in a.log() or (_ for _ in ()).throw(AssertionError()), timeout=10)

        ca = a.connect()
        cha = ca.channel()
        cha.queue_declare("ha.q", durable=True)
        eventually(lambda: queue_view(etcd, "ha.q")["in_sync"] == ["b"]
                   or (_ for _ in ()).throw(AssertionError()), timeout=10)
        cha.confirm_delivery()
        for i in range(200):
            cha.basic_publish("", "ha.q", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2),
                              mandatory=True)
        # 50 consumed and acked, 10 delivered and left unacknowledged at the fault
        cc = a.connect()
        chc = cc.channel()
        chc.basic_qos(prefetch_count=60)
        seen = []
        for method, _, body in chc.consume("ha.q", inactivity_timeout=5):
            assert method is not None
            seen.append((method.delivery_tag, body))
            if len(seen) == 60:
                break
        chc.basic_ack(seen[49][0], multiple=True)
        time.sleep(0.5)  # the acks reach the mirror (an ack is not confirmed to anyone)
        epoch = queue_view(etcd, "ha.q")["epoch"]

        t0 = time.monotonic()
        a.kill()
        view = eventually(lambda: queue_view(etcd, "ha.q") if queue_view(etcd, "ha.q")["master"]
                          == "b" else (_ for _ in ()).throw(AssertionError()), timeout=15)
        failover = time.monotonic() - t0
        assert view["epoch"] > epoch
        assert failover < 2 + 6  # the lease TTL plus a few seconds (shared machine)

        cb = b.connect()
        chb = cb.channel()
        got = []
        for method, _, body in chb.consume("ha.q", inactivity_timeout=3):
            if method is None:
                break
            got.append((body, method.redelivered))
            chb.basic_ack(method.delivery_tag)
        bodies = [g[0] for g in got]
        # nothing confirmed and not acknowledged is lost; the acknowledged are gone
        assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(50, 200))
        assert all(redelivered for _, redelivered in got)
        cb.close()
    finally:
        b.stop()
        a.stop()


@pytest.mark.timeout(60)
def test_manual_sync_mode_waits_for_sync_queue(tmp_path, etcd, secret):
    from .test_cluster_nodes import cli
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        r = httpx.put(f"{a.http_url}/api/policies/%2F/man", auth=AUTH, json={
            "pattern": "^man\\.", "definition": {"ha-mode": "all", "ha-sync-mode": "manual"},
            "apply-to": "queues"})
        assert r.status_code in (201, 204), r.text
        ca = a.connect()
        ch = ca.channel()
        ch.queue_declare("man.q", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "man.q", b"x", pika.BasicProperties(delivery_mode=2))
        eventually(lambda: queue_view(etcd, "man.q")["mirrors"] == ["b"]
                   or (_ for _ in ()).throw(AssertionError()), timeout=10)
        time.sleep(0.5)
        view = queue_view(etcd, "man.q")
        assert view["in_sync"] == [] and view["progress"] == {"b": "manual"}
        p = cli("cluster", "sync-queue", "man.q", "--cluster", etcd.url("c"))
        assert p.returncode == 0 and "sent to its master 'a'" in p.stdout, p.stderr
        eventually(lambda: queue_view(etcd, "man.q")["in_sync"] == ["b"]
                   or (_ for _ in ()).throw(AssertionError()), timeout=10)
        ca.close()
    finally:
        b.stop()
        a.stop()
