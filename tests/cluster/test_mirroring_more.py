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

from .test_cluster_nodes import eventually, node
from .test_mirroring import AUTH, queue_view


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
@pytest.mark.slow  # mirrored queues (deprecated): make test-slow
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


def isr_record(etcd, queue, prefix="c") -> dict:
    import base64
    import json
    key = f"/{prefix}/isr/%2F/{queue}"
    r = httpx.post(f"http://{etcd.endpoint}/v3/kv/range",
                   json={"key": base64.b64encode(key.encode()).decode()})
    kvs = r.json().get("kvs", [])
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else {}


def publish_confirmed(broker, queue, bodies) -> None:
    conn = broker.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    conn.close()


@pytest.mark.timeout(150)
@pytest.mark.slow  # mirrored queues (deprecated): make test-slow
def test_promote_on_shutdown_and_on_failure_are_distinct(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        # manual sync: b's mirrors get what enters from now on, never join the in-sync set
        put_policy(a, "sd", "^sd\\.", {"ha-mode": "all", "ha-sync-mode": "manual",
                                       "ha-promote-on-shutdown": "always"})
        put_policy(a, "fl", "^fl\\.", {"ha-mode": "all", "ha-sync-mode": "manual",
                                       "ha-promote-on-failure": "always"})
        put_policy(a, "ok", "^ok\\.", {"ha-mode": "all"})  # synchronised: defaults
        conn = a.connect()
        ch = conn.channel()
        for q in ("sd.q", "fl.q", "ok.q"):
            ch.queue_declare(q, durable=True)
        conn.close()
        wait_in_sync(etcd, "ok.q", ["b"])
        publish_confirmed(a, "ok.q", [f"ok-{i}".encode() for i in range(5)])
        for q in ("sd.q", "fl.q"):
            eventually(lambda q=q: queue_view(etcd, q)["progress"] == {"b": "manual"}
                       or (_ for _ in ()).throw(AssertionError()), timeout=10)
            publish_confirmed(a, q, [f"{q}-{i}".encode() for i in range(5)])
        time.sleep(0.5)  # the live ops reach the unsynchronised mirror
        a.stop()  # SIGTERM: a controlled shutdown
        # ha-promote-on-shutdown always: the unsynchronised mirror takes over
        wait_master(etcd, "sd.q", "b", timeout=10)
        # when-synced (default): the synchronised mirror takes over
        wait_master(etcd, "ok.q", "b", timeout=10)
        assert sorted(drain(b, "ok.q")) == sorted(f"ok-{i}".encode() for i in range(5))
        assert sorted(drain(b, "sd.q")) == sorted(f"sd.q-{i}".encode() for i in range(5))
        # fl.q: ha-promote-on-shutdown is when-synced (default): unavailable
        time.sleep(3)
        view = queue_view(etcd, "fl.q")
        assert view["master"] is None and view["home"] == "a", view

        a.start()  # claims fl.q again; its old sd.q copy is stale (home b) and dropped
        view = wait_master(etcd, "fl.q", "a")
        eventually(lambda: queue_view(etcd, "fl.q")["progress"] == {"b": "manual"}
                   or (_ for _ in ()).throw(AssertionError()), timeout=10)
        publish_confirmed(a, "fl.q", [f"new-{i}".encode() for i in range(3)])
        time.sleep(0.5)
        a.kill()  # a failure: ha-promote-on-failure always promotes the unsynced mirror,
        wait_master(etcd, "fl.q", "b", timeout=15)
        # which has only what entered after it started: the 5 older messages are lost
        assert sorted(drain(b, "fl.q")) == [f"new-{i}".encode() for i in range(3)]
    finally:
        b.stop()
        a.stop()


@pytest.mark.timeout(150)
@pytest.mark.slow  # mirrored queues (deprecated): make test-slow
def test_sync_progress_in_status_while_the_queue_serves(tmp_path, etcd, secret):
    from broker.cluster.tools import render
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret)
    try:
        put_policy(a, "sy", "^sy\\.", {"ha-mode": "all", "ha-sync-batch-size": 1})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("sy.q", durable=True)
        for _ in range(20000):  # seconds of sync at one message per batch
            ch.basic_publish("", "sy.q", b"x" * 100, pika.BasicProperties(delivery_mode=2))
        ch.confirm_delivery()
        ch.basic_publish("", "sy.q", b"last", pika.BasicProperties(delivery_mode=2))
        b.start()
        seen = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            view = isr_record(etcd, "sy.q")  # read directly: the CLI is too slow to poll
            if view.get("in_sync") == ["b"]:
                break
            if "b" in view.get("sync", {}):
                seen.append(view)
                # the queue keeps serving while it syncs: a confirmed publish, a get
                ch.basic_publish("", "sy.q", b"during", pika.BasicProperties(delivery_mode=2))
                method, _, _ = ch.basic_get("sy.q", auto_ack=True)
                assert method is not None
            time.sleep(0.1)
        assert view["in_sync"] == ["b"] and view["sync"] == {}, view
        partial = [v["sync"]["b"] for v in seen if 0 < v["sync"]["b"]["synced"]
                   < v["sync"]["b"]["total"]]
        assert partial, seen
        assert partial[0]["total"] >= 20001
        shown = dict(queue_view(etcd, "sy.q"), sync=seen[-1]["sync"],
                     progress=seen[-1]["progress"])
        assert f"b syncing {seen[-1]['sync']['b']['synced']}/" in render(
            {"revision": 1, "definitions": 0, "nodes": [], "queues": [shown]}, "c/")
        conn.close()
    finally:
        b.stop()
        a.stop()


@pytest.mark.timeout(60)
def test_ha_nodes_names_checked_against_the_clusters_members(tmp_path, etcd, secret):
    from brokerproc import BrokerProc
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    single = BrokerProc(tmp_path / "single", http=True).start()
    try:
        body = {"pattern": "^n\\.", "apply-to": "queues",
                "definition": {"ha-mode": "nodes", "ha-params": ["a", "zz"]}}
        r = httpx.put(f"{a.http_url}/api/policies/%2F/n", auth=AUTH, json=body)
        assert r.status_code == 400, r.text
        reason = r.json()["reason"]
        assert "ha-params: 'zz' is not a member of this cluster (members: a, b)" in reason
        # the other keys' texts stay RabbitMQ's; the offending key is ha-params
        r = httpx.put(f"{a.http_url}/api/policies/%2F/n", auth=AUTH, json=dict(
            body, definition={"ha-mode": "exactly", "ha-params": 0}))
        assert r.status_code == 400 and 'ha-mode=\\"exactly\\" takes an integer' in r.text
        b.stop()  # a member that is down is still a member
        put_policy(a, "n", "^n\\.", {"ha-mode": "nodes", "ha-params": ["a", "b"]})
        # without a cluster any names are taken, as RabbitMQ takes them
        r = httpx.put(f"{single.http_url}/api/policies/%2F/n", auth=AUTH, json=body)
        assert r.status_code in (201, 204), r.text
    finally:
        single.stop()
        b.stop()
        a.stop()


@pytest.mark.timeout(120)
@pytest.mark.slow  # mirrored queues (deprecated): make test-slow
def test_tx_commit_ok_of_acks_waits_for_the_mirrors(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("ha.txack", durable=True)
        wait_in_sync(etcd, "ha.txack", ["b"])
        publish_confirmed(a, "ha.txack", [f"m{i}".encode() for i in range(2000)])
        ch.basic_qos(prefetch_count=2000)
        ch.tx_select()
        tags = []
        for method, _, _ in ch.consume("ha.txack", inactivity_timeout=5):
            assert method is not None
            tags.append(method.delivery_tag)
            if len(tags) == 2000:
                break
        for tag in tags[:1990]:  # one by one: 1,990 seqs leave in this commit
            ch.basic_ack(tag)
        ch.tx_commit()
        a.kill()  # at once after commit-ok: the acknowledged must not come back
        wait_master(etcd, "ha.txack", "b")
        got = drain(b, "ha.txack")
        assert sorted(got) == sorted(f"m{i}".encode() for i in range(1990, 2000))
    finally:
        b.stop()
        a.stop()
