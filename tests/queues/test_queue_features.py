"""Queue features driven directly on a VirtualHost with a fake clock: message TTL, x-expires,
max-length and overflow modes, dead-lettering (x-death), priorities, single active consumer,
consumer priorities, auto-delete and requeue order."""
from __future__ import annotations

import pytest

from broker.amqp.fields import Long, Timestamp
from broker.queues.queue import Consumer

from ..support import bind, declare_exchange, declare_queue, make_message


class FakeChannel:
    """What a queue needs from a channel: credit and a place to deliver to."""
    metrics_protocol = None  # counts its own deliveries, as an AMQP 0-9-1 channel

    def __init__(self):
        self.can_deliver = True
        self.global_prefetch = 0
        self.unacked_count = 0
        self.deliveries = []  # (consumer tag, entry)

    def deliver(self, consumer, queue, entry) -> None:
        self.deliveries.append((consumer.tag, entry))

    def bodies(self, tag=None) -> list:
        return [e.message.body for t, e in self.deliveries if tag is None or t == tag]


def consume(queue, tag, channel=None, no_ack=True, priority=0, prefetch=0, exclusive=False):
    channel = channel or FakeChannel()
    consumer = Consumer(tag, channel, queue, no_ack, exclusive, priority, prefetch, {})
    queue.add_consumer(consumer)
    return consumer


def drain(queue) -> list:
    out = []
    while (entry := queue.get()) is not None:
        out.append(entry.message.body)
    return out


def fill(queue, *bodies, **props) -> list:
    return [queue.enqueue(make_message(b, routing_key=queue.name, **props)) for b in bodies]


@pytest.fixture
def dlq(vhost):
    """A fanout 'dlx' with the queue 'dlq' bound: where dead letters land."""
    declare_exchange(vhost, "dlx", "fanout")
    q = declare_queue(vhost, "dlq")
    bind(vhost, "dlx", q)
    return q


def x_death(message) -> list:
    return message.properties["headers"]["x-death"]


# ---- message TTL ------------------------------------------------------------------------------
def test_queue_ttl_expires_ready_messages(vhost, clock):
    q = declare_queue(vhost, "q", arguments={"x-message-ttl": 1000})
    fill(q, b"a")
    clock.advance(0.5)
    fill(q, b"b")
    clock.advance(0.6)  # a is 1.1 s old, b 0.6 s
    assert q.message_count == 1
    clock.advance(0.5)
    assert q.message_count == 0
    assert q.ready_bytes == 0


def test_expired_message_is_not_handed_out_even_before_its_timer_ran(vhost, clock):
    q = declare_queue(vhost, "q", arguments={"x-message-ttl": 100})
    fill(q, b"a", b"b")
    clock.t += 1  # time passes, no timer has run yet
    assert q.get() is None
    assert q.message_count == 0


def test_per_message_expiration_and_the_smaller_ttl_wins(vhost, clock):
    q = declare_queue(vhost, "q", arguments={"x-message-ttl": 5000})
    fill(q, b"short", expiration="200")
    fill(q, b"long", expiration="60000")
    clock.advance(0.3)
    assert drain(q) == [b"long"]  # capped at the queue's 5 s, not yet due


def test_ttl_applies_at_the_head_only(vhost, clock):
    # as RabbitMQ: a long-lived head shelters shorter-lived messages behind it
    q = declare_queue(vhost, "q")
    fill(q, b"long", expiration="10000")
    fill(q, b"short", expiration="100")
    clock.advance(1)
    assert q.message_count == 2
    assert q.get().message.body == b"long"
    assert q.get() is None  # 'short' was expired once it reached the head
    assert q.message_count == 0


def test_ttl_zero_delivers_to_a_waiting_consumer_or_never(vhost, clock):
    q = declare_queue(vhost, "q", arguments={"x-message-ttl": 0})
    ch = FakeChannel()
    consumer = consume(q, "c", ch)
    fill(q, b"now")
    assert ch.bodies() == [b"now"]
    q.remove_consumer(consumer)
    fill(q, b"never")
    clock.advance(0.01)
    assert q.message_count == 0


def test_expired_messages_are_dead_lettered(vhost, clock, dlq):
    q = declare_queue(vhost, "q", arguments={"x-message-ttl": 100, "x-dead-letter-exchange": "dlx"})
    fill(q, b"a")
    fill(q, b"b", expiration="50")
    clock.advance(0.2)
    assert q.message_count == 0
    entries = [dlq.get() for _ in range(2)]
    assert [e.message.body for e in entries] == [b"a", b"b"]
    for e in entries:
        death = x_death(e.message)[0]
        assert death["reason"] == b"expired"
        assert death["queue"] == b"q"
    # the per-message TTL is removed and remembered
    assert "expiration" not in entries[1].message.properties
    assert x_death(entries[1].message)[0]["original-expiration"] == b"50"
    assert "original-expiration" not in x_death(entries[0].message)[0]


# ---- x-expires ----------------------------------------------------------------------------------
def test_unused_queue_expires(vhost, clock):
    q = declare_queue(vhost, "q", arguments={"x-expires": 1000})
    clock.advance(0.9)
    assert "q" in vhost.queues
    clock.advance(0.2)
    assert "q" not in vhost.queues
    assert q.deleted


def test_activity_postpones_queue_expiry(vhost, clock):
    declare_queue(vhost, "q", arguments={"x-expires": 1000})
    clock.advance(0.8)
    q = declare_queue(vhost, "q", arguments={"x-expires": 1000})  # a redeclare is activity
    clock.advance(0.8)
    q.get()  # so is basic.get
    clock.advance(0.8)
    assert "q" in vhost.queues
    clock.advance(0.3)
    assert "q" not in vhost.queues


def test_queue_with_a_consumer_does_not_expire(vhost, clock):
    q = declare_queue(vhost, "q", arguments={"x-expires": 1000})
    c = consume(q, "c")
    clock.advance(5)
    assert "q" in vhost.queues
    q.remove_consumer(c)
    clock.advance(0.9)
    assert "q" in vhost.queues
    clock.advance(0.2)
    assert "q" not in vhost.queues


# ---- max-length and overflow ---------------------------------------------------------------------
def test_drop_head(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 2})
    assert fill(q, b"1", b"2", b"3") == [True, True, True]
    assert drain(q) == [b"2", b"3"]


def test_max_length_zero_keeps_nothing(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 0})
    fill(q, b"1")
    assert q.message_count == 0


def test_max_length_bytes(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-length-bytes": 10})
    fill(q, b"aaaa", b"bbbb", b"cccc")
    assert drain(q) == [b"bbbb", b"cccc"]


def test_reject_publish(vhost, dlq):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 2, "x-overflow": "reject-publish",
                                             "x-dead-letter-exchange": "dlx"})
    assert fill(q, b"1", b"2", b"3") == [True, True, False]
    assert drain(q) == [b"1", b"2"]
    assert dlq.message_count == 0  # refused, not dead-lettered


def test_reject_publish_dlx(vhost, dlq):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                             "x-dead-letter-exchange": "dlx"})
    assert fill(q, b"1", b"2") == [True, False]
    assert drain(q) == [b"1"]
    dead = dlq.get()
    assert dead.message.body == b"2"
    assert x_death(dead.message)[0]["reason"] == b"maxlen"


def test_drop_head_dead_letters_with_reason_maxlen(vhost, dlq):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 1, "x-dead-letter-exchange": "dlx"})
    fill(q, b"old", b"new")
    assert drain(q) == [b"new"]
    dead = dlq.get()
    assert dead.message.body == b"old"
    assert x_death(dead.message)[0]["reason"] == b"maxlen"


def test_limits_count_ready_messages_only(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-length": 1})
    fill(q, b"1")
    taken = q.get()  # unacked, not ready
    fill(q, b"2")
    assert taken.message.body == b"1"
    assert drain(q) == [b"2"]


# ---- dead-lettering ---------------------------------------------------------------------------------
def test_rejected_message_x_death(vhost, dlq):
    q = declare_queue(vhost, "q", arguments={"x-dead-letter-exchange": "dlx"})
    q.enqueue(make_message(b"m", exchange="amq.direct", routing_key="orig",
                           headers={"CC": [b"cc-key"], "BCC": [b"bcc-key"], "keep": 1}))
    q.reject(q.get(), None)
    assert q.message_count == 0
    dead = dlq.get().message
    assert dead.exchange == "dlx" and dead.routing_key == "orig"
    headers = dead.properties["headers"]
    assert "BCC" not in headers and headers["keep"] == 1
    [death] = headers["x-death"]
    assert death["count"] == 1 and isinstance(death["count"], Long)
    assert isinstance(death["time"], Timestamp)
    assert death["reason"] == b"rejected"
    assert death["queue"] == b"q"
    assert death["exchange"] == b"amq.direct"
    assert death["routing-keys"] == [b"orig", b"cc-key", b"bcc-key"]
    assert headers["x-first-death-reason"] == b"rejected"
    assert headers["x-first-death-queue"] == b"q"
    assert headers["x-first-death-exchange"] == b"amq.direct"


def test_dead_letter_routing_key_replaces_the_key(vhost):
    declare_exchange(vhost, "dlx", "direct")
    target = declare_queue(vhost, "target")
    bind(vhost, "dlx", target, "dead")
    q = declare_queue(vhost, "q", arguments={"x-dead-letter-exchange": "dlx",
                                             "x-dead-letter-routing-key": "dead"})
    fill(q, b"m")
    q.reject(q.get(), None)
    assert target.get().message.routing_key == "dead"


def test_missing_dlx_drops_the_message(vhost):
    q = declare_queue(vhost, "q", arguments={"x-dead-letter-exchange": "nowhere"})
    fill(q, b"m")
    q.reject(q.get(), None)
    assert q.message_count == 0


def test_repeated_deaths_count_up_most_recent_first(vhost):
    # q1 -(rejected)-> q2 -(expired)-> q1 -(rejected)-> q2 ...
    declare_queue(vhost, "q2", arguments={"x-dead-letter-exchange": "",
                                          "x-dead-letter-routing-key": "q1", "x-message-ttl": 0})
    q1 = declare_queue(vhost, "q1", arguments={"x-dead-letter-exchange": "",
                                               "x-dead-letter-routing-key": "q2"})
    fill(q1, b"m")
    for _ in range(2):
        q1.reject(q1.get(), None)  # -> q2, which expires it at once back to q1
        vhost.queues["q2"].expire_ready(vhost.timers.now() + 1)
    message = q1.get().message
    deaths = [(d["queue"], d["reason"], d["count"]) for d in x_death(message)]
    assert deaths == [(b"q2", b"expired", 2), (b"q1", b"rejected", 2)]
    assert message.properties["headers"]["x-first-death-queue"] == b"q1"


def test_automatic_dead_letter_cycle_is_dropped(vhost):
    # a queue expiring into itself would loop forever: RabbitMQ drops the message, while a
    # sibling target of the same dead-lettering still gets it
    declare_exchange(vhost, "dlx", "fanout")
    q = declare_queue(vhost, "q", arguments={"x-dead-letter-exchange": "dlx", "x-message-ttl": 10})
    other = declare_queue(vhost, "other")
    bind(vhost, "dlx", q)
    bind(vhost, "dlx", other)
    fill(q, b"m")
    q.expire_ready(vhost.timers.now() + 1)
    assert q.message_count == 0
    assert other.message_count == 1


def test_cycle_with_a_rejection_is_not_dropped(vhost):
    # a client rejection along the way means the loop is not automatic: it goes round
    q = declare_queue(vhost, "q", arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "q"})
    fill(q, b"m")
    q.reject(q.get(), None)
    q.reject(q.get(), None)
    entry = q.get()
    assert [(d["reason"], d["count"]) for d in x_death(entry.message)] == [(b"rejected", 2)]


# ---- priorities -----------------------------------------------------------------------------------
def test_priority_order_and_cap(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-priority": 5})
    fill(q, b"p1", priority=1)
    fill(q, b"none")
    fill(q, b"p5", priority=5)
    fill(q, b"p9", priority=9)  # capped at 5, after p5
    fill(q, b"p1b", priority=1)
    assert drain(q) == [b"p5", b"p9", b"p1", b"p1b", b"none"]


def test_priority_requeue_keeps_position(vhost):
    q = declare_queue(vhost, "q", arguments={"x-max-priority": 2})
    fill(q, b"a", b"b", priority=2)
    fill(q, b"c", priority=1)
    first, second = q.get(), q.get()
    q.requeue([(second, None), (first, None)])
    entries = [q.get() for _ in range(3)]
    assert [e.message.body for e in entries] == [b"a", b"b", b"c"]
    assert [e.redelivered for e in entries] == [True, True, False]


def test_without_max_priority_the_property_is_ignored(vhost):
    q = declare_queue(vhost, "q")
    fill(q, b"low", priority=0)
    fill(q, b"high", priority=9)
    assert drain(q) == [b"low", b"high"]


# ---- consumers ---------------------------------------------------------------------------------------
def test_round_robin_without_single_active_consumer(vhost):
    q = declare_queue(vhost, "q")
    ch = FakeChannel()
    consume(q, "a", ch)
    consume(q, "b", ch)
    fill(q, b"1", b"2", b"3", b"4")
    assert ch.bodies("a") == [b"1", b"3"]
    assert ch.bodies("b") == [b"2", b"4"]


def test_single_active_consumer_and_hand_over(vhost):
    q = declare_queue(vhost, "q", arguments={"x-single-active-consumer": True})
    ch = FakeChannel()
    first = consume(q, "first", ch)
    consume(q, "second", ch)
    fill(q, b"1", b"2", b"3")
    assert ch.bodies("first") == [b"1", b"2", b"3"]
    assert ch.bodies("second") == []
    q.remove_consumer(first)
    fill(q, b"4")
    assert ch.bodies("second") == [b"4"]


def test_single_active_consumer_waits_rather_than_skipping(vhost):
    q = declare_queue(vhost, "q", arguments={"x-single-active-consumer": True})
    busy, idle = FakeChannel(), FakeChannel()
    consume(q, "active", busy, no_ack=False, prefetch=1)
    consume(q, "standby", idle)
    fill(q, b"1", b"2")
    assert busy.bodies() == [b"1"]
    assert idle.bodies() == []  # the standby consumer never gets messages
    assert q.message_count == 1


def test_consumer_priority_and_credit(vhost):
    q = declare_queue(vhost, "q")
    ch = FakeChannel()
    consume(q, "low", ch, priority=0)
    high = consume(q, "high", ch, no_ack=False, priority=10, prefetch=2)
    fill(q, b"1", b"2", b"3")
    assert ch.bodies("high") == [b"1", b"2"]  # until its prefetch is full
    assert ch.bodies("low") == [b"3"]
    assert high.unacked == 2 and q.unacked_count == 2


def test_no_delivery_while_the_channel_cannot_take(vhost):
    q = declare_queue(vhost, "q")
    ch = FakeChannel()
    ch.can_deliver = False
    consume(q, "c", ch)
    fill(q, b"1")
    assert ch.deliveries == [] and q.message_count == 1
    ch.can_deliver = True
    q.dispatch()
    assert ch.bodies() == [b"1"]


def test_auto_delete_after_the_last_consumer_leaves(vhost):
    q = declare_queue(vhost, "q", auto_delete=True)
    a, b = consume(q, "a"), consume(q, "b")
    q.remove_consumer(a)
    assert "q" in vhost.queues
    q.remove_consumer(b)
    assert "q" not in vhost.queues


def test_auto_delete_queue_never_consumed_stays(vhost):
    q = declare_queue(vhost, "q", auto_delete=True)
    fill(q, b"1")
    q.get()
    assert "q" in vhost.queues


def test_requeue_restores_original_positions(vhost):
    q = declare_queue(vhost, "q")
    fill(q, b"1", b"2", b"3", b"4")
    taken = [q.get() for _ in range(3)]
    q.requeue([(taken[2], None), (taken[0], None)])
    entries = [q.get() for _ in range(3)]
    assert [e.message.body for e in entries] == [b"1", b"3", b"4"]
    assert [e.redelivered for e in entries] == [True, True, False]
    assert entries[0].delivery_count == 2


def test_purge_and_delete_report_ready_counts(vhost):
    q = declare_queue(vhost, "q")
    fill(q, b"1", b"2", b"3")
    q.get()
    assert q.purge() == 2
    fill(q, b"4")
    assert vhost.delete_queue(q) == 1
