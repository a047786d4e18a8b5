"""A publish in flight when the master of a mirrored queue is killed gets an answer --
a confirm, a nack or its connection closed (541) -- within the failover time, on every
node: pika publishers with confirms on both non-master nodes of three (ha-mode all), one
publish at a time, while the master is killed with -9. Real etcd, real nodes."""
from __future__ import annotations

import threading
import time

import pika
import pytest

from .test_cluster_nodes import node
from .test_mirroring import queue_view
from .test_mirroring_more import put_policy, start_together, wait_in_sync

# the lease TTL is 2 s: an answer later than this is a publisher left hanging
BOUND = 20.0


class Publisher(threading.Thread):
    """Publishes one message at a time with confirms to ``queue`` on ``broker``; records
    how long each took to be answered and how; reconnects after a closed connection."""

    def __init__(self, broker, queue: str):
        super().__init__(daemon=True)
        self.broker = broker
        self.queue = queue
        self.stop = threading.Event()
        self.started_at: float | None = None  # the publish waiting for its answer
        self.answers: list[tuple[float, str]] = []  # (seconds to the answer, how)
        self.errors: list[str] = []

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters(
                    "127.0.0.1", self.broker.port, heartbeat=10, blocked_connection_timeout=30,
                    credentials=pika.PlainCredentials("guest", "guest")))
            except pika.exceptions.AMQPError as exc:
                self.errors.append(f"connect: {exc!r}")
                time.sleep(0.2)
                continue
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stop.is_set():
                    n += 1
                    self.started_at = time.monotonic()
                    how = "confirm"
                    try:
                        ch.basic_publish("", self.queue, b"p%d" % n,
                                         pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.NackError:
                        how = "nack"
                    except pika.exceptions.UnroutableError:
                        how = "unroutable"
                    except pika.exceptions.AMQPError as exc:
                        self.answers.append((time.monotonic() - self.started_at,
                                             f"closed: {exc!r}"))
                        self.started_at = None
                        break
                    self.answers.append((time.monotonic() - self.started_at, how))
                    self.started_at = None
                    if how != "confirm":
                        time.sleep(0.05)
            except pika.exceptions.AMQPError as exc:
                self.errors.append(repr(exc))
                self.started_at = None
            finally:
                try:
                    if conn.is_open:
                        conn.close()
                except Exception:
                    pass

    def waiting_for(self) -> float:
        started = self.started_at
        return 0.0 if started is None else time.monotonic() - started


@pytest.mark.timeout(240)
@pytest.mark.parametrize("prefill", [0, 20000])
def test_every_publish_in_flight_at_a_failover_is_answered(tmp_path, etcd, secret, prefill):
    nodes = [node(tmp_path, etcd, n, secret) for n in ("a", "b", "c")]
    a, b, c = nodes
    start_together(nodes)
    try:
        put_policy(a, "ha", "^ha\\.", {"ha-mode": "all"})
        conn = a.connect()
        conn.channel().queue_declare("ha.f", durable=True)
        conn.close()
        wait_in_sync(etcd, "ha.f", ["b", "c"], timeout=30)
        if prefill:  # what the promoted master takes over and syncs to the other mirror
            conn = a.connect()
            ch = conn.channel()
            for i in range(prefill):
                ch.basic_publish("", "ha.f", b"x%d" % i, pika.BasicProperties(delivery_mode=2))
            ch.confirm_delivery()
            ch.basic_publish("", "ha.f", b"fence", pika.BasicProperties(delivery_mode=2))
            conn.close()
        publishers = [Publisher(b, "ha.f"), Publisher(c, "ha.f")]
        for p in publishers:
            p.start()
        deadline = time.monotonic() + 30
        while not all(sum(h == "confirm" for _, h in p.answers) >= 20 for p in publishers):
            assert time.monotonic() < deadline, [p.answers[-3:] for p in publishers]
            time.sleep(0.1)
        epoch = queue_view(etcd, "ha.f")["epoch"]
        a.kill()
        # the new master, and confirms flowing again on both nodes
        deadline = time.monotonic() + 60
        while True:
            view = queue_view(etcd, "ha.f")
            if view["master"] in ("b", "c") and view["epoch"] > epoch:
                break
            for p in publishers:
                assert p.waiting_for() < BOUND, (p.broker.name if hasattr(p.broker, "name")
                                                 else p.broker.port, p.answers[-5:])
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        counts = [len(p.answers) for p in publishers]
        deadline = time.monotonic() + 40
        while True:
            flowing = [sum(h == "confirm" for _, h in p.answers[k:]) >= 10
                       for p, k in zip(publishers, counts, strict=True)]
            if all(flowing):
                break
            for p in publishers:
                assert p.waiting_for() < BOUND, (p.answers[-5:], p.errors[-3:])
            assert time.monotonic() < deadline, ([p.answers[-5:] for p in publishers],
                                                 [p.errors[-3:] for p in publishers])
            time.sleep(0.1)
        for p in publishers:
            p.stop.set()
        for p in publishers:
            p.join(BOUND)
            assert not p.is_alive(), ("a publish never answered", p.answers[-5:])
            slow = [(t, h) for t, h in p.answers if t >= BOUND]
            assert not slow, slow
    finally:
        for n in nodes:
            n.stop()


@pytest.mark.timeout(120)
def test_a_publish_on_a_link_that_never_came_up_is_answered(tmp_path, etcd, secret):
    """A node that never forwarded to a queue's master (no link to it yet) gets a publish
    for it after the master died: the link to a node without an address never connects,
    and the publish held for its first connection is nacked within the lease TTL (it was
    held for ever)."""
    a = node(tmp_path, etcd, "a", secret).start()
    b = node(tmp_path, etcd, "b", secret).start()
    try:
        conn = a.connect()
        conn.channel().queue_declare("solo", durable=True)
        conn.close()
        from .test_mirroring_more import wait_master
        wait_master(etcd, "solo", "a")
        a.kill()
        deadline = time.monotonic() + 30
        while queue_view(etcd, "solo")["master"] is not None:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        p = Publisher(b, "solo")
        p.start()
        deadline = time.monotonic() + BOUND + 10
        while len(p.answers) < 3:
            assert p.waiting_for() < BOUND, ("a publish left hanging", p.answers, p.errors)
            assert time.monotonic() < deadline, (p.answers, p.errors)
            time.sleep(0.1)
        p.stop.set()
        p.join(BOUND)
        assert {h for _, h in p.answers} <= {"nack"}, p.answers
        assert all(t < BOUND for t, _ in p.answers), p.answers
    finally:
        b.stop()
        a.stop()
