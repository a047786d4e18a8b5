"""Hostile input at the Stream-protocol edge, in process with raw frames: what no client
library sends. Each gets the protocol's response code (or Close with its code) and the
connection, the broker and other clients go on (bench/hostile_edges.py measures the same
against a subprocess with a memory limit)."""
from __future__ import annotations

import trio

from broker.streamproto import codec as c
from broker.streams import super as ss

from .test_session import broker, login

__all__ = ["broker"]


async def test_a_super_stream_past_the_partition_bound_is_refused_at_once(broker):
    cl = await login(broker)
    n = ss.MAX_PARTITIONS + 1
    parts = [f"hs-{i}" for i in range(n)]
    with trio.fail_after(30):
        code, _ = await cl.request(c.CreateSuperStream(cl.cid(), "hs", parts,
                                                       [str(i) for i in range(n)], {}))
    assert code == c.PRECONDITION_FAILED
    vhost = broker.vhosts["/"]
    assert "hs" not in vhost.exchanges and "hs-0" not in vhost.queues
    code, _ = await cl.request(c.CreateSuperStream(cl.cid(), "hs", parts[:3],
                                                   ["0", "1", "2"], {}))
    assert code == c.OK
