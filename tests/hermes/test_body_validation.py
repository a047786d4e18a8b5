"""Published bodies are checked before a topic takes them, on both ports (httpx against the
broker): a JSON topic refuses a body that is not JSON, an AVRO topic refuses a JSON body
with a key its schema does not have (the Avro encoding would drop it), each with 400 and
Hermes' error body naming the problem; nothing reaches the subscription queue."""
from __future__ import annotations

import json

import httpx
import pytest

from broker.hermes.bodies import unknown_field

from .test_http import make_subscription, make_topic

NESTED = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "string"},
    {"name": "lines", "type": {"type": "array", "items": {
        "type": "record", "name": "Line", "fields": [{"name": "sku", "type": "string"}]}}},
    {"name": "note", "type": ["null", {"type": "record", "name": "Note",
                                       "fields": [{"name": "text", "type": "string"}]}],
     "default": None},
    {"name": "tags", "type": {"type": "map", "values": "Line"}, "default": {}}]}


def _order(**extra):
    return {"id": "o1", "lines": [{"sku": "a"}], "note": None, "tags": {}, **extra}


@pytest.mark.parametrize("port_name", ["management", "frontend"])
async def test_json_topic_refuses_a_body_that_is_not_json(hermes_broker, port_name):
    http = hermes_broker.http
    await make_topic(http)
    await make_subscription(http, "shop.orders", "s", "http://127.0.0.1:9/x", state="SUSPENDED")
    port = (hermes_broker.broker.http_server.port if port_name == "management"
            else hermes_broker.hermes.frontend.port)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                 auth=("guest", "guest")) as client:
        for body, why in ((b"not json", "Expecting value: line 1 column 1 (char 0)"),
                          (b'{"id": 1', "Expecting ',' delimiter"),
                          (b'{"id": 1} trailing', "Extra data"),
                          (b"\xff\xfe", "invalid JSON")):
            r = await client.post("/topics/shop.orders", content=body,
                                  headers={"Content-Type": "application/json"})
            assert r.status_code == 400, (body, r.text)
            err = r.json()
            assert err["code"] == "VALIDATION_ERROR"
            assert err["message"].startswith("Invalid message: invalid JSON") and why in err["message"]
        r = await client.post("/topics/shop.orders", content=b'{"id": 1}',
                              headers={"Content-Type": "application/json"})
        assert r.status_code == 201, r.text
        r = await client.post("/topics/shop.orders", content=b'"a JSON string"')
        assert r.status_code == 201, r.text  # any JSON document, as Hermes' JSON topics
    assert hermes_broker.vhost.queues["shop.orders.s"].message_count == 2


@pytest.mark.parametrize("port_name", ["management", "frontend"])
async def test_avro_topic_refuses_unknown_fields(hermes_broker, port_name):
    http = hermes_broker.http
    await make_topic(http, name="shop.avro", contentType="AVRO", schema=json.dumps(NESTED))
    await make_subscription(http, "shop.avro", "s", "http://127.0.0.1:9/x", state="SUSPENDED")
    port = (hermes_broker.broker.http_server.port if port_name == "management"
            else hermes_broker.hermes.frontend.port)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                 auth=("guest", "guest")) as client:
        for datum, path in ((_order(colour="red"), "colour"),
                            (_order(lines=[{"sku": "a"}, {"sku": "b", "qty": 2}]), "lines[1].qty"),
                            (_order(note={"text": "t", "by": "me"}), "note.by"),
                            (_order(tags={"k": {"sku": "x", "size": 1}}), "tags.k.size")):
            r = await client.post("/topics/shop.avro", json=datum)
            assert r.status_code == 400, (datum, r.text)
            assert r.json() == {"message": "Invalid message: Failed to convert JSON to Avro: "
                                           f"Field {path} is unknown",
                                "code": "VALIDATION_ERROR"}
        r = await client.post("/topics/shop.avro", json=_order(note={"text": "t"},
                                                               tags={"k": {"sku": "x"}}))
        assert r.status_code == 201, r.text
    assert hermes_broker.vhost.queues["shop.avro.s"].message_count == 1


def test_unknown_field_walks_named_types_and_unions():
    assert unknown_field(NESTED, json.dumps(_order()).encode()) is None
    assert unknown_field(NESTED, b"not json") is None  # the schema's validation says why
    recursive = {"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"}, {"name": "next", "type": ["null", "Node"]}]}
    good = {"v": 1, "next": {"v": 2, "next": None}}
    assert unknown_field(recursive, json.dumps(good).encode()) is None
    bad = {"v": 1, "next": {"v": 2, "next": {"v": 3, "x": 0, "next": None}}}
    assert unknown_field(recursive, json.dumps(bad).encode()) == "next.next.x"
    either = ["null", {"type": "map", "values": "int"}]
    assert unknown_field(either, b'{"anything": 1}') is None  # a map takes any key
