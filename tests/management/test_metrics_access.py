"""/metrics as an operator coming from rabbitmq_prometheus expects it: aggregated and without
login by default, per-object series at /metrics/per-object, a login required on request."""
from __future__ import annotations

import httpx

from .conftest import start_http_broker


async def _setup(api) -> None:
    assert (await api.put("/api/vhosts/secret-vhost")).status_code in (201, 204)
    assert (await api.put("/api/queues/secret-vhost/payroll-queue", json={})).status_code == 201
    assert (await api.put("/api/queues/%2F/mq", json={})).status_code == 201
    for q in ("mq", "mq"):
        r = await api.post("/api/exchanges/%2F/amq.default/publish", json={
            "routing_key": q, "payload": "m", "payload_encoding": "string", "properties": {}})
        assert r.json() == {"routed": True}
    await api.put("/api/users/watcher", json={"password": "w", "tags": "monitoring"})
    await api.put("/api/users/plain", json={"password": "p", "tags": "management"})


async def test_metrics_aggregated_without_names_by_default(api, http_broker):
    await _setup(api)
    async with httpx.AsyncClient(base_url=http_broker.url, timeout=10) as anonymous:
        r = await anonymous.get("/metrics")
        assert r.status_code == 200
        assert "payroll-queue" not in r.text and "secret-vhost" not in r.text
        assert "rabbitmq_queue_messages_ready 2.0" in r.text.splitlines()
        assert "rabbitmq_queues 2.0" in r.text.splitlines()
        # per object, as rabbitmq_prometheus's /metrics/per-object (no login there either)
        r = await anonymous.get("/metrics/per-object")
        assert r.status_code == 200
        assert 'rabbitmq_queue_messages_ready{queue="mq",vhost="/"} 2.0' in r.text
        assert 'queue="payroll-queue",vhost="secret-vhost"' in r.text


async def test_metrics_auth_asks_a_monitoring_user(nursery, tmp_path):
    hb = await start_http_broker(nursery, tmp_path, metrics_auth=True)
    async with hb.client() as api:
        await _setup(api)
    for path in ("/metrics", "/metrics/per-object"):
        async with httpx.AsyncClient(base_url=hb.url, timeout=10) as anonymous:
            r = await anonymous.get(path)
            assert r.status_code == 401 and "www-authenticate" in r.headers
        async with hb.client("guest", "wrong") as c:
            assert (await c.get(path)).status_code == 401
        async with hb.client("plain", "p") as c:  # management only: not enough
            r = await c.get(path)
            assert r.status_code == 401 and r.json()["reason"] == "Not monitor user"
        async with hb.client("watcher", "w") as c:
            r = await c.get(path)
            assert r.status_code == 200 and "rabbitmq_queue_messages_ready" in r.text
    await hb.server.shutdown()


async def test_metrics_per_object_option(nursery, tmp_path):
    hb = await start_http_broker(nursery, tmp_path, metrics_per_object=True)
    async with hb.client() as api:
        await _setup(api)
        r = await api.get("/metrics")
        assert 'rabbitmq_queue_messages_ready{queue="mq",vhost="/"} 2.0' in r.text
    await hb.server.shutdown()
