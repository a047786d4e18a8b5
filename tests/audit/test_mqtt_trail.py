"""MQTT publishes in the audit trail and through the publish hooks, as AMQP ones: a real
broker process, real paho clients, the Avro files read back."""
from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import fastavro
import httpx
import paho.mqtt.client as mqtt
import pytest

from broker.audit.reader import FileReader
from broker.audit.writer import node_files

ROOT = __file__.rsplit("/tests/", 1)[0]
ORDER = {"type": "record", "name": "Order", "namespace": "shop",
         "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}]}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(p, port: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)


class Broker:
    def __init__(self, base, *args: str) -> None:
        self.base = base
        self.port, self.mqtt_port, self.http_port = _port(), _port(), _port()
        self.log = open(base / "broker.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1",
             "--port", str(self.port), "--mqtt-port", str(self.mqtt_port),
             "--http-port", str(self.http_port), "--data-dir", str(base / "data"),
             "--store", "memory", "--audit-dir", str(base / "trail"), "--audit-node", "mq",
             *args], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        _wait_port(self.proc, self.mqtt_port)
        _wait_port(self.proc, self.http_port)

    def stop(self) -> list[dict]:
        """Stop cleanly (the converter finishes); the trail's records in sequence order."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(60) == 0
        self.log.close()
        records = [r for f in node_files(str(self.base / "trail"), "mq") for r in FileReader(f)]
        return sorted(records, key=lambda r: r["seq"])


class Client:
    """A paho client whose received messages and disconnects are recorded."""

    def __init__(self, port: int, client_id: str) -> None:
        self.received: list = []
        self.disconnected = threading.Event()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        c = self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
        c.on_connect = lambda *a: self.connected.set()
        c.on_subscribe = lambda *a: self.subscribed.set()
        c.on_message = lambda _c, _u, m: self.received.append((m.topic, m.payload, m.qos))
        c.on_disconnect = lambda *a: self.disconnected.set()
        c.connect("127.0.0.1", port, keepalive=30)
        c.loop_start()
        assert self.connected.wait(10)
        host, port = c.socket().getsockname()[:2]
        self.local = f"{host}:{port}"

    def subscribe(self, topic: str, qos: int) -> None:
        self.c.subscribe(topic, qos)
        assert self.subscribed.wait(10)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def hermes_topic(http: httpx.Client, name: str, content_type: str, **extra) -> None:
    """A Hermes topic ``name`` with one suspended subscription ``s`` (its queue keeps what
    is published)."""
    r = http.post("/topics", json={"name": name, "description": "d", "contentType": content_type,
                                   "owner": {"source": "Plaintext", "id": "team"}, **extra})
    assert r.status_code == 201, r.text
    r = http.post(f"/topics/{name}/subscriptions",
                  json={"name": "s", "topicName": name, "state": "SUSPENDED",
                        "endpoint": "http://127.0.0.1:9/x"})
    assert r.status_code == 201, r.text


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_mqtt_publish_deliver_ack_in_the_trail(tmp_path):
    b = Broker(tmp_path)
    try:
        sub = Client(b.mqtt_port, "sub-1")
        sub.subscribe("sensors/#", 1)
        pub = Client(b.mqtt_port, "pub-1")
        info = pub.c.publish("sensors/room1/temp", b"21.5", qos=1)
        info.wait_for_publish(10)
        pub.c.publish("sensors/room2/temp", b"19", qos=0)
        pub.c.publish("nobody/listens", b"x", qos=1).wait_for_publish(10)
        _wait(lambda: len(sub.received) == 2)
        time.sleep(0.2)  # the subscriber's PUBACK
        pub.close()
        sub.close()
    finally:
        records = b.stop()
    pubs = [r for r in records if r["event"] == "published"]
    common = {"vhost": "/", "exchange": "amq.topic", "user": "guest", "connection": pub.local,
              "channel": None}
    assert [{k: r[k] for k in common} for r in pubs] == [common] * 3
    queue = "mqtt-subscription-sub-1qos1"
    assert [(r["routing_key"], r["body_size"], r["persistent"], r["outcome"], r["queues"],
             r["confirm_seq"]) for r in pubs] == [
        ("sensors.room1.temp", 4, True, "routed", [queue], info.mid),
        ("sensors.room2.temp", 2, False, "routed", [queue], None),
        ("nobody.listens", 1, True, "unroutable", [], pubs[2]["confirm_seq"])]
    assert pubs[2]["confirm_seq"] > 0
    qos1, qos0 = pubs[0]["msg"], pubs[1]["msg"]
    delivered = [r for r in records if r["event"] == "delivered"]
    assert [(r["queue"], r["msg"], r["consumer_tag"], r["connection"], r["redelivered"])
            for r in delivered] == [(queue, qos1, "mqtt-sub-1-qos1", sub.local, False),
                                    (queue, qos0, "mqtt-sub-1-qos1", sub.local, False)]
    assert delivered[0]["delivery_tag"] > 0 and delivered[1]["delivery_tag"] is None
    # the QoS 1 delivery is acked by the client's PUBACK, the QoS 0 one settled as written
    acked = [r for r in records if r["event"] == "acked"]
    assert [(r["queue"], r["msg"], r["delivery_tag"]) for r in acked] == [
        (queue, qos1, delivered[0]["delivery_tag"])]
    settled = [r for r in records if r["event"] == "settled"]
    assert [(r["queue"], r["msg"]) for r in settled] == [(queue, qos0)]


def _avro(record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(ORDER), record)
    return out.getvalue()


@pytest.mark.timeout(120)
def test_mqtt_publishes_pass_the_publish_hooks(tmp_path):
    """Hermes' hook checks publishes into an Avro topic's exchange: MQTT ones too (the
    MQTT exchange set to the topic's)."""
    b = Broker(tmp_path, "--mqtt-exchange", "shop.avro")
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{b.http_port}",
                            auth=("guest", "guest"))
        hermes_topic(http, "shop.avro", "AVRO", schema=json.dumps(ORDER))
        pub = Client(b.mqtt_port, "dev-1")
        pub.c.publish("orders/eu", _avro({"id": "o1", "qty": 2}), qos=1).wait_for_publish(10)
        # not the topic's schema: the hook refuses it, the broker closes the connection
        pub.c.publish("orders/eu", b"not avro at all", qos=1)
        assert pub.disconnected.wait(10)
        pub.c.loop_stop()
        q = http.get("/api/queues/%2F/shop.avro.s").json()
        assert q["messages"] == 1
    finally:
        records = b.stop()
    pubs = [r for r in records if r["event"] == "published"]
    assert [(r["exchange"], r["routing_key"], r["outcome"], r["queues"]) for r in pubs] == [
        ("shop.avro", "orders.eu", "routed", ["shop.avro.s"])]
