"""$SYS topics (Mosquitto's names, published retained on an interval) against a TrioMQ
subprocess with paho, and compared with the Mosquitto on 127.0.0.1:1883 where one listens:
the same topic names and formats, and neither hands $SYS to '#' or '+/...' subscribers
(MQTT-4.7.2-1). TrioMQ only otherwise: the RabbitMQ here has no MQTT plugin."""
from __future__ import annotations

import re
import socket
import threading
import time
import uuid

import paho.mqtt.client as paho
import pytest
from brokerproc import BrokerProc
from paho.mqtt.enums import CallbackAPIVersion

pytestmark = pytest.mark.timeout(120)

MOSQUITTO = ("127.0.0.1", 1883)
INTERVAL = "0.5"  # seconds between rounds here (Mosquitto's default is 10)
# names a monitoring tool reads, as Mosquitto 2.0 publishes them
CORE = ["version", "uptime", "clients/connected", "clients/total",
        "messages/received", "messages/sent", "bytes/received", "bytes/sent",
        "subscriptions/count", "retained messages/count", "load/messages/received/1min",
        "load/bytes/sent/5min", "load/connections/15min"]


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    yield
    while _open_clients:
        _open_clients.pop().close()


_open_clients: list = []


def _start(path, interval):
    return BrokerProc(path, store="memory", mqtt=True,
                      extra=["--mqtt-sys-interval", interval]).start()


@pytest.fixture(scope="module")
def mq(tmp_path_factory, external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    proc = _start(tmp_path_factory.mktemp("mqttsys") / "data", INTERVAL)
    yield proc
    proc.stop()


def mosquitto_listening() -> bool:
    try:
        socket.create_connection(MOSQUITTO, timeout=1).close()
        return True
    except OSError:
        return False


def uid() -> str:
    return "s-" + uuid.uuid4().hex[:10]


class Paho:
    """A paho client on its own thread; ``got``: (topic, payload, retain) in arrival order;
    ``latest``: each topic's last payload (text)."""

    def __init__(self, port, host="127.0.0.1"):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=uid())
        self.got: list = []
        self.latest: dict[str, str] = {}
        self.lock = threading.RLock()
        connected = threading.Event()

        def on_message(c, u, msg):
            with self.lock:
                self.got.append((msg.topic, msg.payload, msg.retain))
                self.latest[msg.topic] = msg.payload.decode("utf-8", "replace")
        self.c.on_message = on_message
        self.c.on_connect = lambda *a: connected.set()
        self.c.connect(host, port, keepalive=30)
        self.c.loop_start()
        _open_clients.append(self)
        assert connected.wait(20), "no CONNACK"

    def subscribe(self, *filters):
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe([(f, 0) for f in filters])
        assert done.wait(20), "no SUBACK"

    def publish(self, topic, payload, qos=1):
        info = self.c.publish(topic, payload, qos=qos)
        if qos:
            info.wait_for_publish(20)

    def until(self, cond, within=30.0, what="condition"):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self.lock:
                if cond():
                    return
            time.sleep(0.02)
        raise AssertionError(f"not within {within}s: {what}; latest: {self.latest}")

    def value(self, name: str) -> str | None:
        with self.lock:
            return self.latest.get("$SYS/broker/" + name)

    def number(self, name: str) -> float:
        v = self.value(name)
        return float(v.split()[0]) if v is not None else -1.0

    def close(self):
        if self in _open_clients:
            _open_clients.remove(self)
        self.c.disconnect()
        self.c.loop_stop()


def test_values_follow_clients_subscriptions_and_publishes(mq):
    mon = Paho(mq.mqtt_port)
    mon.subscribe("$SYS/broker/#")
    mon.until(lambda: all(mon.value(n) is not None for n in CORE), what="every core topic")
    assert re.fullmatch(r"TrioMQ version \S+", mon.value("version"))
    assert re.fullmatch(r"\d+ seconds", mon.value("uptime"))
    first_uptime = mon.number("uptime")
    connected = mon.number("clients/connected")
    assert connected >= 1  # the monitor itself
    subs = mon.number("subscriptions/count")
    others = [Paho(mq.mqtt_port) for _ in range(3)]
    mon.until(lambda: mon.number("clients/connected") == connected + 3, what="3 more clients")
    assert mon.number("clients/maximum") >= connected + 3
    assert mon.number("clients/total") >= connected + 3
    others[0].subscribe(f"{uid()}/a", f"{uid()}/b/#", f"{uid()}/+/c")
    mon.until(lambda: mon.number("subscriptions/count") == subs + 3, what="3 subscriptions")
    received, bytes_in = mon.number("messages/received"), mon.number("bytes/received")
    payload_in = mon.number("publish/bytes/received")
    for _ in range(50):
        others[1].publish(f"{uid()}/nobody", b"p" * 100, qos=1)
    mon.until(lambda: mon.number("messages/received") >= received + 50, what="50 received")
    mon.until(lambda: mon.number("bytes/received") >= bytes_in + 50 * 100)
    mon.until(lambda: mon.number("publish/bytes/received") == payload_in + 50 * 100)
    mon.until(lambda: mon.number("load/messages/received/1min") > 0, what="a load average")
    for c in others:
        c.close()
    mon.until(lambda: mon.number("clients/connected") == connected, what="the 3 gone")
    mon.until(lambda: mon.number("uptime") > first_uptime, what="uptime moving")


def test_retained_for_late_subscribers_and_messages_sent_counted(mq):
    """A subscriber arriving between rounds gets every value at once, retained; what the
    broker delivers counts in messages/sent."""
    mon = Paho(mq.mqtt_port)
    mon.subscribe("$SYS/broker/version", "$SYS/broker/messages/sent")
    mon.until(lambda: len(mon.got) >= 2, what="two retained values")
    assert all(retain for _, _, retain in mon.got[:2])
    sent = mon.number("messages/sent")
    t = uid()
    sub, pub = Paho(mq.mqtt_port), Paho(mq.mqtt_port)
    sub.subscribe(t)
    for _ in range(10):
        pub.publish(t, b"x")
    sub.until(lambda: len(sub.got) == 10)
    mon.until(lambda: mon.number("messages/sent") >= sent + 10, what="10 more sent")


@pytest.mark.parametrize("broker", ["triomq", "mosquitto"])
def test_wildcard_filters_get_no_sys(mq, broker):
    """'#', '+/broker/#' and '+/+/+' subscribers get neither the retained $SYS values (they
    would arrive before the marker published after the SUBACK) nor the live ones."""
    if broker == "mosquitto" and not mosquitto_listening():
        pytest.skip("no Mosquitto on 127.0.0.1:1883")
    host, port = MOSQUITTO if broker == "mosquitto" else ("127.0.0.1", mq.mqtt_port)
    t = uid()
    wild = Paho(port, host)
    wild.subscribe("#", "+/broker/#", "+/+/+")
    sys_sub = Paho(port, host)
    sys_sub.subscribe("$SYS/broker/uptime", "$SYS/broker/version")
    Paho(port, host).publish(f"{t}/marker", b"after the SUBACK")
    wild.until(lambda: any(tp == f"{t}/marker" for tp, _, _ in wild.got), what="the marker")
    if broker == "triomq":  # two more rounds (Mosquitto's interval is 10 s: not waited for)
        n = len(sys_sub.got)
        sys_sub.until(lambda: len(sys_sub.got) >= n + 2, what="two $SYS rounds")
        Paho(port, host).publish(f"{t}/marker2", b"")
        wild.until(lambda: any(tp == f"{t}/marker2" for tp, _, _ in wild.got))
    sys_sub.until(lambda: sys_sub.value("version") is not None, what="$SYS on a $SYS filter")
    with wild.lock:
        leaked = [tp for tp, _, _ in wild.got if tp.startswith("$")]
    assert leaked == []


def test_topic_names_and_formats_are_mosquittos(mq):
    if not mosquitto_listening():
        pytest.skip("no Mosquitto on 127.0.0.1:1883")
    ours, theirs = Paho(mq.mqtt_port), Paho(*reversed(MOSQUITTO))
    for c in (ours, theirs):
        c.subscribe("$SYS/#")
    for c, name in ((ours, "TrioMQ"), (theirs, "Mosquitto")):
        c.until(lambda c=c: all(c.value(n) is not None for n in CORE), within=40,
                what=f"{name}'s core topics")
    for c in (ours, theirs):
        assert re.fullmatch(r"\S+ version \S+", c.value("version"))
        assert re.fullmatch(r"\d+ seconds", c.value("uptime"))
        for n in CORE[2:]:
            assert re.fullmatch(r"\d+(\.\d\d)?", c.value(n)), (n, c.value(n))
            assert ("." in c.value(n)) == n.startswith("load/"), n
    with ours.lock, theirs.lock:
        names = {t for t in ours.latest if t.startswith("$SYS/broker/")}
        mosquitto_names = {t for t in theirs.latest if t.startswith("$SYS/broker/")}
    # every name published here is one Mosquitto publishes (given its options and uptime)
    unknown = {n for n in names - mosquitto_names
               if not re.search(r"/(disconnected|inactive|expired|dropped|maximum|15min)$", n)
               and not n.startswith("$SYS/broker/publish/")}
    assert unknown == set()


def test_interval_zero_publishes_nothing(tmp_path):
    proc = _start(tmp_path / "data", "0")
    try:
        c = Paho(proc.mqtt_port)
        t = uid()
        c.subscribe("$SYS/#", t)
        Paho(proc.mqtt_port).publish(t, b"marker")
        c.until(lambda: any(tp == t for tp, _, _ in c.got))
        assert [tp for tp, _, _ in c.got] == [t]
    finally:
        while _open_clients:
            _open_clients.pop().close()
        proc.stop()


@pytest.mark.parametrize("broker", ["triomq", "mosquitto"])
def test_clients_cannot_publish_into_sys(mq, broker):
    """A client's PUBLISH to a $SYS topic is acknowledged and dropped (not delivered, not
    retained), as Mosquitto does: nobody can fake the broker's status."""
    if broker == "mosquitto" and not mosquitto_listening():
        pytest.skip("no Mosquitto on 127.0.0.1:1883")
    host, port = MOSQUITTO if broker == "mosquitto" else ("127.0.0.1", mq.mqtt_port)
    t = uid()
    watcher = Paho(port, host)
    watcher.subscribe(f"$SYS/{t}/#", t)
    spoofer = Paho(port, host)
    topics = [f"$SYS/{t}/x"]
    if broker == "triomq":  # (not on the shared Mosquitto's real topics)
        topics.append("$SYS/broker/version")
    for topic in topics:
        spoofer.publish(topic, b"spoofed", qos=1)  # acknowledged (waits for the PUBACK)
        spoofer.c.publish(topic, b"spoofed", qos=0, retain=True)
    spoofer.publish(t, b"marker")
    watcher.until(lambda: any(tp == t for tp, _, _ in watcher.got), what="the marker")
    assert [tp for tp, _, _ in watcher.got] == [t]
    late = Paho(port, host)
    late.subscribe(f"$SYS/{t}/#", "$SYS/broker/version", t)
    spoofer.publish(t, b"marker 2")
    late.until(lambda: any(tp == t for tp, _, _ in late.got), what="the second marker")
    assert b"spoofed" not in [p for _, p, _ in late.got]
