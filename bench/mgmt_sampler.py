"""The statistics sampler's pass (``Sampler.sample``, every 5 s on the broker's loop) over N
queues: what ``idle_since`` and the churn counters add to it (docs/management.md).

    python -m bench.mgmt_sampler --queues 10000 --runs 30

An in-process broker (memory store, no listeners) with N idle classic queues and nothing
else; each run is one ``sample()``; prints the minimum and median CPU time in ms (CPU time
and the minimum: on a shared machine wall times swing 3x between runs). Run the same command
from an older checkout's directory for the comparison.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    from broker.broker import Broker
    from broker.config import Config
    from broker.management.stats import MessageTotals, Sampler
    from broker.persistence import MemoryStore

    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(Config(data_dir=tmp), MemoryStore())
        broker.message_totals = MessageTotals(broker.services)
        vhost = broker.vhosts["/"]
        for i in range(args.queues):
            vhost.declare_queue(f"q{i}", None, arguments={})
        sampler = Sampler(broker.services, broker.message_totals)
        sampler.sample()
        times = []
        for _ in range(args.runs):
            t0 = time.process_time()
            sampler.sample()
            times.append((time.process_time() - t0) * 1000)
        print(f"queues={args.queues} runs={args.runs} sample() CPU min {min(times):.2f} ms, "
              f"median {statistics.median(times):.2f} ms")


if __name__ == "__main__":
    main()
