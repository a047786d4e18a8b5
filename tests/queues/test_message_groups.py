"""JMSXGroupID message groups on a queue with x-message-groups, through broker Sessions
(no sockets)."""
from __future__ import annotations

from broker.amqp import spec


def bodies(written) -> list[bytes]:
    return [w.body for w in written if isinstance(w.method, spec.Basic.Deliver)]


def _consumers(session_client, n: int) -> list:
    out = []
    for _ in range(n):
        c = session_client()
        c.open_channel(1)
        c.call(1, spec.Basic.Qos(0, 100, False))
        out.append(c)
    return out


def test_a_group_goes_to_one_consumer(session_client, broker):
    pub = session_client()
    pub.open_channel(1)
    pub.declare_queue(1, "q", arguments={"x-message-groups": True})
    a, b = _consumers(session_client, 2)
    a.consume(1, "q", tag="a")
    b.consume(1, "q", tag="b")
    for i in range(6):
        pub.publish(1, b"%s%d" % (b"xy"[i % 2:i % 2 + 1], i), routing_key="q",
                    headers={"JMSXGroupID": "x" if i % 2 == 0 else "y"})
    got_a, got_b = bodies(a.output()), bodies(b.output())
    # each group whole, in order, at one consumer; the two groups at different ones
    assert sorted([got_a, got_b]) == [[b"x0", b"x2", b"x4"], [b"y1", b"y3", b"y5"]]


def test_without_the_argument_messages_are_spread(session_client, broker):
    pub = session_client()
    pub.open_channel(1)
    pub.declare_queue(1, "q")
    a, b = _consumers(session_client, 2)
    a.consume(1, "q", tag="a")
    b.consume(1, "q", tag="b")
    for i in range(4):
        pub.publish(1, b"m%d" % i, routing_key="q", headers={"JMSXGroupID": "x"})
    assert bodies(a.output()) == [b"m0", b"m2"]  # round robin, as before
    assert bodies(b.output()) == [b"m1", b"m3"]


def test_sequence_minus_one_closes_the_group_and_a_leaving_owner_gives_it_up(
        session_client, broker):
    pub = session_client()
    pub.open_channel(1)
    pub.declare_queue(1, "q", arguments={"x-message-groups": True})
    a, b = _consumers(session_client, 2)
    a.consume(1, "q", tag="a")
    b.consume(1, "q", tag="b")
    pub.publish(1, b"g1", routing_key="q", headers={"JMSXGroupID": "g"})
    pub.publish(1, b"g2-last", routing_key="q", headers={"JMSXGroupID": "g", "JMSXGroupSeq": -1})
    first = a if bodies(a.output()) == [b"g1", b"g2-last"] else b
    other = b if first is a else a
    groups = broker.vhosts["/"].queues["q"].message_groups
    assert "g" not in groups.owner  # closed
    # a new group "h" goes to the consumer holding fewer groups; its owner leaving hands it on
    pub.publish(1, b"h1", routing_key="q", headers={"JMSXGroupID": "h"})
    owner = groups.owner["h"]
    owner_client = a if owner.tag == "a" else b
    rest = b if owner_client is a else a
    assert bodies(owner_client.output()) == [b"h1"]
    owner_client.call(1, spec.Basic.Cancel(owner.tag))
    pub.publish(1, b"h2", routing_key="q", headers={"JMSXGroupID": "h"})
    assert bodies(rest.output()) == [b"h2"]
    assert groups.owner["h"].tag == ("b" if owner.tag == "a" else "a")
    del first, other


def test_an_owner_without_credit_holds_its_group_but_not_others(session_client, broker):
    pub = session_client()
    pub.open_channel(1)
    pub.declare_queue(1, "q", arguments={"x-message-groups": True})
    a = session_client()
    a.open_channel(1)
    a.call(1, spec.Basic.Qos(0, 1, False))
    a.consume(1, "q", tag="a")
    pub.publish(1, b"g1", routing_key="q", headers={"JMSXGroupID": "g"})
    assert bodies(a.output()) == [b"g1"]
    b = session_client()
    b.open_channel(1)
    b.consume(1, "q", tag="b", no_ack=True)
    pub.publish(1, b"g2", routing_key="q", headers={"JMSXGroupID": "g"})
    pub.publish(1, b"free", routing_key="q")
    assert bodies(b.output()) == [b"free"]  # g2 waits for a, the group's owner
    assert bodies(a.call(1, spec.Basic.Ack(1, False))) == [b"g2"]


def test_a_message_groups_policy_groups_queues_without_the_argument(session_client, broker):
    """ActiveMQ groups every queue: the policy key message-groups does that for the queues
    it matches, on and off at run time; a queue's own argument wins."""
    pub = session_client()
    pub.open_channel(1)
    pub.declare_queue(1, "jms.orders")
    pub.declare_queue(1, "jms.opted-out", arguments={"x-message-groups": False})
    broker.policies.set_policy("/", "groups", "^jms\\.", {"message-groups": True})
    q = broker.vhosts["/"].queues["jms.orders"]
    assert q.message_groups is not None
    assert broker.vhosts["/"].queues["jms.opted-out"].message_groups is None
    a, b = _consumers(session_client, 2)
    a.consume(1, "jms.orders", tag="a")
    b.consume(1, "jms.orders", tag="b")
    for i in range(6):
        pub.publish(1, b"%s%d" % (b"xy"[i % 2:i % 2 + 1], i), routing_key="jms.orders",
                    headers={"JMSXGroupID": "x" if i % 2 == 0 else "y"})
    got_a, got_b = bodies(a.output()), bodies(b.output())
    assert sorted([got_a, got_b]) == [[b"x0", b"x2", b"x4"], [b"y1", b"y3", b"y5"]]
    # the policy gone: round robin again, whatever the header
    broker.policies.clear_policy("/", "groups")
    assert q.message_groups is None
    for i in range(4):
        pub.publish(1, b"m%d" % i, routing_key="jms.orders", headers={"JMSXGroupID": "x"})
    got_a, got_b = bodies(a.output()), bodies(b.output())
    assert sorted(got_a + got_b) == [b"m0", b"m1", b"m2", b"m3"]
    assert len(got_a) == len(got_b) == 2  # one group, yet both consumers


def test_message_groups_policy_value_is_validated(broker):
    import pytest

    from broker.policies.registry import PolicyError
    with pytest.raises(PolicyError):
        broker.policies.set_policy("/", "bad", ".*", {"message-groups": "yes"})
