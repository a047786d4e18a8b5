"""Prometheus: the queue byte gauges (ready, unacknowledged, all) and the ``protocol`` split
of rabbitmq_global_* (publishes; deliveries and acks by queue type) moved by real clients:
pika (amqp091), paho (mqtt311, mqtt50) and stomp.py (counted as amqp091, as RabbitMQ's STOMP
adapter's channel is)."""
from __future__ import annotations

import time

import paho.mqtt.client as mqtt
import pika
import stomp
import trio

from .conftest import start_http_broker
from .test_prometheus_families import _scrape, values


def _pika_unacked(port: int, sizes: list[int], take: int) -> pika.BlockingConnection:
    """Publishes bodies of ``sizes`` to queue bytes-q and takes ``take`` of them without
    acking; the connection stays open (its deliveries unacked)."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("bytes-q")
    for n in sizes:
        ch.basic_publish("", "bytes-q", b"x" * n)
    for _ in range(take):
        method, _props, _body = ch.basic_get("bytes-q", auto_ack=False)
        assert method is not None
    return conn


Q = (("queue", "bytes-q"), ("vhost", "/"))


async def test_queue_byte_gauges(nursery, tmp_path):
    hb = await start_http_broker(nursery, tmp_path)
    conn = await trio.to_thread.run_sync(_pika_unacked, hb.amqp_port, [100, 20, 3], 2)
    try:
        per_object = values(await _scrape(hb.url + "/metrics/per-object"))
        assert per_object[("rabbitmq_queue_messages_ready_bytes", Q)] == 3
        assert per_object[("rabbitmq_queue_messages_unacked_bytes", Q)] == 120
        assert per_object[("rabbitmq_queue_messages_bytes", Q)] == 123
        aggregated = values(await _scrape(hb.url + "/metrics"))
        assert aggregated[("rabbitmq_queue_messages_unacked_bytes", ())] == 120
        assert aggregated[("rabbitmq_queue_messages_bytes", ())] == 123
        detailed = values(await _scrape(hb.url + "/metrics/detailed?family=queue_metrics"))
        assert detailed[("rabbitmq_detailed_queue_messages_unacked_bytes", Q)] == 120
        async with hb.client() as api:
            q = (await api.get("/api/queues/%2F/bytes-q")).json()
        assert (q["message_bytes"], q["message_bytes_unacknowledged"]) == (123, 120)
    finally:
        # closing the channel requeues both: the unacked bytes go back to ready
        await trio.to_thread.run_sync(conn.close)
    with trio.fail_after(30):
        while True:
            v = values(await _scrape(hb.url + "/metrics/per-object"))
            if v[("rabbitmq_queue_messages_ready_bytes", Q)] == 123:
                break
            await trio.sleep(0.05)
    assert v[("rabbitmq_queue_messages_unacked_bytes", Q)] == 0
    await hb.server.shutdown()


def _mqtt_publish(port: int, protocol: int, topics: list[str]) -> None:
    """Connects, publishes each topic at QoS 1 (waiting for its PUBACK) and disconnects."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"split-{protocol}",
                         protocol=protocol)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for topic in topics:
            client.publish(topic, b"m", qos=1).wait_for_publish(timeout=30)
    finally:
        client.disconnect()
        client.loop_stop()


def _mqtt_subscribe(port: int, topic: str) -> mqtt.Client:
    subscribed: list[int] = []
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="split-sub",
                         protocol=mqtt.MQTTv311)
    client.on_subscribe = lambda *args: subscribed.append(1)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.subscribe(topic, qos=1)
    deadline = time.monotonic() + 30
    while not subscribed and time.monotonic() < deadline:
        time.sleep(0.02)  # paho's own thread answers; nothing to poll but this list
    assert subscribed
    return client


def _stomp_send(port: int) -> None:
    conn = stomp.Connection([("127.0.0.1", port)])
    conn.connect("guest", "guest", wait=True)
    conn.send("/queue/split-stomp", "s", headers={"receipt": "r1"})
    conn.disconnect()  # after the receipt: stomp.py waits for DISCONNECT's own receipt


def _g(v: dict, name: str, protocol: str) -> float:
    return v.get((name, (("protocol", protocol),)), 0)


async def test_global_counters_split_by_protocol(nursery, tmp_path):
    hb = await start_http_broker(nursery, tmp_path, mqtt_port=0, stomp_port=0)
    with trio.fail_after(10):
        while "mqtt" not in hb.broker.mqtt.ports or "stomp" not in hb.broker.stomp.ports:  # noqa: ASYNC110 - they bind after AMQP
            await trio.sleep(0.01)
    mqtt_port = hb.broker.mqtt.ports["mqtt"]
    before = values(await _scrape(hb.url + "/metrics"))
    for protocol in ("amqp091", "stream"):  # RabbitMQ 3.10's labels, present at 0
        assert _g(before, "rabbitmq_global_messages_received_total", protocol) == 0
        assert ("rabbitmq_global_messages_received_total",
                (("protocol", protocol),)) in before
    sub = await trio.to_thread.run_sync(_mqtt_subscribe, mqtt_port, "split/routed")
    try:
        # 3.1.1: two routed to the subscriber, one to no queue; 5.0: one unroutable
        await trio.to_thread.run_sync(_mqtt_publish, mqtt_port, mqtt.MQTTv311,
                                      ["split/routed", "split/routed", "split/none"])
        await trio.to_thread.run_sync(_mqtt_publish, mqtt_port, mqtt.MQTTv5, ["split/none"])
        v = values(await _scrape(hb.url + "/metrics"))
        assert _g(v, "rabbitmq_global_consumers", "mqtt311") == 1
        # the subscriber's two QoS 1 deliveries and paho's PUBACKs, under mqtt311
        classic = (("protocol", "mqtt311"), ("queue_type", "rabbit_classic_queue"))
        with trio.fail_after(30):  # paho's PUBACKs come from its own thread
            while True:
                d = values(await _scrape(hb.url + "/metrics"))
                if d.get(("rabbitmq_global_messages_acknowledged_total", classic)) == 2:
                    break
                await trio.sleep(0.05)
        assert d[("rabbitmq_global_messages_delivered_total", classic)] == 2
        assert d[("rabbitmq_global_messages_delivered_consume_manual_ack_total", classic)] == 2
        amqp = (("protocol", "amqp091"), ("queue_type", "rabbit_classic_queue"))
        assert d[("rabbitmq_global_messages_delivered_total", amqp)] == 0
        assert d[("rabbitmq_global_messages_acknowledged_total", amqp)] == 0
    finally:
        await trio.to_thread.run_sync(sub.disconnect)
        await trio.to_thread.run_sync(sub.loop_stop)
    assert _g(v, "rabbitmq_global_messages_received_total", "mqtt311") == 3
    assert _g(v, "rabbitmq_global_messages_routed_total", "mqtt311") == 2
    assert _g(v, "rabbitmq_global_messages_unroutable_dropped_total", "mqtt311") == 1
    assert _g(v, "rabbitmq_global_messages_received_total", "mqtt50") == 1
    assert _g(v, "rabbitmq_global_messages_unroutable_dropped_total", "mqtt50") == 1
    # nothing of MQTT's is counted as AMQP 0-9-1
    assert _g(v, "rabbitmq_global_messages_received_total", "amqp091") == 0
    stomp_port = hb.broker.stomp.ports["stomp"]
    await trio.to_thread.run_sync(_stomp_send, stomp_port)
    v = values(await _scrape(hb.url + "/metrics"))
    assert _g(v, "rabbitmq_global_messages_received_total", "amqp091") == 1
    assert _g(v, "rabbitmq_global_messages_routed_total", "amqp091") == 1
    assert _g(v, "rabbitmq_global_messages_received_total", "mqtt311") == 3
    await hb.server.shutdown()
