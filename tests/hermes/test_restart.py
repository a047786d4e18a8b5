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


async def test_clean_stop_settles_pushes_in_flight(nursery, tmp_path, endpoint):
    """A clean stop waits for the requests already sent: the endpoint's 2xx acks them, so
    nothing it accepted is pushed again after the restart; what was not sent is."""
    data = tmp_path / "data"
    hb = await start_broker(nursery, data)
    await make_topic(hb.http, name="shop.drain", ack="ALL")
    await make_subscription(hb.http, "shop.drain", "push", endpoint.url,
                            subscriptionPolicy={"rate": 1000, "inflightSize": 2,
                                                "requestTimeout": 5000})
    endpoint.script = [(200, 0.3), (200, 0.3)]  # slow answers: in flight when the stop begins
    for i in range(4):
        r = await hb.http.post("/topics/shop.drain", json={"n": i})
        assert r.status_code == 201, r.text
    await endpoint.wait_for(lambda e: e.arrived == 2)
    await stop_broker(hb)
    assert [json.loads(r.body)["n"] for r in endpoint.ok] == [0, 1]

    hb = await start_broker(nursery, data)
    await endpoint.wait_for(lambda e: len(e.ok) == 4)
    await settled(hb.vhost.queues["shop.drain.push"])
    assert sorted(json.loads(r.body)["n"] for r in endpoint.ok) == [0, 1, 2, 3]  # none twice
    await stop_broker(hb)
