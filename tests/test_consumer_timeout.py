"""Consumer timeouts (RabbitMQ's consumer_timeout, x-consumer-timeout, the consumer-timeout
policy key): a delivery unacknowledged too long closes its channel with 406 and is requeued.

Through a Session on the fake clock: the sweep runs on the broker's timer heap when the test
advances time. The sweep is every second: a delivery times out after its timeout, at most
2 s later (it knows the sweep after it, not its own time).
"""
from __future__ import annotations

from broker.amqp import spec
from broker.config import Config

from .support import channel_close, methods


def deliveries(written) -> list:
    return [w for w in written if isinstance(w.method, spec.Basic.Deliver)]


def advance(clock, seconds: float, step: float = 0.25) -> None:
    """Move time on in steps, as a running loop would: each due sweep runs in turn."""
    while seconds > 1e-9:
        clock.advance(min(step, seconds))
        seconds -= step


def timed_out_text(channel: int, ms: int) -> str:
    return (f"PRECONDITION_FAILED - delivery acknowledgement on channel {channel} timed out. "
            f"Timeout value used: {ms} ms. This timeout value can be configured, see consumers "
            "doc guide to learn more")


def _consume_one(c, queue="q", channel=1, **declare):
    c.open_channel(channel)
    c.declare_queue(channel, queue, **declare)
    c.publish(channel, b"m", routing_key=queue)
    [d] = deliveries(c.consume(channel, queue, tag="t"))
    return d


def test_default_is_rabbitmqs_thirty_minutes(broker):
    assert Config().consumer_timeout == 1_800_000
    assert broker.consumer_timeouts.timeout_ms == 1_800_000


def test_unacked_delivery_closes_the_channel_and_is_requeued(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = 5000
    c = session_client()
    _consume_one(c)
    other = session_client()
    other.open_channel(1)
    advance(clock, 4.9)
    assert c.output() == []  # not before the timeout
    advance(clock, 2.2)
    close = channel_close(c.output())
    assert (close.reply_code, close.reply_text) == (406, timed_out_text(1, 5000))
    assert (close.class_id, close.method_id) == (0, 0)
    q = broker.vhosts["/"].queues["q"]
    assert q.message_count == 1 and q.unacked_count == 0 and not q.consumers
    got = other.ok(1, spec.Basic.Get(queue="q", no_ack=True), spec.Basic.GetOk)
    assert got.redelivered
    # the connection and its other channels go on; the client answers close-ok
    assert methods(c.call(1, spec.Channel.CloseOk())) == []
    c.open_channel(2)


def test_acked_in_time_nothing_happens(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = 5000
    c = session_client()
    d = _consume_one(c)
    advance(clock, 4.0)
    c.call(1, spec.Basic.Ack(d.method.delivery_tag, False))
    advance(clock, 30.0)
    assert c.output() == []


def test_oldest_delivery_counts(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = 5000
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.publish(1, b"a", routing_key="q")
    [d1] = deliveries(c.consume(1, "q", tag="t"))
    advance(clock, 4.0)
    [d2] = deliveries(c.publish(1, b"b", routing_key="q"))
    c.call(1, spec.Basic.Ack(d1.method.delivery_tag, False))
    advance(clock, 4.0)  # the second is 4 s old
    assert c.output() == []
    advance(clock, 3.0)
    assert channel_close(c.output()).reply_code == 406
    assert d2.body == b"b"


def test_basic_get_deliveries_time_out_too(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = 2000
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.publish(1, b"m", routing_key="q")
    c.ok(1, spec.Basic.Get(queue="q"), spec.Basic.GetOk)
    advance(clock, 10.0)
    assert channel_close(c.output()).reply_text == timed_out_text(1, 2000)
    assert broker.vhosts["/"].queues["q"].message_count == 1


def test_no_ack_consumers_and_disabled_timeout(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = None
    c = session_client()
    _consume_one(c, "held")
    c.open_channel(2)
    c.declare_queue(2, "auto")
    c.publish(2, b"m", routing_key="auto")
    c.consume(2, "auto", no_ack=True)
    advance(clock, 3600.0)
    assert methods(c.output(), spec.Channel.Close) == []


def test_queue_argument(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = None  # the queue's own applies anyway
    c = session_client()
    _consume_one(c, "short", arguments={"x-consumer-timeout": 2000})
    other = session_client()
    _consume_one(other, "plain")
    advance(clock, 4.0)
    assert channel_close(c.output()).reply_text == timed_out_text(1, 2000)
    assert other.output() == []


def test_policy_and_argument_lower_wins(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = 600_000
    broker.policies.set_policy("/", "ct", "^ct", {"consumer-timeout": 3000})
    c = session_client()
    _consume_one(c, "ct-arg", arguments={"x-consumer-timeout": 10_000})
    advance(clock, 2.9)
    assert c.output() == []
    advance(clock, 2.2)
    assert channel_close(c.output()).reply_text == timed_out_text(1, 3000)


def test_invalid_queue_argument(session_client):
    c = session_client()
    c.open_channel(1)
    close = channel_close(c.call(1, spec.Queue.Declare(
        queue="bad", arguments={"x-consumer-timeout": -1})))
    assert close.reply_code == 406
    assert "invalid arg 'x-consumer-timeout'" in close.reply_text


def test_invalid_policy_value(broker):
    import pytest

    from broker.policies.validate import PolicyError
    with pytest.raises(PolicyError) as ei:
        broker.policies.set_policy("/", "bad", ".*", {"consumer-timeout": -5})
    assert "-5 is not a valid consumer timeout" in str(ei.value)


def test_channels_are_forgotten_when_they_go(broker, session_client, clock):
    c = session_client()
    _consume_one(c)
    c.open_channel(2)
    assert len(broker.consumer_timeouts.channels) == 2
    c.call(2, spec.Channel.Close(200, "bye", 0, 0))
    assert len(broker.consumer_timeouts.channels) == 1
    c.drop()
    assert broker.consumer_timeouts.channels == set()
    advance(clock, 5.0)  # the sweep stops re-arming with no channel left
    assert broker.consumer_timeouts._handle is None


def test_exempt_users_are_never_timed_out(broker, session_client, clock):
    # the cluster exempts its node-to-node link user this way
    broker.consumer_timeouts.timeout_ms = 1000
    broker.consumer_timeouts.exempt_users.add("guest")
    c = session_client()
    _consume_one(c)
    advance(clock, 60.0)
    assert c.output() == []


def test_consumer_argument_overrides_the_queue(broker, session_client, clock):
    broker.consumer_timeouts.timeout_ms = None
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q", arguments={"x-consumer-timeout": 600_000})
    c.publish(1, b"m", routing_key="q")
    c.consume(1, "q", tag="t", arguments={"x-consumer-timeout": 2000})
    advance(clock, 4.0)
    assert channel_close(c.output()).reply_text == timed_out_text(1, 2000)


def test_a_late_sweep_never_times_out_early(broker, session_client, clock):
    # The loop is busy: the sweep due a second after the last one runs 4 s after it, and a
    # delivery made just before it is only 0.5 s old then.
    broker.consumer_timeouts.timeout_ms = 2000
    c = session_client()
    c.open_channel(1)
    c.declare_queue(1, "q")
    c.consume(1, "q", tag="t")
    clock.t += 3.5  # time passes without the timers running
    [d] = deliveries(c.publish(1, b"m", routing_key="q"))
    assert d.body == b"m"
    advance(clock, 0.5)  # the late sweep
    assert c.output() == []
    advance(clock, 1.2)
    assert c.output() == []  # 1.7 s old
    advance(clock, 2.0)
    assert channel_close(c.output()).reply_text == timed_out_text(1, 2000)
