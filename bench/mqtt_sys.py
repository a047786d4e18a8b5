"""What a $SYS round costs (broker/listeners/mqtt_sys.py), in process: a broker with a
MemoryStore, ``--sessions`` MQTT sessions (``--persistent`` of them disconnected, their
queues kept), each with ``--filters`` subscriptions, and ``--sys-subscribers`` of them on
``$SYS/#``; the figure is the median time of one round (every value read, the changed
ones published into every vhost).

    .venv/bin/python -m bench.mqtt_sys [--sessions 10000] [--persistent 2000]
                                       [--filters 2] [--sys-subscribers 10] [--rounds 20]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from broker.broker import Broker
from broker.config import Config
from broker.listeners.mqtt_session import MQTTService, MQTTSession
from broker.listeners.mqtt_sys import SysTopics
from broker.mqtt import codec as m
from broker.persistence import MemoryStore


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.mqtt_sys")
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--persistent", type=int, default=2_000)
    p.add_argument("--filters", type=int, default=2)
    p.add_argument("--sys-subscribers", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    config = Config(host="127.0.0.1", port=0, data_dir=tempfile.mkdtemp(prefix="sysbench-"),
                    memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0)
    broker = Broker(config, MemoryStore())
    service = MQTTService(broker)
    sessions = []
    for i in range(args.sessions):
        s = MQTTSession(service, f"127.0.0.1:{10000 + i}", "127.0.0.1")
        clean = i >= args.persistent
        s.data_received(m.encode(m.Connect(f"c{i}", clean, 0)))
        filters = [(f"dev/{i}/f{j}", 1) for j in range(args.filters)]
        if i >= args.sessions - args.sys_subscribers:  # connected ones
            filters.append(("$SYS/#", 0))
        s.data_received(m.encode(m.Subscribe(1, filters)))
        s.conn.data_to_send()
        sessions.append(s)
    for s in sessions[:args.persistent]:
        s.connection_lost()  # a persistent session without its connection
    sys_topics = SysTopics(service, 10.0)
    times = []
    for _ in range(args.rounds):
        t = time.perf_counter()
        sys_topics.publish_round()
        times.append(time.perf_counter() - t)
        for s in sessions[-args.sys_subscribers:]:
            s.conn.data_to_send()
    print(f"{args.sessions} sessions ({args.persistent} disconnected), {args.filters} filters "
          f"each, {args.sys_subscribers} on $SYS/#: first round {times[0] * 1e3:.1f} ms, "
          f"median {statistics.median(times[1:]) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
