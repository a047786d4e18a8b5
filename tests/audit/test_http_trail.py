"""HTTP publishes in the audit trail, as AMQP and MQTT ones: a publish through the management
API and one through Hermes' topic API each leave a "published" event with the user and the
queues that took it (a real broker process, httpx, the Avro files read back)."""
from __future__ import annotations

import httpx
import pytest

from .test_mqtt_trail import Broker, hermes_topic


@pytest.mark.timeout(120)
def test_api_and_hermes_publishes_are_published_events(tmp_path):
    b = Broker(tmp_path)
    try:
        http = httpx.Client(base_url=f"http://127.0.0.1:{b.http_port}", auth=("guest", "guest"))
        assert http.put("/api/queues/%2F/hq", json={"durable": True}).status_code in (201, 204)
        for key in ("hq", "nowhere"):
            r = http.post("/api/exchanges/%2F/amq.default/publish", json={
                "routing_key": key, "payload": "hello", "payload_encoding": "string",
                "properties": {"message_id": f"api-{key}", "delivery_mode": 2}})
            assert r.status_code == 200, r.text
        hermes_topic(http, "shop.json", "JSON")
        r = http.post("/topics/shop.json", content=b'{"id": 1}',
                      headers={"content-type": "application/json"})
        assert r.status_code in (201, 202), r.text
        hermes_id = r.headers["Hermes-Message-Id"]
    finally:
        records = b.stop()
    pubs = [r for r in records if r["event"] == "published"]
    assert [(r["exchange"], r["routing_key"], r["message_id"], r["user"], r["outcome"],
             r["queues"], r["persistent"], r["body_size"]) for r in pubs] == [
        ("", "hq", "api-hq", "guest", "routed", ["hq"], True, 5),
        ("", "nowhere", "api-nowhere", "guest", "unroutable", [], True, 5),
        ("shop.json", "shop.json", hermes_id, "guest", "routed", ["shop.json.s"], True, 9)]
    assert all(r["connection"] == "127.0.0.1" and r["channel"] is None for r in pubs)
