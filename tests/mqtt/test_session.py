"""The MQTT session against a whole broker (memory store, fake clock), without sockets:
publish/subscribe mapping onto amq.topic and subscription queues, the QoS 1 window,
clean and persistent sessions, takeover, will, retained messages, login, and AMQP on the
other end (SessionClient)."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.amqp import spec
from broker.listeners.mqtt_session import MQTTService, MQTTSession, queue_names
from broker.mqtt import codec as m
from broker.mqtt.codec import PacketReader, encode

from ..support import bind, declare_queue


@pytest.fixture
def service(broker):
    broker.config.mqtt_prefetch = 3
    return MQTTService(broker)


class Client:
    def __init__(self, service, client_id="c1", clean=True, username=None, password=None,
                 will=None, peer="127.0.0.1:40000"):
        self.session = MQTTSession(service, peer, peer.rsplit(":", 1)[0])
        self.reader = PacketReader()
        self.connack = self.send(m.Connect(client_id, clean, 60, username, password, will))

    def send(self, *packets) -> list:
        self.session.data_received(b"".join(encode(p) for p in packets))
        return self.output()

    def output(self) -> list:
        return self.reader.feed(self.session.conn.data_to_send())

    def subscribe(self, *topics, pid=1) -> list:
        return self.send(m.Subscribe(pid, list(topics)))

    def publish(self, topic, payload, qos=0, retain=False, pid=None) -> list:
        return self.send(m.Publish(topic, payload, qos, retain, False,
                                   pid if qos else None))

    def drop(self):
        self.session.connection_lost()


def publishes(packets) -> list:
    return [(p.topic, p.payload, p.qos, p.retain, p.dup) for p in packets
            if isinstance(p, m.Publish)]


def test_connect_and_subscribe_declares_queue_and_binding(broker, service):
    c = Client(service)
    assert c.connack == [m.ConnAck(0, False)]
    assert c.subscribe(("a/+/c", 1), ("d/#", 0), ("e", 2)) == [m.SubAck(1, [1, 0, 2])]
    q0_name, q1_name = queue_names("c1")
    q1 = broker.vhosts["/"].queues[q1_name]
    assert q0_name not in broker.vhosts["/"].queues  # one queue, the QoS in the bindings
    # clean session: nothing outlives the connection, nothing goes to disk
    assert q1.auto_delete and not q1.durable
    persistent = Client(service, "c2", clean=False)
    persistent.subscribe(("x", 1))
    assert broker.vhosts["/"].queues[queue_names("c2")[1]].durable
    exchanges = broker.vhosts["/"].exchanges
    bindings = [exchanges[x].bindings[key] for x, key in q1.bindings]
    assert {(b.routing_key, b.arguments.get("x-mqtt-qos")) for b in bindings} == {
        ("a.*.c", 1), ("d.#", 0), ("e", 2)}
    assert len(q1.consumers) == 1


def test_publish_reaches_subscriber_with_puback_order(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("a/b", 1))
    pub = Client(service, "pub")
    got = pub.send(m.Publish("a/b", b"1", 1, False, False, 10),
                   m.Publish("nobody/here", b"2", 1, False, False, 11),
                   m.Publish("a/b", b"3", 0))
    assert got == [m.PacketId(m.PUBACK, 10), m.PacketId(m.PUBACK, 11)]
    out = sub.output()
    assert publishes(out) == [("a/b", b"1", 1, False, False), ("a/b", b"3", 0, False, False)]
    q1 = broker.vhosts["/"].queues[queue_names("sub")[1]]
    assert q1.unacked_count == 1  # the QoS 0 message was settled as written
    sub.send(m.PacketId(m.PUBACK, out[0].packet_id))
    assert q1.unacked_count == 0 and q1.message_count == 0


def test_one_read_of_mixed_publishes_keeps_order_and_stops_at_a_refused_one(broker, service):
    """A read's PUBLISHes go in one pass (known topics straight to the publish path, the
    rest one by one): deliveries and PUBACKs keep PUBLISH order, and a PUBLISH that closes
    the connection ends the read (what follows it is not routed)."""
    sub = Client(service, "sub")
    sub.subscribe(("#", 1))
    pub = Client(service, "pub")
    pub.publish("a/b", b"0", qos=1, pid=1)  # "a/b" is a known topic from here on
    got = pub.send(m.Publish("a/b", b"1", 1, False, False, 2),
                   m.Publish("new/t", b"2", 1, False, False, 3),
                   m.Publish("a/b", b"3", 0),
                   m.Publish("a/b", b"4", 1, True, False, 4),  # retained: one by one
                   m.Publish("a/b", b"5", 1, False, False, 5),
                   m.Publish("x" * 300, b"6", 1, False, False, 6),  # too long: closed
                   m.Publish("a/b", b"7", 1, False, False, 7))
    assert [p.packet_id for p in got if isinstance(p, m.PacketId)] == [2, 3, 4, 5]
    assert pub.session.finished
    # the window (prefetch 3) holds the rest back: "3" to "5" wait, "7" was never routed
    assert [p.payload for p in sub.output() if isinstance(p, m.Publish)] == [b"0", b"1", b"2"]
    q = broker.vhosts["/"].queues[queue_names("sub")[1]]
    assert [e.message.body for e in q.ready] == [b"3", b"4", b"5"]


def test_acks_of_one_read_keep_publish_order_across_qos(broker, service):
    """The publish loop collects a read's immediate PUBACKs itself; a QoS 2 PUBLISH (PUBREC)
    and a retained one between them, which take the one-by-one path, keep their place."""
    Client(service, "sub").subscribe(("#", 2))
    pub = Client(service, "pub")
    pub.publish("a/b", b"0")  # a known topic from here on (at QoS 0: no PUBACK list yet)
    got = pub.send(m.Publish("a/b", b"1", 1, False, False, 2),
                   m.Publish("a/b", b"2", 2, False, False, 3),
                   m.Publish("a/b", b"3", 1, False, False, 4),
                   m.Publish("a/b", b"4", 1, True, False, 5),
                   m.Publish("a/b", b"5", 1, False, False, 6))
    assert [(p.type, p.packet_id) for p in got] == [
        (m.PUBACK, 2), (m.PUBREC, 3), (m.PUBACK, 4), (m.PUBACK, 5), (m.PUBACK, 6)]


def test_a_read_of_pubacks_settles_each_and_refills_the_window(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("t", 1))
    pub = Client(service, "pub")
    for i in range(7):
        pub.publish("t", b"%d" % i, qos=1, pid=i + 1)
    first = sub.output()
    assert [p.payload for p in first] == [b"0", b"1", b"2"]  # prefetch 3
    q = broker.vhosts["/"].queues[queue_names("sub")[1]]
    # all three PUBACKs in one read, one of them twice (the second settles nothing)
    more = sub.send(*[m.PacketId(m.PUBACK, p.packet_id) for p in first],
                    m.PacketId(m.PUBACK, first[0].packet_id))
    assert [p.payload for p in more] == [b"3", b"4", b"5"]
    assert q.unacked_count == 3 and [e.message.body for e in q.ready] == [b"6"]
    assert q.stats_acked == 3


def test_qos1_window_is_the_prefetch(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("t", 1))
    pub = Client(service, "pub")
    for i in range(5):
        pub.publish("t", b"%d" % i, qos=1, pid=i + 1)
    first = sub.output()
    assert [p.payload for p in first] == [b"0", b"1", b"2"]  # prefetch 3
    more = sub.send(m.PacketId(m.PUBACK, first[0].packet_id))
    assert [p.payload for p in more] == [b"3"]


def test_unacked_come_back_with_dup_to_a_persistent_session(broker, service):
    sub = Client(service, "dev", clean=False)
    sub.subscribe(("t", 1))
    pub = Client(service, "pub")
    pub.publish("t", b"x", qos=1, pid=1)
    assert publishes(sub.output()) == [("t", b"x", 1, False, False)]
    sub.drop()
    pub.publish("t", b"y", qos=1, pid=2)
    again = Client(service, "dev", clean=False)
    assert again.connack[0] == m.ConnAck(0, True)
    assert publishes(again.connack[1:]) == [("t", b"x", 1, False, True), ("t", b"y", 1, False, False)]
    # a clean session of the same client id discards it all
    again.drop()
    fresh = Client(service, "dev", clean=True)
    assert fresh.connack == [m.ConnAck(0, False)]
    assert queue_names("dev")[1] not in broker.vhosts["/"].queues


def test_clean_session_queues_go_with_the_connection(broker, service):
    sub = Client(service, "tmp")
    sub.subscribe(("t", 1), ("u", 0))
    sub.send(m.Bare(m.DISCONNECT))
    sub.drop()
    assert not any(n in broker.vhosts["/"].queues for n in queue_names("tmp"))


def test_second_connection_takes_the_session_over(broker, service):
    first = Client(service, "same", clean=False)
    first.subscribe(("t", 1))
    second = Client(service, "same", clean=False)
    assert first.session.finished and first.session.ended
    assert second.connack == [m.ConnAck(0, True)]
    Client(service, "pub").publish("t", b"z", qos=1, pid=1)
    assert publishes(second.output()) == [("t", b"z", 1, False, False)]
    assert first.output() == []


def test_will_published_on_abnormal_end_only(broker, service):
    watcher = Client(service, "w")
    watcher.subscribe(("status/#", 0))
    dev = Client(service, "dev", will=m.Will("status/dev", b"gone", 1, False))
    dev.drop()
    assert publishes(watcher.output()) == [("status/dev", b"gone", 0, False, False)]
    polite = Client(service, "dev2", will=m.Will("status/dev2", b"gone", 0, False))
    polite.send(m.Bare(m.DISCONNECT))
    polite.drop()
    assert watcher.output() == []


def test_retained_messages(broker, service):
    pub = Client(service, "pub")
    pub.publish("home/kitchen/temp", b"21", qos=1, retain=True, pid=1)
    pub.publish("home/hall/temp", b"19", qos=0, retain=True)
    sub = Client(service, "sub")
    got = sub.subscribe(("home/+/temp", 1))
    assert got[0] == m.SubAck(1, [1])
    assert sorted(publishes(got[1:])) == [("home/hall/temp", b"19", 0, True, False),
                                          ("home/kitchen/temp", b"21", 1, True, False)]
    pub.publish("home/kitchen/temp", b"", qos=0, retain=True)  # clears it
    live = sub.output()
    assert publishes(live) == [("home/kitchen/temp", b"", 0, False, False)]
    other = Client(service, "other")
    assert publishes(other.subscribe(("home/#", 0))[1:]) == [("home/hall/temp", b"19", 0, True, False)]


def test_amqp_publish_reaches_mqtt_and_back(broker, service, session_client):
    amqp = session_client()
    amqp.open_channel(1)
    q = declare_queue(broker.vhosts["/"], "amqp-side")
    amqp.ok(1, spec.Queue.Bind(queue="amqp-side", exchange="amq.topic", routing_key="sensors.#"),
            spec.Queue.BindOk)
    dev = Client(service, "dev")
    dev.subscribe(("cmd/+", 1))
    amqp.publish(1, b"reboot", exchange="amq.topic", routing_key="cmd.dev")
    assert publishes(dev.output()) == [("cmd/dev", b"reboot", 1, False, False)]
    assert dev.publish("sensors/t1", b"20.5", qos=1, pid=5) == [m.PacketId(m.PUBACK, 5)]
    assert q.message_count == 1
    entry = q.get()
    assert entry.message.routing_key == "sensors.t1"
    assert entry.message.persistent
    assert entry.message.properties["headers"] == {"x-mqtt-publish-qos": 1, "x-mqtt-dup": False}


def test_no_puback_when_a_queue_refuses(broker, service):
    vh = broker.vhosts["/"]
    q = declare_queue(vh, "full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    vh.bind("amq.topic", q, "full", {})
    pub = Client(service, "pub")
    assert pub.publish("full", b"x", qos=1, pid=1) == []  # refused: the client will resend
    assert pub.publish("other", b"x", qos=1, pid=2) == [m.PacketId(m.PUBACK, 2)]
    assert not pub.session.finished


def test_login(broker, service):
    assert Client(service, "a", username="guest", password=b"nope").connack == [m.ConnAck(4)]
    assert Client(service, "b", username="nohost:guest", password=b"guest").connack == [m.ConnAck(5)]
    assert Client(service, "c", username="/:guest", password=b"guest").connack == [m.ConnAck(0)]
    remote = Client(service, "d", peer="10.1.2.3:5000")  # anonymous is guest: loopback only
    assert remote.connack == [m.ConnAck(4)]
    assert Client(service, "", clean=False).connack == [m.ConnAck(2)]
    anon = Client(service, "", clean=True)
    assert anon.connack == [m.ConnAck(0)] and anon.session.client_id.startswith("triomq-")


def test_wildcard_publish_closes_only_that_connection(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("ok", 0))
    bad = Client(service, "bad")
    raw = b"\x30\x06\x00\x03a/#x"
    bad.session.data_received(raw)
    assert bad.session.finished
    Client(service, "pub").publish("ok", b"fine")
    assert publishes(sub.output()) == [("ok", b"fine", 0, False, False)]


def test_unsubscribe(broker, service):
    sub = Client(service, "sub")
    sub.subscribe(("a", 1), ("b", 0))
    assert sub.send(m.Unsubscribe(2, ["a", "b"])) == [m.PacketId(m.UNSUBACK, 2)]
    Client(service, "pub").publish("a", b"x")
    assert sub.output() == []


def test_permissions_and_vhost_from_the_user_name(broker, service):
    access = broker.access
    access.add_vhost("iot")
    access.add_user("dev", "pw")
    access.set_permissions("dev", "iot", "^mqtt-", "^(amq\\.topic|mqtt-.*)$",
                           "^(amq\\.topic|mqtt-.*)$")
    access.set_topic_permissions("dev", "iot", "amq.topic", "^sensors\\.", "^(sensors|cmd)\\.")
    assert Client(service, "d0", username="dev", password=b"pw").connack == [m.ConnAck(5)]
    dev = Client(service, "d1", username="iot:dev", password=b"pw")
    assert dev.connack == [m.ConnAck(0)]
    assert dev.session.vhost.name == "iot"
    assert dev.subscribe(("cmd/#", 1), ("admin/#", 1)) == [m.SubAck(1, [1, 0x80])]
    assert dev.publish("sensors/t", b"1", qos=1, pid=3) == [m.PacketId(m.PUBACK, 3)]
    assert dev.publish("admin/x", b"1", qos=1, pid=4) == []
    assert dev.session.finished  # a refused publish closes the connection, as RabbitMQ


def test_connections_live_in_broker_sessions_and_go_with_fencing(broker, service):
    """MQTT sessions are the broker's connections, next to AMQP ones: counted for
    max-connections, closed (will published) when the store is fenced or their vhost
    deleted; while fenced new clients are refused."""
    broker.access.add_vhost("iot")
    broker.access.set_permissions("guest", "iot", ".*", ".*", ".*")
    wills = declare_queue(broker.vhosts["/"], "wills")
    bind(broker.vhosts["/"], "amq.topic", wills, "gone.#")
    watcher = Client(service, "w")
    dev = Client(service, "d", will=m.Will("gone/d", b"bye", 1, False))
    other = Client(service, "o", username="iot:guest", password=b"guest")
    assert {dev.session, other.session, watcher.session} <= broker.sessions
    assert dev.session.connection_info()["protocol"] == "MQTT 3.1.1"
    broker.access.set_vhost_limits("iot", {"max-connections": 1})
    assert Client(service, "o2", username="iot:guest", password=b"guest").connack == [
        m.ConnAck(5)]
    broker.access.delete_vhost("iot")
    assert other.session.finished and other.session not in broker.sessions
    broker.on_store_fenced(broker.store, True, "lease lost")
    assert dev.session.finished and dev.session.conn.closed
    assert not broker.sessions and watcher.session.finished
    assert wills.message_count == 1  # the devices did nothing wrong: their wills go out
    assert Client(service, "late").connack == [m.ConnAck(3)]
    broker.on_store_fenced(broker.store, False)
    assert Client(service, "w2").connack == [m.ConnAck(0)]


async def test_puback_waits_for_the_journal_and_retained_survive(tmp_path):
    """A QoS 1 publish into a durable queue, and a retained one, are acknowledged only after
    the journal wrote them; both come back after a restart."""
    import trio

    from broker.broker import Broker
    from broker.config import Config
    from broker.persistence import open_store

    async def life(body):
        store = open_store("journal", str(tmp_path))
        await store.open()
        # as the command line does: the listener's service exists before recovery
        broker = Broker(Config(data_dir=str(tmp_path), mqtt_port=0), store)
        broker.recover()
        service = broker.mqtt.service
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            await body(broker, service)
            nursery.cancel_scope.cancel()
        await store.close()

    async def first(broker, service):
        dev = Client(service, "dev", clean=False)
        dev.subscribe(("jobs/#", 1))
        dev.drop()
        pub = Client(service, "pub")
        assert pub.publish("jobs/1", b"j1", qos=1, pid=1) == []  # not yet on disk
        assert pub.publish("cfg", b"5", qos=1, retain=True, pid=2) == []
        with trio.fail_after(5):
            while True:
                await trio.sleep(0.01)
                got = pub.output()
                if got:
                    break
        assert got == [m.PacketId(m.PUBACK, 1), m.PacketId(m.PUBACK, 2)]

    async def second(broker, service):
        dev = Client(service, "dev", clean=False)
        assert dev.connack[0] == m.ConnAck(0, True)
        assert publishes(dev.connack[1:]) == [("jobs/1", b"j1", 1, False, False)]
        got = dev.subscribe(("cfg", 0))  # answered once the binding is on disk
        with trio.fail_after(5):
            while not got:
                await trio.sleep(0.01)
                got = dev.output()
        assert got[0] == m.SubAck(1, [0])
        assert publishes(got[1:]) == [("cfg", b"5", 0, True, False)]

    await life(first)
    await life(second)


async def test_pubacks_keep_publish_order_across_store_waits(tmp_path):
    """PUBACKs leave in PUBLISH order: one that waits for nothing (unroutable, or routed to
    a clean session's transient queue) waits behind an earlier one waiting for the fsync,
    in the same read and in later reads."""
    import trio

    from broker.broker import Broker
    from broker.config import Config
    from broker.persistence import open_store

    store = open_store("journal", str(tmp_path))
    await store.open()
    broker = Broker(Config(data_dir=str(tmp_path), mqtt_port=0), store)
    broker.recover()
    service = broker.mqtt.service
    async with trio.open_nursery() as nursery:
        dev = Client(service, "dev", clean=False)  # durable queue: its messages wait
        dev.subscribe(("d/#", 1))
        live = Client(service, "live")  # clean session: transient, nothing to wait for
        live.subscribe(("t/#", 1))
        pub = Client(service, "pub")
        assert pub.send(m.Publish("t/1", b"a", 1, False, False, 1)) == [
            m.PacketId(m.PUBACK, 1)]  # nothing written, nothing waited for
        assert pub.send(m.Publish("d/1", b"b", 1, False, False, 2),
                        m.Publish("nowhere", b"c", 1, False, False, 3),
                        m.Publish("t/2", b"d", 1, False, False, 4)) == []
        assert pub.send(m.Publish("t/3", b"e", 1, False, False, 5)) == []
        nursery.start_soon(store.run)  # the journal writes now
        got: list = []
        with trio.fail_after(5):
            while len(got) < 4:
                await trio.sleep(0.01)
                got += pub.output()
        assert got == [m.PacketId(m.PUBACK, i) for i in (2, 3, 4, 5)]
        assert pub.send(m.Publish("t/4", b"f", 1, False, False, 6)) == [
            m.PacketId(m.PUBACK, 6)]
        assert [p.payload for p in live.output() if isinstance(p, m.Publish)] == [
            b"a", b"d", b"e", b"f"]
        nursery.cancel_scope.cancel()
    await store.close()


_topics = st.sampled_from(["a", "a/b", "a/c", "b", "$x/a"])
_filters = st.sampled_from(["a", "a/+", "#", "+/b", "b", "a/#"])
_packets = st.one_of(
    st.builds(m.Publish, _topics, st.binary(max_size=8), st.integers(0, 2), st.booleans(),
              st.just(False), st.integers(1, 5)),
    st.builds(m.Subscribe, st.integers(1, 5),
              st.lists(st.tuples(_filters, st.integers(0, 2)), min_size=1, max_size=3)),
    st.builds(m.Unsubscribe, st.integers(1, 5), st.lists(_filters, min_size=1, max_size=2)),
    st.builds(m.PacketId, st.sampled_from([m.PUBACK, m.PUBREL, m.PUBREC, m.PUBCOMP]),
              st.integers(1, 70)),
    st.just(m.Bare(m.PINGREQ)),
    st.just(m.Bare(m.DISCONNECT)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), _packets, st.booleans()), max_size=40),
       st.binary(max_size=12))
def test_random_traffic_keeps_every_message_accounted(tmp_path_factory, script, garbage):
    """Three clients (persistent, clean, clean) send random packets (and one of them
    garbage at the end); nothing raises, and once all are gone every message is either in
    the persistent session's queues or settled."""
    from broker.broker import Broker
    from broker.config import Config
    from broker.persistence import MemoryStore
    from broker.queues.ops import LEAVING, Op, OpRecorder

    broker = Broker(Config(data_dir=str(tmp_path_factory.mktemp("d")), mqtt_port=0,
                           memory_limit_bytes=1 << 50), MemoryStore())
    service = broker.mqtt.service
    clients = [Client(service, "p0", clean=False), Client(service, "c1"), Client(service, "c2")]
    recorders: dict = {}
    for who, packet, reconnect in script:
        c = clients[who]
        if c.session.finished:
            if not reconnect:
                continue
            c.drop()
            c = clients[who] = Client(service, ["p0", "c1", "c2"][who], clean=who != 0)
        c.send(packet)
        for q in broker.vhosts["/"].queues.values():
            if q not in recorders:
                recorders[q] = OpRecorder()
                q.observers.append(recorders[q])
            assert q.unacked_count >= 0
    clients[2].session.data_received(garbage)
    for c in clients:
        c.drop()
    live = broker.vhosts["/"].queues
    assert set(live) <= set(queue_names("p0"))
    for q in live.values():
        assert q.unacked_count == 0 and not q.consumers
    for q, rec in recorders.items():
        entered = {seq for op, seq in rec.ops if op is Op.ENQUEUE}
        gone = Counter(seq for op, seq in rec.ops if op in LEAVING)
        assert all(n == 1 for n in gone.values())  # nothing leaves twice
        if live.get(q.name) is not q:  # a deleted queue: everything it took has left
            assert entered <= set(gone)
        else:
            assert len(entered - set(gone)) <= q.message_count
