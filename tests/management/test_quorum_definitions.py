"""Quorum queues through the management API: PUT with "type", the listing's type and
members, definitions export and import (a RabbitMQ export holding a quorum queue), and
import refusing what the type refuses."""
from __future__ import annotations

import json

# A RabbitMQ 3.10 definitions export with one quorum queue (trimmed to the entities).
RABBIT_EXPORT = {
    "rabbit_version": "3.10.7",
    "vhosts": [{"name": "/"}],
    "queues": [{"name": "orders", "vhost": "/", "durable": True, "auto_delete": False,
                "arguments": {"x-queue-type": "quorum", "x-delivery-limit": 5,
                              "x-dead-letter-strategy": "at-least-once",
                              "x-overflow": "reject-publish",
                              "x-quorum-initial-group-size": 3}}],
    "exchanges": [], "bindings": [], "policies": [],
}


async def test_rabbitmq_export_with_a_quorum_queue_imports(api, http_broker):
    r = await api.post("/api/definitions", content=json.dumps(RABBIT_EXPORT))
    assert r.status_code == 204, r.text
    q = http_broker.broker.vhosts["/"].queues["orders"]
    assert q.queue_type.name == "quorum" and q.opts.extra["x-delivery-limit"] == 5
    listed = (await api.get("/api/queues/%2F/orders")).json()
    assert listed["type"] == "quorum" and listed["members"] == [listed["node"]]
    exported = (await api.get("/api/definitions")).json()
    (entry,) = [e for e in exported["queues"] if e["name"] == "orders"]
    assert entry["arguments"]["x-queue-type"] == "quorum" and entry["durable"] is True
    # the export imports again unchanged (equivalent)
    r = await api.post("/api/definitions", content=json.dumps(exported))
    assert r.status_code == 204, r.text


async def test_import_with_a_type_field_and_refusals(api, http_broker):
    defs = {"queues": [{"name": "typed", "vhost": "/", "durable": True, "type": "quorum",
                        "arguments": {}}]}
    r = await api.post("/api/definitions", content=json.dumps(defs))
    assert r.status_code == 204, r.text
    assert http_broker.broker.vhosts["/"].queues["typed"].queue_type.name == "quorum"
    bad = {"queues": [{"name": "transient", "vhost": "/", "durable": False,
                       "arguments": {"x-queue-type": "quorum"}}]}
    r = await api.post("/api/definitions", content=json.dumps(bad))
    assert r.status_code == 400
    assert "invalid property 'non-durable' for queue 'transient'" in r.json()["reason"]
    assert "transient" not in http_broker.broker.vhosts["/"].queues


async def test_put_queue_with_type(api, http_broker):
    r = await api.put("/api/queues/%2F/qq", json={"durable": True, "type": "quorum"})
    assert r.status_code == 201, r.text
    assert (await api.get("/api/queues/%2F/qq")).json()["type"] == "quorum"
    r = await api.put("/api/queues/%2F/qt", json={"durable": False, "type": "quorum"})
    assert r.status_code == 400 and "non-durable" in r.json()["reason"], r.text
    r = await api.put("/api/queues/%2F/qc", json={"durable": True})
    assert (await api.get("/api/queues/%2F/qc")).json()["type"] == "classic"
