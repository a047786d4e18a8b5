"""basic.publish with a routing key that is not UTF-8: RabbitMQ accepts it (other methods'
shortstrs get 501 "Malformed UTF-8 in shortstr") and hands the bytes back untouched, so
every path that writes the key back must too -- basic.return, get-ok / deliver, x-death,
consistent hashing."""
from __future__ import annotations

from broker.amqp import spec
from broker.amqp.codec import method_frame

from .support import publish_frames

KEY = b"order-\xff\xfe".decode("utf-8", "surrogateescape")


def _get(c, queue):
    written = c.call(1, spec.Basic.Get(queue=queue, no_ack=True))
    assert written and isinstance(written[0].method, spec.Basic.GetOk), written
    return written[0]


def _raw_reply(c, data: bytes) -> bytes:
    """What the broker wrote for ``data``, undecoded (the test's own frame parser refuses a
    shortstr that is not UTF-8, as the broker's does for everything but basic.publish)."""
    c.session.data_received(data)
    return c.conn.data_to_send()


def test_returned_delivered_and_dead_lettered_with_the_same_bytes(session_client):
    raw_key = KEY.encode("utf-8", "surrogateescape")
    c = session_client()
    c.open_channel(1)
    # unroutable + mandatory: the return carries the key as sent (as RabbitMQ's does)
    out = _raw_reply(c, publish_frames(1, b"r", "amq.direct", KEY, mandatory=True))
    assert b"\x08NO_ROUTE\x0aamq.direct" + bytes([len(raw_key)]) + raw_key in out
    # delivered, then rejected into a dead-letter queue: x-death names the key's bytes
    c.declare_queue(1, "dlq")
    c.declare_queue(1, "q", arguments={"x-dead-letter-exchange": "",
                                       "x-dead-letter-routing-key": "dlq"})
    c.ok(1, spec.Queue.Bind(queue="q", exchange="amq.fanout"), spec.Queue.BindOk)
    c.publish(1, b"m", "amq.fanout", KEY)
    out = _raw_reply(c, method_frame(1, spec.Basic.Get(queue="q", no_ack=False)))
    assert b"\x0aamq.fanout" + bytes([len(raw_key)]) + raw_key in out  # get-ok
    c.call(1, spec.Basic.Reject(delivery_tag=1, requeue=False))
    dead = _get(c, "dlq")
    (death,) = dead.headers["x-death"]
    assert death["routing-keys"] == [raw_key]
    assert death["reason"] == b"rejected" and death["queue"] == b"q"


def test_consistent_hash_routes_a_key_that_is_not_utf8(session_client):
    c = session_client()
    c.open_channel(1)
    c.ok(1, spec.Exchange.Declare(exchange="h", type="x-consistent-hash"), spec.Exchange.DeclareOk)
    for i in range(3):
        c.declare_queue(1, f"p{i}")
        c.ok(1, spec.Queue.Bind(queue=f"p{i}", exchange="h", routing_key="1"), spec.Queue.BindOk)
    for _ in range(3):
        c.publish(1, b"x", "h", KEY)
    counts = [c.ok(1, spec.Queue.Declare(queue=f"p{i}", passive=True)).message_count
              for i in range(3)]
    assert sorted(counts) == [0, 0, 3]
