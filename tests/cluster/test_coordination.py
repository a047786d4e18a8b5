"""The etcd client and a node's membership, election and fencing against a REAL etcd
(tests/cluster/etcdproc.py: own data dir, free ports; paused with SIGSTOP for outages)."""
from __future__ import annotations

import json

import pytest
import trio

from broker.cluster.etcd import CoordinationUnavailable, EtcdGateway
from broker.cluster.node import ClusterJoinError, ClusterNode, cluster_view
from broker.cluster.settings import (
    ClusterConfigError,
    ClusterSettings,
    build_settings,
    parse_cluster_url,
)

from .etcdproc import free_port


async def until(predicate, seconds: float) -> None:
    """Poll ``predicate`` (state another task changes) until true, at most ``seconds``."""
    with trio.fail_after(seconds):
        while not predicate():  # noqa: ASYNC110 - polling a condition owned by another task
            await trio.sleep(0.02)


def settings(etcd, name, secret=None, ttl=2.0, prefix="/t/") -> ClusterSettings:
    return ClusterSettings([etcd.endpoint], prefix, name, f"127.0.0.1:{5600 + len(name)}",
                           secret, ttl, etcd_timeout=0.5)


async def test_kv_prefix_create_replace_and_watch(etcd):
    c = EtcdGateway([etcd.endpoint])
    try:
        rev = await c.put("/p/a", b"1")
        await c.put("/p/b", b"2")
        await c.put("/q/c", b"3")
        kvs, read_rev = await c.get_prefix("/p/")
        assert [(kv.key, kv.value) for kv in kvs] == [("/p/a", b"1"), ("/p/b", b"2")]
        assert read_rev >= rev
        created, kv = await c.create("/p/a", b"x")
        assert not created and kv is not None and kv.value == b"1"
        created, new = await c.create("/p/new", b"n")
        assert created and new is not None and new.create_revision > rev
        current = await c.get("/p/a")
        assert current is not None
        assert not await c.replace("/p/a", b"y", current.mod_revision - 1)
        assert await c.replace("/p/a", b"y", current.mod_revision)
        # fenced_put: only while the fence key is the incarnation of that epoch
        assert await c.fenced_put("/p/isr", b"ok", "/p/new", new.create_revision)
        await c.delete("/p/new")
        await c.create("/p/new", b"again")
        assert not await c.fenced_put("/p/isr", b"stale", "/p/new", new.create_revision)
        got = await c.get("/p/isr")
        assert got is not None and got.value == b"ok"

        seen: list = []

        async def on_events(events, revision):
            seen.extend((e.kind, e.kv.key, e.kv.value) for e in events)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(c.watch, "/p/", read_rev + 1, on_events)
            await c.write_batch([("/p/w", b"1")], ["/p/b"])
            await until(lambda: len(seen) >= 7, 5)  # the changes since read_rev, in order
            nursery.cancel_scope.cancel()
        assert ("delete", "/p/b", b"") in seen and ("put", "/p/w", b"1") in seen
        assert await c.delete("/p/", prefix=True) >= 4
    finally:
        await c.aclose()


async def test_leases_expire_and_unreachable_is_one_error(etcd):
    c = EtcdGateway([f"127.0.0.1:{free_port()}", etcd.endpoint], timeout=0.5)
    try:
        # the first endpoint is dead: every call moves on to the second
        lease, ttl = await c.grant(1)
        assert ttl == 2  # etcd's shortest lease (1.5 x election timeout, rounded up)
        await c.put("/l/k", b"v", lease)
        assert await c.keepalive(lease) > 0
        await trio.sleep(3.2)
        assert await c.keepalive(lease) == 0
        assert await c.get("/l/k") is None
        lease, _ = await c.grant(5)
        await c.put("/l/k", b"v", lease)
        await c.revoke(lease)
        assert await c.get("/l/k") is None
    finally:
        await c.aclose()
    dead = EtcdGateway([f"127.0.0.1:{free_port()}"], timeout=0.5)
    with pytest.raises(CoordinationUnavailable, match=r"etcd unreachable at 127\.0\.0\.1:"):
        await dead.get("/x")
    await dead.aclose()


def test_settings_validation(tmp_path):
    assert parse_cluster_url("etcd://h1:2379,h2:2380/prod") == (["h1:2379", "h2:2380"], "/prod/")
    assert parse_cluster_url("etcd://h1") == (["h1:2379"], "/triomq/")
    for bad, text in (("http://h:2379/x", "expected etcd://"), ("etcd://h:99999/x", "invalid port"),
                      ("etcd:///x", "no etcd endpoint")):
        with pytest.raises(ClusterConfigError, match=text):
            parse_cluster_url(bad)
    with pytest.raises(ClusterConfigError, match="needs --node-name"):
        build_settings("etcd://h/x", None, None, "0.0.0.0", 5672, None, 5)
    with pytest.raises(ClusterConfigError, match="--advertise"):
        build_settings("etcd://h/x", "a", "nohostport", "0.0.0.0", 5672, None, 5)
    short = tmp_path / "s"
    short.write_text("short")
    with pytest.raises(ClusterConfigError, match="at least 16 bytes"):
        build_settings("etcd://h/x", "a", None, "0.0.0.0", 5672, str(short), 5)
    with pytest.raises(ClusterConfigError, match="No such file"):
        build_settings("etcd://h/x", "a", None, "0.0.0.0", 5672, str(tmp_path / "none"), 5)
    s = build_settings("etcd://h/x", "a", None, "127.0.0.1", 5700, None, 5)
    assert s.advertise == "127.0.0.1:5700"


async def test_join_secret_and_name_in_use(etcd):
    c = EtcdGateway([etcd.endpoint], timeout=0.5)
    try:
        a = ClusterNode(c, settings(etcd, "a", secret=b"s" * 16))
        await a.join()
        wrong = ClusterNode(c, settings(etcd, "b", secret=b"x" * 16))
        with pytest.raises(ClusterJoinError, match="wrong cluster secret: node 'b' refused"):
            await wrong.join()
        nosecret = ClusterNode(c, settings(etcd, "b"))
        with pytest.raises(ClusterJoinError, match="requires a cluster secret"):
            await nosecret.join()
        twin = ClusterNode(c, settings(etcd, "a", secret=b"s" * 16))
        with pytest.raises(ClusterJoinError, match="node name 'a' is in use by a running node"):
            await twin.join(wait=0.5)
        await a.leave()
        await twin.join(wait=0.5)  # the name is free once the first left
        view = await cluster_view(c, "/t/")
        assert [(n["name"], n["health"]) for n in view["nodes"]] == [("a", "up")]
        await twin.leave()
        view = await cluster_view(c, "/t/")
        assert [(n["name"], n["health"]) for n in view["nodes"]] == [("a", "down")]
    finally:
        await c.aclose()


async def test_master_election_epochs_and_fenced_isr(etcd):
    c = EtcdGateway([etcd.endpoint], timeout=0.5)
    try:
        a = ClusterNode(c, settings(etcd, "a"))
        b = ClusterNode(c, settings(etcd, "b"))
        await a.join()
        await b.join()
        ma = await a.claim_master("/", "q")
        assert ma.node == "a" and a.mastership("/", "q") == ma
        mb = await b.claim_master("/", "q")
        assert mb == ma and b.conflicts == {("/", "q"): "a"} and b.mastership("/", "q") is None
        assert await a.set_in_sync("/", "q", ["b"], ["b"], {"b": 100})
        view = await cluster_view(c, "/t/")
        assert view["queues"] == [{"vhost": "/", "name": "q", "master": "a", "epoch": ma.epoch,
                                   "home": "a", "mirrors": ["b"], "in_sync": ["b"],
                                   "members": [],  # a quorum queue's member group only
                                   "progress": {"b": 100}, "sync": {},
                                   "stopped_cleanly": False}]
        # a dies (its lease ends): b takes the queue under a higher epoch ...
        stale = dict(a.masters)
        await a.leave()
        mb = await b.claim_master("/", "q")
        assert mb.node == "b" and mb.epoch > ma.epoch and not b.conflicts
        # ... and a deposed master holding the old epoch can no longer write the in-sync set
        a.masters = stale
        assert not await a.set_in_sync("/", "q", [], [])
        rec = json.loads((await c.get(b.isr_key("/", "q"))).value)
        assert rec["epoch"] == ma.epoch  # untouched by the deposed master
        assert await b.set_in_sync("/", "q", [], [])
        view = await cluster_view(c, "/t/")
        assert view["queues"][0]["master"] == "b" and view["queues"][0]["epoch"] == mb.epoch
        assert view["queues"][0]["home"] == "b"
        await b.release_master("/", "q")
        assert (await cluster_view(c, "/t/"))["queues"] == []
    finally:
        await c.aclose()


async def test_fenced_while_etcd_is_unreachable_then_resumes(etcd):
    """SIGSTOP etcd: the node fences itself when its own view of the lease runs out (no
    later than etcd could expire it), and serves again by itself once etcd answers: here
    etcd expired the lease meanwhile, so it rejoins and claims its queue under a new epoch."""
    c = EtcdGateway([etcd.endpoint], timeout=0.3)
    node = ClusterNode(c, settings(etcd, "a", ttl=3.0))
    events: list = []
    try:
        await node.join()
        node.on_fenced.append(lambda fenced, reason: events.append((trio.current_time(), fenced)))
        first = await node.claim_master("/", "q")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.run)
            await trio.sleep(1.2)
            assert node.serving
            t0 = trio.current_time()
            etcd.pause()
            try:
                await until(lambda: node.fenced, 5)
                fenced_after = trio.current_time() - t0
                assert node.mastership("/", "q") is None  # stops acting as master at once
                assert fenced_after <= 3.0 + 0.1
            finally:
                etcd.resume()
            await until(lambda: not node.fenced, 5)
            again = node.mastership("/", "q")
            assert again is not None and again.epoch >= first.epoch
            nursery.cancel_scope.cancel()
        assert [f for _, f in events] == [True, False]
    finally:
        await node.leave()
        await c.aclose()


async def test_lease_expired_in_etcd_rejoins_under_new_epochs(etcd):
    """Paused longer than the TTL: etcd expired the lease, so the queue's record is gone;
    the node rejoins with a new lease and claims its queue again under a new epoch, unless
    another node took it meanwhile."""
    c = EtcdGateway([etcd.endpoint], timeout=0.3)
    a = ClusterNode(c, settings(etcd, "a", ttl=1.0))
    b = ClusterNode(c, settings(etcd, "b", ttl=30.0))
    try:
        await a.join()
        await b.join()
        first = await a.claim_master("/", "q1")
        await a.claim_master("/", "q2")
        old_lease = a.lease
        await c.revoke(a.lease)  # as if etcd had expired it
        await b.claim_master("/", "q2")  # b takes q2 meanwhile
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.run)
            await until(lambda: a.lease != old_lease and not a.fenced and a.masters, 10)
            nursery.cancel_scope.cancel()
        assert a.masters[("/", "q1")].epoch > first.epoch
        assert ("/", "q2") not in a.masters and a.conflicts == {("/", "q2"): "b"}
    finally:
        await a.leave()
        await b.leave()
        await c.aclose()
