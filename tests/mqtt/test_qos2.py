"""QoS 2 exactly-once (MQTT 3.1.1 section 4.3.3) and delivery at the highest granted QoS
(section 3.3.5), against a whole broker without sockets (the harness of test_session)."""
from __future__ import annotations

import pytest

from broker.listeners.mqtt_session import MQTTService, queue_names
from broker.mqtt import codec as m

from ..support import declare_queue
from .test_session import Client, publishes


@pytest.fixture
def service(broker):
    broker.config.mqtt_prefetch = 3
    return MQTTService(broker)

PUBREC, PUBREL, PUBCOMP = m.PUBREC, m.PUBREL, m.PUBCOMP


def ids(packets, ptype) -> list[int]:
    return [p.packet_id for p in packets if isinstance(p, m.PacketId) and p.type == ptype]


def test_inbound_qos2_routes_once_until_pubrel(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("t", 1))
    pub = Client(service, "pub")
    assert pub.publish("t", b"once", qos=2, pid=5) == [m.PacketId(PUBREC, 5)]
    assert publishes(sub.output()) == [("t", b"once", 1, False, False)]
    # the same packet id again before PUBREL (the PUBREC was lost): PUBREC, not routed
    again = pub.send(m.Publish("t", b"once", 2, False, True, 5))
    assert again == [m.PacketId(PUBREC, 5)]
    assert sub.output() == []
    assert pub.send(m.PacketId(PUBREL, 5)) == [m.PacketId(PUBCOMP, 5)]
    # released: the id is free, a new message with it is routed
    assert pub.publish("t", b"next", qos=2, pid=5) == [m.PacketId(PUBREC, 5)]
    assert [p[1] for p in publishes(sub.output())] == [b"next"]
    # PUBREL of an id never seen is still answered (section 4.3.3)
    assert pub.send(m.PacketId(PUBREL, 77)) == [m.PacketId(PUBCOMP, 77)]


def test_acknowledgements_keep_publish_order(broker, service):
    pub = Client(service, "pub")
    got = pub.send(m.Publish("a", b"1", 1, False, False, 1), m.Publish("a", b"2", 2, False, False, 2),
                   m.Publish("a", b"3", 1, False, False, 3))
    assert got == [m.PacketId(m.PUBACK, 1), m.PacketId(PUBREC, 2), m.PacketId(m.PUBACK, 3)]


def test_inbound_qos2_refused_by_a_queue_is_not_received(broker, service):
    vh = broker.vhosts["/"]
    q = declare_queue(vh, "full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    vh.bind("amq.topic", q, "full", {})
    pub = Client(service, "pub")
    assert pub.publish("full", b"x", qos=2, pid=1) == []  # no PUBREC: the client resends
    assert 1 not in pub.session.qos2.received


def test_outbound_qos2_pubrec_settles_pubrel_pubcomp(broker, service):
    sub = Client(service, "sub")
    assert sub.subscribe(("t", 2)) == [m.SubAck(1, [2])]
    Client(service, "pub").publish("t", b"x", qos=2, pid=9)
    [p] = sub.output()
    assert (p.qos, p.dup) == (2, False)
    q = broker.vhosts["/"].queues[queue_names("sub")[1]]
    assert q.unacked_count == 1
    assert sub.send(m.PacketId(m.PUBACK, p.packet_id)) == []  # settles nothing at QoS 2
    assert q.unacked_count == 1
    assert sub.send(m.PacketId(PUBREC, p.packet_id)) == [m.PacketId(PUBREL, p.packet_id)]
    assert q.unacked_count == 0 and q.message_count == 0
    assert sub.session.conn.releasing == {p.packet_id}
    assert sub.send(m.PacketId(PUBREC, p.packet_id)) == [m.PacketId(PUBREL, p.packet_id)]
    assert sub.send(m.PacketId(PUBCOMP, p.packet_id)) == []
    assert sub.session.conn.releasing == set()


def test_released_ids_are_not_reused_before_pubcomp(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("t", 2))
    pub = Client(service, "pub")
    pub.publish("t", b"1", qos=2, pid=1)
    [first] = sub.output()
    sub.send(m.PacketId(PUBREC, first.packet_id))
    for i in range(3):
        pub.publish("t", b"%d" % i, qos=2, pid=10 + i)
    later = [p for p in sub.output() if isinstance(p, m.Publish)]
    assert first.packet_id not in {p.packet_id for p in later}


def test_persistent_session_resends_pubrel_not_publish(broker, service):
    sub = Client(service, "dev", clean=False)
    sub.subscribe(("t", 2))
    pub = Client(service, "pub")
    pub.publish("t", b"a", qos=2, pid=1)
    pub.publish("t", b"b", qos=2, pid=2)
    a, b = sub.output()
    sub.send(m.PacketId(PUBREC, a.packet_id))  # a: in the PUBREL phase; b: no PUBREC yet
    sub.drop()
    again = Client(service, "dev", clean=False)
    assert again.connack[0] == m.ConnAck(0, True)
    rest = again.connack[1:]
    assert ids(rest, PUBREL) == [a.packet_id]
    # b again, with DUP and the packet id it had
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in rest if isinstance(p, m.Publish)] == [
        (b"b", 2, True, b.packet_id)]
    again.send(m.PacketId(PUBCOMP, a.packet_id))
    again.send(m.PacketId(PUBREC, b.packet_id))
    again.send(m.PacketId(PUBCOMP, b.packet_id))
    assert again.session.conn.releasing == set()
    again.drop()
    assert ("/", "dev") not in service.qos2.states  # nothing left to keep


def test_persistent_session_remembers_received_ids(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("t", 0))
    dev = Client(service, "dev", clean=False)
    assert dev.publish("t", b"x", qos=2, pid=3) == [m.PacketId(PUBREC, 3)]
    dev.drop()  # the PUBREC was lost with the connection
    dev = Client(service, "dev", clean=False)
    assert dev.send(m.Publish("t", b"x", 2, False, True, 3)) == [m.PacketId(PUBREC, 3)]
    assert dev.send(m.PacketId(PUBREL, 3)) == [m.PacketId(PUBCOMP, 3)]
    assert [p[1] for p in publishes(sub.output())] == [b"x"]  # once
    # a clean session of the same id forgets it all
    dev.drop()
    fresh = Client(service, "dev", clean=True)
    assert fresh.publish("t", b"y", qos=2, pid=3) == [m.PacketId(PUBREC, 3)]
    assert [p[1] for p in publishes(sub.output())] == [b"y"]


def test_clean_session_forgets_received_ids(broker, service):
    dev = Client(service, "dev", clean=True)
    dev.publish("t", b"x", qos=2, pid=3)
    dev.drop()
    sub = Client(service, "sub")
    sub.subscribe(("t", 0))
    dev = Client(service, "dev", clean=True)
    assert dev.publish("t", b"x", qos=2, pid=3) == [m.PacketId(PUBREC, 3)]
    assert len(publishes(sub.output())) == 1


def test_overlapping_subscriptions_deliver_once_at_the_highest_qos(broker, service):
    sub = Client(service, "sub")
    assert sub.subscribe(("a/#", 0), ("a/b", 2), ("a/+", 1)) == [m.SubAck(1, [0, 2, 1])]
    pub = Client(service, "pub")
    pub.publish("a/c/d", b"y", qos=2, pid=4)  # a/# only: 0
    pub.publish("a/b", b"2", qos=2, pid=1)
    pub.publish("a/b", b"1", qos=1, pid=2)  # the lower of the two: 1
    pub.publish("a/c", b"x", qos=2, pid=3)  # a/# and a/+: 1
    out = sub.output()
    assert [(p[0], p[1], p[2]) for p in publishes(out)] == [
        ("a/c/d", b"y", 0), ("a/b", b"2", 2), ("a/b", b"1", 1), ("a/c", b"x", 1)]
    sub.send(*[m.PacketId(PUBREC if p.qos == 2 else m.PUBACK, p.packet_id) for p in out[1:]])
    # subscribing a filter again replaces its QoS (section 3.8.4)
    sub.subscribe(("a/b", 0), pid=2)
    sub.output()
    pub.publish("a/b", b"z", qos=2, pid=5)
    assert [(p[1], p[2]) for p in publishes(sub.output())] == [(b"z", 1)]


def test_persistent_session_keeps_filter_qos(broker, service):
    dev = Client(service, "dev", clean=False)
    dev.subscribe(("x/#", 0), ("x/y", 2))
    dev.drop()
    dev = Client(service, "dev", clean=False)
    Client(service, "pub").publish("x/y", b"m", qos=2, pid=1)
    assert [(p[1], p[2]) for p in publishes(dev.output())] == [(b"m", 2)]


def test_session_stored_with_two_queues_is_upgraded(broker, service):
    vh = broker.vhosts["/"]
    q0_name, q1_name = queue_names("old")
    q0 = declare_queue(vh, q0_name)
    q1 = declare_queue(vh, q1_name, durable=True)
    vh.bind("amq.topic", q0, "zero.#", {})  # as bound by a version with a QoS 0 queue
    vh.bind("amq.topic", q1, "one", {})
    dev = Client(service, "old", clean=False)
    assert dev.connack == [m.ConnAck(0, True)]
    assert q0_name not in vh.queues
    assert dev.session.filters == {"zero/#": 0, "one": 1}
    pub = Client(service, "pub")
    pub.publish("zero/a", b"0", qos=1, pid=1)
    pub.publish("one", b"1", qos=1, pid=2)
    assert [(p[1], p[2]) for p in publishes(dev.output())] == [(b"0", 0), (b"1", 1)]


def test_will_and_retained_at_qos2(broker, service):
    watcher = Client(service, "w")
    watcher.subscribe(("status/#", 2))
    dev = Client(service, "dev", will=m.Will("status/dev", b"gone", 2, True))
    dev.drop()
    [will] = [p for p in watcher.output() if isinstance(p, m.Publish)]
    assert (will.payload, will.qos) == (b"gone", 2)
    late = Client(service, "late")
    got = late.subscribe(("status/+", 2))
    assert [(p.topic, p.payload, p.qos, p.retain) for p in got if isinstance(p, m.Publish)] == [
        ("status/dev", b"gone", 2, True)]
    [r] = [p for p in got if isinstance(p, m.Publish)]
    assert late.send(m.PacketId(PUBREC, r.packet_id)) == [m.PacketId(PUBREL, r.packet_id)]
    assert late.send(m.PacketId(PUBCOMP, r.packet_id)) == []


def test_publisher_flow_set_made_and_released(broker, service):
    """A publisher into a queue with a backlog is held in flow until it drains (its set of
    such queues is made on first use)."""
    broker.config.flow_high, broker.config.flow_low = 2, 0
    sub = Client(service, "sub")
    sub.subscribe(("t", 1))
    pub = Client(service, "pub")
    resumed = []
    pub.session.flow_resumed = lambda: resumed.append(True)
    assert not pub.session.flow_queues
    for i in range(8):
        pub.publish("t", b"%d" % i, qos=1, pid=i + 1)
    assert len(pub.session.flow_queues) == 1  # 3 in flight (prefetch), 5 ready > 2
    out = sub.output()
    while not resumed:
        out = [p for p in out if isinstance(p, m.Publish)]
        assert out, "the queue stopped delivering"
        out = sub.send(*[m.PacketId(m.PUBACK, p.packet_id) for p in out])
    assert not pub.session.flow_queues
    pub.drop()
    assert not pub.session.flow_queues
