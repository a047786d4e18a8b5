"""AMQP 1.0 transfers, deliveries and dispositions in the audit trail, as AMQP 0-9-1, MQTT
and STOMP ones: a real broker process (tests/audit's), qpid-proton's client, the Avro
files read back."""
from __future__ import annotations

import pytest
from proton import Message
from proton.utils import BlockingConnection

from ..audit.test_mqtt_trail import Broker


@pytest.mark.timeout(120)
def test_amqp10_publish_deliver_accept_reject_in_the_trail(tmp_path):
    b = Broker(tmp_path)
    try:
        c = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{b.port}", timeout=20,
                               allowed_mechs="PLAIN")
        snd = c.create_sender("/queue/orders")
        snd.send(Message(body=b"one", inferred=True, durable=True))
        snd.send(Message(body=b"two", inferred=True))
        rcv = c.create_receiver("/queue/orders", credit=2)
        rcv.receive(timeout=20)
        rcv.accept()
        rcv.receive(timeout=20)
        rcv.reject()
        c.close()
    finally:
        records = b.stop()
    pubs = [r for r in records if r["event"] == "published" and r["routing_key"] == "orders"]
    assert len({r["connection"] for r in pubs}) == 1  # the client's address
    assert [(r["exchange"], r["user"], r["body_size"], r["persistent"], r["outcome"],
             r["queues"]) for r in pubs] == [
        ("", "guest", 3, True, "routed", ["orders"]),
        ("", "guest", 3, False, "routed", ["orders"])]
    delivered = [r for r in records if r["event"] == "delivered"]
    assert [(r["queue"], r["msg"]) for r in delivered] == [
        ("orders", pubs[0]["msg"]), ("orders", pubs[1]["msg"])]
    acked = [r for r in records if r["event"] == "acked"]
    assert [(r["queue"], r["msg"]) for r in acked] == [("orders", pubs[0]["msg"])]
    assert any(r["event"] == "rejected" and r["msg"] == pubs[1]["msg"] for r in records), [
        r["event"] for r in records]
