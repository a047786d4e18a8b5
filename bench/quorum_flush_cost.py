"""``python -m bench.quorum_flush_cost``: what a quorum queue's leader spends in Python per
message on replication bookkeeping, in-process and without I/O: persistent messages
enqueued into a quorum queue whose ``Mirroring`` has ``--followers`` in-sync followers
(0: the same enqueue with nobody to replicate to), flushed every ``--per-flush`` messages
to the followers' links (marked connected: the frames are built and dropped, not sent),
then every follower's answer. Best of ``--rounds`` rounds, µs per message.

The real objects (a broker with a memory store, ``ClusterStore``, ``Mirrors``,
``Mirroring``, ``Link``) without etcd or other nodes: the figure is the CPU the leader's
replication code adds per message, apart from the sockets and wake-ups around it (see
docs/performance-cluster.md)."""
from __future__ import annotations

import argparse
import tempfile
import time
from collections import OrderedDict

import trio

from broker.broker import Broker
from broker.cluster.etcd import EtcdGateway
from broker.cluster.mirror import Mirrors
from broker.cluster.mirror_master import Mirroring
from broker.cluster.node import ClusterNode
from broker.cluster.settings import build_settings
from broker.cluster.store import ClusterStore
from broker.config import Config
from broker.message import Message
from broker.persistence import MemoryStore


async def measure(followers: int, per_flush: int, flushes: int, rounds: int, size: int) -> float:
    broker = Broker(Config(host="127.0.0.1", port=0, data_dir=tempfile.mkdtemp(),
                           memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0),
                    MemoryStore())
    settings = build_settings("etcd://127.0.0.1:1/bench", "a", None, "127.0.0.1", 5672, None,
                              2.0)
    coord = EtcdGateway(settings.endpoints, settings.etcd_timeout)
    store = ClusterStore(MemoryStore(), coord, ClusterNode(coord, settings))
    store.broker = broker
    names = [f"f{i}" for i in range(followers)]
    store._addresses = {n: "127.0.0.1:1" for n in names}
    q = broker.vhosts["/"].declare_queue("qq", durable=True,
                                         arguments={"x-queue-type": "quorum"})
    m = Mirroring(Mirrors(store), q, epoch=7)
    q.observers.append(m)
    m.members = ["a", *names]
    m.nodes.update({n: "in_sync" for n in names})
    m.isr_dirty = False
    links = [store.link_for(n, "/") for n in names]
    for link in links:
        link.connected = True
    body = b"x" * size
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(flushes):
            for _ in range(per_flush):
                store.publishing = None
                q.enqueue(Message("", "qq", b"\x10\x00\x02", {"delivery_mode": 2}, body))
                store.when_durable(lambda: None, lambda: None)
            m.flush()
            for link in links:
                link._out.clear()
                link._out_bytes = 0
                pending, link._pending = link._pending, OrderedDict()
                for done, _t in pending.values():
                    done(True)
        best = min(best, (time.perf_counter() - t0) / (flushes * per_flush) * 1e6)
        q.purge()
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quorum_flush_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--followers", type=int, default=2)
    p.add_argument("--per-flush", type=int, default=27)
    p.add_argument("--flushes", type=int, default=20)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--size", type=int, default=256)
    args = p.parse_args(argv)
    us = trio.run(measure, args.followers, args.per_flush, args.flushes, args.rounds,
                  args.size)
    print(f"{args.followers} followers, {args.per_flush} messages per flush: "
          f"{us:.2f} us per message (best of {args.rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
