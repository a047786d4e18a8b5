"""Hermes-style HTTP publishing and push subscriptions in a TrioMQ subprocess, with pika on
the AMQP side, httpx as the HTTP producer and a real http.server endpoint (in a thread)
that fails on purpose. TrioMQ only: RabbitMQ has no Hermes API."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pika
import pytest
from brokerproc import BrokerProc
from helpers import assert_channel_error, wait_for


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("the Hermes HTTP API is TrioMQ's")


class Endpoint:
    """Records POSTs; answers ``status`` (changeable while running)."""

    def __init__(self):
        self.status = 200
        self.received: list[tuple[int, dict, bytes]] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                status = endpoint.status
                with endpoint.lock:
                    endpoint.received.append((status, dict(self.headers), body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def ok(self) -> list:
        with self.lock:
            return [(h, b) for s, h, b in self.received if 200 <= s < 300]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    ep = Endpoint()
    yield ep
    ep.close()


@pytest.fixture
def proc(tmp_path):
    p = BrokerProc(tmp_path / "data", http=True).start()
    yield p
    p.stop()


def wait_http(p: BrokerProc) -> httpx.Client:
    client = httpx.Client(base_url=p.http_url, timeout=10, auth=("guest", "guest"))
    wait_for(lambda: _reachable(client), msg="HTTP listener")
    return client


def _reachable(client) -> bool:
    try:
        client.get("/topics")
        return True
    except httpx.TransportError:
        return False


SCHEMA = {"type": "record", "name": "Order", "namespace": "shop",
          "fields": [{"name": "id", "type": "string"}, {"name": "qty", "type": "int"}]}


def test_http_amqp_both_ways(proc, endpoint):
    http = wait_http(proc)
    assert http.post("/topics", json={"name": "shop.orders", "contentType": "JSON"}).status_code == 201
    assert http.post("/topics/shop.orders/subscriptions",
                     json={"name": "push", "endpoint": endpoint.url}).status_code == 201
    conn = proc.connect()
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, "shop.orders", "#")
    # HTTP producer -> AMQP consumer and push subscriber
    r = http.post("/topics/shop.orders", content=b'{"via": "http"}',
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 201
    mid = r.headers["Hermes-Message-Id"]
    method, props, body = None, None, None
    deadline = time.monotonic() + 10
    while method is None and time.monotonic() < deadline:
        method, props, body = ch.basic_get(q, auto_ack=True)
    assert body == b'{"via": "http"}' and props.message_id == mid and props.delivery_mode == 2
    # AMQP producer (pika) -> push subscriber
    ch.confirm_delivery()
    ch.basic_publish("shop.orders", "any.key", b'{"via": "amqp"}',
                     pika.BasicProperties(content_type="application/json", delivery_mode=2))
    wait_for(lambda: len(endpoint.ok()) == 2, msg="two pushes")
    bodies = sorted(b for _h, b in endpoint.ok())
    assert bodies == [b'{"via": "amqp"}', b'{"via": "http"}']
    headers = dict(endpoint.ok()[0][0])
    assert headers["Hermes-Topic-Name"] == "shop.orders"
    assert headers["Hermes-Subscription-Name"] == "push"
    assert headers["Hermes-Message-Id"] == mid
    conn.close()


def test_avro_topic_over_amqp_and_http(proc, endpoint):
    http = wait_http(proc)
    r = http.post("/topics", json={"name": "shop.avro", "contentType": "AVRO",
                                   "schema": json.dumps(SCHEMA)})
    assert r.status_code == 201, r.text
    http.post("/topics/shop.avro/subscriptions", json={"name": "push", "endpoint": endpoint.url})
    r = http.post("/topics/shop.avro", json={"id": "o1", "qty": "lots"})
    assert r.status_code == 400 and "field 'qty'" in r.json()["message"]
    assert http.post("/topics/shop.avro", json={"id": "o1", "qty": 1}).status_code == 201
    conn = proc.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    # a JSON body that does not conform: nacked in confirm mode
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("shop.avro", "", b'{"id": 5}',
                         pika.BasicProperties(content_type="application/json"))
    ch.basic_publish("shop.avro", "", b'{"id": "o2", "qty": 2}',
                     pika.BasicProperties(content_type="application/json"))
    # without confirms: the channel is closed with 406 naming the field
    ch2 = conn.channel()
    assert_channel_error(406, "PRECONDITION_FAILED - message rejected by the Avro schema of exchange "
                              "'shop.avro' in vhost '/'",
                         lambda: (ch2.basic_publish("shop.avro", "", b"\xff\xff\xff"),
                                  ch2.queue_declare("", exclusive=True)))
    wait_for(lambda: len(endpoint.ok()) == 2, msg="two pushes")
    # pushed as JSON to a JSON subscription
    assert sorted(json.loads(b)["id"] for _h, b in endpoint.ok()) == ["o1", "o2"]
    conn.close()


def test_nothing_lost_across_kill_9(proc, endpoint):
    http = wait_http(proc)
    http.post("/topics", json={"name": "shop.crash"})
    http.post("/topics/shop.crash/subscriptions",
              json={"name": "push", "endpoint": endpoint.url,
                    "subscriptionPolicy": {"messageBackoff": 50, "rate": 500}})
    endpoint.status = 503
    ids = set()
    for i in range(20):
        r = http.post("/topics/shop.crash", content=b'{"n": %d}' % i)
        assert r.status_code == 201
        ids.add(r.headers["Hermes-Message-Id"])
    wait_for(lambda: len(endpoint.received) >= 20, msg="first attempts")
    proc.kill()
    endpoint.status = 200
    proc.start()
    http = wait_http(proc)
    wait_for(lambda: {h["Hermes-Message-Id"] for h, _b in endpoint.ok()} == ids, timeout=20,
             msg="every message pushed after the restart")
    # a 2xx was never followed by another delivery of the same message
    oks = [h["Hermes-Message-Id"] for h, _b in endpoint.ok()]
    assert len(oks) == len(set(oks)) == 20
    assert http.get("/topics/shop.crash/subscriptions").json() == ["push"]


def test_ctl_verbs(proc, endpoint, tmp_path, capsys):
    from broker.cli import main

    def ctl(proc: BrokerProc, *args: str) -> subprocess.CompletedProcess:
        # the command line's own entry point, in this process (an interpreter per call is slow)
        code = main(["ctl", "--url", proc.http_url, *args])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    wait_http(proc)
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(SCHEMA))
    r = ctl(proc, "add_hermes_topic", "shop.ctl", "--content-type", "AVRO", "--schema-file", str(schema))
    assert r.returncode == 0, r.stderr
    r = ctl(proc, "add_hermes_subscription", "shop.ctl", "push", endpoint.url, "--rate", "50",
            "--ordered")
    assert r.returncode == 0, r.stderr
    r = ctl(proc, "--formatter", "json", "list_hermes_subscriptions", "shop.ctl")
    [row] = json.loads(r.stdout)
    assert row["endpoint"] == endpoint.url and row["rate"] == 50 and row["ordered"] is True
    # refusals: one line, rabbitmqctl's exit statuses
    r = ctl(proc, "delete_hermes_topic", "shop.ctl")
    assert r.returncode == 65 and "has subscriptions" in r.stderr
    r = ctl(proc, "add_hermes_subscription", "shop.ctl", "bad", "ftp://x")
    assert r.returncode == 65 and r.stderr.strip() == "Error: endpoint: must be an http:// or https:// URL, got 'ftp://x'"
    r = ctl(proc, "-q", "--password", "wrong", "list_hermes_topics")
    assert r.returncode == 77


def test_mqtt_http_push_and_amqp_on_one_core(tmp_path, endpoint):
    """An MQTT device, an HTTP producer, a push subscriber and an AMQP client exchange
    messages through one broker: two exchange-to-exchange bindings join MQTT's amq.topic
    and the Hermes topic's exchange."""
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    proc = BrokerProc(tmp_path / "data", http=True, mqtt=True).start()
    try:
        http = wait_http(proc)
        http.post("/topics", json={"name": "shop.orders"}).raise_for_status()
        http.post("/topics/shop.orders/subscriptions",
                  json={"name": "push", "endpoint": endpoint.url}).raise_for_status()
        conn = proc.connect()
        ch = conn.channel()
        ch.exchange_bind("shop.orders", "amq.topic", "shop.orders")  # MQTT shop/orders -> topic
        ch.exchange_bind("amq.topic", "shop.orders", "#")  # topic -> MQTT subscribers
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(q, "shop.orders", "#")  # an AMQP consumer of the topic
        got: list = []
        connected = threading.Event()
        subscribed = threading.Event()
        device = paho.Client(CallbackAPIVersion.VERSION2, client_id="h7-device")
        device.username_pw_set("guest", "guest")
        device.on_connect = lambda c, u, f, rc, p: connected.set()
        device.on_subscribe = lambda c, u, mid, codes, p: subscribed.set()
        device.on_message = lambda c, u, m: got.append((m.topic, m.payload))
        device.connect("127.0.0.1", proc.mqtt_port, keepalive=30)
        device.loop_start()
        assert connected.wait(10)
        device.subscribe("shop/orders", qos=1)
        assert subscribed.wait(10)
        # HTTP producer -> MQTT device, AMQP consumer, push endpoint
        assert http.post("/topics/shop.orders", content=b'{"from": "http"}').status_code == 201
        # MQTT device -> push endpoint, AMQP consumer (and back to itself, as MQTT does)
        device.publish("shop/orders", b'{"from": "mqtt"}', qos=1).wait_for_publish(10)
        wait_for(lambda: len(endpoint.ok()) == 2, msg="pushes")
        assert sorted(b for _h, b in endpoint.ok()) == [b'{"from": "http"}', b'{"from": "mqtt"}']
        wait_for(lambda: len(got) == 2, msg="MQTT deliveries")
        assert sorted(got) == [("shop/orders", b'{"from": "http"}'), ("shop/orders", b'{"from": "mqtt"}')]
        bodies = []
        deadline = time.monotonic() + 10
        while len(bodies) < 2 and time.monotonic() < deadline:
            _m, _p, body = ch.basic_get(q, auto_ack=True)
            if body is not None:
                bodies.append(body)
        assert sorted(bodies) == [b'{"from": "http"}', b'{"from": "mqtt"}']
        device.loop_stop()
        device.disconnect()
        conn.close()
    finally:
        proc.stop()
