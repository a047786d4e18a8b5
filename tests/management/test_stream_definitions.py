"""Streams through the management API: PUT with "type": "stream", the queue view (type,
messages, segments, offsets), definitions export and import, ctl list_queues' type."""
from __future__ import annotations

import json

import trio

RABBIT_EXPORT = {
    "rabbit_version": "3.10.7",
    "vhosts": [{"name": "/"}],
    "queues": [{"name": "events", "vhost": "/", "durable": True, "auto_delete": False,
                "arguments": {"x-queue-type": "stream", "x-max-age": "7D",
                              "x-stream-max-segment-size-bytes": 1000000}}],
    "exchanges": [], "bindings": [], "policies": [
        {"vhost": "/", "name": "ret", "pattern": "^events$", "apply-to": "streams",
         "definition": {"max-length-bytes": 50000000}, "priority": 0}],
}


async def test_rabbitmq_export_with_a_stream_imports(api, http_broker):
    r = await api.post("/api/definitions", content=json.dumps(RABBIT_EXPORT))
    assert r.status_code == 204, r.text
    q = http_broker.broker.vhosts["/"].queues["events"]
    assert q.queue_type.name == "stream"
    assert (q.log.max_age, q.log.max_segment_size, q.log.max_bytes) == (7 * 86400, 1000000,
                                                                        50000000)
    q.enqueue(_message(b"one"))
    with trio.fail_after(30):
        await q.log.wait_committed(0)
    listed = (await api.get("/api/queues/%2F/events")).json()
    assert listed["type"] == "stream" and listed["messages"] == 1
    assert listed["segments"] == 1 and listed["committed_offset"] == 0
    assert listed["policy"] == "ret"
    exported = (await api.get("/api/definitions")).json()
    (entry,) = [e for e in exported["queues"] if e["name"] == "events"]
    assert entry["arguments"]["x-queue-type"] == "stream" and entry["durable"] is True
    r = await api.post("/api/definitions", content=json.dumps(exported))
    assert r.status_code == 204, r.text


async def test_put_stream_and_refusals(api, http_broker):
    r = await api.put("/api/queues/%2F/st", json={"durable": True, "type": "stream"})
    assert r.status_code == 201, r.text
    assert (await api.get("/api/queues/%2F/st")).json()["type"] == "stream"
    r = await api.put("/api/queues/%2F/st2", json={"durable": False, "type": "stream"})
    assert r.status_code == 400 and "non-durable" in r.json()["reason"], r.text
    r = await api.put("/api/queues/%2F/st3", json={"durable": True, "type": "stream",
                                                    "arguments": {"x-max-age": "10X"}})
    assert r.status_code == 400 and "invalid_max_age" in r.json()["reason"], r.text


def _message(body: bytes):
    from broker.amqp.fields import encode_properties
    from broker.message import Message
    return Message("", "events", encode_properties({}), {}, body)


async def test_ctl_list_queues_shows_the_type(api, http_broker):
    import subprocess
    import sys
    from pathlib import Path
    r = await api.put("/api/queues/%2F/ctl-st", json={"durable": True, "type": "stream"})
    assert r.status_code == 201, r.text
    cmd = [sys.executable, "-m", "broker", "ctl", "--url", http_broker.url, "list_queues",
           "-s", "name", "type"]
    p = await trio.to_thread.run_sync(lambda: subprocess.run(
        cmd, cwd=str(Path(__file__).resolve().parents[2]), capture_output=True, text=True,
        timeout=120))
    assert p.returncode == 0 and "ctl-st\tstream" in p.stdout.splitlines(), p.stdout + p.stderr


async def test_get_and_purge_refused_as_rabbitmq(api, http_broker):
    """RabbitMQ 3.10's answers (read with curl against the machine's RabbitMQ)."""
    r = await api.put("/api/queues/%2F/gs", json={"durable": True, "type": "stream"})
    assert r.status_code == 201, r.text
    r = await api.post("/api/queues/%2F/gs/get", json={"count": 1, "ackmode": "ack_requeue_true",
                                                        "encoding": "auto"})
    assert (r.status_code, r.json()) == (400, {
        "error": "bad_request",
        "reason": "540 basic.get not supported by stream queues queue 'gs' in vhost '/'"})
    r = await api.delete("/api/queues/%2F/gs/contents")
    assert (r.status_code, r.json()) == (400, {
        "error": "bad_request",
        "reason": "queue.purge not supported by stream queues queue 'gs' in vhost '/'"})
