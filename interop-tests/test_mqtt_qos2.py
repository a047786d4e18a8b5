"""MQTT 3.1.1 QoS 2 exactly-once (section 4.3.3), overlapping subscriptions at the highest
granted QoS (3.3.5), wills and retained messages at QoS 2: paho-mqtt, amqtt and raw packets
against a TrioMQ subprocess and, where the behaviour is plain spec, against the machine's
Mosquitto (127.0.0.1:1883; skipped when it does not listen). Plus a TrioMQ restart between
a QoS 2 PUBLISH and its PUBREL. The reference RabbitMQ here has no MQTT plugin."""
from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid

import paho.mqtt.client as paho
import pika
import pytest
from brokerproc import BrokerProc
from paho.mqtt.enums import CallbackAPIVersion

from broker.mqtt import codec as m

pytestmark = pytest.mark.timeout(120)

MOSQUITTO = ("127.0.0.1", 1883)


def _listening(addr) -> bool:
    try:
        socket.create_connection(addr, timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def triomq(tmp_path_factory, external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    proc = BrokerProc(tmp_path_factory.mktemp("mqtt-qos2") / "data", mqtt=True)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(params=["triomq", "mosquitto"])
def addr(request, external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    if request.param == "mosquitto":
        if not _listening(MOSQUITTO):
            pytest.skip("no Mosquitto on 127.0.0.1:1883")
        return MOSQUITTO
    return ("127.0.0.1", request.getfixturevalue("triomq").mqtt_port)


def uid() -> str:
    return "q2-" + uuid.uuid4().hex[:10]


class Raw:
    """A raw MQTT connection: ``send`` packets, ``expect`` the next ones (with a deadline)."""

    def __init__(self, addr, cid: str, clean: bool = True, will: m.Will | None = None):
        self.s = socket.create_connection(addr, timeout=10)
        self.reader = m.PacketReader()
        self.pending: list = []
        self.send(m.Connect(cid, clean, 60, will=will))
        [ack] = self.expect(1)
        assert isinstance(ack, m.ConnAck) and ack.return_code == m.ACCEPTED, ack
        self.session_present = ack.session_present

    def send(self, *packets) -> None:
        self.s.sendall(b"".join(m.encode(p) for p in packets))

    def expect(self, n: int, within: float = 15.0) -> list:
        deadline = time.monotonic() + within
        while len(self.pending) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"waited for {n} packets, got {self.pending}")
            self.s.settimeout(left)
            try:
                data = self.s.recv(65536)
            except TimeoutError:
                continue
            if not data:
                raise AssertionError(f"closed; got {self.pending}")
            self.pending += self.reader.feed(data)
        got, self.pending = self.pending[:n], self.pending[n:]
        return got

    def until(self, predicate, within: float = 15.0) -> list:
        """Packets up to and including the first that ``predicate`` accepts."""
        out: list = []
        while True:
            [p] = self.expect(1, within)
            out.append(p)
            if predicate(p):
                return out

    def subscribe(self, *topics, pid: int = 1) -> list[int]:
        self.send(m.Subscribe(pid, list(topics)))
        [ack] = self.expect(1)
        assert isinstance(ack, m.SubAck), ack
        return ack.return_codes

    def publish2(self, topic: str, payload: bytes, pid: int) -> None:
        """A whole QoS 2 publish flow from the client side."""
        self.send(m.Publish(topic, payload, 2, False, False, pid))
        assert self.expect(1) == [m.PacketId(m.PUBREC, pid)]
        self.send(m.PacketId(m.PUBREL, pid))
        assert self.expect(1) == [m.PacketId(m.PUBCOMP, pid)]

    def close(self) -> None:
        self.s.close()


def publishes(packets) -> list:
    return [(p.topic, p.payload, p.qos) for p in packets if isinstance(p, m.Publish)]


def is_marker(p) -> bool:
    return isinstance(p, m.Publish) and p.payload == b"marker"


def settle(raw: Raw, packets) -> None:
    """Finish the deliveries among ``packets`` as a client does (PUBACK / PUBREC+PUBCOMP)."""
    for p in packets:
        if isinstance(p, m.Publish) and p.qos == 1:
            raw.send(m.PacketId(m.PUBACK, p.packet_id))
        elif isinstance(p, m.Publish) and p.qos == 2:
            raw.send(m.PacketId(m.PUBREC, p.packet_id))
            assert raw.expect(1) == [m.PacketId(m.PUBREL, p.packet_id)]
            raw.send(m.PacketId(m.PUBCOMP, p.packet_id))


class Paho:
    def __init__(self, addr, client_id=None, clean=True):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id or uid(),
                             clean_session=clean, protocol=paho.MQTTv311)
        self.got: list = []
        self.connected = threading.Event()
        self.c.on_message = lambda c, u, msg: self.got.append((msg.topic, msg.payload, msg.qos))
        self.c.on_connect = lambda c, u, flags, rc, props: self.connected.set()
        self.c.connect(addr[0], addr[1], keepalive=30)
        self.c.loop_start()
        assert self.connected.wait(10), "no CONNACK"

    def subscribe(self, *topics) -> list[int]:
        done = threading.Event()
        granted: list[int] = []

        def on_subscribe(c, u, mid, codes, props):
            granted.extend(rc.value for rc in codes)
            done.set()
        self.c.on_subscribe = on_subscribe
        self.c.subscribe(list(topics))
        assert done.wait(10), "no SUBACK"
        return granted

    def wait_for(self, predicate, within: float = 20.0) -> list:
        deadline = time.monotonic() + within
        while not predicate(self.got) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert predicate(self.got), self.got[-5:]
        return self.got

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_paho_qos2_publish_and_subscribe(addr):
    topic = f"q2/{uid()}"
    sub = Paho(addr)
    pub = Paho(addr)
    try:
        assert sub.subscribe((topic, 2)) == [2]
        infos = [pub.c.publish(topic, b"%d" % i, qos=2) for i in range(100)]
        for info in infos:
            info.wait_for_publish(20)
            assert info.is_published()  # PUBCOMP came back
        got = sub.wait_for(lambda g: len(g) >= 100)
        # paho hands a QoS 2 message over at the PUBLISH (method A): any duplicate would
        # be seen as well; the last publish completed, so nothing more is on the way
        assert got == [(topic, b"%d" % i, 2) for i in range(100)]
    finally:
        pub.close()
        sub.close()


def test_amqtt_publish_qos2(addr):
    topic = f"q2/{uid()}"
    sub = Paho(addr)
    sub.subscribe((topic, 2))

    async def amqtt_side():
        from amqtt.client import MQTTClient
        from amqtt.mqtt.constants import QOS_2
        client = MQTTClient(client_id=uid(), config={"auto_reconnect": False})
        await client.connect(f"mqtt://{addr[0]}:{addr[1]}/")
        await client.subscribe([(topic + "/back", QOS_2)])
        await asyncio.wait_for(client.publish(topic, b"from amqtt", qos=QOS_2), 20)
        other = Paho(addr)
        other.c.publish(topic + "/back", b"to amqtt", qos=2).wait_for_publish(20)
        message = await asyncio.wait_for(client.deliver_message(), 20)
        other.close()
        await client.disconnect()
        return message.topic, bytes(message.data), message.qos

    try:
        assert asyncio.run(amqtt_side()) == (topic + "/back", b"to amqtt", 2)
        assert sub.wait_for(lambda g: len(g) >= 1) == [(topic, b"from amqtt", 2)]
    finally:
        sub.close()


def test_duplicate_publish_before_pubrel_is_not_delivered_again(addr):
    topic = f"q2/{uid()}"
    sub = Raw(addr, uid())
    assert sub.subscribe((topic, 2)) == [2]
    pub = Raw(addr, uid())
    try:
        pub.send(m.Publish(topic, b"one", 2, False, False, 1))
        assert pub.expect(1) == [m.PacketId(m.PUBREC, 1)]
        # the PUBREC "was lost": the client sends the PUBLISH again, DUP set
        pub.send(m.Publish(topic, b"one", 2, False, True, 1))
        assert pub.expect(1) == [m.PacketId(m.PUBREC, 1)]
        pub.send(m.PacketId(m.PUBREL, 1))
        assert pub.expect(1) == [m.PacketId(m.PUBCOMP, 1)]
        pub.send(m.PacketId(m.PUBREL, 1))  # a PUBREL again is still answered
        assert pub.expect(1) == [m.PacketId(m.PUBCOMP, 1)]
        # released: the same packet id carries a new message
        pub.publish2(topic, b"two", 1)
        pub.publish2(topic, b"marker", 2)
        got = sub.until(is_marker)
        assert [p[1] for p in publishes(got)] == [b"one", b"two", b"marker"]
        assert {p[2] for p in publishes(got)} == {2}
    finally:
        pub.close()
        sub.close()


def test_persistent_subscriber_resumes_mid_flow(addr):
    """PUBREC sent, connection lost before PUBCOMP: the reconnect gets PUBREL (not the
    PUBLISH again); PUBLISH without PUBREC: sent again with DUP and the same packet id."""
    topic, cid = f"q2/{uid()}", uid()
    sub = Raw(addr, cid, clean=False)
    sub.subscribe((topic, 2))
    pub = Raw(addr, uid())
    try:
        pub.publish2(topic, b"a", 1)
        pub.publish2(topic, b"b", 2)
        a, b = sub.expect(2)
        assert publishes([a, b]) == [(topic, b"a", 2), (topic, b"b", 2)]
        sub.send(m.PacketId(m.PUBREC, a.packet_id))
        assert sub.expect(1) == [m.PacketId(m.PUBREL, a.packet_id)]
        sub.close()
        sub = Raw(addr, cid, clean=False)
        assert sub.session_present
        again = sub.expect(2)
        assert m.PacketId(m.PUBREL, a.packet_id) in again
        [resent] = [p for p in again if isinstance(p, m.Publish)]
        assert (resent.payload, resent.qos, resent.dup, resent.packet_id) == (
            b"b", 2, True, b.packet_id)
        sub.send(m.PacketId(m.PUBCOMP, a.packet_id))
        settle(sub, [resent])
        pub.publish2(topic, b"marker", 3)
        got = sub.until(is_marker)
        assert publishes(got) == [(topic, b"marker", 2)]  # nothing delivered twice
        settle(sub, got)
    finally:
        pub.close()
        sub.close()
        Raw(addr, cid, clean=True).close()  # drop the stored session


def test_paho_persistent_session_gets_qos2_messages_once(addr):
    topic, cid = f"q2/{uid()}", uid()
    sub = Paho(addr, cid, clean=False)
    sub.subscribe((topic, 2))
    sub.close()
    pub = Paho(addr)
    try:
        for i in range(50):
            pub.c.publish(topic, b"%d" % i, qos=2).wait_for_publish(20)
        sub = Paho(addr, cid, clean=False)
        got = sub.wait_for(lambda g: len(g) >= 50)
        pub.c.publish(topic, b"marker", qos=2).wait_for_publish(20)
        got = sub.wait_for(lambda g: g and g[-1][1] == b"marker")
        assert got == [(topic, b"%d" % i, 2) for i in range(50)] + [(topic, b"marker", 2)]
        sub.close()
    finally:
        pub.close()
        Raw(addr, cid, clean=True).close()


def test_overlapping_subscriptions_deliver_once_at_the_highest_qos(addr):
    base = f"q2/{uid()}"
    sub = Raw(addr, uid())
    assert sub.subscribe((f"{base}/#", 0), (f"{base}/a", 2), (f"{base}/+", 1)) == [0, 2, 1]
    pub = Raw(addr, uid())
    try:
        pub.publish2(f"{base}/a", b"x", 1)  # matches all three: QoS 2, once
        pub.send(m.Publish(f"{base}/b", b"y", 1, False, False, 2))  # '#' and '+': QoS 1
        assert pub.expect(1) == [m.PacketId(m.PUBACK, 2)]
        pub.publish2(f"{base}/b/c", b"marker", 3)  # '#' only: QoS 0
        got = sub.until(is_marker)
        assert publishes(got) == [(f"{base}/a", b"x", 2), (f"{base}/b", b"y", 1),
                                  (f"{base}/b/c", b"marker", 0)]
    finally:
        pub.close()
        sub.close()


def test_will_and_retained_at_qos2(addr):
    topic = f"q2/{uid()}/status"
    watcher = Raw(addr, uid())
    watcher.subscribe((topic, 2))
    dev = Raw(addr, uid(), will=m.Will(topic, b"gone", 2, True))
    dev.s.shutdown(socket.SHUT_RDWR)  # an abnormal end: the will is published
    dev.close()
    try:
        [will] = watcher.expect(1)
        assert (will.topic, will.payload, will.qos) == (topic, b"gone", 2)
        settle(watcher, [will])
        late = Raw(addr, uid())
        late.send(m.Subscribe(1, [(topic, 2)]))
        ack, retained = late.expect(2)
        assert ack == m.SubAck(1, [2])
        assert (retained.payload, retained.qos, retained.retain) == (b"gone", 2, True)
        settle(late, [retained])
        late.close()
    finally:
        cleaner = Raw(addr, uid())
        cleaner.send(m.Publish(topic, b"", 0, True, False, None))  # clear the retained one
        cleaner.publish2(topic + "/x", b"", 1)  # behind it: the clear is processed
        cleaner.close()
        watcher.close()


@pytest.fixture(params=["journal", "postgresql", "mysql"])
def store_url(request):
    """The store backends: the journal, and the SQL store on the machine's PostgreSQL and
    MariaDB (a database of its own, dropped afterwards; skipped when not reachable)."""
    if request.param == "journal":
        yield None
        return
    db = "triomq_q2_" + uuid.uuid4().hex[:12]
    if request.param == "postgresql":
        if not _listening(("127.0.0.1", 5432)):
            pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
        import psycopg
        admin = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{db}"')
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{db}"
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        return
    if not _listening(("127.0.0.1", 3306)):
        pytest.skip("MariaDB is not reachable on 127.0.0.1:3306")
    import pymysql
    c = pymysql.connect(host="127.0.0.1", port=3306, user="root")
    with c.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}`")
    yield f"mysql+pymysql://root@127.0.0.1:3306/{db}"
    with c.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
    c.close()


@pytest.mark.timeout(240)
def test_restart_between_publish_and_pubrel(tmp_path, external_broker, store_url):
    """TrioMQ is killed after a persistent session's QoS 2 PUBREC and a subscriber's PUBREC:
    after the restart the duplicate PUBLISH is not routed again, the subscriber gets PUBREL
    (every store backend: the state goes through the store's metadata seam)."""
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    proc = BrokerProc(tmp_path / "data", store_url, mqtt=True)
    proc.start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port))
        ch = conn.channel()
        ch.queue_declare("counted", durable=True)
        ch.queue_bind("counted", "amq.topic", "r.t")
        conn.close()
        addr = ("127.0.0.1", proc.mqtt_port)
        sub = Raw(addr, "sub-r", clean=False)
        sub.subscribe(("r/t", 2))
        pub = Raw(addr, "pub-r", clean=False)
        pub.send(m.Publish("r/t", b"once", 2, False, False, 7))
        assert pub.expect(1) == [m.PacketId(m.PUBREC, 7)]  # written before it was sent
        [d] = sub.expect(1)
        sub.send(m.PacketId(m.PUBREC, d.packet_id))
        assert sub.expect(1) == [m.PacketId(m.PUBREL, d.packet_id)]
        pub.publish2("r/t", b"unreceived", 8)  # delivered, but no PUBREC before the kill
        [u] = sub.expect(1)
        assert u.payload == b"unreceived"
        proc.stop(hard=True)
        pub.close()
        sub.close()
        proc.start()
        addr = ("127.0.0.1", proc.mqtt_port)
        sub = Raw(addr, "sub-r", clean=False)
        assert sub.session_present
        pubrel, again = sub.expect(2)
        assert pubrel == m.PacketId(m.PUBREL, d.packet_id)
        # sent again with its packet id (section 4.4), not as a new message
        assert (again.payload, again.qos, again.packet_id) == (b"unreceived", 2, u.packet_id)
        sub.send(m.PacketId(m.PUBCOMP, d.packet_id))
        settle(sub, [again])
        pub = Raw(addr, "pub-r", clean=False)
        assert pub.session_present
        pub.send(m.Publish("r/t", b"once", 2, False, True, 7))
        assert pub.expect(1) == [m.PacketId(m.PUBREC, 7)]
        pub.send(m.PacketId(m.PUBREL, 7))
        assert pub.expect(1) == [m.PacketId(m.PUBCOMP, 7)]
        pub.publish2("r/t", b"marker", 7)
        got = sub.until(is_marker)
        assert publishes(got) == [("r/t", b"marker", 2)]
        settle(sub, got)
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", proc.port))
        bodies = []
        for _ in range(4):
            _, _, body = conn.channel().basic_get("counted", auto_ack=True)
            bodies.append(body)
        assert bodies == [b"once", b"unreceived", b"marker", None]
        conn.close()
        pub.close()
        sub.close()
    except AssertionError as exc:  # the broker's side of it, for a failure under load
        raise AssertionError(f"{exc}\n--- broker log (last 5000 chars) ---\n{proc.log()}") from exc
    finally:
        proc.stop()
