"""Hermes state across a broker restart on the journal and the SQL store (SQLite): topic and subscription definitions
(store metadata), the messages not yet pushed, and nothing pushed twice to a 2xx endpoint."""
from __future__ import annotations

import json

import pytest

from .conftest import start_broker, stop_broker
from .test_http import make_subscription, make_topic
from .test_push import settled

SCHEMA = {"type": "record", "name": "E", "fields": [{"name": "n", "type": "int"}]}


@pytest.mark.parametrize("store", ["journal", "sqlite"])
async def test_definitions_and_messages_survive_restart(nursery, tmp_path, endpoint, store):
    data = tmp_path / "data"
    url = "journal" if store == "journal" else f"sqlite:///{tmp_path}/store.db"
    hb = await start_broker(nursery, data, url)
    await make_topic(hb.http, name="shop.events", contentType="AVRO", schema=json.dumps(SCHEMA),
                     ack="ALL")
    await make_subscription(hb.http, "shop.events", "push", endpoint.url,
                            subscriptionPolicy={"messageBackoff": 20, "rate": 1000,
                                                "inflightSize": 2})
    endpoint.script = [200, 200]  # the first two succeed, then the endpoint fails
    endpoint.default = 500
    for i in range(5):
        r = await hb.http.post("/topics/shop.events", json={"n": i})
        assert r.status_code == 201, r.text
    await endpoint.wait_for(lambda e: len(e.ok) == 2 and len(e.received) >= 4)
    await stop_broker(hb)

    endpoint.default = 200
    hb = await start_broker(nursery, data, url)
    assert (await hb.http.get("/topics")).json() == ["shop.events"]
    topic = (await hb.http.get("/topics/shop.events")).json()
    assert topic["contentType"] == "AVRO" and json.loads(topic["schema"]) == SCHEMA
    sub = (await hb.http.get("/topics/shop.events/subscriptions/push")).json()
    assert sub["subscriptionPolicy"]["inflightSize"] == 2 and sub["endpoint"] == endpoint.url
    await endpoint.wait_for(lambda e: len(e.ok) == 5)
    await settled(hb.vhost.queues["shop.events.push"])
    # every message reached the endpoint with a 2xx exactly once, as JSON
    assert sorted(json.loads(r.body)["n"] for r in endpoint.ok) == [0, 1, 2, 3, 4]
    ids = [r.headers["hermes-message-id"] for r in endpoint.ok]
    assert len(set(ids)) == 5
    # validation still applies after the restart
    assert (await hb.http.post("/topics/shop.events", json={"n": "x"})).status_code == 400
    await stop_broker(hb)
