"""TrioMQ nodes started with ``--cluster`` against a REAL etcd, driven by pika and the
management HTTP API: definitions and metadata seen by every node (live and on rejoin), queue
masters in etcd, fencing while etcd is unreachable, start-up errors, ``cluster status`` and
``cluster forget-node``."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pika
import pytest
from brokerproc import REPO_ROOT, BrokerProc

TTL = "2"


def node(tmp_path, etcd, name, secret_file=None, prefix="c") -> BrokerProc:
    extra = ["--cluster", etcd.url(prefix), "--node-name", name, "--cluster-ttl", TTL]
    if secret_file is not None:
        extra += ["--cluster-secret-file", str(secret_file)]
    return BrokerProc(tmp_path / name, extra=extra, http=True)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=str(REPO_ROOT),
                          capture_output=True, text=True, timeout=30)


def status(etcd, prefix="c") -> dict:
    p = cli("cluster", "status", "--cluster", etcd.url(prefix), "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def eventually(check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (AssertionError, pika.exceptions.AMQPError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def exchange_exists(broker: BrokerProc, name: str) -> bool:
    conn = broker.connect()
    try:
        conn.channel().exchange_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.timeout(90)
def test_definitions_everywhere_and_rejoin_catches_up(tmp_path, etcd, secret):
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.exchange_declare("orders", "topic", durable=True)
        ch.exchange_declare("eu", "fanout", durable=True)
        ch.exchange_bind("eu", "orders", "order.eu.*")
        ch.queue_declare("qa", durable=True)
        conn.close()
        # a user, its permissions and a policy made on a, through the management API
        auth = ("guest", "guest")
        r = httpx.put(f"{a.http_url}/api/users/alice", auth=auth,
                      json={"password": "wonderland", "tags": ""})
        assert r.status_code in (201, 204), r.text
        r = httpx.put(f"{a.http_url}/api/permissions/%2F/alice", auth=auth,
                      json={"configure": ".*", "write": ".*", "read": ".*"})
        assert r.status_code in (201, 204), r.text
        r = httpx.put(f"{a.http_url}/api/policies/%2F/cap", auth=auth,
                      json={"pattern": "^capped", "definition": {"max-length": 2},
                            "apply-to": "queues"})
        assert r.status_code in (201, 204), r.text

        # b sees all of it, live: alice logs in on b and routes through a's bindings
        def on_b():
            cb = pika.BlockingConnection(pika.ConnectionParameters(
                "127.0.0.1", b.port, credentials=pika.PlainCredentials("alice", "wonderland")))
            return cb
        cb = eventually(on_b)
        chb = cb.channel()
        chb.exchange_declare("orders", passive=True)
        chb.queue_declare("capped-b", durable=True)
        chb.queue_declare("qb", durable=True)
        chb.queue_bind("qb", "eu")
        for i in range(4):
            chb.basic_publish("", "capped-b", str(i).encode())
        chb.basic_publish("orders", "order.eu.created", b"hello")
        time.sleep(0.2)
        assert chb.queue_declare("capped-b", passive=True).method.message_count == 2  # policy
        method, _, body = chb.basic_get("qb", auto_ack=True)
        assert body == b"hello"
        cb.close()
        policy = httpx.get(f"{b.http_url}/api/policies/%2F/cap", auth=auth).json()
        assert policy["definition"] == {"max-length": 2}

        view = status(etcd)
        assert [(n["name"], n["health"]) for n in view["nodes"]] == [("a", "up"), ("b", "up")]
        masters = {q["name"]: q["master"] for q in view["queues"]}
        assert masters == {"qa": "a", "capped-b": "b", "qb": "b"}
        # a durable queue lives on one node: on b, a's queue is its proxy (no second copy)
        cb = b.connect()
        cb.channel().queue_declare("qa", durable=True)
        cb.close()
        assert {q["name"]: q["master"] for q in status(etcd)["queues"]}["qa"] == "a"
        text = cli("cluster", "status", "--cluster", etcd.url("c")).stdout
        assert "a                    up" in text and "qa" in text

        # b stops; changes made meanwhile reach it when it comes back
        b.stop()
        eventually(lambda: [n["health"] for n in status(etcd)["nodes"]] == ["up", "down"] or
                   (_ for _ in ()).throw(AssertionError()))
        conn = a.connect()
        ch = conn.channel()
        ch.exchange_declare("late", "direct", durable=True)
        ch.exchange_delete("eu")
        conn.close()
        r = httpx.delete(f"{a.http_url}/api/users/alice", auth=auth)
        assert r.status_code == 204, r.text
        b.start()
        assert exchange_exists(b, "late")
        assert exchange_exists(b, "orders")
        # deleted while b was away: gone on b too, though b's own store still had them
        assert not exchange_exists(b, "eu")
        assert httpx.get(f"{b.http_url}/api/users/alice", auth=auth).status_code == 404
        assert "dropped what the cluster deleted while this node was away: " in b.log()
    finally:
        b.stop()
        a.stop()
    # a clean stop revokes the lease at once: no node up, no queue mastered (they keep
    # their home nodes)
    view = status(etcd)
    assert [n["health"] for n in view["nodes"]] == ["down", "down"]
    assert {(q["name"], q["master"], q["home"]) for q in view["queues"]} == {
        ("qa", None, "a"), ("capped-b", None, "b"), ("qb", None, "b")}


@pytest.mark.timeout(90)
def test_fencing_kill9_forget_and_start_errors(tmp_path, etcd, secret):
    wrong = tmp_path / "wrong"
    wrong.write_text("another-secret-of-16-bytes")
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        code, err = node(tmp_path, etcd, "c", wrong).start_expect_failure()
        assert code == 1
        assert err.strip().splitlines() == [
            "triomq: error: cluster: wrong cluster secret: node 'c' refused by cluster c "
            "(check --cluster-secret-file)"]
        code, err = node(tmp_path, etcd, "b", secret).start_expect_failure()
        assert code == 1 and "node name 'b' is in use by a running node" in err
        conn = a.connect()
        conn.channel().queue_declare("qa", durable=True)

        # etcd unreachable: a fences itself (320 on every connection) within the TTL, then
        # rejoins by itself and serves again once etcd answers
        etcd.pause()
        t0 = time.monotonic()
        try:
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                while time.monotonic() - t0 < 10:
                    conn.process_data_events(0.1)
            fenced_after = time.monotonic() - t0
        finally:
            etcd.resume()
        assert closed.value.reply_code == 320
        assert "cluster lease not renewed in time" in closed.value.reply_text
        assert fenced_after <= float(TTL) + 2.0  # the machine is shared: some slack
        eventually(lambda: a.connect().close(), timeout=10)
        eventually(lambda: {q["name"]: q["master"] for q in status(etcd)["queues"]} == {"qa": "a"}
                   or (_ for _ in ()).throw(AssertionError()), timeout=10)

        # kill -9: the node is down after its TTL, its queue unmastered; forget-node
        p = cli("cluster", "forget-node", "a", "--cluster", etcd.url("c"))
        assert p.returncode == 1 and "node 'a' is running" in p.stderr
        a.kill()
        eventually(lambda: [n["health"] for n in status(etcd)["nodes"]] == ["down", "up"]
                   or (_ for _ in ()).throw(AssertionError()), timeout=float(TTL) + 5)
        view = status(etcd)
        assert [(q["name"], q["master"], q["home"]) for q in view["queues"]] == [("qa", None, "a")]
        assert "(none: home a down)" in cli("cluster", "status", "--cluster", etcd.url("c")).stdout
        cb = b.connect()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            cb.channel().queue_declare("qa", durable=True)
        assert refused.value.reply_text == (
            "NOT_FOUND - home node 'a' of durable queue 'qa' in vhost '/' is down or inaccessible")
        p = cli("cluster", "forget-node", "a", "--cluster", etcd.url("c"))
        assert p.returncode == 0, p.stderr
        assert "1 durable queues it was home of forgotten" in p.stdout
        assert [n["name"] for n in status(etcd)["nodes"]] == ["b"]
        assert status(etcd)["queues"] == []
        eventually(lambda: cb.channel().queue_declare("qa", durable=True))  # b may have it now
        cb.close()
    finally:
        b.stop()
        a.stop()
    # etcd unreachable at start: one line, exit 1
    etcd.stop()
    code, err = node(tmp_path, etcd, "d").start_expect_failure()
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"triomq: error: cluster: etcd unreachable at {etcd.endpoint}"), err
    p = cli("cluster", "status", "--cluster", etcd.url("c"))
    assert p.returncode == 1 and "etcd unreachable" in p.stderr
    p = cli("run", "--cluster", "etcd://h/x")
    assert p.returncode == 2 and p.stderr.strip() == "triomq: error: --cluster needs --node-name NAME"
