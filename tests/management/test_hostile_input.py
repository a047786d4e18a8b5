"""Valid-looking but hostile request bodies at the HTTP API (management and Hermes): deep
nesting, numbers no field can take, wrong types in fields. Each gets a 4xx naming the
problem, never a 500, and nothing is half created."""
from __future__ import annotations

import json

import pytest

from broker.management.http import MAX_JSON_DEPTH

DEEP = b"[" * 100_000 + b"]" * 100_000  # past the JSON decoder's recursion
JUST_TOO_DEEP = b'{"a":' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1)


def _reason(r) -> str:
    body = r.json()
    return body.get("reason") or body.get("message") or ""


# (method, path, a body the endpoint accepts)
ENDPOINTS = [
    ("PUT", "/api/queues/%2F/hq", {"durable": True, "arguments": {"x-max-length": 5}}),
    ("PUT", "/api/exchanges/%2F/hx", {"type": "direct", "arguments": {}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish",
     {"routing_key": "hq", "payload": "m", "payload_encoding": "string",
      "properties": {"priority": 1, "expiration": "1000", "headers": {"h": 1}}}),
    ("PUT", "/api/users/hu", {"password": "p", "tags": "management"}),
    ("PUT", "/api/vhosts/hv", {"description": "d", "tags": "a"}),
    ("PUT", "/api/permissions/%2F/guest", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 1000}),
    ("PUT", "/api/policies/%2F/hp", {"pattern": "^zz", "definition": {"max-length": 1},
                                     "priority": 1, "apply-to": "queues"}),
    ("PUT", "/api/parameters/vhost-limits/%2F/limits", {"value": {"max-queues": 1000}}),
    ("POST", "/api/definitions", {"queues": [{"name": "hdq", "vhost": "/", "durable": True,
                                              "auto_delete": False, "arguments": {}}]}),
    ("POST", "/topics", {"name": "g.ht", "maxMessageSize": 1000}),
]


@pytest.mark.parametrize("method,path,good", ENDPOINTS, ids=[e[1] for e in ENDPOINTS])
async def test_deep_json_and_huge_numbers_are_400_naming_the_problem(api, method, path, good):
    for raw in (DEEP, JUST_TOO_DEEP):
        r = await api.request(method, path, content=raw)
        assert r.status_code == 400, (raw[:20], r.status_code, r.text[:200])
        assert f"nested deeper than {MAX_JSON_DEPTH} levels" in _reason(r)
    # the first field of the good body, holding a number no field can take
    field = next(iter(good))
    for number in ("1e400", "-1e400", "NaN", str(1 << 64)):
        raw = json.dumps({**good, field: "@"}).replace('"@"', number).encode()
        r = await api.request(method, path, content=raw)
        assert r.status_code == 400, (number, r.status_code, r.text[:200])
        assert f"field '{field}': number out of range" in _reason(r), r.text
    r = await api.request(method, path, content=b'{"x": ' + b"1" * 5000 + b"}")
    assert r.status_code == 400 and "number out of range" in _reason(r)
    # the same values one level down are named with their place
    if isinstance(good.get("arguments"), dict):
        raw = json.dumps({**good, "arguments": {"x-max-length": "@"}}).replace('"@"', "1e999")
        r = await api.request(method, path, content=raw.encode())
        assert r.status_code == 400 and "'arguments.x-max-length'" in _reason(r), r.text
    # and the endpoint still works
    r = await api.request(method, path, json=good)
    assert r.status_code < 300, r.text


async def test_wrong_types_and_ranges_in_fields_are_400_naming_the_field(api):
    await api.put("/api/queues/%2F/hq", json={})
    publish = {"routing_key": "hq", "payload": "m", "payload_encoding": "string"}
    for props, field in (({"expiration": "soon"}, "properties.expiration"),
                         ({"expiration": " "}, "properties.expiration"),
                         ({"priority": 1000}, "properties.priority"),
                         ({"delivery_mode": -1}, "properties.delivery_mode"),
                         ({"timestamp": -5}, "properties.timestamp"),
                         ({"content_type": "x" * 300}, "properties.content_type")):
        r = await api.post("/api/exchanges/%2F/amq.default/publish",
                           json={**publish, "properties": props})
        assert r.status_code == 400 and f"'{field}'" in _reason(r), (props, r.text)
    assert (await api.get("/api/queues/%2F/hq")).json()["messages_ready"] == 0
    # definitions naming a queue that exists with another auto_delete: 400 before any change
    r = await api.post("/api/definitions", json={
        "exchanges": [{"name": "hdx", "vhost": "/", "type": "direct", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "queues": [{"name": "hq", "vhost": "/", "durable": True, "auto_delete": True,
                    "arguments": {}}]})
    assert r.status_code == 400 and "queues[0].auto_delete" in _reason(r), r.text
    assert (await api.get("/api/exchanges/%2F/hdx")).status_code == 404


async def test_hermes_names_and_schemas(api, http_broker):
    schema = {"type": "record", "name": "r", "fields": [{"name": "a", "type": "int"}]}
    r = await api.post("/topics", json={"name": "g.av", "contentType": "AVRO",
                                        "schema": json.dumps(schema)})
    assert r.status_code == 201, r.text
    # a schema too deep for the decoder, as a body and as a string inside a topic
    r = await api.put("/topics/g.av/schema", content=DEEP)
    assert r.status_code == 400 and "nested deeper" in _reason(r), r.text
    deep_text = '{"type":' * 5000 + '"int"' + "}" * 5000
    r = await api.post("/topics", json={"name": "g.av2", "contentType": "AVRO",
                                        "schema": deep_text})
    assert r.status_code == 400 and "schema" in _reason(r), r.text
    # a field name of the wrong JSON type
    bad = {**schema, "fields": [{"name": [], "type": "int"}]}
    r = await api.put("/topics/g.av/schema", json=bad)
    assert r.status_code == 400 and "schema" in _reason(r), r.text
    # a subscription whose queue name or consumer tag could not be an AMQP short string
    r = await api.post("/topics", json={"name": "g.ht"})
    assert r.status_code == 201
    r = await api.post("/topics/g.ht/subscriptions",
                       json={"name": "s" * 300, "endpoint": "http://127.0.0.1:1/x"})
    assert r.status_code == 400 and "name" in _reason(r), r.text
    assert not [q for q in http_broker.broker.vhosts["/"].queues if q.startswith("g.ht.")]


BAD_VALUES = [[], {}, -1, 1 << 70, 1.5, "x", " ", True, None, "x" * 300, [[[]]], {"a": {"b": []}}]


async def test_no_field_value_gets_a_500(api):
    """Every field of every endpoint above, and every key of its object fields, replaced by
    values of each JSON type."""
    await api.put("/api/queues/%2F/hq", json={})
    await api.post("/topics", json={"name": "g.ht"})
    endpoints = [
        *ENDPOINTS,
        ("POST", "/api/queues/%2F/hq/get", {"count": 1, "ackmode": "ack_requeue_true",
                                            "encoding": "auto", "truncate": 10}),
        ("POST", "/api/bindings/%2F/e/amq.direct/q/hq", {"routing_key": "k", "arguments": {}}),
        ("PUT", "/api/topic-permissions/%2F/guest", {"exchange": "amq.topic", "write": ".*",
                                                     "read": ".*"}),
        ("PUT", "/topics/g.ht", {"maxMessageSize": 2000}),
        ("POST", "/topics/g.ht/subscriptions", {"name": "s", "endpoint": "http://127.0.0.1:1/"}),
    ]
    failures = []
    for method, path, good in endpoints:
        variants = [(field, {**good, field: value}) for field in good for value in BAD_VALUES]
        # one level down too: each key of an object field (properties, arguments, value...)
        variants += [(f"{field}.{key}", {**good, field: {**inner, key: value}})
                     for field, inner in good.items() if isinstance(inner, dict)
                     for key in inner for value in BAD_VALUES]
        for where, doc in variants:
            r = await api.request(method, path, json=doc)
            if r.status_code >= 500:
                failures.append((method, path, where, r.status_code))
    assert not failures


async def test_download_name_cannot_inject_headers(api):
    for name, expected in (("x\r\nSet-Cookie: a", 'filename="x__Set-Cookie_ a"'),
                           ("défs.json", 'filename="d_fs.json"'), ("", 'filename="definitions.json"')):
        r = await api.get("/api/definitions", params={"download": name})
        assert r.status_code == 200, (name, r.status_code)
        assert r.headers["content-disposition"] == f"attachment; {expected}"
        assert "set-cookie" not in r.headers


async def test_wide_json_refused_before_decoding(api):
    """A valid body of millions of tiny objects would decode to tens of times its size."""
    wide = b"[" + b"{}," * 200_000 + b"{}]"  # 600 KB
    r = await api.put("/api/queues/%2F/wq", content=wide)
    assert r.status_code == 400 and "objects and arrays in" in _reason(r), r.text
    # a long flat array is fine, and its numbers are still checked
    r = await api.put("/api/queues/%2F/wq", json={"arguments": {"x-x": list(range(1000))}})
    assert r.status_code == 201, r.text
    r = await api.put("/api/queues/%2F/wq2", json={"arguments": {"x-x": [*range(1000), 1 << 64]}})
    assert r.status_code == 400 and "'arguments.x-x.1000'" in _reason(r), r.text


async def test_super_stream_partitions_bounded_400_naming_the_field(api, http_broker):
    from broker.streams.super import MAX_PARTITIONS
    path = "/api/stream/super-streams/%2F/hss"
    for body, field in (({"partitions": 10 ** 9}, "partitions"),
                        ({"partitions": MAX_PARTITIONS + 1}, "partitions"),
                        ({"binding_keys": [str(i) for i in range(MAX_PARTITIONS + 1)]},
                         "binding_keys")):
        r = await api.put(path, json=body)
        assert r.status_code == 400, (body.keys(), r.status_code, r.text[:200])
        assert f"field '{field}'" in _reason(r)
    assert "hss" not in http_broker.broker.vhosts["/"].exchanges
    long = "s" * 254  # its partitions "s...s-0" are 256 bytes
    r = await api.put(f"/api/stream/super-streams/%2F/{long}", json={"partitions": 2})
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert "255 bytes, actually was 256" in _reason(r)
    assert long not in http_broker.broker.vhosts["/"].exchanges


async def test_path_names_not_utf8_are_400(api, http_broker):
    """A percent-encoded name that is not UTF-8 was decoded with U+FFFD in place of the
    bytes and a different name than the one asked for was created (201)."""
    vhost = http_broker.broker.vhosts["/"]
    before = set(vhost.queues)
    for path in ("/api/queues/%2F/a%FFb", "/api/exchanges/%2F/x%C3", "/api/vhosts/v%FE",
                 "/api/stream/super-streams/%2F/s%FF"):
        body = {"partitions": 1} if "super" in path else {}
        r = await api.put(path, json=body)
        assert r.status_code == 400, (path, r.status_code, r.text[:200])
        assert "UTF-8" in _reason(r)
    assert set(vhost.queues) == before
    r = await api.put("/api/queues/%2F/" + "é" * 128, json={})  # 256 bytes: AMQP cannot name it
    assert r.status_code == 400, (r.status_code, r.text[:200])
    assert "less than 255 bytes, actually was 256" in _reason(r)
    r = await api.put("/api/queues/%2F/a%00b", json={})  # any UTF-8, as RabbitMQ
    assert r.status_code == 201, r.text[:200]
