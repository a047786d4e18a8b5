"""A vhost's default_queue_type (RabbitMQ 3.11+ vhost metadata), set with
``PUT /api/vhosts/{name}`` or in definitions: a durable, non-exclusive, non-auto-delete,
client-named declare without x-queue-type makes a queue of that type (pika and the HTTP
API); every other declare stays classic, as RabbitMQ's augment_declare_args. Before, the
setting was stored and listed but every such queue was classic."""
from __future__ import annotations

import json

import pika
import trio


def _declares(port: int) -> str:
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, "dqt", pika.PlainCredentials("guest", "guest")))
    try:
        ch = conn.channel()
        ch.queue_declare("durable-q", durable=True)
        ch.queue_declare("durable-q", durable=True)  # redeclared without the type: same queue
        ch.queue_declare("explicit-classic", durable=True, arguments={"x-queue-type": "classic"})
        ch.queue_declare("transient-q", durable=False)
        ch.queue_declare("auto-delete-q", durable=True, auto_delete=True)
        ch.queue_declare("exclusive-q", durable=True, exclusive=True)
        named = ch.queue_declare("", durable=True).method.queue
        return json.dumps({"named": named})
    finally:
        conn.close()


async def _types(api) -> dict:
    return {q["name"]: q["type"] for q in (await api.get("/api/queues/dqt")).json()}


async def test_default_queue_type_from_the_http_api(api, http_broker):
    r = await api.put("/api/vhosts/dqt", json={"default_queue_type": "quorum"})
    assert r.status_code == 201
    assert (await api.get("/api/vhosts/dqt")).json()["default_queue_type"] == "quorum"
    named = json.loads(await trio.to_thread.run_sync(_declares, http_broker.amqp_port))["named"]
    types = await _types(api)
    assert types["durable-q"] == "quorum"
    assert types["explicit-classic"] == "classic"
    assert types["transient-q"] == "classic"
    assert types["auto-delete-q"] == "classic"
    assert "exclusive-q" not in types  # gone with its connection (it was classic: declared)
    assert types[named] == "classic"
    # the management API's declare is augmented too
    assert (await api.put("/api/queues/dqt/http-q", json={"durable": True})).status_code == 201
    assert (await _types(api))["http-q"] == "quorum"
    q = (await api.get("/api/queues/dqt/http-q")).json()
    assert q["arguments"] == {"x-queue-type": "quorum"}


async def test_default_queue_type_from_definitions(api, http_broker):
    defs = {"vhosts": [{"name": "dqt", "description": "", "tags": [],
                        "metadata": {"description": "", "tags": [],
                                     "default_queue_type": "quorum"}}],
            "permissions": [{"user": "guest", "vhost": "dqt", "configure": ".*",
                             "write": ".*", "read": ".*"}]}
    r = await api.post("/api/definitions", content=json.dumps(defs))
    assert r.status_code in (200, 201, 204), r.text
    await trio.to_thread.run_sync(_declares, http_broker.amqp_port)
    assert (await _types(api))["durable-q"] == "quorum"
    exported = (await api.get("/api/definitions")).json()
    (vhost,) = [v for v in exported["vhosts"] if v["name"] == "dqt"]
    assert vhost["metadata"]["default_queue_type"] == "quorum"


async def test_no_default_keeps_classic(api, http_broker):
    assert (await api.put("/api/vhosts/dqt", json={})).status_code == 201
    await trio.to_thread.run_sync(_declares, http_broker.amqp_port)
    assert set((await _types(api)).values()) == {"classic"}
