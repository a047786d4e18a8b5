"""Tag-based authorization of the API: every endpoint of the matrix x tags, RabbitMQ's
statuses and texts; management users see only their vhosts; writes need AMQP permissions."""
from __future__ import annotations

from .authz_matrix import EXPECTED, NOT_MGMT, PATHS, REQUESTS


async def _users(api, tags_list):
    for tags in tags_list:
        name = f"u-{tags or 'none'}"
        r = await api.put(f"/api/users/{name}", json={"password": "pw", "tags": tags})
        assert r.status_code in (201, 204), r.text


async def test_matrix_without_permissions(api, http_broker):
    await _users(api, EXPECTED)
    for tags, expected in EXPECTED.items():
        async with http_broker.client(f"u-{tags or 'none'}", "pw") as c:
            for path in PATHS:
                r = await c.get(path)
                status, reason = expected[path]
                assert r.status_code == status, (tags, path, r.text)
                if reason is not None:
                    assert r.json() == {"error": "not_authorised", "reason": reason}, (tags, path)
            for (method, path, body), expected in REQUESTS:
                status, reason = expected if tags else NOT_MGMT
                r = await c.request(method, path.format(p="authz"), json=body)
                assert r.status_code == status, (tags, method, path, r.text)
                if reason is not None:
                    assert r.json()["reason"] == reason, (tags, method, path)


async def test_management_user_sees_and_changes_only_what_it_may(api, http_broker):
    await api.put("/api/vhosts/other", json={})
    await api.put("/api/queues/other/hidden", json={})
    await api.put("/api/queues/%2F/mine-1", json={})
    await api.put("/api/queues/%2F/theirs", json={})
    await _users(api, ["management", "policymaker", "monitoring"])
    for u in ("u-management", "u-policymaker"):
        await api.put(f"/api/permissions/%2F/{u}", json={"configure": "^mine-", "write": ".*",
                                                        "read": "^mine-"})
    async with http_broker.client("u-management", "pw") as c:
        names = {q["name"] for q in (await c.get("/api/queues")).json()}
        assert names == {"mine-1", "theirs"}  # vhost "/" only; "other" is not visible
        assert (await c.get("/api/queues/other")).status_code == 401
        assert (await c.put("/api/queues/%2F/mine-2", json={})).status_code == 201
        r = await c.put("/api/queues/%2F/nope", json={})
        assert r.status_code == 401
        assert r.json()["reason"] == ("access to queue 'nope' in vhost '/' refused for user "
                                      "'u-management'")
        r = await c.post("/api/queues/%2F/theirs/get", json={"count": 1, "ackmode":
                                                             "ack_requeue_true", "encoding": "auto"})
        assert r.status_code == 401
        r = await c.put("/api/policies/%2F/p", json={"pattern": "^mine", "definition": {
            "max-length": 1}})
        assert r.json() == {"error": "not_authorised",
                            "reason": "User not authorised to access object"}
        assert (await c.put("/api/users/x", json={"password": "p", "tags": ""})).status_code == 401
        assert (await c.delete("/api/vhosts/other")).status_code == 401
    async with http_broker.client("u-policymaker", "pw") as c:
        r = await c.put("/api/policies/%2F/p", json={"pattern": "^mine", "definition": {
            "max-length": 1}})
        assert r.status_code == 201
        assert (await c.put("/api/policies/other/p", json={"pattern": "^x", "definition": {
            "max-length": 1}})).status_code == 401
        assert (await c.put("/api/operator-policies/%2F/op", json={
            "pattern": "^x", "definition": {"max-length": 1}})).status_code == 401
    async with http_broker.client("u-monitoring", "pw") as c:
        names = {(q["vhost"], q["name"]) for q in (await c.get("/api/queues")).json()}
        assert ("other", "hidden") in names  # monitoring sees every vhost
        assert (await c.delete("/api/queues/other/hidden")).status_code == 401  # read-only
        assert (await c.get("/api/nodes")).status_code == 200
