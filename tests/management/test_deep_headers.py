"""A message whose headers are nested 18,000 deep (as RabbitMQ accepts) is rendered by
``POST /api/queues/{vhost}/{name}/get`` (json.dumps stops near 1,000 levels; the API
answered 500 before) and its queue is listed."""
from __future__ import annotations

import struct

import trio

from rawamqp import RawAMQP

LEVELS = 18_000


def deep_headers(tag: bytes, levels: int) -> bytes:
    """Content-header properties: headers only, {"k": <levels nested tables or arrays>}."""
    inner = struct.pack(">I", 0)
    for _ in range(levels - 1):
        body = (b"\x01k" if tag == b"F" else b"") + tag + inner
        inner = struct.pack(">I", len(body)) + body
    body = b"\x01k" + tag + inner
    return struct.pack(">H", 1 << 13) + struct.pack(">I", len(body)) + body


def _publish(port: int, tag: bytes) -> None:
    with RawAMQP("127.0.0.1", port, timeout=30) as r:
        r.handshake(frame_max=131072)
        r.channel_open(1)
        r.queue_declare(1, "deep")
        r.confirm_select(1)
        r.publish(1, "", "deep", b"deep", props=deep_headers(tag, LEVELS))
        r.read_method(timeout=30)  # basic.ack: stored


async def test_get_renders_deeply_nested_headers(api, http_broker):
    for tag, opener in ((b"F", '{"k":'), (b"A", "[")):
        await trio.to_thread.run_sync(_publish, http_broker.amqp_port, tag)
        r = await api.post("/api/queues/%2F/deep/get",
                           json={"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
        assert r.status_code == 200, r.text[:200]
        text = r.text
        assert '"payload":"deep"' in text.replace(" ", "")
        start = text.index('"headers":{"k":') + len('"headers":{"k":')
        # json.loads would recurse as deep: check the nesting by its text
        assert text[start:start + len(opener) * (LEVELS - 1)] == opener * (LEVELS - 1)
    assert (await api.get("/api/queues/%2F/deep")).json()["messages"] == 0
