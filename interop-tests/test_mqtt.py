"""MQTT 3.1.1 / 3.1 with real clients (paho-mqtt, amqtt) against a TrioMQ subprocess, and
across protocols with pika. TrioMQ only: the RabbitMQ on this machine has no MQTT plugin."""
from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
from urllib.parse import quote

import httpx
import paho.mqtt.client as paho
import pika
import pytest
from brokerproc import BrokerProc, free_port
from paho.mqtt.enums import CallbackAPIVersion

from broker.mqtt import codec as m

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    yield
    while _open_clients:  # paho's network threads would otherwise reconnect forever
        _open_clients.pop().close()


_open_clients: list = []


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def mq(tmp_path_factory, external_broker, tls_files):
    if external_broker:
        pytest.skip("the reference RabbitMQ here has no MQTT plugin")
    cert, key = tls_files
    tls_port = free_port()
    proc = BrokerProc(tmp_path_factory.mktemp("mqtt") / "data", mqtt=True, http=True,
                      extra=["--mqtts-port", str(tls_port), "--tls-cert", str(cert),
                             "--tls-key", str(key), "--mqtt-prefetch", "50"],
                      wait_ports=[tls_port])
    proc.mqtts_port = tls_port
    proc.start()
    yield proc
    proc.stop()


class Paho:
    """A paho client on its own network thread; ``got`` collects (topic, payload, qos, retain)."""

    def __init__(self, port, client_id=None, clean=True, will=None, username=None,
                 password=None, tls_ca=None, protocol=paho.MQTTv311):
        self.c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id or uid(),
                             clean_session=clean, protocol=protocol)
        self.got: list = []
        self.connected = threading.Event()
        self.rc = None
        self.session_present = None
        self.c.on_message = lambda c, u, msg: self.got.append(
            (msg.topic, msg.payload, msg.qos, msg.retain))

        def on_connect(c, u, flags, rc, props):
            self.rc = rc
            self.session_present = flags.session_present
            self.connected.set()
        self.c.on_connect = on_connect
        if will:
            self.c.will_set(*will)
        if username is not None:
            self.c.username_pw_set(username, password)
        if tls_ca is not None:
            self.c.tls_set(ca_certs=str(tls_ca))
        self.c.connect("127.0.0.1", port, keepalive=30)
        self.c.loop_start()
        _open_clients.append(self)
        assert self.connected.wait(10), "no CONNACK"

    def subscribe(self, *topics):
        done = threading.Event()
        granted = []

        def on_subscribe(c, u, mid, codes, props):
            granted.extend(rc.value for rc in codes)
            done.set()
        self.c.on_subscribe = on_subscribe
        self.c.subscribe(list(topics))
        assert done.wait(10), "no SUBACK"
        return granted

    def publish(self, topic, payload, qos=0, retain=False, wait=True):
        info = self.c.publish(topic, payload, qos=qos, retain=retain)
        if wait and qos:
            info.wait_for_publish(10)
            assert info.is_published()
        return info

    def wait_for(self, n, within=10.0):
        deadline = time.monotonic() + within
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.got

    def close(self):
        if self in _open_clients:
            _open_clients.remove(self)
        self.c.disconnect()
        self.c.loop_stop()


def uid() -> str:
    return "t-" + uuid.uuid4().hex[:10]


def raw(port) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def read_packets(s, n=1, within=5.0) -> list:
    reader = m.PacketReader()
    got: list = []
    s.settimeout(within)
    while len(got) < n:
        data = s.recv(65536)
        if not data:
            break
        got += reader.feed(data)
    return got


def closed_by_server(s, within=5.0) -> bool:
    s.settimeout(within)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_paho_pub_sub_qos0_qos1_and_wildcards(mq):
    sub = Paho(mq.mqtt_port)
    assert sub.subscribe(("plant/+/temp", 1), ("office/#", 0), ("x/y", 2)) == [1, 0, 2]
    pub = Paho(mq.mqtt_port)
    for i in range(200):
        pub.publish("plant/p1/temp", b"%d" % i, qos=1, wait=False)
    pub.publish("office/a/b", b"zero", qos=1)  # the subscription's QoS 0 wins
    pub.publish("x/y", b"two", qos=2)  # PUBREC/PUBREL/PUBCOMP, delivered once at QoS 2
    got = sub.wait_for(202)
    assert [p for t, p, q, r in got if t == "plant/p1/temp"] == [b"%d" % i for i in range(200)]
    assert ("x/y", b"two", 2, False) in got and ("office/a/b", b"zero", 0, False) in got
    assert len(got) == 202
    pub.close()
    sub.close()


def test_mqtt_311_and_31_clients_and_amqtt(mq):
    sub = Paho(mq.mqtt_port, protocol=paho.MQTTv31)
    sub.subscribe(("amqtt/t", 1))

    async def amqtt_side():
        from amqtt.client import MQTTClient
        from amqtt.mqtt.constants import QOS_1
        client = MQTTClient(client_id=uid())
        await client.connect(f"mqtt://127.0.0.1:{mq.mqtt_port}/")
        await client.subscribe([("back/#", QOS_1)])
        await client.publish("amqtt/t", b"from amqtt", qos=QOS_1)
        Paho(mq.mqtt_port).publish("back/1", b"to amqtt", qos=1)
        message = await asyncio.wait_for(client.deliver_message(), 10)
        await client.disconnect()
        return message.topic, bytes(message.data), message.qos

    assert asyncio.run(amqtt_side()) == ("back/1", b"to amqtt", 1)
    assert sub.wait_for(1) == [("amqtt/t", b"from amqtt", 1, False)]
    sub.close()


def test_across_protocols_with_pika(mq):
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mq.port))
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "amq.topic", "devices.*.status")
    dev = Paho(mq.mqtt_port)
    dev.subscribe(("devices/+/cmd", 1))
    dev.publish("devices/d1/status", b"online", qos=1)
    method, props, body = None, None, None
    for _ in range(100):
        method, props, body = ch.basic_get(q, auto_ack=True)
        if method:
            break
        time.sleep(0.05)
    assert body == b"online" and method.routing_key == "devices.d1.status"
    assert props.delivery_mode == 2 and props.headers["x-mqtt-publish-qos"] == 1
    ch.basic_publish("amq.topic", "devices.d1.cmd", b"reboot")
    assert dev.wait_for(1) == [("devices/d1/cmd", b"reboot", 1, False)]
    dev.close()
    conn.close()


def test_retained_last_will_takeover_and_keepalive(mq):
    topic = "status/" + uid()
    pub = Paho(mq.mqtt_port)
    pub.publish(topic + "/a", b"on", qos=1, retain=True)
    late = Paho(mq.mqtt_port)
    late.subscribe((topic + "/#", 1))
    assert late.wait_for(1) == [(topic + "/a", b"on", 1, True)]
    # the will of a connection that just goes away
    s = raw(mq.mqtt_port)
    s.sendall(m.encode(m.Connect(uid(), True, 60, will=m.Will(topic + "/w", b"lost", 1, False))))
    assert read_packets(s) == [m.ConnAck(0)]
    s.close()
    # a second connection with the same client id takes over: the first is closed
    cid = uid()
    first = raw(mq.mqtt_port)
    first.sendall(m.encode(m.Connect(cid, True, 60, will=m.Will(topic + "/t", b"taken", 0, False))))
    assert read_packets(first) == [m.ConnAck(0)]
    second = raw(mq.mqtt_port)
    second.sendall(m.encode(m.Connect(cid, True, 60)))
    assert read_packets(second) == [m.ConnAck(0)]
    assert closed_by_server(first)
    # keep-alive 1 s and silence: closed after 1.5 s, will published
    quiet = raw(mq.mqtt_port)
    quiet.sendall(m.encode(m.Connect(uid(), True, 1, will=m.Will(topic + "/k", b"silent", 0, False))))
    assert read_packets(quiet) == [m.ConnAck(0)]
    assert closed_by_server(quiet, within=4)
    got = late.wait_for(4)
    assert {(t.rsplit("/", 1)[1], p) for t, p, q, r in got[1:]} == {
        ("w", b"lost"), ("t", b"taken"), ("k", b"silent")}
    second.close()
    for c in (pub, late):
        c.close()


def test_bad_input_closes_only_that_connection(mq):
    watcher = Paho(mq.mqtt_port)
    watcher.subscribe(("fine", 0))
    # wrong protocol level: CONNACK 1, then closed
    s = raw(mq.mqtt_port)
    bad = bytearray(m.encode(m.Connect(uid(), True, 60)))
    bad[8] = 7
    s.sendall(bytes(bad))
    assert read_packets(s) == [m.ConnAck(1)]
    assert closed_by_server(s)
    cases = [
        b"\x30\xff\xff\xff\x7f",  # 256 MiB announced
        b"\x82\x02\x00\x01",  # SUBSCRIBE before CONNECT
        b"\x10\x00",  # an empty CONNECT
        b"\xf0\x00garbage",
    ]
    for data in cases:
        s = raw(mq.mqtt_port)
        s.sendall(data)
        assert closed_by_server(s), data
    # a wildcard in a PUBLISH topic after a good CONNECT
    s = raw(mq.mqtt_port)
    s.sendall(m.encode(m.Connect(uid(), True, 60)))
    assert read_packets(s) == [m.ConnAck(0)]
    s.sendall(b"\x30\x06\x00\x03a/#x")
    assert closed_by_server(s)
    # bad credentials and an unknown vhost
    s = raw(mq.mqtt_port)
    s.sendall(m.encode(m.Connect(uid(), True, 60, "guest", b"wrong")))
    assert read_packets(s) == [m.ConnAck(4)]
    s = raw(mq.mqtt_port)
    s.sendall(m.encode(m.Connect(uid(), True, 60, "no-such-vhost:guest", b"guest")))
    assert read_packets(s) == [m.ConnAck(5)]
    Paho(mq.mqtt_port).publish("fine", b"still here", qos=1)
    assert watcher.wait_for(1) == [("fine", b"still here", 0, False)]
    watcher.close()


def test_tls_listener(mq, tls_files):
    cert, _ = tls_files
    sub = Paho(mq.mqtts_port, tls_ca=cert)
    sub.subscribe(("tls/t", 1))
    Paho(mq.mqtt_port).publish("tls/t", b"secret", qos=1)
    assert sub.wait_for(1) == [("tls/t", b"secret", 1, False)]
    sub.close()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", mq.mqtts_port), timeout=5) as plain:
        plain.sendall(m.encode(m.Connect(uid(), True, 60)))  # plain MQTT on the TLS port
        assert closed_by_server(plain)


def test_persistent_session_and_retained_survive_restart(tmp_path):
    proc = BrokerProc(tmp_path / "data", mqtt=True).start()
    try:
        cid = uid()
        dev = Paho(proc.mqtt_port, client_id=cid, clean=False)
        dev.subscribe(("jobs/#", 1))
        dev.close()
        pub = Paho(proc.mqtt_port)
        for i in range(3):
            pub.publish(f"jobs/{i}", b"job%d" % i, qos=1)
        pub.publish("cfg/rate", b"5", qos=1, retain=True)
        pub.close()
        proc.restart()
        dev = Paho(proc.mqtt_port, client_id=cid, clean=False)
        assert dev.session_present
        assert sorted(p for t, p, q, r in dev.wait_for(3)) == [b"job0", b"job1", b"job2"]
        dev.subscribe(("cfg/+", 1))
        assert dev.wait_for(4)[3] == ("cfg/rate", b"5", 1, True)
        dev.close()
    finally:
        proc.stop()


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def test_tls_client_certificates_required(tmp_path):
    ca_key, ca, key, csr, cert = (tmp_path / n for n in ("ca.key", "ca.pem", "k.pem", "r.csr",
                                                          "c.pem"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", str(ca_key), "-out", str(ca))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=device", "-keyout", str(key),
             "-out", str(csr))
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-days", "1", "-out", str(cert))
    port = free_port()
    # the device certificate doubles as the server's: the test only checks who may connect
    proc = BrokerProc(tmp_path / "data", mqtt=True,
                      extra=["--mqtts-port", str(port), "--tls-cert", str(cert), "--tls-key",
                             str(key), "--tls-ca", str(ca),
                             "--tls-fail-if-no-peer-cert"], wait_ports=[port]).start()
    try:
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.check_hostname = False
        ctx.load_cert_chain(str(cert), str(key))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
                ctx.wrap_socket(s) as tls:
            tls.sendall(m.encode(m.Connect(uid(), True, 60)))
            assert read_packets(tls) == [m.ConnAck(0)]
        anonymous = ssl.create_default_context(cafile=str(ca))
        anonymous.check_hostname = False
        # without a certificate: refused during the handshake (TLS 1.3: at the first read)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s, \
                pytest.raises((ssl.SSLError, ConnectionError)), anonymous.wrap_socket(s) as tls:
            tls.sendall(m.encode(m.Connect(uid(), True, 60)))
            if not tls.recv(16):
                raise ConnectionResetError("closed")
    finally:
        proc.stop()


def test_large_messages_to_a_slow_reader(mq):
    """Deliveries bigger than the socket buffer: the direct write takes part of them, the
    writer task the rest, in order; a subscriber that reads late still gets everything."""
    s = raw(mq.mqtt_port)
    s.sendall(m.encode(m.Connect(uid(), True, 60)) + m.encode(m.Subscribe(1, [("big/#", 0)])))
    assert read_packets(s, 2) == [m.ConnAck(0), m.SubAck(1, [0])]
    pub = Paho(mq.mqtt_port)
    payloads = [bytes([i]) * (1_500_000 + i) for i in range(6)]
    for i, p in enumerate(payloads):
        pub.publish(f"big/{i}", p, qos=1)
    time.sleep(0.5)  # the broker's output to `s` is now well past the socket buffers
    got = read_packets(s, 6, within=20)
    assert [(p.topic, p.payload) for p in got] == [(f"big/{i}", p) for i, p in
                                                   enumerate(payloads)]
    s.close()


def _octets(http, match) -> tuple[int, int]:
    """``(recv_oct, send_oct)`` of the one listed connection ``match`` picks."""
    mine = [c for c in http.get("/api/connections").json() if match(c)]
    assert len(mine) == 1, mine
    return mine[0]["recv_oct"], mine[0]["send_oct"]


def test_mqtt_connection_octets_grow(mq):
    """As RabbitMQ's: an MQTT connection's recv_oct and send_oct count its socket's bytes."""
    http = httpx.Client(base_url=mq.http_url, auth=("guest", "guest"), timeout=10)
    cid = uid()
    client = Paho(mq.mqtt_port, client_id=cid)
    try:
        def mine(c):
            return c["client_properties"].get("client_id") == cid
        recv0, send0 = _octets(http, mine)
        assert recv0 > 0 and send0 > 0  # CONNECT in, CONNACK out
        client.subscribe(("octets/" + cid, 1))
        client.publish("octets/" + cid, b"x" * 5000, qos=1)
        assert len(client.wait_for(1)) == 1
        recv1, send1 = _octets(http, mine)
        assert recv1 >= recv0 + 5000 and send1 >= send0 + 5000
    finally:
        client.close()


def test_mqtt_connections_listed_counted_and_closed_with_amqp_ones(mq, capsys):
    """An MQTT connection is one of the broker's connections: the management API, ctl and
    /metrics show it next to AMQP ones, and closing it there ends it (will published)."""
    from broker.cli import main
    http = httpx.Client(base_url=mq.http_url, auth=("guest", "guest"), timeout=10)
    amqp = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mq.port))
    topic = "registry/" + uid()
    watcher_id = uid()
    watcher = Paho(mq.mqtt_port, client_id=watcher_id)
    watcher.subscribe((topic, 1))
    cid = uid()
    dev = raw(mq.mqtt_port)
    dev.sendall(m.encode(m.Connect(cid, True, 30, username="guest", password=b"guest",
                                   will=m.Will(topic, b"closed by the operator", 1, False))))
    assert read_packets(dev) == [m.ConnAck(0)]
    listed = http.get("/api/connections").json()
    mine = [c for c in listed if c["client_properties"].get("client_id") == cid]
    assert len(mine) == 1, listed
    c = mine[0]
    assert (c["protocol"], c["user"], c["vhost"], c["port"], c["channels"], c["timeout"]) == (
        "MQTT 3.1.1", "guest", "/", mq.mqtt_port, 0, 30)
    assert c["peer_port"] == dev.getsockname()[1] and c["state"] == "running"
    assert any(x["protocol"] == "AMQP 0-9-1" for x in listed)
    assert http.get("/api/connections/" + quote(c["name"], safe="")).json()["name"] == c["name"]
    # a subscription queue's consumer names its MQTT connection
    q = http.get(f"/api/queues/%2F/mqtt-subscription-{watcher_id}qos1").json()
    watcher_conn = q["consumer_details"][0]["channel_details"]["connection_name"]
    assert watcher_conn in {x["name"] for x in listed}
    # the Prometheus gauge and the overview count the same connections
    metrics = http.get("/metrics").text
    gauge = [line for line in metrics.splitlines() if line.startswith("rabbitmq_connections ")]
    assert gauge == [f"rabbitmq_connections {float(len(listed))}"]
    assert http.get("/api/overview").json()["object_totals"]["connections"] == len(listed)
    capsys.readouterr()
    assert main(["ctl", "--url", mq.http_url, "--formatter", "json", "list_connections",
                 "name,protocol,user"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {"name": c["name"], "protocol": "MQTT 3.1.1", "user": "guest"} in rows
    # closed through the API: the socket ends and the will goes out
    r = http.delete("/api/connections/" + quote(c["name"], safe=""),
                    headers={"X-Reason": "maintenance"})
    assert r.status_code == 204
    assert closed_by_server(dev)
    assert watcher.wait_for(1) == [(topic, b"closed by the operator", 1, False)]
    for _ in range(50):
        if all(x["name"] != c["name"] for x in http.get("/api/connections").json()):
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the closed MQTT connection is still listed")
    watcher.close()
    amqp.close()
    http.close()
