"""Queue types (queues/types.py): the factory, the quorum type's capabilities on one node
(refusals, delivery limit and x-delivery-count, at-least-once dead-lettering, no global
QoS), the stream type's refusals, and recovery of a quorum queue from the journal."""
from __future__ import annotations

import os

import pytest
import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config
from broker.message import Message
from broker.persistence.journal import JournalStore
from broker.queues.args import QueueOptions, parse_queue_arguments, with_policy
from broker.queues.queue import Consumer
from broker.queues.types import CLASSIC, QUORUM, STREAM, queue_type_of

from ..support import amqp_error, bind, declare_exchange, declare_queue, make_message

Q = {"x-queue-type": "quorum"}


class FakeChannel:
    metrics_protocol = None  # counts its own deliveries, as an AMQP 0-9-1 channel

    def __init__(self, global_prefetch=0):
        self.can_deliver = True
        self.global_prefetch = global_prefetch
        self.unacked_count = 0
        self.deliveries = []

    def deliver(self, consumer, queue, entry) -> None:
        self.deliveries.append(entry)


class Recorder:
    """An observer of a queue's operation stream (what a store sees)."""

    def __init__(self):
        self.ops = []

    def queue_op(self, queue, op, entry) -> None:
        self.ops.append((op.name, entry.message.body))


class DeferredStore:
    """``when_durable`` whose callbacks run when the test says the write is durable."""

    def __init__(self):
        self.waiting = []

    def when_durable(self, callback, on_failure=None) -> None:
        self.waiting.append(callback)

    def queue_op(self, queue, op, entry) -> None:
        pass

    def durable_now(self) -> None:
        callbacks, self.waiting = self.waiting, []
        for cb in callbacks:
            cb()


def test_factory():
    assert queue_type_of({}) is CLASSIC
    assert queue_type_of({"x-queue-type": "classic"}) is CLASSIC
    assert queue_type_of({"x-queue-type": b"quorum"}) is QUORUM
    assert queue_type_of({"x-queue-type": "stream"}) is STREAM
    assert not QUORUM.exclusive and not QUORUM.transient and not QUORUM.auto_delete
    assert not QUORUM.global_qos and QUORUM.default_delivery_limit == 20


def test_quorum_options_follow_rabbitmq_4():
    opts = QUORUM.effective(parse_queue_arguments(Q))
    assert opts.extra["x-delivery-limit"] == 20
    assert "x-delivery-limit" not in QUORUM.effective(
        parse_queue_arguments({**Q, "x-delivery-limit": -1})).extra
    assert QUORUM.effective(parse_queue_arguments({**Q, "x-delivery-limit": 3})).extra[
        "x-delivery-limit"] == 3
    # a policy's limit replaces the default, not just lowers it
    base = parse_queue_arguments(Q)
    assert QUORUM.effective(with_policy(base, Q, {"delivery-limit": 50})).extra[
        "x-delivery-limit"] == 50
    # reject-publish-dlx is not a quorum overflow mode: RabbitMQ falls back to drop-head
    assert QUORUM.effective(parse_queue_arguments(
        {**Q, "x-overflow": "reject-publish-dlx"})).overflow == "drop-head"
    assert CLASSIC.effective(QueueOptions()).extra == {}


@pytest.mark.parametrize("fields, text", [
    ({"exclusive": True, "durable": True}, "invalid property 'exclusive-owner' for queue 'q'"),
    ({"auto_delete": True, "durable": True}, "invalid property 'auto-delete' for queue 'q'"),
    ({"durable": False}, "invalid property 'non-durable' for queue 'q'"),
    ({"durable": True, "arguments": {**Q, "x-max-priority": 500}},
     "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"),
])
def test_quorum_refusals(vhost, fields, text):
    fields.setdefault("arguments", Q)
    with amqp_error(406, text):
        declare_queue(vhost, "q", owner=object(), **fields)
    assert "q" not in vhost.queues


def test_stream_declare_makes_a_stream_queue(vhost, tmp_path):
    from broker.queues.stream import StreamQueue
    from broker.streams.log import StreamStore
    with amqp_error(406, "invalid property 'non-durable' for queue 's'"):
        declare_queue(vhost, "s", arguments={"x-queue-type": "stream"})
    vhost.streams = StreamStore(str(tmp_path))
    q = declare_queue(vhost, "s", durable=True, arguments={"x-queue-type": "stream"})
    assert isinstance(q, StreamQueue) and q.queue_type is STREAM
    q.log.close()


def test_redeclare_without_type_is_equivalent(vhost):
    q = declare_queue(vhost, "q", durable=True, arguments=Q)
    assert declare_queue(vhost, "q", durable=True) is q
    assert q.queue_type is QUORUM
    with amqp_error(406, "inequivalent arg 'x-queue-type'"):
        declare_queue(vhost, "q", durable=True, arguments={"x-queue-type": "classic"})


def _requeue(q, consumer, channel):
    entry = channel.deliveries[-1]
    q.requeue([(entry, consumer)])
    return entry


def test_delivery_count_and_default_limit(vhost):
    declare_exchange(vhost, "dlx", "fanout")
    dlq = declare_queue(vhost, "dlq")
    bind(vhost, "dlx", dlq)
    q = declare_queue(vhost, "q", durable=True, arguments={**Q, "x-dead-letter-exchange": "dlx"})
    channel = FakeChannel()
    consumer = Consumer("c", channel, q, False, False, 0, 1, {})
    q.add_consumer(consumer)
    q.enqueue(make_message(b"poison", routing_key="q"))
    counts = []
    for _ in range(30):
        if not channel.deliveries or dlq.message_count:
            break
        entry = channel.deliveries[-1]
        counts.append((entry.message.properties.get("headers") or {}).get("x-delivery-count"))
        channel.deliveries.clear()
        q.requeue([(entry, consumer)])
    assert counts == [None, *range(1, 21)]
    dead = dlq.get().message
    assert dead.properties["headers"]["x-death"][0]["reason"] == b"delivery_limit"


def test_global_qos_refused(vhost):
    q = declare_queue(vhost, "q", durable=True, arguments=Q)
    with amqp_error(540, "queue 'q' in vhost '/' does not support global qos"):
        q.admit_consumer(FakeChannel(global_prefetch=5))
    q.admit_consumer(FakeChannel())
    declare_queue(vhost, "c").admit_consumer(FakeChannel(global_prefetch=5))


def _at_least_once(vhost, **extra):
    declare_exchange(vhost, "dlx", "fanout")
    return declare_queue(vhost, "src", durable=True, arguments={
        **Q, "x-dead-letter-exchange": "dlx", "x-overflow": "reject-publish",
        "x-dead-letter-strategy": "at-least-once", **extra})


def test_at_least_once_waits_for_the_target_store(vhost):
    src = _at_least_once(vhost)
    target = declare_queue(vhost, "dlq", durable=True)
    bind(vhost, "dlx", target)
    store = DeferredStore()
    target.store = store  # what attach_store does for a stored queue
    ops = Recorder()
    src.observers.append(ops)
    src.enqueue(make_message(b"m", routing_key="src"))
    entry = src.get()
    src.reject(entry, None)
    assert target.message_count == 1
    assert ("DEAD_LETTER", b"m") not in ops.ops  # not gone from the source before the write
    store.durable_now()
    assert ops.ops[-1] == ("DEAD_LETTER", b"m")


def test_at_least_once_retries_an_unroutable_dead_letter(vhost, clock):
    src = _at_least_once(vhost, **{"x-message-ttl": 1000})
    ops = Recorder()
    src.observers.append(ops)
    src.enqueue(make_message(b"m", routing_key="src"))
    clock.advance(1.5)  # expired, routed nowhere: kept
    assert ops.ops[-1][0] == "ENQUEUE"
    target = declare_queue(vhost, "dlq")
    bind(vhost, "dlx", target)
    clock.advance(5)
    assert target.get().message.body == b"m"
    assert ops.ops[-1] == ("DEAD_LETTER", b"m")


def test_at_most_once_without_reject_publish(vhost, clock):
    declare_exchange(vhost, "dlx", "fanout")
    src = declare_queue(vhost, "src", durable=True, arguments={
        **Q, "x-dead-letter-exchange": "dlx", "x-dead-letter-strategy": "at-least-once",
        "x-message-ttl": 1000})
    src.enqueue(make_message(b"m", routing_key="src"))
    clock.advance(1.5)
    target = declare_queue(vhost, "dlq")
    bind(vhost, "dlx", target)
    clock.advance(60)
    assert target.message_count == 0


def test_quorum_queue_recovered_from_the_journal(tmp_path):
    """On one node a quorum queue is a durable queue: its type, arguments, messages and
    delivery counts come back after a crash."""
    path = tmp_path / "data"

    def life(body, crash):
        async def main():
            store = JournalStore(str(path))
            broker = Broker(Config(data_dir=str(path)), store)
            await store.open()
            broker.recover()
            result = body(broker.vhosts["/"])
            await store._flush_once()
            if crash:
                os.close(store._lock_fd)
            else:
                await store.close()
            return result
        return trio.run(main)

    def first(vhost):
        q = vhost.declare_queue("qq", None, durable=True, arguments={**Q, "x-delivery-limit": 5})
        props = {"delivery_mode": 2}
        q.enqueue(Message("", "qq", encode_properties(props), props, b"kept"))
        entry = q.get()
        q.requeue([(entry, None)])

    life(first, crash=True)

    def second(vhost):
        q = vhost.queues["qq"]
        entry = q.get()
        return (q.queue_type.name, q.opts.extra["x-delivery-limit"], entry.message.body,
                entry.delivery_count,
                entry.message.properties["headers"]["x-delivery-count"])

    assert life(second, crash=False) == ("quorum", 5, b"kept", 2, 1)


def test_channel_global_limit_skips_quorum_consumers(vhost):
    channel = FakeChannel(global_prefetch=1)
    channel.unacked_count = 1  # the channel's global limit is reached
    quorum = declare_queue(vhost, "q", durable=True, arguments=Q)
    classic = declare_queue(vhost, "c")
    assert Consumer("a", channel, quorum, False, False, 0, 0, {}).can_take()
    assert not Consumer("b", channel, classic, False, False, 0, 0, {}).can_take()
