"""A Hermes publish while the store's writes fail: refused before any subscription queue
holds it (the journal's failure is a resource alarm: 503; the SQL store's is not: 500), so
a push subscription never delivers a message the publisher was told was not stored;
publishes are accepted again once the store writes."""
from __future__ import annotations

import json

import pytest

from .conftest import start_broker, stop_broker
from .test_http import make_subscription, make_topic


@pytest.mark.parametrize("store", ["journal", "sqlite"])
async def test_publish_refused_while_the_store_fails(nursery, tmp_path, endpoint, store):
    url = "journal" if store == "journal" else f"sqlite:///{tmp_path}/store.db"
    hb = await start_broker(nursery, tmp_path / "data", url)
    await make_topic(hb.http, name="shop.fail", ack="ALL")
    await make_subscription(hb.http, "shop.fail", "push", endpoint.url,
                            subscriptionPolicy={"rate": 1000})
    hb.broker.on_store_failure(hb.broker.store, "no space left on device")
    r = await hb.http.post("/topics/shop.fail", json={"n": 1})
    assert r.status_code == (503 if store == "journal" else 500), r.text
    assert hb.vhost.queues["shop.fail.push"].message_count == 0
    hb.broker.on_store_recovered(hb.broker.store)
    r = await hb.http.post("/topics/shop.fail", json={"n": 2})
    assert r.status_code == 201, r.text
    await endpoint.wait_for(lambda e: len(e.ok) == 1)
    assert [json.loads(r.body)["n"] for r in endpoint.received] == [2]
    await stop_broker(hb)
