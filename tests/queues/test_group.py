"""Consumer groups (queues/group.py) driven directly on a VirtualHost: even, sticky spread
of partitions over members, cooperative hand-over (never while the previous owner holds
unacked deliveries, even after its basic.cancel), the x-partitions convenience."""
from __future__ import annotations

import pytest

from broker.queues.group import find_group

from ..support import amqp_error, declare_exchange, declare_queue, make_message
from .test_queue_features import FakeChannel, consume


def partitions(vhost, n=4, group="g"):
    return [declare_queue(vhost, f"{group}-{i}", arguments={"x-consumer-group": group})
            for i in range(n)]


def join(parts, name):
    """A member: one channel with a manual-ack consumer (prefetch 10) on every partition."""
    ch = FakeChannel()
    return ch, [consume(q, f"{name}-{q.name}", ch, no_ack=False, prefetch=10) for q in parts]


def owners(group, parts) -> list:
    return [group.owner_of(q).tag.split("-")[0] for q in parts]


def test_partitions_spread_evenly_in_join_order_and_stick(vhost):
    parts = partitions(vhost, 5)
    group = find_group(vhost, "g")
    join(parts, "a")
    assert owners(group, parts) == ["a"] * 5
    join(parts, "b")
    assert sorted(owners(group, parts)) == ["a", "a", "a", "b", "b"]
    before = owners(group, parts)
    join(parts, "c")
    after = owners(group, parts)
    assert sorted(after).count("c") == 1 and sorted(after).count("a") == 2
    # sticky: only the partitions c took changed owner
    assert sum(x != y for x, y in zip(before, after, strict=True)) == 1


def test_each_partition_delivers_to_its_owner_only(vhost):
    parts = partitions(vhost, 2)
    cha, _ = join(parts, "a")
    chb, _ = join(parts, "b")
    for q in parts:
        for i in range(3):
            q.enqueue(make_message(b"%s-%d" % (q.name.encode(), i)))
    got_a = {e.message.body[:3] for _t, e in cha.deliveries}
    got_b = {e.message.body[:3] for _t, e in chb.deliveries}
    assert len(got_a) == len(got_b) == 1 and got_a != got_b


def test_hand_over_waits_for_the_previous_owners_acks(vhost):
    (q,) = partitions(vhost, 1)
    cha, (ca,) = join([q], "a")
    for i in range(3):
        q.enqueue(make_message(b"m%d" % i))
    assert cha.bodies() == [b"m0", b"m1", b"m2"] and ca.unacked == 3
    q.remove_consumer(ca)              # basic.cancel: its deliveries stay unacked
    chb, (cb,) = join([q], "b")
    q.enqueue(make_message(b"m3"))
    assert chb.bodies() == []          # not while a still holds m0..m2
    delivered = [e for _t, e in cha.deliveries]
    q.ack(delivered[0], ca)
    q.ack(delivered[1], ca)
    q.dispatch()
    assert chb.bodies() == []
    q.requeue([(delivered[2], ca)])    # a's channel closes: m2 comes back first
    assert chb.bodies() == [b"m2", b"m3"]


def test_member_leaving_hands_its_partitions_over(vhost):
    parts = partitions(vhost, 4)
    group = find_group(vhost, "g")
    _cha, ca = join(parts, "a")
    join(parts, "b")
    for c in ca:
        c.queue.remove_consumer(c)
    assert owners(group, parts) == ["b"] * 4


def test_x_partitions_declares_bound_partition_queues(vhost):
    declare_exchange(vhost, "orders", "x-consistent-hash", arguments={"x-partitions": 3})
    names = [f"orders-{i}" for i in range(3)]
    assert all(n in vhost.queues for n in names)
    group = find_group(vhost, "orders")
    assert [q.name for q in group.partitions] == names
    x = vhost.exchanges["orders"]
    assert sorted(b.destination.name for b in x.bindings.values()) == names
    hits = {vhost.route("orders", f"k{i}", make_message(b"x"))[0].name for i in range(100)}
    assert hits == set(names)


@pytest.mark.parametrize("value", [0, 1025, "8", True])
def test_bad_partition_count_is_refused(vhost, value):
    with amqp_error(406, "x-partitions must be an integer from 1 to 1024"):
        declare_exchange(vhost, "bad", "x-consistent-hash", arguments={"x-partitions": value})
    assert "bad" not in vhost.exchanges


def test_empty_group_name_is_refused(vhost):
    with amqp_error(406, "invalid arg 'x-consumer-group'"):
        declare_queue(vhost, "q", arguments={"x-consumer-group": ""})
