"""A publish into a queue none of whose consumers can take (all at their prefetch, window or
link credit, or with their output full) only appends: the dispatch loop does not run again
until credit returns, and every way credit returns dispatches (queue.py: ``_no_credit``)."""
from __future__ import annotations

from ..support import declare_queue, make_message
from .test_queue_features import FakeChannel, consume


class CountingChannel(FakeChannel):
    """Counts how often a dispatch asks it for credit (``Consumer.can_take`` reads it)."""

    def __init__(self):
        super().__init__()
        self.open = True
        self.asked = 0

    @property  # type: ignore[override]
    def can_deliver(self) -> bool:
        self.asked += 1
        return self.open

    @can_deliver.setter
    def can_deliver(self, value: bool) -> None:
        self.open = value


def _ack_first(q, consumer):
    """The consumer acks its first delivery; its channel dispatches the queue (as every
    protocol's ack path does)."""
    _tag, entry = consumer.channel.deliveries[0]
    q.ack(entry, consumer)
    q.dispatch()


def _publish(q, n, start=0):
    for i in range(start, start + n):
        q.enqueue(make_message(b"%d" % i))


def test_full_consumer_is_not_asked_again_per_publish(vhost):
    q = declare_queue(vhost, "q")
    ch = CountingChannel()
    c = consume(q, "c", ch, no_ack=False, prefetch=2)
    _publish(q, 2)
    assert ch.bodies() == [b"0", b"1"]
    ch.asked = 0
    _publish(q, 100, 2)
    assert ch.asked <= 1 and q.message_count == 100  # before: once per publish (100)
    _ack_first(q, c)
    assert ch.bodies() == [b"0", b"1", b"2"]
    ch.asked = 0
    _publish(q, 50, 102)
    assert ch.asked <= 1 and q.message_count == 149


def test_output_full_then_drained(vhost):
    """A channel whose output is full (MQTT, STOMP, AMQP 1.0, AMQP 0-9-1) dispatches its
    consumers' queues when it drains (``output_drained``)."""
    q = declare_queue(vhost, "q")
    ch = CountingChannel()
    consume(q, "c", ch, no_ack=True)
    ch.open = False
    _publish(q, 20)
    assert ch.asked <= 2 and ch.deliveries == []
    ch.open = True
    q.dispatch()
    assert len(ch.deliveries) == 20
    _publish(q, 1, 20)
    assert len(ch.deliveries) == 21 and q.message_count == 0


def test_empty_ready_list_with_credit_back(vhost):
    """The flag set with nothing ready (the publish's fast path found no consumer) and a
    dispatch that returns early (nothing ready) still clears it."""
    q = declare_queue(vhost, "q")
    ch = CountingChannel()
    consume(q, "c", ch, no_ack=True)
    ch.open = False
    _publish(q, 1)
    assert q.get() is not None and q.message_count == 0
    ch.open = True
    q.dispatch()  # nothing ready: returns at once
    _publish(q, 1, 1)
    assert ch.bodies() == [b"1"]


def test_parked_consumers_of_several_priorities(vhost):
    q = declare_queue(vhost, "q")
    hi = consume(q, "hi", FakeChannel(), no_ack=False, prefetch=1, priority=5)
    lo = consume(q, "lo", FakeChannel(), no_ack=False, prefetch=1)
    _publish(q, 10)
    assert hi.parked and lo.parked and q.message_count == 8
    _ack_first(q, lo)
    assert lo.channel.bodies() == [b"1", b"2"]
    _ack_first(q, hi)
    _publish(q, 1, 10)
    assert hi.channel.bodies() == [b"0", b"3"] and q.message_count == 7


def test_single_active_consumer_next_takes_over(vhost):
    q = declare_queue(vhost, "q", arguments={"x-single-active-consumer": True})
    a = consume(q, "a", FakeChannel(), no_ack=False, prefetch=1)
    b = consume(q, "b", FakeChannel(), no_ack=False, prefetch=1)
    _publish(q, 5)
    assert a.channel.bodies() == [b"0"] and b.channel.deliveries == []
    a.channel.can_deliver = False        # its channel closes: its delivery goes back
    q.requeue([(a.channel.deliveries[0][1], a)])
    q.remove_consumer(a)
    assert b.channel.bodies() == [b"0"]
    _ack_first(q, b)
    _publish(q, 1, 5)
    assert b.channel.bodies() == [b"0", b"1"] and q.message_count == 4


def test_priority_queue_after_credit_returns(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-priority": 5})
    c = consume(q, "c", FakeChannel(), no_ack=False, prefetch=1)
    q.enqueue(make_message(b"first"))
    q.enqueue(make_message(b"low", priority=1))
    q.enqueue(make_message(b"high", priority=5))
    _ack_first(q, c)
    assert c.channel.bodies() == [b"first", b"high"]


def test_a_new_consumer_takes_what_the_full_one_left(vhost):
    q = declare_queue(vhost, "q")
    consume(q, "a", FakeChannel(), no_ack=False, prefetch=1)
    _publish(q, 3)
    b = consume(q, "b", FakeChannel(), no_ack=True)
    assert b.channel.bodies() == [b"1", b"2"]
    _publish(q, 1, 3)
    assert b.channel.bodies() == [b"1", b"2", b"3"]
