"""Consumers at their own prefetch limit leave the queue's rotation until credit returns
(queue.py: ``parked``), so dispatch does not walk past every busy consumer; round-robin order
and every way credit comes back (ack, requeue, a raised prefetch, removal) still hold."""
from __future__ import annotations

import itertools

from ..support import declare_queue, make_message
from .test_queue_features import FakeChannel, consume


def delivered(q, consumers):
    return [c.tag for c in consumers for _t, _e in c.channel.deliveries]


def test_busy_consumers_are_parked_and_come_back_in_turn(vhost):
    q = declare_queue(vhost, "q")
    cs = [consume(q, f"c{i}", no_ack=False, prefetch=1) for i in range(5)]
    for i in range(5):
        q.enqueue(make_message(b"%d" % i))
    assert [len(c.channel.deliveries) for c in cs] == [1] * 5
    q.enqueue(make_message(b"5"))
    assert all(c.parked for c in cs) and q.message_count == 1
    second = cs[3]
    _tag, entry = second.channel.deliveries[0]
    q.ack(entry, second)                      # its credit returns: it takes the next one
    q.dispatch()
    assert not second.parked and [e.message.body for _t, e in second.channel.deliveries] == [b"3", b"5"]


def test_requeue_and_raised_prefetch_unpark(vhost):
    q = declare_queue(vhost, "q")
    a = consume(q, "a", no_ack=False, prefetch=1)
    b = consume(q, "b", no_ack=False, prefetch=1)
    for i in range(3):
        q.enqueue(make_message(b"%d" % i))
    assert a.parked and b.parked
    q.requeue([(a.channel.deliveries[0][1], a)])   # a's message back: a takes it again
    assert not a.parked or a.unacked == 1
    b.prefetch = 5                                   # basic.qos on b's channel
    q.credit_changed(b)
    q.dispatch()
    assert not b.parked and q.message_count == 0


def test_removing_a_parked_consumer(vhost):
    q = declare_queue(vhost, "q")
    a = consume(q, "a", no_ack=False, prefetch=1)
    b = consume(q, "b", no_ack=False, prefetch=1)
    for i in range(3):
        q.enqueue(make_message(b"%d" % i))
    assert a.parked
    q.remove_consumer(a)
    assert not a.parked and q.consumers == [b]
    c = consume(q, "c", no_ack=False, prefetch=1)
    assert [e.message.body for _t, e in c.channel.deliveries] == [b"2"]


def test_round_robin_over_many_consumers_at_prefetch_one(vhost):
    """200 consumers at prefetch 1, 1,000 messages, each delivery acked in the order it was
    made: every consumer gets exactly 5, and no consumer gets two in a row while others wait."""
    q = declare_queue(vhost, "q")
    shared = FakeChannel()
    cs = {f"c{i:03d}": consume(q, f"c{i:03d}", shared, no_ack=False, prefetch=1) for i in range(200)}
    for _ in range(1000):
        q.enqueue(make_message(b"m"))
    order = []
    while shared.deliveries:
        tag, entry = shared.deliveries.pop(0)
        order.append(tag)
        q.ack(entry, cs[tag])
        q.dispatch()
    assert len(order) == 1000
    counts = {t: order.count(t) for t in cs}
    assert set(counts.values()) == {5}
    assert all(a != b for a, b in itertools.pairwise(order))
