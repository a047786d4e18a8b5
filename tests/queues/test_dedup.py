"""x-message-deduplication on a queue (the plugin's queue level): a value already in the
queue is dropped on arrival and is free again once its message leaves; the state comes back
from the queue's own messages after a restart."""
from __future__ import annotations

import pytest

from broker.queues.ops import OpRecorder

from ..support import amqp_error, declare_queue, make_message
from ..support import broker_life as _life

DEDUP = {"x-message-deduplication": True}


def msg(value, body=b"m", **props):
    headers = {"x-deduplication-header": value} if value is not None else {}
    return make_message(body, headers=headers, delivery_mode=2, **props)


def bodies(q) -> list:
    return [e.message.body for e in q.stored_entries()]


def test_a_value_in_the_queue_drops_its_duplicates_and_the_publisher_is_confirmed(vhost):
    q = declare_queue(vhost, "q", arguments=DEDUP)
    assert q.enqueue(msg("a", b"1")) is True
    assert q.enqueue(msg("a", b"2")) is True  # accepted (confirmed) but dropped
    assert q.enqueue(msg(b"a", b"3")) is True
    assert q.enqueue(msg("b", b"4")) and q.enqueue(msg(None, b"5")) and q.enqueue(msg(None, b"6"))
    assert bodies(q) == [b"1", b"4", b"5", b"6"]
    assert q.dedup.dropped == 2


def test_the_value_is_free_once_its_message_leaves_not_before(vhost):
    q = declare_queue(vhost, "q", arguments=DEDUP)
    rec = OpRecorder()
    q.observers.append(rec)
    q.enqueue(msg("a", b"1"))
    held = q.get()  # delivered, not settled: still in the queue
    q.enqueue(msg("a", b"2"))
    assert q.message_count == 0
    q.requeue([(held, None)])  # back in the ready list: still there
    q.enqueue(msg("a", b"3"))
    assert bodies(q) == [b"1"]
    q.ack(q.get(), None)
    q.enqueue(msg("a", b"4"))
    assert bodies(q) == [b"4"]
    q.reject(q.get(), None)  # rejected without requeue: gone
    q.enqueue(msg("a", b"5"))
    assert q.purge() == 1
    q.enqueue(msg("a", b"6"))
    assert bodies(q) == [b"6"] and q.dedup.present


def test_expired_and_max_length_dropped_values_are_free(vhost, clock):
    q = declare_queue(vhost, "q", arguments={**DEDUP, "x-max-length": 2, "x-message-ttl": 1000})
    for v in "abc":  # "a" is dropped by max-length
        q.enqueue(msg(v, v.encode()))
    q.enqueue(msg("a", b"a2"))
    assert bodies(q) == [b"c", b"a2"]
    clock.advance(1.5)
    assert q.message_count == 0 and not q.dedup.present
    q.enqueue(msg("c", b"c2"))
    assert bodies(q) == [b"c2"]


def test_an_expired_message_behind_the_head_no_longer_counts(vhost, clock):
    q = declare_queue(vhost, "q", arguments=DEDUP)
    q.enqueue(msg("long", b"1"))
    q.enqueue(msg("short", b"2", expiration="100"))
    clock.t += 0.2  # "short" waits behind "long": expired but still in the ready list
    q.enqueue(msg("short", b"3"))
    assert bodies(q) == [b"1", b"2", b"3"]
    q.enqueue(msg("short", b"4"))  # the live copy counts
    assert bodies(q) == [b"1", b"2", b"3"]


def test_without_the_argument_nothing_is_checked(vhost):
    q = declare_queue(vhost, "q", arguments={"x-message-deduplication": False})
    assert q.dedup is None
    q.enqueue(msg("a"))
    q.enqueue(msg("a"))
    assert q.message_count == 2


@pytest.mark.parametrize("value,kind", [("true", "longstr"), (1, "signedint")])
def test_a_non_boolean_argument_is_406_naming_it(vhost, value, kind):
    with amqp_error(406, "invalid arg 'x-message-deduplication' for queue 'q' in vhost '/': "
                         f"{{unacceptable_type,{kind}}}"):
        declare_queue(vhost, "q", arguments={"x-message-deduplication": value})
    assert "q" not in vhost.queues


def test_dedup_through_the_channel_confirms_duplicates_without_returning_them(session_client):
    from broker.amqp import spec
    c = session_client()
    ch = c.open_channel()
    c.ok(ch, spec.Queue.Declare(queue="q", arguments=DEDUP))
    c.ok(ch, spec.Confirm.Select())
    written = []
    for body in (b"1", b"2"):
        written += c.publish(ch, body, routing_key="q", mandatory=True,
                             headers={"x-deduplication-header": "k"})
    written += c.output()
    acks = [w.method for w in written if isinstance(w.method, spec.Basic.Ack)]
    assert acks and max(a.delivery_tag for a in acks) == 2
    assert not [w for w in written if isinstance(w.method, (spec.Basic.Return, spec.Basic.Nack))]
    assert c.broker.vhosts["/"].queues["q"].message_count == 1


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_state_is_rebuilt_from_the_stored_messages(kind, tmp_path):
    url = "journal" if kind == "journal" else f"sqlite:///{tmp_path}/store.db"
    seen = {}

    def first(vhost):
        q = declare_queue(vhost, "q", durable=True, arguments=DEDUP)
        for i in range(3000):  # enough for the journal to page a plain queue
            q.enqueue(msg(f"v{i}", b"%d" % i))
        held = q.get()  # v0: delivered, not settled at the stop
        assert held.message.body == b"0"

    def second(vhost):
        q = vhost.queues["q"]
        seen["count"] = q.message_count
        for i in range(3000):
            q.enqueue(msg(f"v{i}", b"again"))
        q.enqueue(msg("new", b"new"))
        seen["after"] = q.message_count

    _life(url, tmp_path / "data", first)
    _life(url, tmp_path / "data", second)
    assert seen["count"] == 3000
    assert seen["after"] == 3001
