"""A channel's unacknowledged deliveries once they are older than a consumer-timeout sweep:
kept as columns (tag, entry, consumer, when) instead of an object each, and every way of
settling them works as on fresh ones (ack, multiple, nack, reject, recover, close, tx).

Through a Session on the fake clock: each ``clock.advance(1.1)`` runs a sweep.
"""
from __future__ import annotations

import gc
import tracemalloc

from broker.amqp import spec
from broker.amqp.codec import method_frame

from .support import make_message, methods

N = 10_000
BOUND = 48  # B of the channel's own records per never-acked delivery, once aged


def _age(clock) -> None:
    clock.advance(1.1)
    clock.advance(1.1)


def _consume_many(c, n: int, queue: str = "q") -> None:
    c.open_channel(1)
    c.declare_queue(1, queue)
    q = c.broker.vhosts["/"].queues[queue]
    for i in range(n):
        q.enqueue(make_message(b"%d" % i))


def test_aged_deliveries_cost_tens_of_bytes(broker, session_client, clock):
    """Fails with an ``Unacked`` object, its int tag and a dict slot per delivery (~160 B)."""
    c = session_client()
    _consume_many(c, N)
    gc.collect()
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        c.session.data_received(method_frame(1, spec.Basic.Consume(queue="q", consumer_tag="t")))
        ch = c.session.channels[1]
        q = broker.vhosts["/"].queues["q"]
        while len(ch.unacked) < N:
            c.conn.data_to_send()  # the deliveries' frames, written out
            q.dispatch()
        c.conn.data_to_send()
        _age(clock)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    assert len(c.session.channels[1].unacked) == N
    keep = [tracemalloc.Filter(True, "*/broker/listeners/amqp_*"),
            tracemalloc.Filter(True, "*/broker/consumer_timeout.py")]
    grown = sum(s.size_diff for s in after.filter_traces(keep).compare_to(
        before.filter_traces(keep), "filename"))
    assert grown / N <= BOUND, f"{grown / N:.0f} B per unacked delivery"


def _deliver(c, n: int, queue: str = "q") -> list[int]:
    c.open_channel(1)
    c.declare_queue(1, queue)
    for i in range(n):
        c.publish(1, b"%d" % i, routing_key=queue)
    return [m.delivery_tag for m in methods(c.consume(1, queue, tag="t"), spec.Basic.Deliver)]


def _bodies(c, queue: str = "q", channel: int = 1) -> list[tuple[bytes, bool]]:
    if channel != 1:
        c.open_channel(channel)
    got = []
    while True:
        written = c.call(channel, spec.Basic.Get(queue=queue, no_ack=True))
        if isinstance(written[0].method, spec.Basic.GetEmpty):
            return got
        got.append((written[0].body, written[0].method.redelivered))


def test_aged_deliveries_settle_as_fresh_ones(broker, session_client, clock):
    c = session_client()
    tags = _deliver(c, 10)
    _age(clock)
    ch = c.session.channels[1]
    assert dict.__len__(ch.unacked) == 0 and len(ch.unacked) == 10  # all aged
    q = broker.vhosts["/"].queues["q"]
    assert q.unacked_count == 10
    c.call(1, spec.Basic.Cancel("t"))  # requeued ones stay in the queue
    c.call(1, spec.Basic.Ack(tags[0], False))
    c.call(1, spec.Basic.Ack(tags[2], True))  # the 2nd and 3rd
    c.call(1, spec.Basic.Reject(tags[4], False))  # the 5th, dropped (no DLX)
    c.call(1, spec.Basic.Nack(tags[6], True, True))  # the 4th, 6th and 7th back
    assert len(ch.unacked) == 3 and q.unacked_count == 3
    assert q.message_count == 3
    c.call(1, spec.Basic.Ack(tags[8], False))
    assert len(ch.unacked) == 2
    out = c.call(1, spec.Basic.Ack(tags[6], False))
    assert methods(out, spec.Channel.Close)[0].reply_code == 406  # no longer out
    assert q.unacked_count == 0 and q.message_count == 5  # the channel's two came back
    assert _bodies(c, channel=2) == [(b"3", True), (b"5", True), (b"6", True), (b"7", True),
                                     (b"9", True)]


def test_aged_and_fresh_deliveries_requeue_in_queue_order(broker, session_client, clock):
    c = session_client()
    old = _deliver(c, 4)
    _age(clock)
    c.publish(1, b"4", routing_key="q")
    c.publish(1, b"5", routing_key="q")
    ch = c.session.channels[1]
    assert dict.__len__(ch.unacked) == 2 and len(ch.unacked) == 6
    c.call(1, spec.Basic.Cancel("t"))
    c.call(1, spec.Basic.Ack(old[1], False))
    c.ok(1, spec.Basic.Recover(requeue=True), spec.Basic.RecoverOk)
    assert len(ch.unacked) == 0
    assert _bodies(c) == [(b"0", True), (b"2", True), (b"3", True), (b"4", True), (b"5", True)]


def test_aged_deliveries_in_a_rolled_back_transaction_stay_out(broker, session_client, clock):
    c = session_client()
    tags = _deliver(c, 3)
    c.ok(1, spec.Tx.Select(), spec.Tx.SelectOk)
    _age(clock)
    c.call(1, spec.Basic.Ack(tags[1], True))
    ch = c.session.channels[1]
    assert len(ch.unacked) == 1
    c.ok(1, spec.Tx.Rollback(), spec.Tx.RollbackOk)
    assert len(ch.unacked) == 3
    c.call(1, spec.Basic.Ack(tags[2], True))
    c.ok(1, spec.Tx.Commit(), spec.Tx.CommitOk)
    assert len(ch.unacked) == 0 and broker.vhosts["/"].queues["q"].message_count == 0


def test_aged_deliveries_time_out_and_come_back_on_close(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = 5000
    c = session_client()
    _deliver(c, 3)
    _age(clock)
    for _ in range(4):
        clock.advance(1.1)
    close = methods(c.output(), spec.Channel.Close)
    assert close and close[0].reply_code == 406
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 3 and q.unacked_count == 0
