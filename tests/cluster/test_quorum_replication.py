"""Quorum queues replicated across a cluster's nodes (real etcd, real broker processes,
pika): a member group of x-quorum-initial-group-size nodes, a publish confirmed only once a
majority of the group has it on disk, a leader killed with -9 replaced by an in-sync
member with every confirmed message, a follower that was down catching up from its own
copy, add_member / delete_member."""
from __future__ import annotations

import signal
import threading
import time

import httpx
import pika
import pytest

from .test_cluster_nodes import eventually, node
from .test_mirroring import AUTH, queue_view
from .test_mirroring_more import start_together

QQ = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def wait_view(etcd, queue, check, timeout=30):
    def ok():
        view = queue_view(etcd, queue)
        assert check(view), view
        return view
    return eventually(ok, timeout=timeout)


def api_queue(broker, queue) -> dict:
    r = httpx.get(f"{broker.http_url}/api/queues/%2F/{queue}", auth=AUTH, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


class Publisher(threading.Thread):
    """Publishes with confirms, one at a time, in its own thread: ``confirmed`` grows as
    confirms come (a publish that waits for one can be watched from the test)."""

    def __init__(self, broker, queue, bodies):
        super().__init__(daemon=True)
        self.broker, self.queue, self.bodies = broker, queue, bodies
        self.confirmed: list[bytes] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = self.broker.connect()
            ch = conn.channel()
            ch.confirm_delivery()
            for body in self.bodies:
                ch.basic_publish("", self.queue, body, PERSISTENT)
                self.confirmed.append(body)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


@pytest.mark.timeout(120)
def test_majority_confirms_and_members(tmp_path, etcd, secret):
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments=QQ)
        view = wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        assert view["master"] == "a" and view["members"] == ["a", "b", "c"], view
        # the same group from every node's management API (leader, members, online)
        for broker in (a, b, c):
            q = eventually(lambda broker=broker: _settled(api_queue(broker, "qq")), timeout=10)
            assert q["leader"] == "a" and q["members"] == ["a", "b", "c"], q
            assert q["online"] == ["a", "b", "c"], q
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", "qq", b"m%d" % i, PERSISTENT)
        conn.close()

        # one follower down: a majority (a and c) is left, confirms go on
        b.kill()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["c"])
        p = Publisher(a, "qq", [b"n0"])
        p.start()
        p.join(60)
        assert p.confirmed == [b"n0"], p.error

        # both followers down: no majority, nothing is confirmed ...
        c.kill()
        p = Publisher(a, "qq", [b"lonely"])
        p.start()
        p.join(5)
        assert p.confirmed == [], "confirmed with one member of three"
        assert p.is_alive(), p.error
        # ... until a follower is back and caught up
        c.start()
        p.join(60)
        assert p.confirmed == [b"lonely"], p.error
        assert "catches up from its own copy" in a.log(), a.log()[-3000:]
        view = wait_view(etcd, "qq", lambda v: v["in_sync"] == ["c"])
        assert view["members"] == ["a", "b", "c"], view
        q = api_queue(c, "qq")
        assert q["online"] == ["a", "c"] and q["messages"] == 102, q
    finally:
        for broker in (a, b, c):
            broker.stop()


def _settled(q: dict) -> dict:
    assert q.get("state") == "running" and len(q.get("online", [])) == 3, q
    return q


class Client(threading.Thread):
    """Publishes ids with confirms one at a time through ``brokers`` (the next one on a
    connection error), recording each id as confirmed, nacked or in doubt."""

    def __init__(self, brokers, queue, count):
        super().__init__(daemon=True)
        self.brokers, self.queue, self.count = brokers, queue, count
        self.confirmed: list[bytes] = []
        self.nacked: list[bytes] = []
        self.doubt: list[bytes] = []
        self.stop = threading.Event()

    def run(self) -> None:
        i = 0
        turn = 0
        while i < self.count and not self.stop.is_set():
            try:
                conn = self.brokers[turn % len(self.brokers)].connect()
            except pika.exceptions.AMQPError:
                turn += 1
                continue
            ch = conn.channel()
            ch.confirm_delivery()
            try:
                while i < self.count and not self.stop.is_set():
                    body = b"id%d" % i
                    i += 1
                    try:
                        ch.basic_publish("", self.queue, body, PERSISTENT)
                        self.confirmed.append(body)
                    except pika.exceptions.NackError:
                        self.nacked.append(body)  # unavailable for now: the queue said so
                        self.stop.wait(0.05)
            except pika.exceptions.AMQPError:
                self.doubt.append(body)
                turn += 1
            finally:
                if conn.is_open:
                    conn.close()


class Consumer(threading.Thread):
    """Consumes with manual acks (prefetch 50) through ``brokers`` until stopped and idle;
    ``got``: (body, redelivered) in order of delivery."""

    def __init__(self, brokers, queue):
        super().__init__(daemon=True)
        self.brokers, self.queue = brokers, queue
        self.got: list[tuple[bytes, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        turn = 0
        while True:
            try:
                conn = self.brokers[turn % len(self.brokers)].connect()
                ch = conn.channel()
                ch.basic_qos(prefetch_count=50)
                for method, _props, body in ch.consume(self.queue, inactivity_timeout=2):
                    if method is None:
                        if self.stop.is_set():
                            conn.close()
                            return
                        continue
                    self.got.append((body, method.redelivered))
                    ch.basic_ack(method.delivery_tag)
            except pika.exceptions.AMQPError:
                turn += 1


@pytest.mark.timeout(150)
@pytest.mark.parametrize("fault", ["kill9", "sigstop"])
def test_leader_fault_during_confirmed_publishing(tmp_path, etcd, secret, fault):
    """kill -9 or SIGSTOP of the leader while clients of the other nodes publish with
    confirms and consume: a follower takes over, nothing confirmed is lost; a paused
    leader that resumes is deposed (its uncommitted entries dropped) and rejoins the
    group as an in-sync follower of the new leader."""
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        conn.channel().queue_declare("qq", durable=True, arguments=QQ)
        conn.close()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        consumer = Consumer([c, b], "qq")
        consumer.start()
        client = Client([b, c], "qq", 1_000_000)
        client.start()
        eventually(lambda: len(client.confirmed) >= 500 or (_ for _ in ()).throw(
            AssertionError(len(client.confirmed))), timeout=60)
        if fault == "kill9":
            a.kill()
        else:
            a.proc.send_signal(signal.SIGSTOP)
        view = wait_view(etcd, "qq", lambda v: v["master"] in ("b", "c"), timeout=30)
        assert view["members"] == ["a", "b", "c"], view
        confirmed_at_kill = len(client.confirmed)
        eventually(lambda: len(client.confirmed) >= confirmed_at_kill + 200 or (
            _ for _ in ()).throw(AssertionError(len(client.confirmed))), timeout=60)
        if fault == "sigstop":
            a.proc.send_signal(signal.SIGCONT)
            # deposed: it drops its copy and syncs from the new leader, under its term
            view = wait_view(etcd, "qq", lambda v: len(v["in_sync"]) == 2, timeout=60)
            assert "a" in view["in_sync"], view
        client.stop.set()
        client.join(60)
        consumer.stop.set()
        consumer.join(90)
        assert not consumer.is_alive()
        seen: dict[bytes, int] = {}
        for body, redelivered in consumer.got:
            # a second delivery of one message is flagged (the old leader may have
            # delivered it: its ack may not have reached the new one)
            assert not seen.get(body) or redelivered, body
            seen[body] = seen.get(body, 0) + 1
        lost = [x for x in client.confirmed if x not in seen]
        assert not lost, (len(lost), lost[:5], len(client.confirmed))
        assert not [x for x in client.nacked if x in seen]
        # clients of the other nodes kept publishing and consuming through the failover
        assert len(client.confirmed) > confirmed_at_kill
    finally:
        for broker in (a, b, c):
            broker.stop()


def ctl(broker, *args):
    from .test_cluster_nodes import cli
    return cli("ctl", "--url", broker.http_url, *args)


@pytest.mark.timeout(150)
def test_add_member_and_delete_member(tmp_path, etcd, secret):
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True,
                         arguments={**QQ, "x-quorum-initial-group-size": 2})
        view = wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b"])
        assert view["members"] == ["a", "b"], view
        ch.confirm_delivery()
        for i in range(50):
            ch.basic_publish("", "qq", b"m%d" % i, PERSISTENT)

        p = ctl(c, "add_member", "qq", "c")  # asked on a node that is not a member
        assert p.returncode == 0, p.stdout + p.stderr
        view = wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        assert view["members"] == ["a", "b", "c"], view
        p = ctl(b, "delete_member", "qq", "b")
        assert p.returncode == 0, p.stdout + p.stderr
        view = wait_view(etcd, "qq", lambda v: v["members"] == ["a", "c"])
        assert view["in_sync"] == ["c"], view
        q = eventually(lambda: _members_are(api_queue(b, "qq"), ["a", "c"]), timeout=10)
        assert q["online"] == ["a", "c"], q
        p = ctl(b, "-q", "quorum_status", "qq")
        rows = [line.split("\t")[:2] for line in p.stdout.splitlines()[1:]]
        assert p.returncode == 0 and rows == [["a", "leader"], ["c", "follower"]], p.stdout
        # grow / shrink: every quorum queue gets, or loses, a member on the node
        p = ctl(c, "grow", "b", "all")
        assert p.returncode == 0, p.stdout + p.stderr
        wait_view(etcd, "qq", lambda v: v["members"] == ["a", "c", "b"]
                  and v["in_sync"] == ["b", "c"])
        p = ctl(c, "-s", "shrink", "b")
        assert p.returncode == 0 and p.stdout.splitlines() == ["/\tqq\t3\tok"], p.stdout
        p = ctl(c, "-s", "shrink", "a")
        assert p.stdout.splitlines() == [
            "/\tqq\t2\terror: the leader is not removed (move it first)"], p.stdout
        wait_view(etcd, "qq", lambda v: v["members"] == ["a", "c"] and v["in_sync"] == ["c"])
        p = ctl(b, "delete_member", "qq", "zz")
        assert p.returncode != 0 and "not_found" in p.stdout + p.stderr, p.stdout + p.stderr
        p = ctl(b, "add_member", "qq", "zz")
        assert p.returncode != 0 and "not a node of this cluster" in p.stdout + p.stderr, \
            p.stdout + p.stderr
        for i in range(50, 60):
            ch.basic_publish("", "qq", b"m%d" % i, PERSISTENT)
        conn.close()

        # the added member has every message: it takes over when the leader is killed.
        # Alone of a group of two it is no majority: what no op of its predecessor told it
        # was committed (the last publish) is held until a is back and synced in its term
        a.kill()
        wait_view(etcd, "qq", lambda v: v["master"] == "c")
        conn = c.connect()
        ch = conn.channel()
        every = [b"m%d" % i for i in range(60)]
        got: list[bytes] = []

        def drain() -> None:
            while True:
                method, _props, body = ch.basic_get("qq", auto_ack=True)
                if method is None:
                    break
                got.append(body)
        drain()
        assert len(got) >= 59 and got == every[:len(got)], got
        assert ch.queue_declare("qq", passive=True).method.message_count == 60 - len(got)
        a.start()
        wait_view(etcd, "qq", lambda v: v["master"] == "c" and v["in_sync"] == ["a"],
                  timeout=60)

        def all_delivered() -> None:
            drain()
            assert got == every, got
        eventually(all_delivered, timeout=30)
        conn.close()
    finally:
        for broker in (a, b, c):
            broker.stop()


def _members_are(q: dict, members) -> dict:
    assert q.get("members") == members, q
    return q


def _copy_files(broker_dir):
    return [p for p in broker_dir.rglob("*.copy") if p.parent.name == "mirror-copies"]


@pytest.mark.timeout(180)
def test_follower_restart_catches_up_from_its_compacted_log(tmp_path, etcd, secret):
    """A follower's log is rewritten as a snapshot of what the queue holds once it grows
    past four times that (and 16 MiB); restarted after being down, the follower reads the
    snapshot back and catches up from it: only what it missed is sent. Checked by making
    it the leader (every other member down) and reading the queue."""
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    try:
        conn = a.connect()
        ch = conn.channel()
        ch.queue_declare("qq", durable=True, arguments=QQ)
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"])
        ch.confirm_delivery()
        big = b"x" * (1 << 20)
        for _ in range(20):  # 20 MiB through the log, then consumed
            ch.basic_publish("", "qq", big, PERSISTENT)
        for _ in range(20):
            method, _, _ = ch.basic_get("qq")
            ch.basic_ack(method.delivery_tag)
        for i in range(100):
            ch.basic_publish("", "qq", b"m%d" % i, PERSISTENT)
        conn.close()
        # compacted: far less than the 20 MiB that went through it
        files = _copy_files(tmp_path / "c")
        assert len(files) == 1 and files[0].stat().st_size < 8 << 20, \
            [(f, f.stat().st_size) for f in files]

        c.kill()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b"])
        conn = a.connect()
        ch = conn.channel()
        ch.confirm_delivery()
        for _ in range(30):  # consumed while c is away
            method, _, _ = ch.basic_get("qq")
            ch.basic_ack(method.delivery_tag)
        for i in range(100, 150):
            ch.basic_publish("", "qq", b"m%d" % i, PERSISTENT)
        conn.close()
        c.start()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["b", "c"], timeout=60)
        assert "mirror 'c' catches up from its own copy (70 messages kept, 50 to send)" \
            in a.log(), a.log()[-3000:]

        b.kill()
        wait_view(etcd, "qq", lambda v: v["in_sync"] == ["c"])
        a.kill()
        wait_view(etcd, "qq", lambda v: v["master"] == "c")
        conn = c.connect()
        ch = conn.channel()
        got = []
        while True:
            method, props, body = ch.basic_get("qq", auto_ack=True)
            if method is None:
                break
            got.append(body)
        conn.close()
        assert got == [b"m%d" % i for i in range(30, 150)], (len(got), got[:3])
    finally:
        for broker in (a, b, c):
            broker.stop()


@pytest.mark.timeout(150)
def test_kombu_and_aio_pika_through_a_leader_kill9(tmp_path, etcd, secret):
    """A kombu producer with confirms on one follower's node and an aio-pika robust
    consumer on the other's keep working through a kill -9 of the quorum queue's leader;
    every id kombu saw confirmed is consumed."""
    from .test_failover_clients import QUEUE, TOTAL, Producer, RobustConsumer
    a, b, c = (node(tmp_path, etcd, n, secret) for n in "abc")
    start_together([a, b, c])
    consumer = None
    try:
        conn = a.connect()
        conn.channel().queue_declare(QUEUE, durable=True, arguments=QQ)
        conn.close()
        view = wait_view(etcd, QUEUE, lambda v: v["in_sync"] == ["b", "c"])
        consumer = RobustConsumer(c.port)
        consumer.start()
        killed = threading.Event()
        producer = Producer(b.port, kill_after=150, killed=killed)
        producer.start()
        assert producer.ready_to_kill.wait(60), producer.error
        a.kill()
        t_kill = time.monotonic()
        killed.set()
        producer.join(90)
        assert producer.error is None, producer.error
        assert producer.confirmed == set(range(TOTAL)), "kombu gave up on some ids"
        after = queue_view(etcd, QUEUE)
        assert after["master"] in ("b", "c") and after["epoch"] > view["epoch"], after

        def all_consumed():
            missing = producer.confirmed - {i for i, _ in consumer.got}
            assert not missing, f"{len(missing)} confirmed ids not consumed: {sorted(missing)[:10]}"
        eventually(all_consumed, timeout=30)
        assert any(t > t_kill for _, t in consumer.got), "aio-pika got nothing after the failover"
        assert consumer.error is None, consumer.error
    finally:
        if consumer is not None:
            consumer.stop.set()
            consumer.join(10)
        for broker in (a, b, c):
            broker.stop()
