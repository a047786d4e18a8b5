"""STOMP publishes, deliveries, acks and nacks in the audit trail, as AMQP and MQTT ones:
a real broker process (tests/audit's), raw STOMP frames, the Avro files read back."""
from __future__ import annotations

import socket
import time

import pytest

from broker.stomp.codec import Frame, FrameReader, encode

from ..audit.test_mqtt_trail import Broker, _port, _wait_port

CONNECT = b"CONNECT\naccept-version:1.2\nhost:/\nlogin:guest\npasscode:guest\n\n\x00"


class Stomp:
    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        host, local_port = self.s.getsockname()[:2]
        self.local = f"{host}:{local_port}"
        self.reader = FrameReader(1 << 20)
        self.reader.version = "1.2"
        self.pending: list[Frame] = []
        self.s.sendall(CONNECT)
        assert self.next().command == "CONNECTED"

    def send(self, command: str, body: bytes = b"", **headers) -> None:
        self.s.sendall(encode(Frame(command, {k.replace("_", "-"): v
                                              for k, v in headers.items()}, body)))

    def next(self) -> Frame:
        deadline = time.monotonic() + 10
        while not self.pending:
            assert time.monotonic() < deadline
            self.pending += self.reader.feed(self.s.recv(65536))
        return self.pending.pop(0)

    def sync(self, rid: str) -> None:
        self.send("SEND", destination="/queue/sync", receipt=rid)
        assert self.next().headers["receipt-id"] == rid


@pytest.mark.timeout(120)
def test_stomp_publish_deliver_ack_nack_in_the_trail(tmp_path):
    port = _port()
    b = Broker(tmp_path, "--stomp-port", str(port))
    try:
        _wait_port(b.proc, port)
        sub = Stomp(port)
        sub.send("SUBSCRIBE", destination="/queue/orders", id="s", ack="client-individual")
        sub.sync("r0")
        pub = Stomp(port)
        pub.send("SEND", b"one", destination="/queue/orders", persistent="true")
        pub.send("SEND", b"two", destination="/queue/orders")
        pub.sync("r1")
        first, second = sub.next(), sub.next()
        sub.send("ACK", id=first.headers["ack"])
        sub.send("NACK", id=second.headers["ack"], requeue="false")
        sub.sync("r2")
        for c in (pub, sub):
            c.send("DISCONNECT")
            c.s.close()
    finally:
        records = b.stop()
    pubs = [r for r in records if r["event"] == "published" and r["routing_key"] == "orders"]
    assert [(r["exchange"], r["user"], r["connection"], r["body_size"], r["persistent"],
             r["outcome"], r["queues"]) for r in pubs] == [
        ("", "guest", pub.local, 3, True, "routed", ["orders"]),
        ("", "guest", pub.local, 3, False, "routed", ["orders"])]
    delivered = [r for r in records if r["event"] == "delivered"]
    assert [(r["queue"], r["msg"], r["consumer_tag"], r["connection"]) for r in delivered] == [
        ("orders", pubs[0]["msg"], "T_s", sub.local), ("orders", pubs[1]["msg"], "T_s", sub.local)]
    acked = [r for r in records if r["event"] == "acked"]
    assert [(r["queue"], r["msg"]) for r in acked] == [("orders", pubs[0]["msg"])]
    assert any(r["event"] == "nacked" and r["msg"] == pubs[1]["msg"] for r in records), [
        r["event"] for r in records]
