"""The queue operation stream (broker/queues/ops.py): every state change, in order,
to every observer; every entry leaves exactly once; retry and ready-store seams."""
from __future__ import annotations

import tracemalloc

from broker.queues.fifo import FifoReady
from broker.queues.ops import LEAVING, Op, OpRecorder
from broker.queues.retry import RetryReady

from ..support import bind, declare_exchange, declare_queue, make_message
from .test_queue_features import FakeChannel, consume


def observed(vhost, name="q", **fields):
    q = declare_queue(vhost, name, **fields)
    rec = OpRecorder()
    q.observers.append(rec)
    return q, rec


def test_publish_get_ack_requeue_purge_delete(vhost):
    q, rec = observed(vhost)
    for body in (b"a", b"b", b"c"):
        q.enqueue(make_message(body))
    e1 = q.get()
    q.settled(e1)                       # acked
    e2 = q.get()
    q.requeue([(e2, None)])             # back at its place, redelivered
    assert q.message_count == 2
    assert q.purge() == 2
    q.enqueue(make_message(b"d"))
    vhost.delete_queue(q)
    assert rec.ops == [
        (Op.ENQUEUE, 1), (Op.ENQUEUE, 2), (Op.ENQUEUE, 3),
        (Op.DELIVER, 1), (Op.SETTLE, 1),
        (Op.DELIVER, 2), (Op.REQUEUE, 2),
        (Op.PURGE, 2), (Op.PURGE, 3),
        (Op.ENQUEUE, 4), (Op.DELETE, 4),
    ]


def test_every_entry_leaves_exactly_once(vhost, clock):
    declare_exchange(vhost, "dlx", "fanout")
    bind(vhost, "dlx", declare_queue(vhost, "dlq"))
    q, rec = observed(vhost, arguments={"x-message-ttl": 1000, "x-max-length": 2,
                                        "x-dead-letter-exchange": "dlx"})
    for body in (b"1", b"2", b"3"):      # 1 is dropped at the head: dead-lettered (maxlen)
        q.enqueue(make_message(body))
    e = q.get()
    q.reject(e, None)                    # rejected: dead-lettered
    clock.advance(2)                     # 3 expires
    assert q.message_count == 0
    left = [(op, seq) for op, seq in rec.ops if op in LEAVING]
    assert left == [(Op.DEAD_LETTER, 1), (Op.DEAD_LETTER, 2), (Op.EXPIRE, 3)]
    entered = [seq for op, seq in rec.ops if op is Op.ENQUEUE]
    assert sorted(entered) == sorted(seq for _op, seq in left)


def test_requeue_to_a_deleted_queue_is_a_delete(vhost):
    q, rec = observed(vhost)
    q.enqueue(make_message(b"x"))
    e = q.get()
    vhost.delete_queue(q)
    q.requeue([(e, None)])               # the channel closes after the queue went
    assert rec.ops[-1] == (Op.DELETE, 1)


def test_no_ack_delivery_is_deliver_then_settle(vhost):
    q, rec = observed(vhost)
    ch = FakeChannel()
    consume(q, "c", ch, no_ack=True)
    q.enqueue(make_message(b"x"))
    assert ch.bodies() == [b"x"]
    assert rec.ops == [(Op.ENQUEUE, 1), (Op.DELIVER, 1), (Op.SETTLE, 1)]


def test_restore_is_not_announced_and_keeps_seq(vhost):
    q, rec = observed(vhost)
    q.enqueue(make_message(b"a"))
    entry = q.get()
    other, rec2 = observed(vhost, "r")
    entry.seq = 41
    assert other.restore([entry]) == 1
    assert rec2.ops == [] and other.message_count == 1 and other.next_seq == 42
    assert other.stored_entries() == [entry]
    assert other.paged_index() is None and not other.restores_paged


def test_no_observer_means_no_allocation_per_op(vhost):
    q = declare_queue(vhost, "hot")
    msg = make_message(b"x")
    for _ in range(100):                 # warm up (deque blocks, counters)
        q.enqueue(msg)
        q.settled(q.get())
    tracemalloc.start()
    try:
        snap1 = tracemalloc.take_snapshot()
        for _ in range(1000):
            q.enqueue(msg)
            q.settled(q.get())
        snap2 = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    ops_py = [s for s in snap2.compare_to(snap1, "filename")
              if s.traceback[0].filename.endswith("broker/queues/ops.py") and s.count_diff > 0]
    assert ops_py == []


def test_retry_seams_wrap_ready_and_unblock_on_settle(vhost, clock):
    q = declare_queue(vhost, "ordered", arguments={"x-retry-delays": [1000],
                                                   "x-retry-ordered": True})
    assert isinstance(q.ready, RetryReady)
    assert "settled" not in vars(q)     # no monkeypatching
    for body in (b"a", b"b"):
        q.enqueue(make_message(body))
    e = q.get()
    q.reject(e, None)                    # waits 1 s for its retry; b is held back
    assert q.retry.waiting_entries() == [e] and e not in q.stored_entries()
    assert q.get() is None
    clock.advance(1.5)
    again = q.get()
    assert again is e and again.redelivered
    q.settled(again)
    clock.advance(0.01)
    assert q.get().message.body == b"b"


def test_plain_queue_ready_store_is_fifo(vhost):
    q = declare_queue(vhost, "plain")
    assert type(q.ready) is FifoReady
    assert q.ready.head_entries() == [] and q.ready.paged_index() is None
