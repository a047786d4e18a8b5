"""The management HTTP API against an in-process broker, with a real HTTP client (httpx)."""
from __future__ import annotations

import json
import socket
from urllib.parse import quote

import trio

from broker.amqp import spec

from ..support import TrioClient


async def test_whoami_and_auth_failures(api, http_broker):
    r = await api.get("/api/whoami")
    assert r.json() == {"name": "guest", "tags": ["administrator"]}
    async with http_broker.client("guest", "wrong") as bad:
        r = await bad.get("/api/overview")
    assert r.status_code == 401
    assert r.json() == {"error": "not_authorized", "reason": "Login failed"}
    assert r.headers["www-authenticate"].startswith("Basic")
    async with http_broker.client("nobody", "x") as bad:
        assert (await bad.get("/api/overview")).json() == r.json()  # never says which
    r = await api.get("/api/no/such/thing")
    assert r.status_code == 404 and r.json() == {"error": "Object Not Found", "reason": "Not Found"}


async def test_queue_life_cycle_with_encoded_vhost(api):
    r = await api.put("/api/queues/%2F/orders", json={"durable": True, "arguments": {"x-max-length": 5}})
    assert r.status_code == 201
    assert (await api.put("/api/queues/%2F/orders", json={"durable": True,
                                                          "arguments": {"x-max-length": 5}})).status_code == 204
    r = await api.put("/api/queues/%2F/orders", json={"durable": False})
    assert r.status_code == 400
    assert r.json()["reason"] == ("inequivalent arg 'durable' for queue 'orders' in vhost '/': "
                                  "received 'false' but current is 'true'")
    q = (await api.get("/api/queues/%2F/orders")).json()
    assert q["name"] == "orders" and q["vhost"] == "/" and q["durable"] is True
    assert q["arguments"] == {"x-max-length": 5}
    assert q["messages"] == 0 and q["consumer_details"] == []
    r = await api.post("/api/exchanges/%2F/amq.default/publish",
                       json={"routing_key": "orders", "payload": "hi", "payload_encoding": "string",
                             "properties": {"delivery_mode": 2, "headers": {"a": 1}}})
    assert r.json() == {"routed": True}
    r = await api.post("/api/exchanges/%2F/amq.default/publish",
                       json={"routing_key": "orders", "payload": "/w==", "payload_encoding": "base64",
                             "properties": {}})
    assert r.json() == {"routed": True}
    got = (await api.post("/api/queues/%2F/orders/get",
                          json={"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})).json()
    assert [m["payload"] for m in got] == ["hi", "/w=="]
    assert [m["payload_encoding"] for m in got] == ["string", "base64"]
    assert got[0]["properties"]["headers"] == {"a": 1} and got[0]["properties"]["delivery_mode"] == 2
    # requeued: still there, now redelivered
    got = (await api.post("/api/queues/%2F/orders/get",
                          json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})).json()
    assert got[0]["redelivered"] is True and got[0]["message_count"] == 1
    assert (await api.get("/api/queues/%2F/orders")).json()["messages"] == 1
    assert (await api.delete("/api/queues/%2F/orders/contents")).status_code == 204
    assert (await api.get("/api/queues/%2F/orders")).json()["messages"] == 0
    assert (await api.delete("/api/queues/%2F/orders")).status_code == 204
    assert (await api.get("/api/queues/%2F/orders")).status_code == 404
    r = await api.post("/api/queues/%2F/orders/get", json={"count": 1, "ackmode": "ack_requeue_true",
                                                           "encoding": "auto"})
    assert r.status_code == 404
    assert r.json()["reason"] == "NOT_FOUND - no queue 'orders' in vhost '/'"


async def test_exchanges_bindings_and_properties_key(api):
    assert (await api.put("/api/exchanges/%2F/ev", json={"type": "topic"})).status_code == 201
    assert (await api.put("/api/queues/%2F/q1", json={})).status_code == 201
    r = await api.post("/api/bindings/%2F/e/ev/q/q1", json={"routing_key": "a.# x~y"})
    assert r.status_code == 201 and r.headers["location"] == "a.%23+x%7Ey"
    r = await api.post("/api/bindings/%2F/e/ev/q/q1", json={"routing_key": "k", "arguments": {"z": 1}})
    assert r.status_code == 201
    pair = (await api.get("/api/bindings/%2F/e/ev/q/q1")).json()
    assert sorted(b["routing_key"] for b in pair) == ["a.# x~y", "k"]
    queue_side = (await api.get("/api/queues/%2F/q1/bindings")).json()
    assert {b["source"] for b in queue_side} == {"", "ev"}  # the default exchange's implicit one
    source = (await api.get("/api/exchanges/%2F/ev/bindings/source")).json()
    assert len(source) == 2
    r = await api.post("/api/exchanges/%2F/ev/publish", json={
        "routing_key": "k", "payload": "m", "payload_encoding": "string", "properties": {}})
    assert r.json() == {"routed": True}
    for b in pair:  # the key goes into the path encoded once more, as rabbitmqadmin does
        path = "/api/bindings/%2F/e/ev/q/q1/" + quote(b["properties_key"], safe="")
        assert (await api.get(path)).status_code == 200
        assert (await api.delete(path)).status_code == 204
    assert (await api.get("/api/bindings/%2F/e/ev/q/q1")).json() == []
    assert (await api.delete("/api/exchanges/%2F/amq.direct")).status_code == 401
    assert (await api.put("/api/exchanges/%2F/amq.mine", json={"type": "direct"})).status_code == 401
    r = await api.put("/api/exchanges/%2F/bad", json={"type": "nope"})
    assert r.status_code == 400 and r.json()["reason"] == "unknown exchange type 'nope'"
    assert (await api.delete("/api/exchanges/%2F/ev")).status_code == 204
    assert (await api.get("/api/exchanges/%2F/ev")).status_code == 404
    assert (await api.get("/api/exchanges/nosuch")).json()["reason"] == "Not Found"
    r = await api.put("/api/exchanges/nosuch/x", json={"type": "direct"})
    assert r.status_code == 404 and r.json()["reason"] == "vhost_not_found"


async def test_bad_input_names_the_field(api):
    r = await api.put("/api/queues/%2F/x", content=b"{bad")
    assert r.status_code == 400 and r.json() == {"error": "bad_request", "reason": "not_json"}
    r = await api.put("/api/queues/%2F/x", json={"durable": True, "bogus": 1})
    assert r.status_code == 400 and "'bogus'" in r.json()["reason"]
    r = await api.put("/api/queues/%2F/x", json={"durable": "maybe"})
    assert r.status_code == 400 and "'durable'" in r.json()["reason"]
    r = await api.put("/api/queues/%2F/x", json={"arguments": {"x-max-length": "a"}})
    assert r.status_code == 400 and "x-max-length" in r.json()["reason"]
    r = await api.put("/api/users/u1", json={"password": "p", "tags": "administrator"})
    assert r.status_code == 201
    r = await api.put("/api/permissions/%2F/u1", json={"configure": "(", "write": ".*", "read": ".*"})
    assert r.status_code == 400 and "configure" in r.json()["reason"]
    r = await api.put("/api/users/u2", json={"password": "p", "tags": "wizard"})
    assert r.status_code == 400 and "tags" in r.json()["reason"]
    r = await api.post("/api/exchanges/%2F/amq.default/publish", json={
        "routing_key": "x", "payload": "m", "payload_encoding": "string",
        "properties": {"delivery_mode": "two"}})
    assert r.status_code == 400 and "delivery_mode" in r.json()["reason"]
    r = await api.put("/api/policies/%2F/p1", json={"pattern": "(", "definition": {"max-length": 1}})
    assert r.status_code == 400 and "pattern" in r.json()["reason"]
    assert (await api.get("/api/queues/%2F/x")).status_code == 404  # nothing was created


async def test_limits_cut_oversized_and_slow_bodies(nursery, tmp_path):
    from .conftest import start_http_broker
    hb = await start_http_broker(nursery, tmp_path, http_max_body=1000, http_timeout=0.5)
    async with hb.client() as api:
        r = await api.put("/api/queues/%2F/big", content=b" " * 5000)
        assert r.status_code == 413
    # a client that sends half a body and stalls is answered 408 and cut off
    stream = await trio.open_tcp_stream("127.0.0.1", hb.http_port)
    await stream.send_all(b"PUT /api/queues/%2F/slow HTTP/1.1\r\nhost: x\r\n"
                          b"authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\ncontent-length: 100\r\n\r\n{")
    with trio.fail_after(5):
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(4096)
    assert data.startswith(b"HTTP/1.1 408")
    await stream.aclose()
    # AMQP was not disturbed meanwhile
    client = await TrioClient.connect(hb.amqp_port)
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.aclose()
    await hb.server.shutdown()


async def test_pagination_filter_sort_columns(api, http_broker):
    for i in range(12):
        assert (await api.put(f"/api/queues/%2F/page-{i:02d}", json={})).status_code == 201
    r = (await api.get("/api/queues?page=2&page_size=5&name=PAGE")).json()
    assert r["filtered_count"] == 12 and r["total_count"] == 12 and r["page_count"] == 3
    assert [q["name"] for q in r["items"]] == [f"page-{i:02d}" for i in range(5, 10)]
    r = (await api.get("/api/queues?page=1&page_size=3&sort=name&sort_reverse=true"
                       "&columns=name,vhost")).json()
    assert r["items"] == [{"name": f"page-{i:02d}", "vhost": "/"} for i in (11, 10, 9)]
    r = (await api.get("/api/queues?page=1&use_regex=true&name=^page-0[12]$")).json()
    assert [q["name"] for q in r["items"]] == ["page-01", "page-02"]
    plain = (await api.get("/api/queues/%2F?columns=name,message_stats.publish")).json()
    assert plain[0] == {"name": "page-00", "message_stats": {"publish": 0}}
    r = await api.get("/api/queues?page=0")
    assert r.status_code == 400 and r.json()["error"] == "invalid_pagination_parameters"
    r = await api.get("/api/queues?page=1&page_size=501")
    assert r.status_code == 400
    r = await api.get("/api/queues?page=9")
    assert r.status_code == 400 and r.json()["error"] == "page_out_of_range"
    r = await api.get("/api/queues?page=1&use_regex=true&name=(")
    assert r.status_code == 400
    r = (await api.get("/api/queues?sort=messages&columns=name")).json()
    assert len(r) == 12


async def test_connections_channels_consumers_and_close(api, http_broker):
    client = await TrioClient.connect(http_broker.amqp_port)
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.call(1, spec.Queue.Declare(queue="cq"), spec.Queue.DeclareOk)
    await client.call(1, spec.Basic.Qos(prefetch_count=7), spec.Basic.QosOk)
    await client.call(1, spec.Basic.Consume(queue="cq", consumer_tag="t1"), spec.Basic.ConsumeOk)
    conns = (await api.get("/api/connections")).json()
    assert len(conns) == 1 and conns[0]["user"] == "guest" and conns[0]["vhost"] == "/"
    assert conns[0]["channels"] == 1 and conns[0]["protocol"] == "AMQP 0-9-1"
    chans = (await api.get("/api/channels")).json()
    assert chans[0]["consumer_count"] == 1 and chans[0]["prefetch_count"] == 7
    cons = (await api.get("/api/consumers")).json()
    assert cons[0]["consumer_tag"] == "t1" and cons[0]["queue"] == {"name": "cq", "vhost": "/"}
    assert cons[0]["channel_details"]["connection_name"] == conns[0]["name"]
    q = (await api.get("/api/queues/%2F/cq")).json()
    assert q["consumers"] == 1 and q["consumer_details"][0]["prefetch_count"] == 7
    r = await api.delete("/api/connections/" + quote(conns[0]["name"], safe=""),
                         headers={"X-Reason": "maintenance"})
    assert r.status_code == 204
    close = await client.expect(spec.Connection.Close)
    assert close.method.reply_code == 320 and close.method.reply_text == "CONNECTION_FORCED - maintenance"
    await client.aclose()


async def test_rates_and_overview(api, http_broker):
    sampler = http_broker.broker.stats_sampler
    client = await TrioClient.connect(http_broker.amqp_port)
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.call(1, spec.Queue.Declare(queue="rq"), spec.Queue.DeclareOk)
    sampler.sample()
    for _ in range(50):
        await client.publish(1, b"x", routing_key="rq")
    await client.call(1, spec.Queue.Declare(queue="rq", passive=True), spec.Queue.DeclareOk)
    sampler.sample()
    q = (await api.get("/api/queues/%2F/rq")).json()
    assert q["messages_ready"] == 50
    assert q["message_stats"]["publish"] == 50 and q["message_stats"]["publish_details"]["rate"] > 0
    ov = (await api.get("/api/overview?msg_rates_age=60")).json()
    assert ov["message_stats"]["publish"] == 50 and ov["queue_totals"]["messages_ready"] == 50
    assert ov["object_totals"]["queues"] == 1 and ov["object_totals"]["connections"] == 1
    assert len(ov["samples"]) >= 2 and ov["samples"][-1]["publish"] == 50
    assert (await api.get("/api/nodes")).json()[0]["name"] == "triomq@localhost"
    vhost = (await api.get("/api/vhosts/%2F")).json()
    assert vhost["message_stats"]["publish"] == 50
    assert vhost["message_stats"]["publish_details"]["rate"] > 0
    await client.aclose()
    with trio.fail_after(5):  # the closed channel's counters stay in the totals
        while http_broker.broker.sessions:  # noqa: ASYNC110 - a short poll in a test
            await trio.sleep(0.01)
    assert http_broker.broker.message_totals.current()["publish"] == 50


async def test_metrics(api, http_broker):
    assert (await api.put("/api/queues/%2F/mq", json={})).status_code == 201
    await api.post("/api/exchanges/%2F/amq.default/publish", json={
        "routing_key": "mq", "payload": "m", "payload_encoding": "string", "properties": {}})
    async with http_broker.client() as c:
        text = (await c.get("/metrics/per-object")).text
    assert 'rabbitmq_queue_messages_ready{queue="mq",vhost="/"} 1.0' in text
    for name in ("rabbitmq_connections", "rabbitmq_channels", "rabbitmq_consumers",
                 "rabbitmq_global_messages_received_total", "rabbitmq_global_messages_delivered_total",
                 "rabbitmq_global_messages_acknowledged_total", "rabbitmq_alarms_memory_used_watermark",
                 "rabbitmq_queue_messages_unacked"):
        assert name in text, name


async def test_health_and_aliveness(api, http_broker):
    assert (await api.get("/api/aliveness-test/%2F")).json() == {"status": "ok"}
    assert (await api.get("/api/health/checks/alarms")).json() == {"status": "ok"}
    assert (await api.get("/api/health/checks/virtual-hosts")).status_code == 200
    r = await api.get(f"/api/health/checks/port-listener/{http_broker.amqp_port}")
    assert r.status_code == 200
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    assert (await api.get(f"/api/health/checks/port-listener/{unused}")).status_code == 503
    http_broker.broker.set_alarm("memory", True)
    r = await api.get("/api/health/checks/local-alarms")
    assert r.status_code == 503 and r.json()["status"] == "failed"
    http_broker.broker.set_alarm("memory", False)


async def test_definitions_round_trip_and_atomic_import(api, http_broker):
    await api.put("/api/vhosts/dev", json={"description": "d"})
    await api.put("/api/users/alice", json={"password": "pw", "tags": "management"})
    await api.put("/api/permissions/dev/alice", json={"configure": ".*", "write": ".*", "read": ".*"})
    await api.put("/api/exchanges/dev/x1", json={"type": "fanout", "durable": True})
    await api.put("/api/queues/dev/q1", json={"durable": True, "arguments": {"x-message-ttl": 1000}})
    await api.post("/api/bindings/dev/e/x1/q/q1", json={"routing_key": ""})
    await api.put("/api/policies/dev/p1", json={"pattern": "^q", "definition": {"max-length": 3},
                                               "apply-to": "queues"})
    defs = (await api.get("/api/definitions")).json()
    assert {"users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings"} <= set(defs)
    assert any(q["name"] == "q1" and q["vhost"] == "dev" for q in defs["queues"])
    # a malformed binding at the end: nothing of the import happens
    bad = {"vhosts": [{"name": "new"}], "queues": [{"name": "nq", "vhost": "new", "durable": True}],
           "bindings": [{"source": "amq.direct", "vhost": "new", "destination": "nq",
                         "destination_type": "stream", "routing_key": ""}]}
    r = await api.post("/api/definitions", content=json.dumps(bad))
    assert r.status_code == 400 and "bindings[0].destination_type" in r.json()["reason"]
    assert (await api.get("/api/vhosts/new")).status_code == 404
    # into a fresh broker: everything comes back, alice can log in with her password
    await api.delete("/api/vhosts/dev")
    await api.delete("/api/users/alice")
    r = await api.post("/api/definitions", content=json.dumps(defs))
    assert r.status_code == 204, r.text
    assert (await api.get("/api/queues/dev/q1")).json()["policy"] == "p1"
    async with http_broker.client("alice", "pw") as alice:
        assert (await alice.get("/api/whoami")).json()["name"] == "alice"


async def test_vhosts_users_permissions(api):
    assert (await api.put("/api/vhosts/a%2Fb", json={})).status_code == 201
    assert "a/b" in [v["name"] for v in (await api.get("/api/vhosts")).json()]
    assert (await api.put("/api/queues/a%2Fb/q", json={})).status_code == 201
    assert (await api.get("/api/queues/a%2Fb/q")).json()["vhost"] == "a/b"
    assert (await api.put("/api/users/bob", json={"password": "x", "tags": ""})).status_code == 201
    assert (await api.put("/api/permissions/a%2Fb/bob", json={
        "configure": "^q", "write": ".*", "read": ".*"})).status_code == 201
    assert (await api.get("/api/permissions/a%2Fb/bob")).json()["configure"] == "^q"
    assert (await api.put("/api/topic-permissions/a%2Fb/bob", json={
        "exchange": "amq.topic", "write": "^a", "read": ".*"})).status_code == 201
    assert len((await api.get("/api/users/bob/topic-permissions")).json()) == 1
    assert (await api.delete("/api/permissions/a%2Fb/bob")).status_code == 204
    assert (await api.get("/api/permissions/a%2Fb/bob")).status_code == 404
    assert (await api.delete("/api/vhosts/a%2Fb")).status_code == 204
    assert (await api.delete("/api/users/bob")).status_code == 204
    assert (await api.delete("/api/users/bob")).status_code == 404


async def test_parameters(api):
    r = await api.put("/api/parameters/vhost-limits/%2F/limits", json={
        "value": {"max-queues": 10}, "component": "vhost-limits", "vhost": "/", "name": "limits"})
    assert r.status_code in (201, 204), r.text
    r = await api.put("/api/parameters/operator_policy/%2F/cap", json={"value": {
        "pattern": "^q", "definition": {"max-length": 5}, "apply-to": "queues"}})
    assert r.status_code == 201, r.text
    got = (await api.get("/api/parameters")).json()
    assert {(p["component"], p["name"]) for p in got} == {("vhost-limits", "limits"),
                                                          ("operator_policy", "cap")}
    assert (await api.get("/api/vhost-limits/%2F")).json()[0]["value"] == {"max-queues": 10}
    assert (await api.get("/api/parameters/federation-upstream")).status_code == 400
    assert (await api.delete("/api/parameters/operator_policy/%2F/cap")).status_code == 204
    assert (await api.delete("/api/parameters/vhost-limits/%2F/limits")).status_code == 204
    assert (await api.get("/api/parameters")).json() == []
