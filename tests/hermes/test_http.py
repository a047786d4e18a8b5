"""Hermes' HTTP API on the broker's HTTP listener: topics, subscriptions, publishing
(201/202/400/404/413), push delivery with retries, and AMQP <-> HTTP both ways."""
from __future__ import annotations

import json

import httpx
import trio

from broker.amqp import spec

from ..support import TrioClient

ORDER_SCHEMA = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"}, {"name": "qty", "type": "int"}]}


async def make_topic(http, name="shop.orders", **fields):
    body = {"name": name, "description": "d", "contentType": "JSON",
            "owner": {"source": "Plaintext", "id": "team"}, **fields}
    r = await http.post("/topics", json=body)
    assert r.status_code == 201, r.text
    return r.json()


async def make_subscription(http, topic, name, endpoint, **fields):
    r = await http.post(f"/topics/{topic}/subscriptions",
                        json={"name": name, "topicName": topic, "endpoint": endpoint, **fields})
    assert r.status_code == 201, r.text
    return r.json()


async def test_topic_management(hermes_broker):
    http = hermes_broker.http
    t = await make_topic(http)
    assert t["name"] == "shop.orders" and t["groupName"] == "shop" and t["ack"] == "ALL"
    assert (await http.get("/topics")).json() == ["shop.orders"]
    assert (await http.post("/topics", json={"name": "shop.orders"})).status_code == 409
    r = await http.post("/topics", json={"name": "nodot"})
    assert r.status_code == 400 and r.json()["message"].startswith("name:")
    r = await http.post("/topics", json={"name": "a.b", "contentType": "XML"})
    assert r.status_code == 400 and "contentType" in r.json()["message"]
    r = await http.post("/topics", json={"name": "a.b", "contentType": "AVRO"})
    assert r.status_code == 400 and "schema" in r.json()["message"]
    r = await http.put("/topics/shop.orders", json={"ack": "LEADER", "description": "x"})
    assert r.status_code == 200 and r.json()["ack"] == "LEADER"
    assert (await http.get("/topics/shop.nope")).status_code == 404
    # the topic is an exchange, visible as such
    x = hermes_broker.vhost.exchanges["shop.orders"]
    assert x.type_name == "topic" and x.durable
    await make_subscription(http, "shop.orders", "s1", "http://127.0.0.1:9/x")
    assert (await http.delete("/topics/shop.orders")).status_code == 403
    assert (await http.delete("/topics/shop.orders/subscriptions/s1")).status_code == 200
    assert "shop.orders.s1" not in hermes_broker.vhost.queues
    assert (await http.delete("/topics/shop.orders")).status_code == 200
    assert "shop.orders" not in hermes_broker.vhost.exchanges


async def test_publish_codes(hermes_broker):
    http = hermes_broker.http
    await make_topic(http, maxMessageSize=100)
    await make_topic(http, name="shop.fast", ack="LEADER")
    await make_subscription(http, "shop.orders", "s", "http://127.0.0.1:9/x",
                            state="SUSPENDED")
    await make_subscription(http, "shop.fast", "s", "http://127.0.0.1:9/x", state="SUSPENDED")
    r = await http.post("/topics/shop.orders", content=b'{"a": 1}',
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 201 and len(r.headers["Hermes-Message-Id"]) == 36
    mid = r.headers["Hermes-Message-Id"]
    assert (await http.post("/topics/shop.fast", content=b"{}")).status_code == 202
    r = await http.post("/topics/shop.orders", content=b"x" * 101)
    assert r.status_code == 413
    r = await http.post("/topics/shop.none", content=b"{}")
    assert r.status_code == 404 and r.json()["code"] == "TOPIC_NOT_FOUND"
    q = hermes_broker.vhost.queues["shop.orders.s"]
    assert q.message_count == 1
    entry = q.ready.peek()
    assert entry.message.properties["message_id"] == mid
    assert entry.message.persistent and q.durable


async def test_avro_topic(hermes_broker):
    http = hermes_broker.http
    await make_topic(http, name="shop.avro", contentType="AVRO", schema=json.dumps(ORDER_SCHEMA))
    await make_subscription(http, "shop.avro", "s", "http://127.0.0.1:9/x", state="SUSPENDED")
    r = await http.post("/topics/shop.avro", json={"id": "o1", "qty": 2})
    assert r.status_code == 201, r.text
    r = await http.post("/topics/shop.avro", json={"id": "o1", "qty": "two"})
    assert r.status_code == 400
    assert "field 'qty'" in r.json()["message"]
    q = hermes_broker.vhost.queues["shop.avro.s"]
    [entry] = list(q.ready)
    assert entry.message.properties["content_type"] == "avro/binary"
    assert entry.message.body == b"\x04o1\x04"  # Avro binary: string "o1", int 2
    # schema evolution: a field without a default is refused, with one accepted
    bad = dict(ORDER_SCHEMA, fields=[*ORDER_SCHEMA["fields"], {"name": "note", "type": "string"}])
    r = await http.post("/topics/shop.avro/schema", content=json.dumps(bad))
    assert r.status_code == 400 and "'note' was added without a default" in r.json()["message"]
    good = dict(ORDER_SCHEMA, fields=[*ORDER_SCHEMA["fields"],
                                      {"name": "note", "type": ["null", "string"], "default": None}])
    assert (await http.post("/topics/shop.avro/schema", content=json.dumps(good))).status_code == 201
    assert (await http.get("/topics/shop.avro")).json()["schemaVersion"] == 2


async def test_push_and_retries(hermes_broker, endpoint):
    http = hermes_broker.http
    await make_topic(http)
    endpoint.script = [500, (200, 0)]
    await make_subscription(http, "shop.orders", "push", endpoint.url,
                            subscriptionPolicy={"messageBackoff": 10, "rate": 1000})
    r = await http.post("/topics/shop.orders", content=b'{"n": 1}')
    mid = r.headers["Hermes-Message-Id"]
    await endpoint.wait_for(lambda e: len(e.ok) == 1)
    first, second = endpoint.received
    assert first.status == 500 and second.status == 200
    assert second.body == b'{"n": 1}'
    assert second.headers["hermes-message-id"] == mid
    assert first.headers["hermes-retry-count"] == "0" and second.headers["hermes-retry-count"] == "1"
    assert second.headers["hermes-topic-name"] == "shop.orders"
    assert second.headers["hermes-subscription-name"] == "push"
    q = hermes_broker.vhost.queues["shop.orders.push"]
    with trio.fail_after(5):
        while q.unacked_count:  # noqa: ASYNC110 - the queue has no event to wait on
            await trio.sleep(0.01)
    assert q.message_count == 0


async def test_amqp_and_http_both_ways(hermes_broker, endpoint):
    http = hermes_broker.http
    await make_topic(http)
    await make_subscription(http, "shop.orders", "push", endpoint.url)
    c = await TrioClient.connect(hermes_broker.port)
    await c.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    # an AMQP consumer of its own queue bound to the topic's exchange
    await c.call(1, spec.Queue.Declare(queue="amqp-side"), spec.Queue.DeclareOk)
    await c.call(1, spec.Queue.Bind(queue="amqp-side", exchange="shop.orders", routing_key="#"),
                 spec.Queue.BindOk)
    await c.call(1, spec.Basic.Consume(queue="amqp-side", no_ack=True), spec.Basic.ConsumeOk)
    # HTTP -> AMQP consumer (and the push endpoint)
    r = await http.post("/topics/shop.orders", content=b'{"from": "http"}')
    assert r.status_code == 201
    d = await c.expect(spec.Basic.Deliver)
    assert d.body == b'{"from": "http"}' and d.properties["message_id"] == r.headers["Hermes-Message-Id"]
    # AMQP publish -> push endpoint
    await c.publish(1, b'{"from": "amqp"}', exchange="shop.orders", routing_key="x")
    await endpoint.wait_for(lambda e: len(e.ok) == 2)
    assert sorted(r.body for r in endpoint.ok) == [b'{"from": "amqp"}', b'{"from": "http"}']
    await c.aclose()


async def test_authentication_and_permissions(hermes_broker):
    http = hermes_broker.http
    base = str(http.base_url)
    await make_topic(http)
    access = hermes_broker.broker.access
    # a management user who may only write to shop.* exchanges and configure nothing
    access.add_user("h7-producer", "secret", tags=["management"])
    access.set_permissions("h7-producer", "/", "^$", "^shop\\..*", "^$")
    async with httpx.AsyncClient(base_url=base) as anonymous:
        r = await anonymous.get("/topics")
        assert r.status_code == 401 and r.json()["error"] == "not_authorized"
    async with httpx.AsyncClient(base_url=base, auth=("h7-producer", "secret")) as producer:
        assert (await producer.get("/topics")).json() == ["shop.orders"]
        assert (await producer.post("/topics/shop.orders", content=b"{}")).status_code == 201
        r = await producer.post("/topics", json={"name": "shop.more"})
        assert r.status_code == 403
        assert r.json()["message"] == ("ACCESS_REFUSED - access to exchange 'shop.more' in vhost '/' "
                                     "refused for user 'h7-producer'")
        r = await producer.delete("/topics/shop.orders")
        assert r.status_code == 403
    assert "shop.orders" in hermes_broker.hermes.topics


async def test_overload_and_a_deleted_exchange(hermes_broker):
    http = hermes_broker.http
    broker = hermes_broker.broker
    await make_topic(http)
    await make_subscription(http, "shop.orders", "s", "http://127.0.0.1:9/x", state="SUSPENDED")
    broker.set_alarm("memory", True)
    try:
        r = await http.post("/topics/shop.orders", content=b"{}")
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert "memory" in r.json()["message"]
    finally:
        broker.set_alarm("memory", False)
    # an AMQP client deleted the topic's exchange: it comes back, with the subscription's binding
    hermes_broker.vhost.delete_exchange("shop.orders")
    assert (await http.post("/topics/shop.orders", content=b"{}")).status_code == 201
    assert hermes_broker.vhost.queues["shop.orders.s"].message_count == 1
