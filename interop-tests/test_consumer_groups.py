"""Consumer groups over partition queues (x-consistent-hash with x-partitions, x-consumer-group).

TrioMQ-only: skipped against a broker without the x-consistent-hash type (the reference
RabbitMQ here runs without the plugin: declaring it is 503 COMMAND_INVALID there).
"""
from __future__ import annotations

import collections
import itertools
import threading
import time

import pika
import pika.exceptions
import pytest
from helpers import wait_for

PARTS = 8


@pytest.fixture
def partitioned(connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-orders")
    try:
        ch.exchange_declare(x, "x-consistent-hash", arguments={"x-partitions": PARTS})
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-consistent-hash exchange type")
        raise
    for i in range(PARTS):
        cleanup.queue(f"{x}-{i}")
    return ch, x


class Member(threading.Thread):
    """One group member: one connection and channel consuming all partitions. It "works"
    on a message until it acks it, in batches (every 10 messages or 20 ms, multiple=True),
    so its deliveries stay unacknowledged for a while, as real processing keeps them.
    Records [received, key, seq, redelivered, member, acked] for every delivery."""

    def __init__(self, connect, exchange, name, log, lock, prefetch=20, parts=PARTS):
        super().__init__(daemon=True)
        self.parts = parts
        self.connect, self.exchange, self.name = connect, exchange, name
        self.log, self.lock, self.prefetch = log, lock, prefetch
        self.stop = threading.Event()
        self.abrupt = False
        self.ready = threading.Event()
        self.partitions: collections.Counter = collections.Counter()
        self.error: BaseException | None = None

    def run(self):
        try:
            conn = self.connect()
            ch = conn.channel()
            ch.basic_qos(prefetch_count=self.prefetch)
            pending: list = []  # (delivery tag, log record) not acked yet

            def ack_pending():
                if pending:
                    ch.basic_ack(pending[-1][0], multiple=True)
                    now = time.monotonic()
                    for _tag, record in pending:
                        record[5] = now
                    pending.clear()

            def on_message(c, method, props, body):
                key, seq = body.decode().split(":")
                part = int(method.consumer_tag.rsplit("-p", 1)[1])
                record = [time.monotonic(), key, int(seq), method.redelivered, self.name, None]
                with self.lock:
                    self.log.append(record)
                self.partitions[part] += 1
                pending.append((method.delivery_tag, record))
                if len(pending) >= 10:
                    ack_pending()

            for i in range(self.parts):
                ch.basic_consume(f"{self.exchange}-{i}", on_message,
                                 consumer_tag=f"{self.name}-p{i}")
            self.ready.set()
            while not self.stop.is_set():
                conn.process_data_events(time_limit=0.02)
                if not self.abrupt:
                    ack_pending()
            if self.abrupt:
                conn._impl._transport._sock.close()  # vanish without connection.close
            else:
                ack_pending()
                conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.ready.set()


def check_per_key_order(log, total, keys):
    """Per key, the message's last delivery (the one that counted: earlier ones were
    redelivered after their member vanished) goes in publish order, and a message handed to
    another member than the previous one of its key is received only after that previous
    one was acked: one consumer at a time, in order."""
    last: dict = {}
    for record in sorted(log, key=lambda r: r[0]):
        last[record[2]] = record
    assert sorted(last) == list(range(total)), "lost messages"
    for k in range(keys):
        seqs = list(range(k, total, keys))
        for before, after in itertools.pairwise(seqs):
            a, b = last[before], last[after]
            if a[4] == b[4]:  # one member: its deliveries come in order
                assert a[0] <= b[0], f"key k{k}: {after} received before {before} by {a[4]}: {[r for r in log if r[2] in (before, after)]}"
                continue
            assert a[5] is not None and a[5] <= b[0], (
                f"key k{k}: {after} received by {b[4]} at {b[0]:.4f} before {before} "
                f"({a[4]}) was acked at {a[5]}: {[r for r in log if r[2] in (before, after)]}")


def test_keys_keep_their_order_while_members_join_and_leave(partitioned, connect):
    """8 partitions, 100,000 messages over 1,000 keys published up front; members A and B
    start, C joins at a quarter consumed, A leaves cleanly at half, D joins and B vanishes
    at three quarters: per key the consumed order is the publish order, one consumer at a
    time (a redelivery comes before anything later of its key), and nothing is lost."""
    ch, x = partitioned
    log: list = []
    lock = threading.Lock()
    members = {n: Member(connect, x, n, log, lock) for n in "ABCD"}
    total, keys = 100_000, 1_000
    pub = connect().channel()
    for i in range(total):
        pub.basic_publish(x, f"k{i % keys}", f"k{i % keys}:{i}".encode())
    pub.connection.close()
    for n in "AB":
        members[n].start()
        members[n].ready.wait(10)

    def at(fraction):
        wait_for(lambda: len(log) >= total * fraction, timeout=60, msg=f"{fraction:.0%} consumed")

    at(0.25)
    members["C"].start()
    members["C"].ready.wait(10)
    at(0.5)
    members["A"].stop.set()
    members["A"].join(10)
    at(0.75)
    members["D"].start()
    members["D"].ready.wait(10)
    members["B"].abrupt = True
    members["B"].stop.set()
    members["B"].join(10)
    wait_for(lambda: len({r[2] for r in list(log) if r[5] is not None}) >= total, timeout=90,
             msg="all messages consumed and acked")
    for n in "CD":
        members[n].stop.set()
        members[n].join(10)
    assert all(m.error is None for m in members.values()), [m.error for m in members.values()]
    check_per_key_order(log, total, keys)
    for n in "CD":
        assert members[n].partitions, f"{n} got nothing"


def test_partitions_spread_evenly_and_move_when_a_member_leaves(partitioned, connect):
    ch, x = partitioned
    log: list = []
    lock = threading.Lock()
    a = Member(connect, x, "A", log, lock)
    b = Member(connect, x, "B", log, lock)
    c = Member(connect, x, "C", log, lock)
    for m in (a, b, c):
        m.start()
        m.ready.wait(10)
    pub = connect().channel()
    pub.confirm_delivery()
    for i in range(800):
        pub.basic_publish(x, f"k{i}", f"k{i}:{i}".encode())
    wait_for(lambda: len(log) >= 800, timeout=20, msg="first round consumed")
    time.sleep(0.2)
    shares = sorted(len(m.partitions) for m in (a, b, c))
    assert shares == [2, 3, 3]  # 8 partitions over 3 members
    c.stop.set()
    c.join(10)
    for m in (a, b):
        m.partitions.clear()
    for i in range(800):
        pub.basic_publish(x, f"k{i}", f"k{i}:{i}".encode())
    wait_for(lambda: len(log) >= 1600, timeout=20, msg="second round consumed")
    assert sorted(len(m.partitions) for m in (a, b)) == [4, 4]
    assert not set(a.partitions) & set(b.partitions)
    for m in (a, b):
        m.stop.set()
        m.join(10)


def test_bad_partition_count_is_406(connect, uid, cleanup):
    ch = connect().channel()
    x = cleanup.exchange(uid + "-bad")
    try:
        ch.exchange_declare(x, "x-consistent-hash", arguments={"x-partitions": 0})
    except pika.exceptions.ConnectionClosedByBroker as exc:
        if exc.reply_code == 503:
            pytest.skip("this broker has no x-consistent-hash exchange type")
        raise
    except pika.exceptions.ChannelClosedByBroker as exc:
        assert exc.reply_code == 406 and "x-partitions must be an integer from 1 to 1024" in exc.reply_text
        return
    raise AssertionError("x-partitions 0 was accepted")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hard", [False, True], ids=["restart", "kill9"])
def test_durable_partitions_and_their_group_survive_a_restart(tmp_path, external_broker, hard):
    """A durable partitioned exchange: partitions, bindings and messages come back after a
    restart and a kill -9, the group forms again, and per-key order holds across it."""
    if external_broker:
        pytest.skip("starts its own TrioMQ brokers")
    from brokerproc import BrokerProc
    b = BrokerProc(tmp_path / "data", "journal").start()
    try:
        ch = b.connect().channel()
        ch.exchange_declare("px", "x-consistent-hash", durable=True, arguments={"x-partitions": 4})
        ch.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2)
        for i in range(400):
            ch.basic_publish("px", f"k{i % 40}", f"k{i % 40}:{i}".encode(), props)
        b.restart(hard=hard)
        log: list = []
        lock = threading.Lock()
        members = [Member(b.connect, "px", n, log, lock, parts=4) for n in "AB"]
        for m in members:
            m.start()
            m.ready.wait(10)
        wait_for(lambda: len({r[2] for r in list(log) if r[5] is not None}) >= 400, timeout=30,
                 msg="all consumed after the restart")
        check_per_key_order(log, 400, 40)
        for m in members:  # the group formed again: two partitions each
            m.partitions.clear()
        ch = b.connect().channel()
        for i in range(400, 800):
            ch.basic_publish("px", f"k{i % 40}", f"k{i % 40}:{i}".encode())
        wait_for(lambda: len({r[2] for r in list(log) if r[5] is not None}) >= 800, timeout=30,
                 msg="second round consumed")
        for m in members:
            m.stop.set()
            m.join(10)
        assert all(m.error is None for m in members), [m.error for m in members]
        assert sorted(len(m.partitions) for m in members) == [2, 2]
    finally:
        b.stop()
