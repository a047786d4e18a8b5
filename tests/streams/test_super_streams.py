"""The super stream layout (``streams/super.py``) on an in-process broker."""
from __future__ import annotations

import pytest

from broker import errors
from broker.queues.stream import StreamQueue
from broker.streams import super as ss


def test_layout_as_rabbitmq_streams_names_them():
    assert ss.layout("inv", 3) == (["inv-0", "inv-1", "inv-2"], ["0", "1", "2"])
    assert ss.layout("inv", binding_keys=["eu", "us"]) == (["inv-eu", "inv-us"], ["eu", "us"])
    for bad in ({"partitions": 0}, {"binding_keys": ["a", "a"]}, {"binding_keys": [""]}, {}):
        with pytest.raises(ValueError):
            ss.layout("inv", **bad)


def test_declare_route_partitions_delete(broker):
    vhost = broker.vhosts["/"]
    parts, keys = ss.layout("inv", 3)
    ss.declare(vhost, "inv", parts, keys, {"x-max-length-bytes": 1000})
    assert ss.is_super_stream(vhost, "inv")
    assert [p for p, _k, _o in ss.partitions_of(vhost, "inv")] == parts
    assert all(isinstance(vhost.queues[p], StreamQueue) for p in parts)
    assert vhost.queues["inv-1"].arguments["x-max-length-bytes"] == 1000
    assert ss.route(vhost, "inv", "2") == ["inv-2"] and ss.route(vhost, "inv", "9") == []
    assert ss.partition_index(vhost, "inv", "inv-2") == 2
    assert ss.partition_index(vhost, "inv", "other") is None
    assert ss.delete(vhost, "inv") == parts
    assert "inv" not in vhost.exchanges and not any(p in vhost.queues for p in parts)


def test_partition_order_comes_from_the_binding_argument(broker):
    """Bound out of order (as over AMQP 0-9-1): Partitions answers by x-stream-partition-order."""
    vhost = broker.vhosts["/"]
    vhost.declare_exchange("x", "direct", durable=True, arguments={"x-super-stream": True})
    for i in (2, 0, 1):
        q = vhost.declare_queue(f"z-{i}", None, durable=True, arguments={"x-queue-type": "stream"})
        vhost.bind("x", q, str(i), {"x-stream-partition-order": i})
    assert [p for p, _k, _o in ss.partitions_of(vhost, "x")] == ["z-0", "z-1", "z-2"]


def test_a_failed_partition_undoes_the_rest(broker):
    vhost = broker.vhosts["/"]
    with pytest.raises(errors.AMQPError):  # an invalid stream argument on every partition
        ss.declare(vhost, "bad", ["bad-0", "bad-1"], ["0", "1"], {"x-max-age": "forever"})
    assert "bad" not in vhost.exchanges and "bad-0" not in vhost.queues


def test_partition_count_is_bounded_before_anything_is_made(broker):
    """A count or key list past MAX_PARTITIONS is refused before the names are listed (10^9
    in an HTTP body made a list of 10^9 names) and before any stream is made (each one's
    files are made on the event loop)."""
    with pytest.raises(ValueError, match="at most"):
        ss.layout("big", 10 ** 9)
    with pytest.raises(ValueError, match="at most"):
        ss.layout("big", binding_keys=[str(i) for i in range(ss.MAX_PARTITIONS + 1)])
    assert len(ss.layout("big", ss.MAX_PARTITIONS)[0]) == ss.MAX_PARTITIONS
    vhost = broker.vhosts["/"]
    parts = [f"big-{i}" for i in range(ss.MAX_PARTITIONS + 1)]
    with pytest.raises(errors.AMQPError) as exc:
        ss.declare(vhost, "big", parts, [str(i) for i in range(len(parts))], {})
    assert exc.value.code == 406 and "at most" in exc.value.text
    assert "big" not in vhost.exchanges and "big-0" not in vhost.queues
