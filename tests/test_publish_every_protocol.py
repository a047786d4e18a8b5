"""The one publish path, beyond tests/test_publishing.py's same-message tests: AMQP 1.0
publishes pass the hooks and route as the others (an ``x-delay`` application property is
scheduled), an MQTT 5 user property reaches the scheduler as an AMQP header does, a
deduplicating exchange drops a repeat whichever protocol (AMQP 0-9-1, STOMP, the management
API, AMQP 1.0) sent the first copy and the repeat, and an Avro exchange refuses a bad body
whichever protocol sent it. The broker runs in-process (test_publishing's fixture: AMQP 0-9-1
and 1.0, MQTT, STOMP, HTTP); qpid-proton's and paho's blocking clients run in worker
threads."""
from __future__ import annotations

import threading

import pytest
import trio
from proton import Delivery, Message
from proton.utils import BlockingConnection, SendException

from .test_publishing import (  # noqa: F401  (every_protocol: a fixture)
    _amqp,
    _http,
    _record_hook,
    _stomp,
    _wait,
    every_protocol,
)


@pytest.fixture
def in_process(every_protocol):  # noqa: F811
    """test_publishing's broker, with its AMQP, MQTT, STOMP and HTTP listeners."""
    return every_protocol


def _send(port: int, address: str, body: bytes, properties: dict | None = None) -> str:
    """The transfer's outcome: "accepted", or "released" (routed nowhere, as RabbitMQ 4)."""
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=10,
                           allowed_mechs="PLAIN")
    try:
        snd = c.create_sender(address)
        try:
            snd.send(Message(body=body, inferred=True, properties=properties))
        except SendException as exc:
            return "released" if exc.state == Delivery.RELEASED else f"state {exc.state}"
        return "accepted"
    finally:
        c.close()


async def test_an_amqp10_publish_passes_the_hooks_and_routes_as_the_others(in_process):
    broker = in_process
    vhost = broker.vhosts["/"]
    seen = _record_hook(broker)
    q = vhost.declare_queue("same", None, arguments={})
    vhost.bind("amq.topic", q, "t.same", {})
    assert await trio.to_thread.run_sync(_send, broker.amqp_port, "/exchange/amq.topic/t.same",
                                         b"same-amqp10") == "accepted"
    await _wait(lambda: q.message_count >= 1, "the message in the queue")
    assert [(x, k, body, v) for x, k, body, v in seen] == [
        ("amq.topic", "t.same", b"same-amqp10", "/")]


async def test_an_amqp10_x_delay_is_scheduled_not_routed(in_process):
    broker = in_process
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    q = vhost.declare_queue("later", None, arguments={})
    vhost.bind("later", q, "k", {})
    before = broker.scheduler.pending
    assert await trio.to_thread.run_sync(_send, broker.amqp_port, "/exchange/later/k",
                                         b"amqp10", {"x-delay": 60_000}) == "accepted"
    await _wait(lambda: broker.scheduler.pending >= before + 1, "one scheduled")
    assert q.message_count == 0


async def test_a_duplicate_is_dropped_whichever_protocol_sent_either(in_process):
    """x-message-deduplication sees one message per x-deduplication-header value, whether
    the first and the repeat came through AMQP 0-9-1, STOMP, the management API or AMQP
    1.0: four publishes of each of two values, one message per value in the queue."""
    broker = in_process
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("dedup", "x-message-deduplication",
                           arguments={"x-cache-size": 100})
    q = vhost.declare_queue("deduped")
    vhost.bind("dedup", q, "", {})
    for value in ("a", "b"):
        header = {"x-deduplication-header": value}
        await _amqp(broker, "dedup", "", f"amqp-{value}".encode(), headers=header)
        frames = await _stomp(broker, "/exchange/dedup", f"stomp-{value}".encode(), **header)
        assert frames[-1].command == "RECEIPT"
        async with _http(broker) as http:
            r = await http.post("/api/exchanges/%2F/dedup/publish", json={
                "routing_key": "", "payload": f"http-{value}", "payload_encoding": "string",
                "properties": {"headers": header}})
            assert r.status_code == 200, r.text
        outcome = await trio.to_thread.run_sync(_send, broker.amqp_port, "/exchange/dedup",
                                                f"amqp10-{value}".encode(), header)
        assert outcome == "released"  # AMQP 1.0's answer for a message routed nowhere
    await _wait(lambda: q.message_count >= 2, "two messages")
    await trio.sleep(0.2)  # a late duplicate would show by now
    assert q.message_count == 2
    assert sorted(e.message.body for e in q.ready) == [b"amqp-a", b"amqp-b"]


SCHEMA = ('{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}')


async def test_an_avro_exchange_refuses_a_bad_body_whichever_protocol_sent_it(in_process):
    """The exchange's Avro schema is a stage of the path: a body that does not conform is
    refused through STOMP (an ERROR), the management API (400) and AMQP 1.0 (rejected) as
    through AMQP 0-9-1 (406); a conforming one is routed. Before, only the AMQP 0-9-1
    channel checked it and the others routed anything."""
    broker = in_process
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("orders", "fanout", arguments={"x-avro-schema": SCHEMA})
    q = vhost.declare_queue("orders")
    vhost.bind("orders", q, "", {})
    json_props = {"content-type": "application/json"}
    frames = await _stomp(broker, "/exchange/orders", b'{"id": "x"}', **json_props)
    assert frames[-1].command == "ERROR"
    assert "Avro schema" in frames[-1].headers.get("message", "") + frames[-1].body.decode()
    async with _http(broker) as http:
        r = await http.post("/api/exchanges/%2F/orders/publish", json={
            "routing_key": "", "payload": '{"id": "x"}', "payload_encoding": "string",
            "properties": {"content_type": "application/json"}})
        assert r.status_code == 400, r.text
        assert "Avro schema" in r.json()["reason"]
        r = await http.post("/api/exchanges/%2F/orders/publish", json={
            "routing_key": "", "payload": '{"id": 7}', "payload_encoding": "string",
            "properties": {"content_type": "application/json"}})
        assert r.status_code == 200 and r.json() == {"routed": True}
    outcome = await trio.to_thread.run_sync(_send_json, broker.amqp_port, "/exchange/orders",
                                            b'{"id": "x"}')
    assert outcome == "rejected"
    await trio.sleep(0.1)
    assert [e.message.body for e in q.ready] == [b'{"id": 7}']


def _send_json(port: int, address: str, body: bytes) -> str:
    c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{port}", timeout=10,
                           allowed_mechs="PLAIN")
    try:
        snd = c.create_sender(address)
        try:
            snd.send(Message(body=body, inferred=True, content_type="application/json"))
        except SendException as exc:
            return "rejected" if exc.state == Delivery.REJECTED else f"state {exc.state}"
        return "accepted"
    finally:
        c.close()


def _mqtt5_publish(port: int, topic: str, body: bytes, user_properties: list) -> int:
    """An MQTT 5 QoS 1 publish with user properties (AMQP headers on the broker's side);
    the PUBACK's reason code."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    done = threading.Event()
    result: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="delay5",
                    protocol=mqtt.MQTTv5)
    c.username_pw_set("guest", "guest")
    c.on_publish = lambda _c, _u, _mid, reason, _p: (result.append(reason.value), done.set())
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = user_properties
        c.publish(topic, body, qos=1, properties=props)
        assert done.wait(10), "no PUBACK"
    finally:
        c.loop_stop()
        c.disconnect()
    return result[0]


async def test_an_mqtt5_scheduled_delay_user_property_is_scheduled_not_routed(in_process):
    """MQTT 5 user properties travel as AMQP headers, so an ``AMQ_SCHEDULED_DELAY`` one
    (ActiveMQ's, honoured on any exchange: MQTT publishes to amq.topic) is taken by the
    path's scheduler hook as the AMQP header is."""
    broker = in_process
    vhost = broker.vhosts["/"]
    q = vhost.declare_queue("later5")
    vhost.bind("amq.topic", q, "d.#", {})
    before = broker.scheduler.pending
    reason = await trio.to_thread.run_sync(_mqtt5_publish, broker.mqtt.ports["mqtt"], "d/x",
                                           b"mqtt5", [("AMQ_SCHEDULED_DELAY", "60000")])
    assert reason in (0, 16)  # success (16: no matching subscribers, as MQTT 5 may say)
    await _wait(lambda: broker.scheduler.pending >= before + 1, "one scheduled")
    assert q.message_count == 0
