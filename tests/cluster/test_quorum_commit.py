"""A quorum queue's leader delivers only committed messages (on a majority of its group),
as RabbitMQ's quorum queues: a consumer never sees a message a failover can lose. Three
real nodes, etcd and pika."""
from __future__ import annotations

import time

import pytest

from .test_cluster_nodes import eventually, node
from .test_mirroring_more import start_together
from .test_quorum_replication import PERSISTENT, QQ, Publisher, ctl, wait_view


def quorum_status(broker, queue: str) -> dict[str, list[str]]:
    """rabbitmq-queues quorum_status: member -> [Raft State, Log Index, Commit Index]."""
    p = ctl(broker, "-q", "quorum_status", queue)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split("\t")[:5] == ["Node Name", "Raft State", "Log Index",
                                        "Commit Index", "Snapshot Index"], lines
    return {r[0]: r[1:4] for r in (line.split("\t") for line in lines[1:])}


def _nothing_for(ch, queue: str, seconds: float) -> None:
    """basic.get finds nothing for ``seconds`` (a hold can only make this pass wrongly if
    the machine is too slow to deliver in time, never fail wrongly)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        assert method is None, body
        ch.connection.sleep(0.2)


@pytest.mark.timeout(120)
def test_uncommitted_message_is_neither_confirmed_nor_delivered(tmp_path, etcd, secret):
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments=QQ)
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        ch.confirm_delivery()
        ch.basic_publish("", "qq", b"committed", PERSISTENT)
        method, _props, body = ch.basic_get("qq", auto_ack=True)
        assert body == b"committed", body

        # both followers down: no majority has what is published now
        b.kill()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["c"])
        c.kill()
        p = Publisher(a, "qq", [b"held"])
        p.start()
        _nothing_for(ch, "qq", 3)
        assert p.confirmed == [] and p.is_alive(), p.error
        # a consumer is not given it either (the leader has it: the count says so)
        got: list[bytes] = []
        ch.basic_consume("qq", lambda _ch, m, _p, body: got.append(body), auto_ack=False)
        conn.process_data_events(time_limit=2)
        assert got == [], got
        assert ch.queue_declare("qq", passive=True).method.message_count == 1
        # quorum_status: the leader's log is ahead of its commit index
        status = quorum_status(a, "qq")
        assert status["a"] == ["leader", "2", "1"], status
        assert status["b"] == ["noproc", "1", "1"] and status["c"][1:] == ["1", "1"], status

        # a follower back and caught up: a majority has it, confirmed and delivered
        c.start()
        p.join(60)
        assert p.confirmed == [b"held"], p.error
        end = time.monotonic() + 30
        while not got and time.monotonic() < end:
            conn.process_data_events(time_limit=0.5)
        assert got == [b"held"], got
        conn.close()

        def caught_up():
            status = quorum_status(a, "qq")
            assert status["a"] == ["leader", "2", "2"], status
            assert status["c"] == ["follower", "2", "2"], status
        eventually(caught_up, timeout=30)
    finally:
        for broker in (a, b, c):
            broker.stop()


@pytest.mark.timeout(120)
def test_delivery_count_survives_leader_kill9(tmp_path, etcd, secret):
    """Three deliveries nacked on the leader, the leader killed with -9: the new leader
    delivers it with x-delivery-count 3 and redelivered, and the delivery limit (3) still
    applies: one more nack drops it."""
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True,
                         arguments={**QQ, "x-delivery-limit": 3})
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        ch.confirm_delivery()
        ch.basic_publish("", "qq", b"poison", PERSISTENT)
        for n in range(3):
            method, props, body = ch.basic_get("qq", auto_ack=False)
            assert body == b"poison", body
            assert (props.headers or {}).get("x-delivery-count", 0) == n, props.headers
            ch.basic_nack(method.delivery_tag, requeue=True)
        # a confirmed publish after the nacks: every member applied what came before it
        ch.basic_publish("", "qq", b"marker", PERSISTENT)
        conn.close()

        a.kill()
        view = wait_view(etcd, "qq", lambda v: v["master"] in ("b", "c"), timeout=30)
        leader = b if view["master"] == "b" else c
        conn = leader.connect()
        ch = conn.channel()
        method, props, body = ch.basic_get("qq", auto_ack=False)
        assert body == b"poison", body
        assert method.redelivered
        assert (props.headers or {}).get("x-delivery-count") == 3, props.headers
        ch.basic_nack(method.delivery_tag, requeue=True)  # the 4th return: over the limit
        method, props, body = ch.basic_get("qq", auto_ack=True)
        assert body == b"marker", body
        assert ch.basic_get("qq", auto_ack=True)[0] is None
        conn.close()
    finally:
        for broker in (a, b, c):
            broker.stop()


@pytest.mark.timeout(120)
def test_new_leader_holds_inherited_entries_until_a_majority_has_them(tmp_path, etcd, secret):
    """Raft's rule for a new leader: c down, m1 then m2 confirmed by a and b (m2's op told b
    that m1 is committed; nothing told it about m2), a killed with -9. b leads alone: it
    delivers m1 but holds m2, which only b is known to have, until a majority of the group
    holds it under b's term (c back and synced). It delivered both at once before."""
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments=QQ)
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        c.kill()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b"])
        ch.confirm_delivery()
        ch.basic_publish("", "qq", b"m1", PERSISTENT)
        ch.basic_publish("", "qq", b"m2", PERSISTENT)
        conn.close()

        a.kill()
        wait_view(etcd, "qq", lambda v: v["master"] == "b", timeout=30)

        def promoted():
            # a proxy answers 0 for the counts: the promoted queue counts both
            with b.connect() as conn:
                count = conn.channel().queue_declare("qq", passive=True).method.message_count
            assert count == 2, count
        eventually(promoted, timeout=30)
        conn = b.connect()
        ch = conn.channel()
        method, _props, body = ch.basic_get("qq", auto_ack=True)
        assert body == b"m1", body
        _nothing_for(ch, "qq", 3)
        assert ch.queue_declare("qq", passive=True).method.message_count == 1

        # c back: synced under b's term, a majority (b and c) holds m2
        c.start()
        wait_view(etcd, "qq", lambda v: v["master"] == "b" and v["in_sync"] == ["c"],
                  timeout=60)

        def delivered():
            method, _props, body = ch.basic_get("qq", auto_ack=True)
            assert body == b"m2", body
        eventually(delivered, timeout=30)
        conn.close()
    finally:
        for broker in (a, b, c):
            broker.stop()


LARGE = 50_000


@pytest.mark.timeout(240)
def test_leader_promoted_with_a_large_queue_keeps_its_lease(tmp_path, etcd, secret):
    """TTL 2 s: a follower promoted with 50,000 messages builds the queue and syncs the
    other member without starving its lease renewals (it once fenced itself, rejoined
    under a new term and resynced from nothing, over and over)."""
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments=QQ)
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        body = b"x" * 100
        for i in range(LARGE):
            ch.basic_publish("", "qq", body, PERSISTENT)
            if i % 500 == 499:  # a round trip: a bounded flood (not what is tested here)
                ch.queue_declare("qq", passive=True)
        ch.confirm_delivery()  # the last one confirmed: the ones before it are everywhere
        ch.basic_publish("", "qq", b"last", PERSISTENT)
        conn.close()

        a.kill()
        view = wait_view(etcd, "qq", lambda v: v["master"] in ("b", "c"), timeout=30)
        name = view["master"]
        leader, other = (b, "c") if name == "b" else (c, "b")
        epoch = view["epoch"]
        # the other follower back in sync under the same term
        view = wait_view(etcd, "qq", lambda v: v["in_sync"] == [other], timeout=120)
        assert view["epoch"] == epoch and view["master"] == name, view
        assert "fenced" not in leader.log(), leader.log()[-3000:]
        conn = leader.connect()
        assert conn.channel().queue_declare("qq", passive=True).method.message_count \
            == LARGE + 1
        conn.close()
        assert "fenced" not in leader.log(), leader.log()[-3000:]
    finally:
        for broker in (a, b, c):
            broker.stop()
