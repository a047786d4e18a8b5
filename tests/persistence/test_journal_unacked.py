"""Persistent deliveries an AMQP channel holds past a consumer-timeout sweep are parked in the
journal as rows (``Store.park``): no ``QueueEntry``, no message object, about what a paged
queue's entry costs. Every way of settling them takes the entry back whole (ack, multiple,
nack, reject to a dead-letter queue, requeue on close, the consumer timeout, a rolled-back
transaction), and checkpoints, compaction and a restart after a crash see them as
delivered-unsettled messages.

Through a Session on the fake clock: each ``clock.advance(1.1)`` runs a sweep; the journal's
writer runs only when the test flushes (``_flush``).
"""
from __future__ import annotations

import gc
import os
import tracemalloc

import pytest
import trio

from broker.amqp import spec
from broker.amqp.codec import method_frame
from broker.broker import Broker
from broker.config import JournalSettings
from broker.persistence.journal import JournalStore

from ..conftest import _config
from ..support import SessionClient, methods

N = 3_000
BOUND = 100  # B per never-acked persistent delivery, once parked (~350 B as objects)


def _open(tmp_path, clock, **settings) -> Broker:
    data = str(tmp_path / "data")
    js = JournalSettings(**settings)
    store = JournalStore(data, segment_size=js.segment_size, settings=js)
    b = Broker(_config(tmp_path), store)
    trio.run(store.open)
    b.recover()
    b.timers.now = clock
    clock.timers = b.timers
    return b


@pytest.fixture
def broker(tmp_path, clock):
    b = _open(tmp_path, clock)
    yield b
    if b.store._lock_fd is not None:
        trio.run(b.store.close)


def _flush(broker) -> None:
    trio.run(broker.store._flush_once)


def _age(clock) -> None:
    clock.advance(1.1)
    clock.advance(1.1)


def _declare(c, broker, queue: str = "q", **arguments) -> None:
    c.send(method_frame(1, spec.Queue.Declare(queue=queue, durable=True, arguments=arguments)))
    _flush(broker)  # a durable queue's declare-ok waits for its definition to be written
    assert methods(c.output(), spec.Queue.DeclareOk)


def _deliver(c, broker, bodies, queue: str = "q") -> list[int]:
    c.open_channel(1)
    _declare(c, broker, queue)
    for body in bodies:
        c.publish(1, body, routing_key=queue, delivery_mode=2, headers={"n": body[:8]})
    _flush(broker)
    return [m.delivery_tag for m in methods(c.consume(1, queue, tag="t"), spec.Basic.Deliver)]


def _drain(c, queue: str = "q", channel: int = 2) -> list[tuple[bytes, bool]]:
    c.open_channel(channel)
    got = []
    while True:
        written = c.call(channel, spec.Basic.Get(queue=queue, no_ack=True))
        if isinstance(written[0].method, spec.Basic.GetEmpty):
            return got
        w = written[0]
        assert w.properties["delivery_mode"] == 2 and w.properties["headers"]["n"] == w.body[:8]
        got.append((w.body, w.method.redelivered))


def test_parked_deliveries_cost_what_a_paged_entry_does(broker, clock):
    """Fails with the entry, its StoredMessage, their ints and the journal's dict slot per
    delivery (~350 B)."""
    c = SessionClient(broker)
    c.open_channel(1)
    _declare(c, broker)
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        for i in range(N):
            c.publish(1, b"%06d" % i + b"." * 200, routing_key="q", delivery_mode=2)
        _flush(broker)
        c.consume(1, "q", tag="t")
        ch = c.session.channels[1]
        q = broker.vhosts["/"].queues["q"]
        while len(ch.unacked) < N:
            c.conn.data_to_send()  # the deliveries' frames, written out
            q.dispatch()
        _age(clock)
        c.output()
        _flush(broker)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    # (not the frame parser's receive buffer: grown once, per connection)
    keep = [tracemalloc.Filter(True, "*/broker/*"), tracemalloc.Filter(False, "*/amqp/codec.py")]
    grown = sum(s.size_diff for s in after.filter_traces(keep).compare_to(
        before.filter_traces(keep), "filename"))
    assert grown / N <= BOUND, f"{grown / N:.0f} B per unacked persistent delivery"
    assert broker.store._parked.live == N and not broker.store._out
    c.call(1, spec.Basic.Ack(0, True))
    assert broker.store._parked.live == 0 and broker.vhosts["/"].queues["q"].message_count == 0


def test_parked_deliveries_settle_every_way(broker, clock):
    c = SessionClient(broker)
    bodies = [b"body-%03d" % i + b"x" * 300 for i in range(10)]
    tags = _deliver(c, broker, bodies)
    _age(clock)
    store = broker.store
    assert store._parked.live == 10 and not store._out
    q = broker.vhosts["/"].queues["q"]
    c.call(1, spec.Basic.Cancel("t"))
    c.call(1, spec.Basic.Ack(tags[0], False))
    c.call(1, spec.Basic.Ack(tags[2], True))       # the 2nd and 3rd
    c.call(1, spec.Basic.Reject(tags[4], False))   # the 5th, dropped (no DLX)
    c.call(1, spec.Basic.Nack(tags[6], True, True))  # the 4th, 6th and 7th back, whole
    assert q.unacked_count == 3 and q.message_count == 3 and store._parked.live == 3
    c.call(1, spec.Basic.Ack(tags[8], False))
    c.call(1, spec.Channel.Close(200, "bye", 0, 0))  # the 8th and 10th back
    assert q.unacked_count == 0 and store._parked.live == 0 and not store._out
    assert _drain(c) == [(bodies[i], True) for i in (3, 5, 6, 7, 9)]
    _flush(broker)
    assert q.message_count == 0 and not store._seg_live  # every message removed


def test_parked_deliveries_dead_letter_time_out_and_roll_back(broker, clock):
    c = SessionClient(broker)
    c.open_channel(1)
    _declare(c, broker, "dlq")
    _declare(c, broker, "q", **{"x-dead-letter-exchange": "",
                                "x-dead-letter-routing-key": "dlq"})
    bodies = [b"dl-%03d" % i + b"y" * 100 for i in range(6)]
    for body in bodies:
        c.publish(1, body, routing_key="q", delivery_mode=2, headers={"n": body[:8]})
    _flush(broker)
    tags = [m.delivery_tag for m in methods(c.consume(1, "q", tag="t"), spec.Basic.Deliver)]
    c.ok(1, spec.Tx.Select(), spec.Tx.SelectOk)
    _age(clock)
    assert broker.store._parked.live == 6
    c.call(1, spec.Basic.Reject(tags[0], False))
    c.call(1, spec.Basic.Ack(tags[2], True))
    assert broker.store._parked.live == 3  # taken back, held by the transaction
    c.ok(1, spec.Tx.Rollback(), spec.Tx.RollbackOk)  # undone: parked again
    assert broker.store._parked.live == 6
    c.call(1, spec.Basic.Reject(tags[0], False))  # dead-lettered at commit
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    assert broker.store._parked.live == 5
    _age(clock)
    assert broker.store._parked.live == 5
    broker.consumer_timeouts.timeout_ms = 1000
    clock.advance(1.1)
    close = methods(c.output(), spec.Channel.Close)
    assert close and close[0].reply_code == 406  # timed out: all back in the queue
    assert broker.store._parked.live == 0
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 5 and q.unacked_count == 0
    got = _drain(c, "q", channel=3)
    assert sorted(got) == [(b, True) for b in bodies[1:]]
    assert _drain(c, "dlq", channel=4) == [(bodies[0], False)]


def _crash(broker) -> None:
    """What a kill -9 leaves: what was written, no close, no final checkpoint."""
    store = broker.store
    for fd in store._fds.values():
        os.close(fd)
    store._fds.clear()
    os.close(store._lock_fd)
    store._lock_fd = None


def test_parked_deliveries_survive_checkpoint_compaction_and_a_crash(tmp_path, clock):
    broker = _open(tmp_path, clock, segment_size=64 * 1024, compact_dead_fraction=0.0)
    c = SessionClient(broker)
    bodies = [b"p-%04d" % i + b"z" * 994 for i in range(120)]
    tags = _deliver(c, broker, bodies)
    _age(clock)
    store = broker.store
    assert store._parked.live == 120
    c.call(1, spec.Basic.Ack(tags[59], True))  # the first 60 settled
    trio.run(store.checkpoint)
    _declare(c, broker, "other")
    for i in range(150):  # the log moves on; the old segments are compacted
        c.publish(1, b"late-%03d" % i + b"." * 990, routing_key="other", delivery_mode=2)
    _flush(broker)
    trio.run(store.checkpoint)
    old = dict(zip(tags, bodies, strict=True))
    trio.run(store.checkpoint)
    assert store.compact_written > 0
    assert min(store._parked.locs[s] >> 32 for s in store._parked.slots()) > 1
    c.call(1, spec.Basic.Cancel("t"))
    c.call(1, spec.Basic.Ack(tags[69], True))  # ten more, after the checkpoint
    c.call(1, spec.Basic.Nack(tags[70], False, True))  # requeued: read back whole
    assert _drain(c, channel=3) == [(old[tags[70]], True)]
    _flush(broker)
    _crash(broker)

    again = _open(tmp_path, clock)
    q = again.vhosts["/"].queues["q"]
    c2 = SessionClient(again)
    assert q.message_count == 49
    assert _drain(c2, channel=1) == [(old[t], True) for t in tags[71:]]
    trio.run(again.store.close)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_parked_deliveries_come_back_after_a_checkpoint_and_kill_9(tmp_path):
    """A broker process: a consumer holds 20 persistent deliveries past two sweeps (parked),
    a checkpoint is written after that (it must list them), then kill -9: after the restart
    the 20 are back, redelivered, and the 10 acked before never."""
    import signal
    import time

    import pika

    from bench.procinfo import TrioMQProcess

    data = str(tmp_path / "data")
    args = ["--journal-checkpoint-records", "200"]
    persistent = pika.BasicProperties(delivery_mode=2)
    with TrioMQProcess(quiet=True, data_dir=data, extra_args=args) as b:
        params = pika.URLParameters(b.url)
        pub = pika.BlockingConnection(params)
        pch = pub.channel()
        pch.confirm_delivery()
        pch.queue_declare("ua", durable=True)
        pch.queue_declare("other", durable=True)
        for i in range(30):
            pch.basic_publish("", "ua", b"ua-%02d" % i, persistent)
        con = pika.BlockingConnection(params)
        cch = con.channel()
        got: list = []
        cch.basic_consume("ua", lambda _c, m, _p, body: got.append((m.delivery_tag, body)))
        while len(got) < 30:
            con.process_data_events(0.1)
        cch.basic_ack(got[9][0], multiple=True)
        con.process_data_events(0.1)
        cch.basic_cancel(cch.consumer_tags[0])
        time.sleep(2.5)  # two consumer-timeout sweeps: the 20 left are parked
        ckpt = os.path.join(data, "journal", "checkpoint")
        before = os.stat(ckpt).st_mtime_ns if os.path.exists(ckpt) else 0
        for i in range(300):  # past --journal-checkpoint-records: a checkpoint
            pch.basic_publish("", "other", b"o-%03d" % i, persistent)
        deadline = time.monotonic() + 60
        while (not os.path.exists(ckpt) or os.stat(ckpt).st_mtime_ns == before) \
                and time.monotonic() < deadline:
            con.process_data_events(0.2)
        assert os.path.exists(ckpt) and os.stat(ckpt).st_mtime_ns != before
        os.killpg(b.proc.pid, signal.SIGKILL)
        b.proc.wait()
    with TrioMQProcess(quiet=True, data_dir=data) as b:
        c = pika.BlockingConnection(pika.URLParameters(b.url))
        ch = c.channel()
        back = []
        while True:
            m, _p, body = ch.basic_get("ua", auto_ack=True)
            if m is None:
                break
            back.append((body, m.redelivered))
        c.close()
    assert back == [(b"ua-%02d" % i, True) for i in range(10, 30)]


def test_parked_deliveries_of_a_purged_or_deleted_queue(broker, clock):
    c = SessionClient(broker)
    bodies = [b"pd-%03d" % i + b"w" * 100 for i in range(6)]
    tags = _deliver(c, broker, bodies)
    _age(clock)
    store = broker.store
    assert store._parked.live == 6
    c.ok(1, spec.Queue.Purge(queue="q"), spec.Queue.PurgeOk)  # the ready ones only
    c.call(1, spec.Basic.Cancel("t"))
    c.ok(1, spec.Basic.Recover(requeue=True), spec.Basic.RecoverOk)  # all six back
    assert store._parked.live == 0
    tags = [m.delivery_tag for m in methods(c.consume(1, "q", tag="t2"), spec.Basic.Deliver)]
    assert len(tags) == 6
    _age(clock)
    assert store._parked.live == 6
    c.call(1, spec.Basic.Ack(tags[1], False))
    c.open_channel(2)
    written = c.send(method_frame(2, spec.Queue.Delete(queue="q")))
    _flush(broker)
    assert methods(written + c.output(), spec.Queue.DeleteOk)
    c.call(1, spec.Basic.Ack(tags[2], False))  # settled after the queue went
    c.close_connection()  # the rest: returned to a queue that is gone
    assert store._parked.live == 0 and not store._out
    _flush(broker)
    assert not store._seg_live  # nothing of theirs counted live any more


def test_parked_deliveries_of_a_queue_deleted_and_declared_again(tmp_path, clock):
    """The queue of parked deliveries is deleted and declared again with the same name: the
    new queue is another (its own id), so the old deliveries, settled or requeued later, or
    written in a checkpoint before a crash, never turn up in it."""
    broker = _open(tmp_path, clock)
    c = SessionClient(broker)
    bodies = [b"rd-%03d" % i + b"v" * 100 for i in range(6)]
    tags = _deliver(c, broker, bodies)
    _age(clock)
    store = broker.store
    assert store._parked.live == 6
    c.open_channel(2)
    written = c.send(method_frame(2, spec.Queue.Delete(queue="q")))
    _flush(broker)
    assert methods(written + c.output(), spec.Queue.DeleteOk)
    c.send(method_frame(2, spec.Queue.Declare(queue="q", durable=True)))
    _flush(broker)
    c.publish(2, b"new-one", routing_key="q", delivery_mode=2, headers={"n": b"new-one"})
    _flush(broker)
    trio.run(store.checkpoint)  # the old rows, still parked, are not the new queue's
    c.call(1, spec.Basic.Nack(tags[0], False, True))  # requeued to a queue that is gone
    c.call(1, spec.Basic.Ack(tags[1], False))
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 1 and q.unacked_count == 0
    _flush(broker)
    _crash(broker)

    again = _open(tmp_path, clock)
    c2 = SessionClient(again)
    assert _drain(c2, channel=1) == [(b"new-one", False)]
    trio.run(again.store.close)


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx", "drop-head"])
def test_a_parked_delivery_requeued_to_a_full_queue(broker, clock, overflow):
    """Nack with requeue of a parked delivery to a queue at its max-length: back in the
    queue as any requeue (RabbitMQ's overflow applies to publishes, not requeues; drop-head
    dead-letters the head), read whole, its names (exchange, routing key) for dead-lettering
    read from the record."""
    c = SessionClient(broker)
    c.open_channel(1)
    _declare(c, broker, "dlq")
    args = {"x-max-length": 3, "x-overflow": overflow, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "dlq"}
    _declare(c, broker, "q", **args)
    bodies = [b"fq-%03d" % i + b"u" * 100 for i in range(3)]
    for body in bodies:
        c.publish(1, body, routing_key="q", delivery_mode=2, headers={"n": body[:8]})
    _flush(broker)
    tags = [m.delivery_tag for m in methods(c.consume(1, "q", tag="t"), spec.Basic.Deliver)]
    _age(clock)
    assert broker.store._parked.live == 3
    c.call(1, spec.Basic.Cancel("t"))
    more = [b"fq-new%01d" % i + b"u" * 100 for i in range(3)]
    for body in more:  # the queue full again
        c.publish(1, body, routing_key="q", delivery_mode=2, headers={"n": body[:8]})
    _flush(broker)
    c.call(1, spec.Basic.Nack(tags[-1], True, True))
    assert broker.store._parked.live == 0
    got = _drain(c, "q", channel=3) + _drain(c, "dlq", channel=4)
    assert sorted(b for b, _r in got) == sorted(bodies + more)


def test_parked_deliveries_of_a_deleted_queue_rejected_requeued_acked(tmp_path, clock):
    """A deleted queue's parked deliveries settled afterwards, every way (reject to its
    dead-letter queue, nack with requeue, ack): taken back whole (their names read from the
    record, the queue's id being gone), as they would be unparked; nothing back in a queue."""
    broker = _open(tmp_path, clock)
    c = SessionClient(broker)
    c.open_channel(1)
    _declare(c, broker, "dlq")
    _declare(c, broker, "q", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"})
    for i in range(5):
        c.publish(1, b"dq-%05d" % i + b"z" * 1000, routing_key="q", delivery_mode=2,
                  headers={"n": b"dq-%05d" % i})
    _flush(broker)
    tags = [m.delivery_tag for m in methods(c.consume(1, "q", tag="t"), spec.Basic.Deliver)]
    _age(clock)
    store = broker.store
    assert store._parked.live == 5
    c.open_channel(2)
    written = c.send(method_frame(2, spec.Queue.Delete(queue="q")))
    _flush(broker)
    assert methods(written + c.output(), spec.Queue.DeleteOk)
    c.call(1, spec.Basic.Reject(tags[0], False))
    c.call(1, spec.Basic.Nack(tags[1], False, True))
    c.call(1, spec.Basic.Ack(tags[2], False))
    c.close_connection()
    assert store._parked.live == 0 and not store._out
    c2 = SessionClient(broker)
    # as an unparked delivery's reject: dead-lettered whole (body, headers)
    assert [b[:8] for b, _r in _drain(c2, "dlq", channel=1)] == [b"dq-00000"]


class _SteppedWallClock:
    """The wall clock an hour ahead (an NTP or operator step while a delivery is parked)."""

    @staticmethod
    def time() -> float:
        import time

        return time.time() + 3600.0


def test_a_wall_clock_step_while_parked_does_not_expire_a_requeued_delivery(broker, clock,
                                                                           monkeypatch):
    """A parked delivery's expiry is the broker's clock, as an unparked one's: a wall-clock
    step between its parking and its requeue does not make it expire (before, the expiry
    went through the wall clock and back, an hour early: the requeued message was gone)."""
    from broker.persistence.journal import parking

    c = SessionClient(broker)
    c.open_channel(1)
    _declare(c, broker)
    c.publish(1, b"ttl-0000" + b"t" * 100, routing_key="q", delivery_mode=2,
              headers={"n": b"ttl-0000"}, expiration="600000")  # ten minutes
    _flush(broker)
    tags = [m.delivery_tag for m in methods(c.consume(1, "q", tag="t"), spec.Basic.Deliver)]
    _age(clock)
    assert broker.store._parked.live == 1
    monkeypatch.setattr(parking, "time", _SteppedWallClock)
    c.call(1, spec.Basic.Cancel("t"))
    c.call(1, spec.Basic.Nack(tags[0], False, True))
    assert [b[:8] for b, _r in _drain(c, channel=2)] == [b"ttl-0000"]


def test_a_parked_delivery_keeps_its_expiry_through_a_checkpoint_and_a_crash(tmp_path, clock):
    """The parked row's expiry, written by a checkpoint as wall-clock time: after a crash the
    message is back with an expiry, not expired. (Recovery runs before the test's fake clock
    is set, so how much time is left is not checked here.)"""
    broker = _open(tmp_path, clock)
    c = SessionClient(broker)
    c.open_channel(1)
    _declare(c, broker)
    c.publish(1, b"ttl-0001" + b"t" * 100, routing_key="q", delivery_mode=2,
              headers={"n": b"ttl-0001"}, expiration="600000")
    _flush(broker)
    c.consume(1, "q", tag="t")
    _age(clock)
    assert broker.store._parked.live == 1
    trio.run(broker.store.checkpoint)
    _crash(broker)

    again = _open(tmp_path, clock)
    q = again.vhosts["/"].queues["q"]
    assert [e.expires_at is not None for e in q.stored_entries()] == [True]
    assert [b[:8] for b, _r in _drain(SessionClient(again), channel=1)] == [b"ttl-0001"]
    trio.run(again.store.close)
