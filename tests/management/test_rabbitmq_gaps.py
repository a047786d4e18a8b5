"""The management API's last differences from RabbitMQ's, each against a real client: httpx,
a raw socket for the status line, pika for a named connection, Celery Flower's own broker
code. Where the machine's RabbitMQ has its management plugin on (``RABBITMQ_API``, default
http://127.0.0.1:15672, and it must say it is RabbitMQ), the same request is asked of it too;
those comparisons skip cleanly otherwise (the plugin is never enabled from a test)."""
from __future__ import annotations

import asyncio
import json
import os
from urllib.parse import quote

import httpx
import pytest
import trio

from broker.amqp import spec

from ..support import TrioClient

RABBITMQ_API = os.environ.get("RABBITMQ_API", "http://127.0.0.1:15672")


def _rabbitmq() -> httpx.Client | None:
    """A client for the machine's RabbitMQ management API, or None when it is not on (or
    the port answers for something else, e.g. a TrioMQ on its default port)."""
    client = httpx.Client(base_url=RABBITMQ_API, auth=("guest", "guest"), timeout=5)
    try:
        ov = client.get("/api/overview")
        if ov.status_code == 200 and ov.json().get("product_name") == "RabbitMQ":
            return client
    except (httpx.HTTPError, ValueError):
        pass
    client.close()
    return None


@pytest.fixture
async def rabbit():
    client = await trio.to_thread.run_sync(_rabbitmq)
    if client is None:
        pytest.skip(f"RabbitMQ's management API is not on at {RABBITMQ_API}")
    yield client
    client.close()


async def _declare(port: int, queue: str) -> TrioClient:
    client = await TrioClient.connect(port)
    await client.call(1, spec.Channel.Open(), spec.Channel.OpenOk)
    await client.call(1, spec.Queue.Declare(queue=queue, durable=False, exclusive=False,
                                            auto_delete=False, arguments={}),
                      spec.Queue.DeclareOk)
    return client


async def test_trailing_slash_is_ignored(api, http_broker):
    client = await _declare(http_broker.amqp_port, "slashq")
    for path in ("/api/queues/", "/api/queues/%2F/"):
        r = await api.get(path)
        assert r.status_code == 200, (path, r.text)
        assert [q["name"] for q in r.json()] == ["slashq"]
    assert (await api.get("/api/queues/%2F/slashq/")).json()["name"] == "slashq"
    assert "object_totals" in (await api.get("/api/overview/")).json()
    # an empty segment is a vhost named "": 404, as in RabbitMQ
    r = await api.get("/api/queues//")
    assert r.status_code == 404 and r.json()["error"] == "Object Not Found"
    await client.aclose()


async def test_celery_flower_broker_tab(http_broker):
    """Flower's own code for its broker tab: it asks /api/queues/ on vhost "/"."""
    pytest.importorskip("flower")
    from flower.utils.broker import Broker

    client = await _declare(http_broker.amqp_port, "celery")
    api = f"http://guest:guest@127.0.0.1:{http_broker.http_port}/api/"

    def ask():
        broker = Broker(f"amqp://guest:guest@127.0.0.1:{http_broker.amqp_port}//", http_api=api)
        return asyncio.run(broker.queues(["celery"]))

    queues = await trio.to_thread.run_sync(ask)
    assert [q["name"] for q in queues] == ["celery"]
    assert queues[0]["messages"] == 0 and "consumers" in queues[0]
    await client.aclose()


async def _status_line(port: int, request: bytes) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        with trio.fail_after(10):
            while b"\r\n" not in data:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
    return data.split(b"\r\n", 1)[0]


async def test_reason_phrases(http_broker):
    port = http_broker.http_port
    assert await _status_line(port, b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n") \
        == b"HTTP/1.1 401 Unauthorized"
    auth = b"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"
    assert await _status_line(port, b"GET /api/nope HTTP/1.1\r\nHost: x\r\n" + auth
                              + b"\r\n") == b"HTTP/1.1 404 Not Found"
    assert await _status_line(port, b"GET /api/overview HTTP/1.1\r\nHost: x\r\n" + auth
                              + b"\r\n") == b"HTTP/1.1 200 OK"


async def test_healthchecks_index_and_rabbitmqadmin(api, http_broker):
    assert (await api.get("/api/healthchecks/node")).json() == {"status": "ok"}
    assert (await api.get("/api/healthchecks/node/")).json() == {"status": "ok"}
    node = (await api.get("/api/nodes")).json()[0]["name"]
    assert (await api.get(f"/api/healthchecks/node/{quote(node)}")).json() == {"status": "ok"}
    assert (await api.get("/api/healthchecks/node/other@host")).status_code == 404
    r = await api.get("/api/index.html")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "/api/overview" in r.text
    from broker.management.api_overview import rabbitmqadmin_path
    async with httpx.AsyncClient(base_url=http_broker.url) as anonymous:
        r = await anonymous.get("/cli/rabbitmqadmin")
    if rabbitmqadmin_path() is None:
        assert r.status_code == 404 and "not installed" in r.json()["reason"]
    else:
        assert r.status_code == 200 and r.text.startswith("#!")


async def test_node_contexts(api, http_broker):
    node = (await api.get("/api/nodes")).json()[0]
    assert node["contexts"] == [{"description": "RabbitMQ Management", "path": "/",
                                 "cowboy_opts": "[{sendfile,false}]",
                                 "port": str(http_broker.http_port)}]
    assert (await api.get("/api/overview")).json()["contexts"] == []  # as RabbitMQ's


async def test_node_has_rabbitmq_fields(api, rabbit):
    theirs = (await trio.to_thread.run_sync(lambda: rabbit.get("/api/nodes").json()))[0]
    ours = (await api.get("/api/nodes")).json()[0]
    assert set(theirs) - set(ours) == set()
    for name in ("gc_num", "io_read_count", "connection_created", "queue_deleted"):
        assert isinstance(ours[name], int) and ours[name + "_details"] == {"rate": 0.0}
    assert set(ours["contexts"][0]) == set(theirs["contexts"][0])


async def test_user_provided_name(api, http_broker):
    import pika

    params = pika.ConnectionParameters("127.0.0.1", http_broker.amqp_port,
                                       client_properties={"connection_name": "orders-worker"})
    conn = await trio.to_thread.run_sync(pika.BlockingConnection, params)
    try:
        with trio.fail_after(10):
            while not (conns := (await api.get("/api/connections")).json()):  # noqa: ASYNC110
                await trio.sleep(0.05)  # polling the API: the open happens in pika's thread
        assert conns[0]["user_provided_name"] == "orders-worker"
        assert conns[0]["client_properties"]["connection_name"] == "orders-worker"
    finally:
        await trio.to_thread.run_sync(conn.close)
    # a connection that names nothing has no such field, as in RabbitMQ
    client = await TrioClient.connect(http_broker.amqp_port)
    with trio.fail_after(10):
        while len(conns := (await api.get("/api/connections")).json()) != 1:  # noqa: ASYNC110
            await trio.sleep(0.05)  # pika's connection closing
    assert "user_provided_name" not in conns[0]
    await client.aclose()


# routing key -> its binding id, and the answers to the id encoded twice and once: a "~"
# (encoded %7E) arrives as the id's separator when encoded once, and RabbitMQ too answers 404
KEYS = {"a/b c": ("a%2Fb+c", [200, 200]), "x~y": ("x%7Ey", [200, 404])}


async def test_binding_key_encoded_once_and_null_key(api, http_broker):
    client = await _declare(http_broker.amqp_port, "bq")
    base = "/api/bindings/%2F/e/amq.direct/q/bq"
    for key in KEYS:
        assert (await api.post(base, json={"routing_key": key})).status_code == 201
    ids = {b["routing_key"]: b["properties_key"] for b in (await api.get(base)).json()}
    for key, (pk, codes) in KEYS.items():
        assert ids[key] == pk
        got = [(await api.get(f"{base}/{e}")).status_code for e in (quote(pk, safe=""), pk)]
        assert got == codes, key
    r = await api.get(f"{base}/{KEYS['a/b c'][0]}")
    assert r.json()["routing_key"] == "a/b c"
    # a null routing key is the empty one
    r = await api.post(base, json={"routing_key": None})
    assert r.status_code == 201, r.text
    keys = sorted(b["routing_key"] for b in (await api.get(base)).json())
    assert keys == ["", "a/b c", "x~y"]
    assert (await api.delete(f"{base}/{KEYS['a/b c'][0]}")).status_code == 204
    assert sorted(b["routing_key"] for b in (await api.get(base)).json()) == ["", "x~y"]
    await client.aclose()


async def test_binding_key_encodings_as_rabbitmq(rabbit):
    """The same requests against RabbitMQ give the same answers."""
    import pika

    def run():
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1"))
        try:
            ch = conn.channel()
            ch.queue_declare("triomq.gaps.bq", auto_delete=True)
            base = "/api/bindings/%2F/e/amq.direct/q/triomq.gaps.bq"
            out = {}
            for key in KEYS:
                ch.queue_bind("triomq.gaps.bq", "amq.direct", key)
                pk = next(b for b in rabbit.get(base).json() if b["routing_key"] == key)[
                    "properties_key"]
                out[key] = (pk, [rabbit.get(f"{base}/{e}").status_code
                                 for e in (quote(pk, safe=""), pk)])
            return out
        finally:
            rabbit.delete("/api/queues/%2F/triomq.gaps.bq")  # auto-delete needs a consumer
            conn.close()

    assert await trio.to_thread.run_sync(run) == KEYS


async def test_idle_since(api, http_broker):
    sampler = http_broker.broker.stats_sampler
    client = await _declare(http_broker.amqp_port, "idleq")
    sampler.sample()
    sampler.sample()  # no change between the two: idle since the first saw it
    q = (await api.get("/api/queues/%2F/idleq")).json()
    since = q["idle_since"]
    assert len(since) == len("2026-11-27T21:49:51.985+00:00") and since[10] == "T"
    await client.publish(1, b"x", routing_key="idleq")
    with trio.fail_after(10):
        while http_broker.broker.vhosts["/"].queues["idleq"].message_count == 0:  # noqa: ASYNC110
            await trio.sleep(0.01)  # the publish being read by the broker
    sampler.sample()
    assert "idle_since" not in (await api.get("/api/queues/%2F/idleq")).json()
    await client.aclose()


async def test_dangling_binding_skipped_rest_imported(api):
    defs = {"queues": [{"name": "dq", "vhost": "/", "durable": True, "auto_delete": False,
                        "arguments": {}}],
            "exchanges": [{"name": "dx", "vhost": "/", "type": "fanout", "durable": True,
                           "auto_delete": False, "internal": False, "arguments": {}}],
            "bindings": [{"source": "gone", "vhost": "/", "destination": "dq",
                          "destination_type": "queue", "routing_key": "", "arguments": {}},
                         {"source": "dx", "vhost": "/", "destination": "vanished",
                          "destination_type": "queue", "routing_key": "", "arguments": {}},
                         {"source": "dx", "vhost": "/", "destination": "dq",
                          "destination_type": "queue", "routing_key": "k", "arguments": {}}]}
    r = await api.post("/api/definitions", content=json.dumps(defs))
    assert r.status_code == 204, r.text
    assert (await api.get("/api/queues/%2F/dq")).status_code == 200
    bindings = (await api.get("/api/bindings/%2F/e/dx/q/dq")).json()
    assert [b["routing_key"] for b in bindings] == ["k"]
    # a malformed binding still refuses the whole file
    defs["queues"][0]["name"] = "dq2"
    defs["bindings"].append({"source": "dx", "vhost": "/", "destination": "dq2",
                             "destination_type": "queue", "routing_key": 7})
    r = await api.post("/api/definitions", content=json.dumps(defs))
    assert r.status_code == 400 and "bindings[3].routing_key" in r.json()["reason"]
    assert (await api.get("/api/queues/%2F/dq2")).status_code == 404


async def test_churn_rates_and_memory_breakdown(api, http_broker):
    client = await _declare(http_broker.amqp_port, "churnq")
    await client.call(1, spec.Channel.Close(reply_code=200, reply_text="", class_id=0,
                                            method_id=0), spec.Channel.CloseOk)
    http_broker.broker.stats_sampler.sample()
    churn = (await api.get("/api/overview")).json()["churn_rates"]
    assert churn["connection_created"] == 1 and churn["connection_closed"] == 0
    assert churn["channel_created"] == 1 and churn["channel_closed"] == 1
    assert churn["queue_declared"] == 1 and churn["queue_created"] == 1
    assert churn["queue_deleted"] == 0 and churn["queue_created_details"]["rate"] >= 0
    node = (await api.get("/api/nodes")).json()[0]
    assert node["channel_created"] == 1 and node["connection_closed"] == 0
    memory = (await api.get(f"/api/nodes/{quote(node['name'])}?memory=true")).json()["memory"]
    assert memory["total"]["rss"] > 0 and memory["strategy"] == "rss"
    assert memory["queue_procs"] == 0 and "memory" not in node
    await client.aclose()


async def test_churn_rates_keys_as_rabbitmq(api, rabbit):
    theirs = (await trio.to_thread.run_sync(lambda: rabbit.get("/api/overview").json()))
    ours = (await api.get("/api/overview")).json()
    assert set(ours["churn_rates"]) == set(theirs["churn_rates"])


PATHS = ("/api/queues/", "/api/queues/%2F/", "/api/overview/", "/api/queues//",
         "/api/healthchecks/node", "/api/healthchecks/node/", "/api/index.html", "/api/nope",
         "/cli/rabbitmqadmin")


async def test_paths_and_status_lines_as_rabbitmq(api, http_broker, rabbit):
    """The same paths answer the same status codes on both; the status lines carry the same
    reason phrases."""
    from broker.management.api_overview import rabbitmqadmin_path
    theirs = await trio.to_thread.run_sync(lambda: {p: rabbit.get(p).status_code for p in PATHS})
    ours = {p: (await api.get(p)).status_code for p in PATHS}
    if rabbitmqadmin_path() is None:  # this host's script is what TrioMQ serves
        ours.pop("/cli/rabbitmqadmin"), theirs.pop("/cli/rabbitmqadmin")
    assert ours == theirs
    port = RABBITMQ_API.rsplit(":", 1)[1]  # on 127.0.0.1, as the default
    request = b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n"
    assert await _status_line(int(port), request) \
        == await _status_line(http_broker.http_port, request) == b"HTTP/1.1 401 Unauthorized"
