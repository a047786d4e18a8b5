"""Direct replies in the audit trail: a reply its requester got is recorded as published
with outcome ``replied`` (whether published over AMQP, mandatory or not, or through the
management API), not ``unroutable``/``returned``; a reply to a requester that is gone
stays ``unroutable``. A real broker process, pika and httpx, the Avro files read back.
Before, every direct reply was recorded as unroutable (or returned)."""
from __future__ import annotations

import time

import httpx
import pika
import pytest

from .test_mqtt_trail import Broker

REPLY_TO = "amq.rabbitmq.reply-to"


@pytest.mark.timeout(120)
def test_direct_replies_are_recorded_as_replied(tmp_path):
    b = Broker(tmp_path)
    try:
        params = pika.ConnectionParameters("127.0.0.1", b.port)
        requester = pika.BlockingConnection(params)
        server_conn = pika.BlockingConnection(params)
        ch = requester.channel()
        replies: list = []
        ch.basic_consume(REPLY_TO, lambda c, m, p, body: replies.append(body), auto_ack=True)
        server = server_conn.channel()
        server.queue_declare("rpc")
        ch.basic_publish("", "rpc", b"req", pika.BasicProperties(reply_to=REPLY_TO,
                                                                message_id="req"))
        deadline = time.monotonic() + 30
        while (got := server.basic_get("rpc", auto_ack=True))[0] is None:
            assert time.monotonic() < deadline
            server_conn.process_data_events(0.05)
        name = got[1].reply_to
        server.basic_publish("", name, b"r1", pika.BasicProperties(message_id="amqp"))
        server.basic_publish("", name, b"r2", pika.BasicProperties(message_id="amqp-mandatory"),
                             mandatory=True)
        http = httpx.Client(base_url=f"http://127.0.0.1:{b.http_port}", auth=("guest", "guest"))
        r = http.post("/api/exchanges/%2F/amq.default/publish", json={
            "routing_key": name, "payload": "r3", "payload_encoding": "string",
            "properties": {"message_id": "http"}})
        assert r.status_code == 200
        while len(replies) < 3:
            assert time.monotonic() < deadline, replies
            requester.process_data_events(0.05)
        requester.close()
        server.basic_publish("", name, b"late", pika.BasicProperties(message_id="gone"))
        server_conn.close()
    finally:
        records = b.stop()
    outcome = {r["message_id"]: r["outcome"] for r in records if r["event"] == "published"}
    assert outcome == {"req": "routed", "amqp": "replied", "amqp-mandatory": "replied",
                       "http": "replied", "gone": "unroutable"}
