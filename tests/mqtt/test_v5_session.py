"""MQTT 5.0 sessions against a whole broker (memory store, fake clock), without sockets:
the CONNACK's capabilities, session expiry (Clean Start + Session Expiry Interval on the
subscription queue), reason codes on SUBACK/UNSUBACK, server DISCONNECT reasons
(takeover), the client's Receive Maximum and Maximum Packet Size, 3.1.1 beside it."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.listeners.mqtt_session import (
    RECEIVE_MAXIMUM,
    TOPIC_ALIAS_MAXIMUM,
    MQTTService,
    MQTTSession,
    queue_names,
)
from broker.mqtt import codec as m
from broker.mqtt import properties as P
from broker.mqtt.codec import PacketReader, encode


@pytest.fixture
def service(broker):
    broker.config.mqtt_prefetch = 10
    return MQTTService(broker)


class Client5:
    def __init__(self, service, client_id="c1", clean=True, props=None, will=None,
                 level=5):
        self.session = MQTTSession(service, "127.0.0.1:40000", "127.0.0.1")
        self.reader = PacketReader()
        self.reader.version = level
        self.reader.started = True
        self.connack = self.send(m.Connect(client_id, clean, 60, will=will, protocol_level=level,
                                           properties=props if level == 5 else None))

    def send(self, *packets) -> list:
        self.session.data_received(b"".join(encode(p) for p in packets))
        return self.output()

    def output(self) -> list:
        return self.reader.feed(self.session.conn.data_to_send())


def test_connack_states_capabilities(service):
    c = Client5(service, "", props={})
    [ack] = c.connack
    assert ack.return_code == 0
    props = ack.properties
    assert props[P.ASSIGNED_CLIENT_IDENTIFIER] == c.session.client_id
    assert props[P.RECEIVE_MAXIMUM] == RECEIVE_MAXIMUM
    assert props[P.TOPIC_ALIAS_MAXIMUM] == TOPIC_ALIAS_MAXIMUM
    assert props[P.SHARED_SUBSCRIPTION_AVAILABLE] == 1
    assert props[P.SUBSCRIPTION_IDENTIFIER_AVAILABLE] == 1
    assert props[P.WILDCARD_SUBSCRIPTION_AVAILABLE] == 1
    assert props[P.RETAIN_AVAILABLE] == 1
    assert P.MAXIMUM_QOS not in props  # absent: QoS 2 is supported
    assert props[P.MAXIMUM_PACKET_SIZE] == service.max_packet + 2
    assert c.session.protocol == "MQTT 5.0"


def test_session_expiry_keeps_the_queue_with_x_expires(broker, service):
    vhost = broker.vhosts["/"]
    name = queue_names("dev")[1]
    c = Client5(service, "dev", clean=True, props={P.SESSION_EXPIRY_INTERVAL: 120})
    assert c.connack[0].session_present is False
    c.send(m.Subscribe(1, [("a/b", 1)], {}))
    q = vhost.queues[name]
    assert q.durable and not q.auto_delete and q.opts.expires == 120_000
    c.session.connection_lost()
    assert name in vhost.queues
    # Clean Start 0 resumes it
    c2 = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 120})
    assert c2.connack[0].session_present is True
    # a DISCONNECT with expiry 0 ends it at once
    c2.send(m.Disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}))
    assert name not in vhost.queues


def test_expiry_zero_without_clean_start_resumes_then_ends(broker, service):
    vhost = broker.vhosts["/"]
    name = queue_names("dev")[1]
    c = Client5(service, "dev", props={P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF})
    c.send(m.Subscribe(1, [("a", 1)], {}))
    assert vhost.queues[name].opts.expires is None  # never expires
    c.session.connection_lost()
    c2 = Client5(service, "dev", clean=False, props={})  # expiry 0
    assert c2.connack[0].session_present is True
    c2.session.connection_lost()
    assert name not in vhost.queues


def test_takeover_of_an_expiry_zero_session_keeps_it_for_the_new_connection(broker, service):
    c = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 60})
    c.send(m.Subscribe(1, [("a", 1)], {}))
    c.session.connection_lost()
    old = Client5(service, "dev", clean=False, props={})  # resumed, expiry 0
    new = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 60})
    assert old.session.ended and new.connack[0].session_present
    assert queue_names("dev")[1] in broker.vhosts["/"].queues
    assert new.session.filters == {"a": 1}


def test_clean_start_with_expiry_drops_the_old_session(broker, service):
    c = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 60})
    c.send(m.Subscribe(1, [("a", 1)], {}))
    c.session.connection_lost()
    c2 = Client5(service, "dev", clean=True, props={P.SESSION_EXPIRY_INTERVAL: 60})
    assert c2.connack[0].session_present is False
    assert queue_names("dev")[1] not in broker.vhosts["/"].queues


def test_takeover_tells_the_old_connection_why(service):
    old = Client5(service, "dev", props={})
    Client5(service, "dev", props={})
    [d] = old.output()
    assert isinstance(d, m.Disconnect) and d.reason_code == P.SESSION_TAKEN_OVER


def test_suback_and_unsuback_reason_codes(service):
    c = Client5(service, "dev", props={})
    [ack] = c.send(m.Subscribe(1, [("a/+", 2), ("$share/g/a", 1), ("b", 0x04 | 1),
                                   ("c", 0x20 | 1)], {}))
    assert ack.return_codes == [2, 1, 1, 1]
    [ack] = c.send(m.Unsubscribe(2, ["a/+", "zzz"], {}))
    assert ack == m.UnsubAck(2, [P.SUCCESS, P.NO_SUBSCRIPTION_EXISTED], {})


def test_subscription_identifiers_no_local_and_retain_as_published(broker, service):
    c = Client5(service, "dev", props={})
    c.send(m.Subscribe(1, [("a/#", 1)], {P.SUBSCRIPTION_IDENTIFIER: 7}),
           m.Subscribe(2, [("a/b", 0x04 | 0x08 | 1)], {P.SUBSCRIPTION_IDENTIFIER: 9}),
           m.Subscribe(3, [("n/#", 0x04 | 1)], {}))
    other = Client5(service, "other", props={})
    got = other.send(m.Publish("a/b", b"r", 1, True, False, 1, {}))
    got = [p for p in c.output() if isinstance(p, m.Publish)]
    # both filters match: once, both identifiers, RETAIN as published (a/b says so)
    [p] = got
    assert p.properties[P.SUBSCRIPTION_IDENTIFIER] == [7, 9] and p.retain
    c.send(m.PacketId(m.PUBACK, p.packet_id))
    # its own message: the No Local filter a/b does not take it, a/# does (no RAP there)
    got = [p for p in c.send(m.Publish("a/b", b"own", 1, True, False, 5, {}))
           if isinstance(p, m.Publish)]
    [p] = got
    assert p.payload == b"own" and p.properties[P.SUBSCRIPTION_IDENTIFIER] == [7]
    assert not p.retain
    c.send(m.PacketId(m.PUBACK, p.packet_id))
    # only No Local filters match: not delivered, and not left in the queue
    got = c.send(m.Publish("n/x", b"mine", 1, False, False, 6, {}))
    assert [p for p in got if isinstance(p, m.Publish)] == []
    assert broker.vhosts["/"].queues[queue_names("dev")[1]].message_count == 0
    other.send(m.Publish("n/x", b"theirs", 0, False, False, None, {}))
    assert [p.payload for p in c.output() if isinstance(p, m.Publish)] == [b"theirs"]


def test_subscription_options_survive_a_reconnect(service):
    c = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 60})
    c.send(m.Subscribe(1, [("x", 0x04 | 1)], {P.SUBSCRIPTION_IDENTIFIER: 3}))
    c.session.connection_lost()
    c = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 60})
    assert c.session.sub_opts == {"x": (0x04, 3)}
    assert [p for p in c.send(m.Publish("x", b"own", 1, False, False, 1, {}))
            if isinstance(p, m.Publish)] == []


def test_retain_handling(service):
    pub = Client5(service, "pub", props={})
    pub.send(m.Publish("r/1", b"kept", 1, True, False, 1, {}))
    sub = Client5(service, "sub", props={})

    def retained(options, pid):
        return [p for p in sub.send(m.Subscribe(pid, [("r/#", options)], {}))
                if isinstance(p, m.Publish)]
    assert retained(0x20 | 1, 1) == []  # 2: never
    assert retained(0x10 | 1, 2) == []  # 1: only for a new subscription (it exists now)
    [p] = retained(0x00 | 1, 3)  # 0: always
    assert p.payload == b"kept" and p.retain


def test_receive_maximum_bounds_deliveries_in_flight(service):
    sub = Client5(service, "sub", props={P.RECEIVE_MAXIMUM: 2})
    sub.send(m.Subscribe(1, [("t", 1)], {}))
    pub = Client5(service, "pub", props={})
    for i in range(5):
        pub.send(m.Publish("t", b"%d" % i, 1, False, False, i + 1, {}))
    got = [p for p in sub.output() if isinstance(p, m.Publish)]
    assert [p.payload for p in got] == [b"0", b"1"]
    got = [p for p in sub.send(m.PacketId(m.PUBACK, got[0].packet_id))
           if isinstance(p, m.Publish)]
    assert [p.payload for p in got] == [b"2"]


def test_deliveries_over_the_clients_maximum_packet_size_are_dropped(broker, service):
    sub = Client5(service, "sub", props={P.MAXIMUM_PACKET_SIZE: 100})
    sub.send(m.Subscribe(1, [("t", 1)], {}))
    pub = Client5(service, "pub", props={})
    pub.send(m.Publish("t", b"x" * 200, 1, False, False, 1, {}),
             m.Publish("t", b"small", 1, False, False, 2, {}))
    got = [p for p in sub.output() if isinstance(p, m.Publish)]
    assert [p.payload for p in got] == [b"small"]
    q = broker.vhosts["/"].queues[queue_names("sub")[1]]
    sub.send(m.PacketId(m.PUBACK, got[0].packet_id))
    assert q.message_count == 0 and not sub.session.conn.inflight  # the big one settled


def test_disconnect_with_will_publishes_the_will(service):
    watcher = Client5(service, "w", props={})
    watcher.send(m.Subscribe(1, [("will/t", 0)], {}))
    c = Client5(service, "dev", props={}, will=m.Will("will/t", b"gone", 0, False, {}))
    c.send(m.Disconnect(P.DISCONNECT_WITH_WILL))
    assert [p.payload for p in watcher.output() if isinstance(p, m.Publish)] == [b"gone"]
    c = Client5(service, "dev2", props={}, will=m.Will("will/t", b"gone2", 0, False, {}))
    c.send(m.Disconnect(0))
    assert watcher.output() == []
    # a client's error code is no normal end: the will goes out
    c = Client5(service, "dev3", props={}, will=m.Will("will/t", b"gone3", 0, False, {}))
    c.send(m.Disconnect(P.UNSPECIFIED_ERROR))
    assert [p.payload for p in watcher.output() if isinstance(p, m.Publish)] == [b"gone3"]


def test_v311_and_v5_clients_together(service):
    v3 = Client5(service, "v3", level=4)
    assert v3.connack == [m.ConnAck(0, False)]
    v5 = Client5(service, "v5", props={})
    v3.send(m.Subscribe(1, [("t", 1)]))
    v5.send(m.Subscribe(1, [("t", 1)], {}))
    got5 = v5.send(m.Publish("t", b"from5", 1, False, False, 1, {}))
    got3 = v3.send(m.Publish("t", b"from3", 1, False, False, 1))
    assert [p.payload for p in got3 if isinstance(p, m.Publish)] == [b"from5", b"from3"]
    got = [p for p in got5 + v5.output() if isinstance(p, m.Publish)]
    assert [p.payload for p in got] == [b"from5", b"from3"]
    assert got[0].properties is not None  # v5 PUBLISH format


def test_publish_properties_map_to_amqp_and_back(broker, service, clock):
    from broker.amqp.fields import encode_properties
    from broker.message import Message

    from ..support import bind, declare_queue
    vhost = broker.vhosts["/"]
    q = declare_queue(vhost, "amqp-side")
    bind(vhost, "amq.topic", q, "req.#")
    sub = Client5(service, "sub", props={})
    sub.send(m.Subscribe(1, [("req/#", 1)], {}))
    pub = Client5(service, "pub", props={})
    v5 = {P.USER_PROPERTY: [("k", "1"), ("k", "2"), ("u", "v"), ("x-mqtt-dup", "no")],
          P.CONTENT_TYPE: "application/json", P.RESPONSE_TOPIC: "resp/dev1",
          P.CORRELATION_DATA: b"abc", P.MESSAGE_EXPIRY_INTERVAL: 30,
          P.PAYLOAD_FORMAT_INDICATOR: 1}
    pub.send(m.Publish("req/x", b"{}", 1, False, False, 1, v5),
             m.Publish("req/y", b"bin", 1, False, False, 2, {P.CORRELATION_DATA: b"\xff\x00"}))
    entry = q.ready.peek() if hasattr(q.ready, "peek") else next(iter(q.ready))
    props = entry.message.properties
    assert props["headers"]["k"] == ["1", "2"] and props["headers"]["u"] == "v"
    assert props["headers"]["x-mqtt-dup"] is False
    assert props["content_type"] == "application/json"
    assert props["reply_to"] == "resp.dev1" and props["correlation_id"] == "abc"
    assert props["expiration"] == "30000"
    clock.advance(10)
    got = [p for p in sub.output() if isinstance(p, m.Publish)]
    first, second = got
    fp = first.properties
    assert fp[P.USER_PROPERTY] == [("k", "1"), ("k", "2"), ("u", "v")]
    assert fp[P.CONTENT_TYPE] == "application/json" and fp[P.RESPONSE_TOPIC] == "resp/dev1"
    assert fp[P.CORRELATION_DATA] == b"abc" and fp[P.PAYLOAD_FORMAT_INDICATOR] == 1
    assert fp[P.MESSAGE_EXPIRY_INTERVAL] == 30
    assert second.properties == {P.CORRELATION_DATA: b"\xff\x00"}
    # an AMQP message with headers, reply_to and correlation_id reaches a v5 client
    amqp = {"headers": {"trace": "t1", "n": 5}, "reply_to": "amq.a.b", "correlation_id": "r1",
            "content_type": "text/plain"}
    msg = Message("amq.topic", "req.z", encode_properties(amqp), amqp, b"hi")
    for dest in vhost.route("amq.topic", "req.z", msg):
        dest.enqueue(msg)
    [p] = [p for p in sub.output() if isinstance(p, m.Publish)]
    assert p.properties == {P.USER_PROPERTY: [("trace", "t1"), ("n", "5")],
                            P.CONTENT_TYPE: "text/plain", P.RESPONSE_TOPIC: "amq/a/b",
                            P.CORRELATION_DATA: b"r1"}


def test_message_expiry_drops_what_waited_too_long(broker, service, clock):
    sub = Client5(service, "sub", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    sub.send(m.Subscribe(1, [("t", 1)], {}))
    sub.session.connection_lost()
    pub = Client5(service, "pub", props={})
    pub.send(m.Publish("t", b"short", 1, False, False, 1, {P.MESSAGE_EXPIRY_INTERVAL: 5}),
             m.Publish("t", b"long", 1, False, False, 2, {P.MESSAGE_EXPIRY_INTERVAL: 100}))
    clock.advance(20)
    back = Client5(service, "sub", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 600})
    got = [p for p in back.output() + back.connack if isinstance(p, m.Publish)]
    assert [p.payload for p in got] == [b"long"]
    assert got[0].properties[P.MESSAGE_EXPIRY_INTERVAL] == 80


def test_shared_subscriptions_are_competing_consumers(broker, service):
    from broker.listeners.mqtt_mapping import shared_queue_name
    vhost = broker.vhosts["/"]
    pub = Client5(service, "pub", props={})
    pub.send(m.Publish("jobs/1", b"retained", 1, True, False, 99, {}))
    a = Client5(service, "a", props={})
    b = Client5(service, "b", level=4)  # 3.1.1 members too, as Mosquitto
    [ack] = a.send(m.Subscribe(1, [("$share/g/jobs/#", 2)], {P.SUBSCRIPTION_IDENTIFIER: 4}))
    assert ack.return_codes == [2]
    got_b = b.send(m.Subscribe(1, [("$share/g/jobs/#", 0)]))
    assert got_b == [m.SubAck(1, [0])]  # no retained message for a shared subscription
    for i in range(6):
        pub.send(m.Publish(f"jobs/{i}", b"%d" % i, 1, False, False, i + 1, {}))
    got_a = [p for p in a.output() if isinstance(p, m.Publish)]
    got_b = [p for p in b.output() if isinstance(p, m.Publish)]
    assert sorted(p.payload for p in got_a + got_b) == [b"%d" % i for i in range(6)]
    assert got_a and got_b  # shared between them
    assert all(p.qos == 1 and p.properties[P.SUBSCRIPTION_IDENTIFIER] == [4] for p in got_a)
    assert all(p.qos == 0 for p in got_b)
    name = shared_queue_name("g", "jobs/#")
    assert vhost.queues[name].consumers
    [ack] = a.send(m.Unsubscribe(2, ["$share/g/jobs/#", "$share/h/x"], {}))
    assert ack.reason_codes == [P.SUCCESS, P.NO_SUBSCRIPTION_EXISTED]
    b.session.connection_lost()  # the last member: the group's queue goes
    assert name not in vhost.queues
    [ack] = a.send(m.Subscribe(3, [("$share/+/x", 1), ("$share/g", 1)], {}))
    assert ack.return_codes == [P.TOPIC_FILTER_INVALID, P.TOPIC_FILTER_INVALID]


_topics5 = st.sampled_from(["a", "a/b", "b/c", "$share/g/a", "$share/g/#", "#", "+/b"])
_text5 = st.one_of(st.sampled_from(["k", "x-mqtt-dup", "r/t", "a.b/*", "k" * 300]),
                  st.text(st.characters(blacklist_characters="\x00",
                                        blacklist_categories=("Cs",)), max_size=8))
_props5 = st.fixed_dictionaries({}, optional={
    P.USER_PROPERTY: st.lists(st.tuples(_text5, _text5), min_size=1, max_size=3),
    P.MESSAGE_EXPIRY_INTERVAL: st.sampled_from([1, 5, 0xFFFFFFFF]),
    P.CONTENT_TYPE: _text5,
    P.PAYLOAD_FORMAT_INDICATOR: st.integers(0, 1),
    P.CORRELATION_DATA: st.one_of(st.binary(max_size=4), st.just(b"c" * 300)),
    P.RESPONSE_TOPIC: _text5})
_packets5 = st.one_of(
    st.builds(lambda t, q, r, pid, props: m.Publish(t, b"x", q, r, False, pid if q else None,
                                                     props),
              st.sampled_from(["a", "a/b", "b/c"]), st.integers(0, 2), st.booleans(),
              st.integers(1, 4), _props5),
    st.builds(lambda pid, ts, sid: m.Subscribe(pid, ts, {P.SUBSCRIPTION_IDENTIFIER: sid}
                                               if sid else {}),
              st.integers(1, 4),
              st.lists(st.tuples(_topics5, st.sampled_from([0, 1, 2, 0x05, 0x09, 0x1a, 0x2c])),
                       min_size=1, max_size=2),
              st.integers(0, 3)),
    st.builds(lambda pid, ts: m.Unsubscribe(pid, ts, {}), st.integers(1, 4),
              st.lists(_topics5, min_size=1, max_size=2)),
    st.builds(lambda t, pid: m.PacketId(t, pid), st.sampled_from([m.PUBACK, m.PUBREC, m.PUBREL,
                                                                  m.PUBCOMP]),
              st.integers(1, 6)),
    st.builds(lambda code: m.Disconnect(code, {P.SESSION_EXPIRY_INTERVAL: 0} if code else None),
              st.sampled_from([0, 4, 0x80])),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), _packets5, st.booleans()), max_size=40))
def test_random_v5_traffic_keeps_every_message_accounted(tmp_path_factory, script):
    """Three v5 clients (expiry 60, expiry 0 resumed, clean) and random v5 packets with
    properties, options, identifiers and shared subscriptions: nothing raises, nothing
    leaves a queue twice, and once all are gone only the expiring session's queue is left."""
    from collections import Counter

    from broker.broker import Broker
    from broker.config import Config
    from broker.persistence import MemoryStore
    from broker.queues.ops import LEAVING, OpRecorder

    broker = Broker(Config(data_dir=str(tmp_path_factory.mktemp("d")), mqtt_port=0,
                           memory_limit_bytes=1 << 50), MemoryStore())
    service = broker.mqtt.service

    def connect(who):
        return Client5(service, f"c{who}", clean=who == 2,
                       props={P.SESSION_EXPIRY_INTERVAL: 60} if who == 0 else {})
    clients = [connect(i) for i in range(3)]
    recorders: dict = {}
    for who, packet, reconnect in script:
        c = clients[who]
        if c.session.finished:
            if not reconnect:
                continue
            c.session.connection_lost()
            c = clients[who] = connect(who)
        c.send(packet)
        for q in broker.vhosts["/"].queues.values():
            if q not in recorders:
                recorders[q] = OpRecorder()
                q.observers.append(recorders[q])
            assert q.unacked_count >= 0
    for c in clients:
        c.session.connection_lost()
    live = broker.vhosts["/"].queues
    assert set(live) <= {queue_names("c0")[1]}
    for q in live.values():
        assert q.unacked_count == 0 and not q.consumers
    for _q, rec in recorders.items():
        gone = Counter(seq for op, seq in rec.ops if op in LEAVING)
        assert all(n == 1 for n in gone.values())


def test_will_delay_interval(broker, service, clock):
    watcher = Client5(service, "w", props={})
    watcher.send(m.Subscribe(1, [("will/#", 0)], {}))

    def device(clean, payload, delay=10):
        return Client5(service, "dev", clean=clean, props={P.SESSION_EXPIRY_INTERVAL: 100},
                       will=m.Will("will/dev", payload, 0, False,
                                   {P.WILL_DELAY_INTERVAL: delay}))

    def wills():
        return [p.payload for p in watcher.output() if isinstance(p, m.Publish)]
    d = device(True, b"1")
    d.session.connection_lost()  # abnormal end: the will waits 10 s
    clock.advance(5)
    assert wills() == []
    d = device(False, b"2")  # the session resumed in time: will 1 never goes
    clock.advance(20)
    assert wills() == []
    d.session.connection_lost()
    clock.advance(11)
    assert wills() == [b"2"]  # after its delay
    d = device(False, b"3")
    d.session.connection_lost()
    device(True, b"4")  # a new session (Clean Start): the old one ended, its will goes now
    assert wills() == [b"3"]
    # the delay is bounded by the session expiry
    d = Client5(service, "dev5", props={P.SESSION_EXPIRY_INTERVAL: 3},
                will=m.Will("will/dev5", b"5", 0, False, {P.WILL_DELAY_INTERVAL: 60}))
    d.session.connection_lost()
    clock.advance(4)
    assert wills() == [b"5"]


def test_expiry_intervals_above_what_queues_take_are_lowered(broker, service):
    """RabbitMQ's queues take x-expires and expiration up to ten years: a longer Session
    Expiry Interval is lowered and the CONNACK says so (section 3.2.2.3.2); a longer
    Message Expiry Interval is lowered too (the publish used to fail in the queue)."""
    c = Client5(service, "dev", clean=False, props={P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFE})
    assert c.connack[0].properties[P.SESSION_EXPIRY_INTERVAL] == 315_360_000
    [ack] = c.send(m.Subscribe(1, [("a", 1)], {}))
    assert ack.return_codes == [1]
    assert broker.vhosts["/"].queues[queue_names("dev")[1]].opts.expires == 315_360_000_000
    never = Client5(service, "dev2", props={P.SESSION_EXPIRY_INTERVAL: 0xFFFFFFFF})
    assert P.SESSION_EXPIRY_INTERVAL not in never.connack[0].properties
    got = c.send(m.Publish("a", b"x", 1, False, False, 1,
                           {P.MESSAGE_EXPIRY_INTERVAL: 0xFFFFFFFF}))
    [p] = [p for p in got if isinstance(p, m.Publish)]
    assert p.properties[P.MESSAGE_EXPIRY_INTERVAL] == 315_360_000


def test_user_property_names_too_long_for_an_amqp_header_are_left_out(broker, service):
    sub = Client5(service, "sub", props={})
    sub.send(m.Subscribe(1, [("t", 0)], {}))
    pub = Client5(service, "pub", props={})
    pub.send(m.Publish("t", b"x", 0, False, False, None,
                       {P.USER_PROPERTY: [("k" * 300, "v"), ("ok", "v")]}))
    [p] = [p for p in sub.output() if isinstance(p, m.Publish)]
    assert p.properties[P.USER_PROPERTY] == [("ok", "v")] and not pub.session.finished


def test_retained_messages_keep_their_v5_properties_and_expire(broker, service, monkeypatch):
    from broker.listeners import mqtt_retained
    now = [1000.0]
    monkeypatch.setattr(mqtt_retained, "_clock", lambda: now[0])
    records = {}
    monkeypatch.setattr(broker.store, "save_meta",
                        lambda kind, key, value: records.__setitem__(key, value))
    pub = Client5(service, "pub", props={})
    v5 = {P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")],
          P.MESSAGE_EXPIRY_INTERVAL: 30, P.TOPIC_ALIAS: 1}
    pub.send(m.Publish("r/a", b"kept", 1, True, False, 1, v5))
    now[0] += 10

    def retained(client_id, level=5):
        c = Client5(service, client_id, level=level, props={} if level == 5 else None)
        sub = m.Subscribe(1, [("r/#", 1)], {P.SUBSCRIPTION_IDENTIFIER: 2} if level == 5 else None)
        return [p for p in c.send(sub) if isinstance(p, m.Publish)]
    [p] = retained("s1")
    assert p.retain and p.properties == {P.CONTENT_TYPE: "text/plain",
                                         P.USER_PROPERTY: [("k", "v")],
                                         P.MESSAGE_EXPIRY_INTERVAL: 20,
                                         P.SUBSCRIPTION_IDENTIFIER: [2]}
    [p] = retained("s2", level=4)
    assert p.payload == b"kept"
    # the record brings them back after a restart
    [record] = records.values()
    again = mqtt_retained.RetainedStore(broker)
    again._restore("k", record)
    assert again.properties("/", "r/a") == ({P.CONTENT_TYPE: "text/plain",
                                              P.USER_PROPERTY: [("k", "v")]}, 20)
    now[0] += 21  # past its Message Expiry Interval: not sent, and gone
    assert retained("s3") == [] and retained("s4", level=4) == []
    assert service.retained.get("/", "r/a") is None


def test_puback_says_no_matching_subscribers(service):
    pub = Client5(service, "pub", props={})
    got = pub.send(m.Publish("nobody", b"x", 1, False, False, 1, {}),
                   m.Publish("nobody", b"x", 2, False, False, 2, {}),
                   m.Publish("nobody", b"x", 0, False, False, None, {}))
    assert [(p.type, p.packet_id, p.reason_code) for p in got] == [
        (m.PUBACK, 1, P.NO_MATCHING_SUBSCRIBERS), (m.PUBREC, 2, P.NO_MATCHING_SUBSCRIBERS)]
    sub = Client5(service, "sub", props={})
    sub.send(m.Subscribe(1, [("t", 0)], {}))
    [ack] = pub.send(m.Publish("t", b"x", 1, False, False, 3, {}))
    assert ack.reason_code == 0
    # the acknowledged ids left the Receive Maximum's count (PUBCOMP for the QoS 2 one)
    pub.send(m.PacketId(m.PUBREL, 2))
    assert not pub.session.conn._inbound
    # 3.1.1: no reason codes
    v3 = Client5(service, "v3", level=4)
    assert v3.session.conn.data_to_send() == b""
    v3.session.data_received(encode(m.Publish("nobody", b"x", 1, False, False, 1)))
    assert v3.session.conn.data_to_send() == b"\x40\x02\x00\x01"
