"""TrioMQ's management API next to the machine's RabbitMQ (127.0.0.1:15672): the same calls
on both, the shapes of the answers compared; the authorization matrix on both; definitions
exported from one imported into the other (temporary entities with a unique prefix, removed
after)."""
from __future__ import annotations

import json
import time
import uuid
from urllib.parse import quote

import httpx
import pika
import pytest
from brokerproc import BrokerProc
from reference import require_rabbitmq_api

from tests.management.authz_matrix import EXPECTED, NOT_MGMT, PATHS, REQUESTS

RABBIT = "http://127.0.0.1:15672"
PREFIX = f"mgmtcompat-{uuid.uuid4().hex[:8]}"
VHOST = PREFIX  # the temporary vhost on both brokers

# RabbitMQ-only internals (Erlang VM, clustering, its stats database) with no meaning here
IGNORED = {"garbage_collection", "reductions", "reductions_details",
           "statistics_db_event_queue", "erlang_full_version", "idle_since",
           "backing_queue_status", "messages_paged_out", "message_bytes_paged_out",
           "pending_raft_commands", "run_queue", "proc_total", "proc_used", "io_read_avg_time",
           "sample_retention_policies", "churn_rates", "release_series_support_status",
           "channel_pid", "client_flow_blocked", "rabbit_version", "global_parameters",
           "messages_ram", "messages_ready_ram", "messages_unacknowledged_ram",
           "message_bytes_ram", "messages_persistent", "message_bytes_persistent"}


@pytest.fixture(autouse=True)
def _triomq_only(external_broker):
    if external_broker:
        pytest.skip("compares a TrioMQ it starts with the machine's RabbitMQ")


@pytest.fixture(scope="module")
def rabbit():
    client = require_rabbitmq_api(RABBIT)
    client.put(f"/api/vhosts/{VHOST}", json={})
    client.put(f"/api/permissions/{VHOST}/guest",
               json={"configure": ".*", "write": ".*", "read": ".*"})
    yield client
    client.delete(f"/api/vhosts/{VHOST}")
    for u in client.get("/api/users").json():
        if u["name"].startswith(PREFIX):
            client.delete("/api/users/" + quote(u["name"], safe=""))
    for v in client.get("/api/vhosts").json():
        if v["name"].startswith(PREFIX):
            client.delete("/api/vhosts/" + quote(v["name"], safe=""))
    client.close()


@pytest.fixture(scope="module")
def triomq(tmp_path_factory):
    proc = BrokerProc(tmp_path_factory.mktemp("compat") / "data", store="memory", http=True)
    proc.start()
    client = httpx.Client(base_url=proc.http_url, auth=("guest", "guest"), timeout=30)
    client.put(f"/api/vhosts/{VHOST}", json={})
    yield proc, client
    client.close()
    proc.stop()


def _populate(client: httpx.Client) -> None:
    v = VHOST
    assert client.put(f"/api/queues/{v}/q", json={"durable": True}).status_code in (201, 204)
    assert client.put(f"/api/exchanges/{v}/x", json={"type": "topic"}).status_code in (201, 204)
    assert client.post(f"/api/bindings/{v}/e/x/q/q", json={"routing_key": "k.#"}).status_code == 201
    assert client.put(f"/api/policies/{v}/p", json={
        "pattern": "^q$", "definition": {"max-length": 100}, "apply-to": "queues"}).status_code in (201, 204)
    r = client.post(f"/api/exchanges/{v}/x/publish", json={
        "routing_key": "k.1", "payload": "m", "payload_encoding": "string", "properties": {}})
    assert r.json() == {"routed": True}


def _missing(reference, ours, path="") -> list[str]:
    """Keys of RabbitMQ's answer that TrioMQ's lacks (recursively, first list items)."""
    if isinstance(reference, list):
        if reference and isinstance(reference[0], (dict, list)) and ours:
            return _missing(reference[0], ours[0], path + "[0]")
        return []
    if not isinstance(reference, dict):
        return []
    out = []
    if not isinstance(ours, dict):
        return [path or "."]
    for key, value in reference.items():
        if key in IGNORED:
            continue
        if key not in ours:
            out.append(f"{path}.{key}")
        elif isinstance(value, dict) and key not in ("arguments", "client_properties",
                                                      "definition", "capabilities",
                                                      "effective_policy_definition",
                                                      "cluster_state", "metadata",
                                                      "properties", "exchange_types"):
            out += _missing(value, ours[key], f"{path}.{key}")
        elif isinstance(value, list) and value and isinstance(value[0], dict) and key not in (
                "listeners", "contexts", "applications", "auth_mechanisms", "exchange_types",
                "users", "vhosts", "permissions", "topic_permissions", "parameters",
                "policies", "queues", "exchanges", "bindings"):
            out += _missing(value, ours.get(key), f"{path}.{key}")
    return out


NODE_KEYS = {"name", "type", "running", "mem_used", "mem_limit", "mem_alarm", "disk_free",
             "disk_free_limit", "disk_free_alarm", "fd_total", "fd_used", "sockets_total",
             "sockets_used", "uptime", "processors", "os_pid", "exchange_types",
             "auth_mechanisms", "applications", "partitions", "rates_mode", "listeners"}


def _untracked(path: str, missing: str) -> bool:
    """Counters TrioMQ does not keep (docs/management.md "Statistics"): the overview's disk
    reads and writes of RabbitMQ's message store, and the Erlang node's internals."""
    if missing.split(".message_stats.", 1)[-1].startswith(("disk_reads", "disk_writes")):
        return True
    if path == "/api/nodes":
        return missing.split(".", 1)[1] not in NODE_KEYS
    return False


def test_answers_have_rabbitmq_shapes(rabbit, triomq):
    proc, ours = triomq
    _populate(rabbit)
    _populate(ours)
    conns = []
    for port in (5672, proc.port):
        c = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, VHOST, pika.PlainCredentials("guest", "guest")))
        ch = c.channel()
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume("q", lambda *a: None)
        conns.append(c)
    try:
        deadline = time.monotonic() + 15  # RabbitMQ's stats arrive every 5 s
        while time.monotonic() < deadline:
            for c in conns:
                c.process_data_events(0.2)
            if (any(x["vhost"] == VHOST for x in rabbit.get("/api/connections").json())
                    and rabbit.get(f"/api/consumers/{VHOST}").json()
                    and any(x["vhost"] == VHOST for x in rabbit.get("/api/channels").json())):
                break
        paths = ["/api/overview", "/api/nodes", f"/api/vhosts/{VHOST}", f"/api/queues/{VHOST}/q",
                 f"/api/queues/{VHOST}", f"/api/exchanges/{VHOST}/x", f"/api/exchanges/{VHOST}",
                 f"/api/bindings/{VHOST}", f"/api/consumers/{VHOST}", "/api/users/guest",
                 f"/api/permissions/{VHOST}/guest", "/api/whoami", f"/api/definitions/{VHOST}",
                 f"/api/aliveness-test/{VHOST}", "/api/health/checks/alarms",
                 f"/api/queues/{VHOST}?page=1&page_size=10", f"/api/policies/{VHOST}/p",
                 f"/api/bindings/{VHOST}/e/x/q/q", "/api/extensions"]
        problems = {}
        for path in paths:
            ref, got = rabbit.get(path), ours.get(path)
            assert got.status_code == ref.status_code, (path, got.text)
            missing = [m for m in _missing(ref.json(), got.json()) if not _untracked(path, m)]
            if missing:
                problems[path] = missing
        for path in ("/api/connections", "/api/channels"):
            ref = [x for x in rabbit.get(path).json() if x.get("vhost") == VHOST]
            got = [x for x in ours.get(path).json() if x.get("vhost") == VHOST]
            assert ref and got, path
            missing = [m for m in _missing(ref[0], got[0]) if not _untracked(path, m)]
            if missing:
                problems[path] = missing
        assert not problems, json.dumps(problems)
        # list answers carry the same objects
        assert {q["name"] for q in rabbit.get(f"/api/queues/{VHOST}").json()} == \
               {q["name"] for q in ours.get(f"/api/queues/{VHOST}").json()}
        assert sorted(b["properties_key"] for b in rabbit.get(f"/api/bindings/{VHOST}").json()) == \
               sorted(b["properties_key"] for b in ours.get(f"/api/bindings/{VHOST}").json())
        # the same errors
        for method, path, body in (
                ("PUT", f"/api/queues/{VHOST}/q", {"durable": False}),
                ("GET", f"/api/queues/{VHOST}/nosuch", None),
                ("PUT", f"/api/exchanges/{VHOST}/bad", {"type": "nope"}),
                ("DELETE", f"/api/exchanges/{VHOST}/amq.direct", None),
                ("GET", "/api/queues?page=0", None),
                ("GET", "/api/exchanges/nosuchvhost-" + PREFIX, None)):
            ref = rabbit.request(method, path, json=body)
            got = ours.request(method, path, json=body)
            assert (got.status_code, got.json()) == (ref.status_code, ref.json()), (method, path)
    finally:
        for c in conns:
            c.close()


def test_authorization_matrix_on_both(rabbit, triomq):
    _proc, ours = triomq
    for client, base in ((rabbit, RABBIT), (ours, _proc.http_url)):
        for tags in EXPECTED:
            name = f"{PREFIX}-t-{tags or 'none'}"
            assert client.put("/api/users/" + name,
                              json={"password": "pw", "tags": tags}).status_code in (201, 204)
        for tags, expected in EXPECTED.items():
            with httpx.Client(base_url=base, auth=(f"{PREFIX}-t-{tags or 'none'}", "pw"),
                              timeout=30) as c:
                for path in PATHS:
                    r = c.get(path)
                    status, reason = expected[path]
                    assert r.status_code == status, (base, tags, path, r.text)
                    if reason is not None:
                        assert r.json()["reason"] == reason, (base, tags, path)
                for (method, path, body), expected in REQUESTS:
                    status, reason = expected if tags else NOT_MGMT
                    # RabbitMQ (cowboy) drops a kept-alive connection after refusing a body
                    r = c.request(method, path.format(p=PREFIX), json=body,
                                  headers={"connection": "close"})
                    assert r.status_code == status, (base, tags, method, path, r.text)
                    if reason is not None:
                        assert r.json()["reason"] == reason, (base, tags, method, path)


def _ours_only(defs: dict, vhost: str, users: set[str]) -> dict:
    return {"users": [u for u in defs["users"] if u["name"] in users],
            "vhosts": [v for v in defs["vhosts"] if v["name"] == vhost],
            "permissions": [p for p in defs["permissions"] if p["vhost"] == vhost],
            "policies": [p for p in defs.get("policies", []) if p["vhost"] == vhost],
            "queues": [q for q in defs["queues"] if q["vhost"] == vhost],
            "exchanges": [x for x in defs["exchanges"] if x["vhost"] == vhost],
            "bindings": [b for b in defs["bindings"] if b["vhost"] == vhost]}


def test_definitions_both_ways(rabbit, triomq):
    proc, ours = triomq
    # RabbitMQ -> TrioMQ: users keep working passwords (RabbitMQ's salted SHA-256 hashes)
    vh, user = f"{PREFIX}-from-rabbit", f"{PREFIX}-ru"
    rabbit.put(f"/api/vhosts/{vh}", json={})
    rabbit.put(f"/api/users/{user}", json={"password": "secret-r", "tags": "management"})
    rabbit.put(f"/api/permissions/{vh}/{user}", json={"configure": ".*", "write": ".*", "read": ".*"})
    rabbit.put(f"/api/queues/{vh}/rq", json={"durable": True, "arguments": {"x-message-ttl": 60000}})
    rabbit.put(f"/api/exchanges/{vh}/rx", json={"type": "direct", "durable": True})
    rabbit.post(f"/api/bindings/{vh}/e/rx/q/rq", json={"routing_key": "rk"})
    rabbit.put(f"/api/policies/{vh}/rp", json={"pattern": "^rq$", "definition": {"max-length": 7},
                                              "apply-to": "queues"})
    defs = _ours_only(rabbit.get("/api/definitions").json(), vh, {user})
    r = ours.post("/api/definitions", json=defs)
    assert r.status_code in (201, 204), r.text
    q = ours.get(f"/api/queues/{vh}/rq").json()
    assert q["arguments"] == {"x-message-ttl": 60000} and q["policy"] == "rp"
    with httpx.Client(base_url=proc.http_url, auth=(user, "secret-r")) as c:
        assert c.get("/api/whoami").json()["name"] == user
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", proc.port, vh, pika.PlainCredentials(user, "secret-r")))
    ch = conn.channel()
    ch.basic_publish("rx", "rk", b"x")
    conn.close()
    # TrioMQ -> RabbitMQ
    vh2, user2 = f"{PREFIX}-from-triomq", f"{PREFIX}-tu"
    ours.put(f"/api/vhosts/{vh2}", json={})
    ours.put(f"/api/users/{user2}", json={"password": "secret-t", "tags": "monitoring"})
    ours.put(f"/api/permissions/{vh2}/{user2}", json={"configure": "^t", "write": ".*", "read": ".*"})
    ours.put(f"/api/queues/{vh2}/tq", json={"durable": True})
    ours.put(f"/api/exchanges/{vh2}/tx", json={"type": "fanout", "durable": True})
    ours.post(f"/api/bindings/{vh2}/e/tx/q/tq", json={"routing_key": ""})
    defs = _ours_only(ours.get("/api/definitions").json(), vh2, {user2})
    r = rabbit.post("/api/definitions", json=defs)
    assert r.status_code in (201, 204), r.text
    assert rabbit.get(f"/api/queues/{vh2}/tq").status_code == 200
    assert len(rabbit.get(f"/api/bindings/{vh2}/e/tx/q/tq").json()) == 1
    with httpx.Client(base_url=RABBIT, auth=(user2, "secret-t")) as c:
        assert c.get("/api/whoami").json() == {"name": user2, "tags": ["monitoring"]}
    assert rabbit.get(f"/api/permissions/{vh2}/{user2}").json()["configure"] == "^t"
