"""MQTT topic rules with paho-mqtt: wildcards at the first level never match '$' topics
(MQTT-4.7.2-1), and a topic means exactly itself ('*' and '.' inside a level are not AMQP
pattern characters). Checked against TrioMQ and, for the MQTT-only rules, the machine's
Mosquitto; the AMQP side (pika on amq.topic) against TrioMQ."""
from __future__ import annotations

import socket
import threading
import time
import uuid

import paho.mqtt.client as paho
import pika
import pytest
from brokerproc import BrokerProc
from paho.mqtt.enums import CallbackAPIVersion

pytestmark = pytest.mark.timeout(120)

MOSQUITTO = ("127.0.0.1", 1883)


@pytest.fixture(scope="module")
def triomq(tmp_path_factory, external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    proc = BrokerProc(tmp_path_factory.mktemp("mqtt-topics") / "data", mqtt=True)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(params=["triomq", "mosquitto"])
def addr(request):
    if request.param == "mosquitto":
        try:
            socket.create_connection(MOSQUITTO, timeout=1).close()
        except OSError:
            pytest.skip("no Mosquitto on 127.0.0.1:1883")
        return MOSQUITTO
    return "127.0.0.1", request.getfixturevalue("triomq").mqtt_port


class Client:
    def __init__(self, addr):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id="tp-" + uuid.uuid4().hex[:8])
        self.got: list = []
        self.c.on_message = lambda c, u, msg: self.got.append((msg.topic, msg.payload))
        ready = threading.Event()
        self.c.on_connect = lambda *a: ready.set()
        self.c.connect(*addr, keepalive=30)
        self.c.loop_start()
        assert ready.wait(10), "no CONNACK"

    def subscribe(self, *filters):
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe([(f, 1) for f in filters])
        assert done.wait(10), "no SUBACK"

    def publish(self, topic, payload):
        info = self.c.publish(topic, payload, qos=1)
        info.wait_for_publish(10)
        assert info.is_published()

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


def settle(clients, marker_topic, within=10.0):
    """Publish a marker every client subscribed to and wait until all have it: what was
    published before it has arrived (or never will)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(any(t == marker_topic for t, _ in c.got) for c in clients):
            return
        time.sleep(0.02)
    raise AssertionError("the marker did not arrive")


def test_leading_wildcards_do_not_match_dollar_topics(addr):
    base = "tp" + uuid.uuid4().hex[:6]
    sub_plus, sub_hash, sub_dollar, pub = Client(addr), Client(addr), Client(addr), Client(addr)
    try:
        sub_plus.subscribe("+/+", f"{base}/m")
        sub_hash.subscribe("#")
        sub_dollar.subscribe(f"${base}/+", f"{base}/m")
        pub.publish(f"${base}/B", b"dollar")
        pub.publish(f"{base}/B", b"plain")
        pub.publish(f"{base}/m", b"marker")
        settle([sub_plus, sub_hash, sub_dollar], f"{base}/m")
        mine = lambda c: [(t, p) for t, p in c.got if base in t]
        assert (f"${base}/B", b"dollar") not in mine(sub_plus)
        assert (f"${base}/B", b"dollar") not in mine(sub_hash)
        assert (f"{base}/B", b"plain") in mine(sub_plus) and (f"{base}/B", b"plain") in mine(sub_hash)
        assert mine(sub_dollar) == [(f"${base}/B", b"dollar"), (f"{base}/m", b"marker")]
    finally:
        for c in (sub_plus, sub_hash, sub_dollar, pub):
            c.close()


def test_star_and_dot_inside_a_level_mean_themselves(addr):
    base = "tp" + uuid.uuid4().hex[:6]
    star, plus, dotted, levels, pub = (Client(addr) for _ in range(5))
    try:
        star.subscribe(f"{base}/*", f"{base}/m")
        plus.subscribe(f"{base}/+", f"{base}/m")
        dotted.subscribe(f"{base}/a.b", f"{base}/m")
        levels.subscribe(f"{base}/a/b", f"{base}/m")
        pub.publish(f"{base}/x", b"x")
        pub.publish(f"{base}/*", b"star")
        pub.publish(f"{base}/a.b", b"dot")
        pub.publish(f"{base}/m", b"marker")
        clients = [star, plus, dotted, levels]
        settle(clients, f"{base}/m")
        assert star.got == [(f"{base}/*", b"star"), (f"{base}/m", b"marker")]
        assert sorted(plus.got) == sorted([(f"{base}/x", b"x"), (f"{base}/*", b"star"),
                                           (f"{base}/a.b", b"dot"), (f"{base}/m", b"marker")])
        assert dotted.got == [(f"{base}/a.b", b"dot"), (f"{base}/m", b"marker")]
        assert levels.got == [(f"{base}/m", b"marker")]
    finally:
        for c in (star, plus, dotted, levels, pub):
            c.close()


def test_amqp_side_of_the_mapping(triomq):
    """An AMQP '#' binding keeps AMQP's meaning ('$' keys included); an MQTT topic with '.'
    in a level reaches AMQP as one escaped word; AMQP keys reach MQTT with '.' as '/'."""
    base = "tp" + uuid.uuid4().hex[:6]
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", triomq.port))
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "amq.topic", "#")
        sub, pub = Client(("127.0.0.1", triomq.mqtt_port)), Client(("127.0.0.1", triomq.mqtt_port))
        try:
            sub.subscribe(f"{base}/+/c")
            pub.publish(f"${base}/x", b"dollar")
            pub.publish(f"{base}/a.b", b"dot")
            ch.basic_publish("amq.topic", f"{base}.amqp.c", b"from amqp")
            deadline = time.monotonic() + 10
            keys: list = []
            while len(keys) < 3 and time.monotonic() < deadline:
                method, _props, _body = ch.basic_get(q, auto_ack=True)
                if method is None:
                    time.sleep(0.02)
                    continue
                keys.append(method.routing_key)
            assert sorted(keys) == sorted([f"${base}.x", f"{base}.a%2Eb", f"{base}.amqp.c"])
            deadline = time.monotonic() + 10
            while not sub.got and time.monotonic() < deadline:
                time.sleep(0.02)
            assert sub.got == [(f"{base}/amqp/c", b"from amqp")]
        finally:
            sub.close()
            pub.close()
    finally:
        conn.close()
