"""Message counters the management API shows, moved by a real client (pika) against the
in-process broker, read with httpx; and their shape next to RabbitMQ's own API on this machine
(skipped where RabbitMQ does not answer on 5672/15672)."""
from __future__ import annotations

import uuid

import httpx
import pika
import pytest
import trio
from reference import rabbitmq_api

RABBIT_API = "http://127.0.0.1:15672"


def _pika(port: int, name: str = "stats") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
        connection_attempts=1, socket_timeout=5, blocked_connection_timeout=5,
        client_properties={"connection_name": name}))


def _setup(port: int):
    conn = _pika(port)
    ch = conn.channel()
    ch.queue_declare("ms")
    ch.exchange_declare("fx", "fanout")
    for q in ("f1", "f2"):
        ch.queue_declare(q)
        ch.queue_bind(q, "fx")
    ch.confirm_delivery()
    return conn, ch


def _traffic(conn, ch):
    """Every counter once or more on one channel: confirms, a mandatory unroutable publish
    (returned), a non-mandatory one (dropped), a get that is requeued and got again
    (redelivered), a no-ack get, a no-ack delivery and a get on the empty queue; a fanout
    exchange into two queues (publish_out counts the queues reached)."""
    for i in range(3):
        ch.basic_publish("", "ms", b"m%d" % i)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("", "nowhere", b"r", mandatory=True)
    ch.basic_publish("", "nowhere", b"d")
    ch.basic_publish("fx", "", b"f")
    method, _, _ = ch.basic_get("ms")
    assert method is not None and not method.redelivered
    ch.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = ch.basic_get("ms")
    assert method is not None and method.redelivered
    ch.basic_ack(method.delivery_tag)
    method, _, _ = ch.basic_get("ms", auto_ack=True)
    assert method is not None
    got = []
    tag = ch.basic_consume("ms", lambda c, m, p, b: got.append(b), auto_ack=True)
    while not got:
        conn.process_data_events(0.05)
    ch.basic_cancel(tag)
    method, _, _ = ch.basic_get("ms")
    assert method is None


async def test_counters_move_as_rabbitmqs(api, http_broker):
    sampler = http_broker.broker.stats_sampler
    conn, ch = await trio.to_thread.run_sync(_setup, http_broker.amqp_port)
    try:
        sampler.sample()
        await trio.to_thread.run_sync(_traffic, conn, ch)
        sampler.sample()
        chans = (await api.get("/api/channels")).json()
        assert len(chans) == 1
        stats = chans[0]["message_stats"]
        counts = {k: v for k, v in stats.items() if not k.endswith("_details")}
        assert counts == {"publish": 6, "confirm": 6, "return_unroutable": 1,
                          "drop_unroutable": 1, "deliver": 0, "deliver_no_ack": 1, "get": 2,
                          "get_no_ack": 1, "get_empty": 1, "redeliver": 1, "deliver_get": 4,
                          "ack": 1}
        assert stats["confirm_details"]["rate"] > 0 and stats["get_empty_details"]["rate"] > 0
        for where in ("/api/overview", "/api/vhosts/%2F"):
            ms = (await api.get(where)).json()["message_stats"]
            assert {k: ms[k] for k in counts} == counts, where
            assert ms["return_unroutable_details"]["rate"] > 0, where

        q = (await api.get("/api/queues/%2F/ms")).json()["message_stats"]
        assert {k: v for k, v in q.items() if not k.endswith("_details")} == {
            "publish": 3, "deliver": 0, "deliver_no_ack": 1, "get": 2, "get_no_ack": 1,
            "get_empty": 1, "redeliver": 1, "deliver_get": 4, "ack": 1}

        fx = (await api.get("/api/exchanges/%2F/fx")).json()["message_stats"]
        assert fx["publish_in"] == 1 and fx["publish_out"] == 2
        assert fx["publish_in_details"]["rate"] > 0
        default = (await api.get("/api/exchanges/%2F/amq.default")).json()["message_stats"]
        assert default["publish_in"] == 5 and default["publish_out"] == 3
        listed = {x["name"]: x for x in (await api.get("/api/exchanges/%2F")).json()}
        assert "message_stats" not in listed["amq.topic"]  # no traffic, no message_stats
        assert listed["fx"]["message_stats"]["publish_out"] == 2

        c = (await api.get("/api/connections")).json()[0]
        assert c["recv_oct"] > 0 and c["send_oct"] > 0 and c["recv_cnt"] > 0 and c["send_cnt"] > 0
        assert c["recv_oct_details"]["rate"] > 0 and c["send_oct_details"]["rate"] > 0
        assert "recv_cnt_details" not in c and "send_cnt_details" not in c

        text = (await api.get("/metrics")).text
        for line in ("rabbitmq_channel_messages_published_total 6.0",
                     "rabbitmq_channel_messages_confirmed_total 6.0",
                     "rabbitmq_channel_messages_unroutable_returned_total 1.0",
                     "rabbitmq_channel_messages_unroutable_dropped_total 1.0",
                     "rabbitmq_channel_messages_redelivered_total 1.0",
                     "rabbitmq_channel_get_ack_total 2.0", "rabbitmq_channel_get_total 1.0",
                     "rabbitmq_channel_messages_delivered_total 1.0",
                     "rabbitmq_channel_messages_delivered_ack_total 0.0",
                     "rabbitmq_channel_messages_acked_total 1.0",
                     "rabbitmq_channel_get_empty_total 1.0"):
            assert line in text, line
        assert "rabbitmq_connection_incoming_bytes_total" in text
    finally:
        await trio.to_thread.run_sync(conn.close)


def _keys(stats: dict | None) -> set:
    return {k for k in (stats or {}) if not k.endswith("_details")}


def _rabbit_shapes() -> dict:
    """RabbitMQ's answers for the same kind of traffic, touching nothing that lasts: a
    confirm channel publishing to a key no queue has (mandatory and not) via amq.default.
    RabbitMQ emits statistics every 5 s, hence the wait."""
    key = "triomq-shape-" + uuid.uuid4().hex
    conn = _pika(5672, key)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        with pytest.raises(pika.exceptions.UnroutableError):
            ch.basic_publish("", key, b"r", mandatory=True)
        ch.basic_publish("", key, b"d")
        auth = ("guest", "guest")
        with httpx.Client(base_url=RABBIT_API, auth=auth, timeout=5) as http:
            for _ in range(60):
                conns = [c for c in http.get("/api/connections").json()
                         if c.get("client_properties", {}).get("connection_name") == key]
                chans = [c for c in http.get("/api/channels").json()
                         if conns and c["connection_details"]["name"] == conns[0]["name"]]
                if chans and "message_stats" in chans[0] and "recv_oct" in conns[0]:
                    break
                conn.process_data_events(0.25)
            else:
                pytest.skip("RabbitMQ emitted no channel statistics in 15 s")
            return {"channel": chans[0], "connection": conns[0],
                    "overview": http.get("/api/overview").json(),
                    "vhost": http.get("/api/vhosts/%2F").json(),
                    "exchange": http.get("/api/exchanges/%2F/amq.default").json()}
    finally:
        conn.close()


@pytest.mark.skipif(rabbitmq_api() is None, reason="no RabbitMQ here")
async def test_new_keys_shaped_as_rabbitmqs(api, http_broker):
    rabbit = await trio.to_thread.run_sync(_rabbit_shapes)
    conn, ch = await trio.to_thread.run_sync(_setup, http_broker.amqp_port)
    try:
        await trio.to_thread.run_sync(_traffic, conn, ch)
        ours = {"channel": (await api.get("/api/channels")).json()[0],
                "connection": (await api.get("/api/connections")).json()[0],
                "overview": (await api.get("/api/overview")).json(),
                "vhost": (await api.get("/api/vhosts/%2F")).json(),
                "exchange": (await api.get("/api/exchanges/%2F/amq.default")).json()}
    finally:
        await trio.to_thread.run_sync(conn.close)
    # RabbitMQ lists a channel's counters once they moved; ours are all there from the start
    assert _keys(rabbit["channel"]["message_stats"]) <= _keys(ours["channel"]["message_stats"])
    # (a vhost's counters too: on a fresh RabbitMQ only those this traffic moved)
    assert _keys(rabbit["vhost"]["message_stats"]) <= _keys(ours["vhost"]["message_stats"])
    # (disk_reads/disk_writes: RabbitMQ's message store, which TrioMQ does not count)
    assert _keys(rabbit["overview"]["message_stats"]) - {"disk_reads", "disk_writes"} \
        <= _keys(ours["overview"]["message_stats"])
    assert _keys(rabbit["exchange"]["message_stats"]) == _keys(ours["exchange"]["message_stats"])
    for side in (rabbit, ours):
        for obj in ("channel", "vhost", "overview", "exchange"):
            ms = side[obj]["message_stats"]
            assert all(set(ms[k + "_details"]) == {"rate"} for k in _keys(ms)), obj
    socket_keys = {k for k in rabbit["connection"] if k.startswith(("recv_", "send_"))} - {
        "send_pend"}
    assert socket_keys == {k for k in ours["connection"] if k.startswith(("recv_", "send_"))} - {
        "send_pend"}


async def test_vhost_octets_outlive_connections_and_api_publishes_count(api, http_broker):
    """A vhost's recv_oct/send_oct sum its connections, closed ones included; a publish
    through the API counts as RabbitMQ's internal channel counts it (publish, confirm, and
    return_unroutable when no queue took it)."""
    sampler = http_broker.broker.stats_sampler
    assert "recv_oct" not in (await api.get("/api/vhosts/%2F")).json()  # no connection yet
    conn, ch = await trio.to_thread.run_sync(_setup, http_broker.amqp_port)
    await trio.to_thread.run_sync(_traffic, conn, ch)
    live = (await api.get("/api/connections")).json()[0]
    vhost = (await api.get("/api/vhosts/%2F")).json()
    assert vhost["recv_oct"] == live["recv_oct"] > 0 and vhost["send_oct"] == live["send_oct"] > 0
    await trio.to_thread.run_sync(conn.close)
    for _ in range(50):
        if not (await api.get("/api/connections")).json():
            break
        await trio.sleep(0.05)
    sampler.sample()
    after = (await api.get("/api/vhosts/%2F")).json()
    assert after["recv_oct"] >= live["recv_oct"] and after["send_oct"] >= live["send_oct"]
    assert set(after["recv_oct_details"]) == {"rate"}

    before = (await api.get("/api/overview")).json()["message_stats"]
    for key in ("ms", "nowhere"):
        r = await api.post("/api/exchanges/%2F/amq.default/publish", json={
            "routing_key": key, "payload": "x", "payload_encoding": "string",
            "properties": {}})
        assert r.status_code == 200
    for where in ("/api/overview", "/api/vhosts/%2F"):
        ms = (await api.get(where)).json()["message_stats"]
        assert ms["publish"] == before["publish"] + 2, where
        assert ms["confirm"] == before["confirm"] + 2, where
        assert ms["return_unroutable"] == before["return_unroutable"] + 1, where
