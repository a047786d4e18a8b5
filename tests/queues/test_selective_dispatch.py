"""Consumers with an x-filter on a queue, through a broker Session (no sockets)."""
from __future__ import annotations

from broker.amqp import spec

from ..support import channel_close


def bodies(written) -> list[bytes]:
    return [w.body for w in written if isinstance(w.method, spec.Basic.Deliver)]


def test_each_message_goes_to_a_consumer_whose_filter_it_matches(session_client, broker):
    pub = session_client()
    pub.open_channel(1)
    pub.declare_queue(1, "q")
    reds, blues = session_client(), session_client()
    reds.open_channel(1)
    blues.open_channel(1)
    got_red = bodies(reds.consume(1, "q", no_ack=True, arguments={"x-filter": "color = 'red'"}))
    got_blue = bodies(blues.consume(1, "q", no_ack=True,
                                    arguments={"x-filter": b"color IN ('blue')"}))
    for i, color in enumerate(["red", "blue", "green", "red", "blue"]):
        pub.publish(1, f"{color}{i}".encode(), routing_key="q", headers={"color": color})
    got_red += bodies(reds.output())
    got_blue += bodies(blues.output())
    assert got_red == [b"red0", b"red3"]
    assert got_blue == [b"blue1", b"blue4"]
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 1  # green: no consumer wants it, it stays for a later one
    greens = session_client()
    greens.open_channel(1)
    assert bodies(greens.consume(1, "q", no_ack=True,
                                 arguments={"x-filter": "color = 'green'"})) == [b"green2"]
    assert q.message_count == 0


def test_an_unmatched_head_does_not_block_the_messages_behind_it(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    for i in range(5):
        c.publish(1, b"skip%d" % i, routing_key="q", headers={"n": i})
    c.publish(1, b"take", routing_key="q", headers={"n": 99})
    assert bodies(c.consume(1, "q", no_ack=True, arguments={"x-filter": "n > 50"})) == [b"take"]
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 5
    # the kept ones are still in publish order for an unfiltered consumer
    assert bodies(c.consume(1, "q", tag="all", no_ack=True)) == [b"skip%d" % i for i in range(5)]


def test_filtered_consumer_respects_prefetch_and_acks(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.call(1, spec.Basic.Qos(0, 1, False))
    for i in range(3):
        c.publish(1, b"m%d" % i, routing_key="q", headers={"k": "yes"})
    assert bodies(c.consume(1, "q", arguments={"x-filter": "k = 'yes'"})) == [b"m0"]
    assert bodies(c.call(1, spec.Basic.Ack(1, False))) == [b"m1"]
    assert bodies(c.call(1, spec.Basic.Ack(2, False))) == [b"m2"]


def test_exclusive_subscription_queue_drops_what_its_filter_refuses(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "sub", exclusive=True)
    assert bodies(c.consume(1, "sub", no_ack=True, arguments={"x-filter": "level >= 3"})) == []
    got = []
    for level in (1, 5, 2, 3):
        got += bodies(c.publish(1, b"L%d" % level, routing_key="sub", headers={"level": level}))
    assert got == [b"L5", b"L3"]
    assert broker.vhosts["/"].queues["sub"].message_count == 0


def test_invalid_filter_is_406_naming_the_position(session_client, broker):
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    close = channel_close(c.call(1, spec.Basic.Consume(queue="q",
                                                       arguments={"x-filter": "a = = 1"})))
    assert close.reply_code == 406
    assert close.reply_text == ("PRECONDITION_FAILED - invalid arg 'x-filter' for consumer: "
                                "at position 5: unexpected '= 1'")
    assert (close.class_id, close.method_id) == (60, 20)
    assert broker.vhosts["/"].queues["q"].consumer_count == 0
    c.open_channel(2)
    close = channel_close(c.call(2, spec.Basic.Consume(queue="q", arguments={"x-filter": 7})))
    assert "must be a string" in close.reply_text
