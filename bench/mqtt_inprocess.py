"""What one MQTT message costs the broker in process, without sockets or trio: a broker with
a MemoryStore, two publisher sessions and one clean-session subscriber on ``bench/#`` (the
shape of ``bench.mqtt throughput``), each publisher read carrying ``--batch`` PUBLISHes of
64 bytes to ``bench/<publisher>/t``; QoS 1 and 2 subscribers answer every delivery of a read
(PUBACK, or PUBREC then PUBCOMP). The figure is process CPU per message (median of the
rounds), so the machine's load counts much less than in the socket bench.

    .venv/bin/python -m bench.mqtt_inprocess [--qos 0] [--batch 64] [--messages 200000]
                                             [--rounds 5] [--prefetch 20] [--window 0]
                                             [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time

from broker.broker import Broker
from broker.config import Config
from broker.listeners.mqtt_session import MQTTService, MQTTSession
from broker.mqtt import codec as m
from broker.persistence import MemoryStore


def _session(service: MQTTService, client_id: str, port: int) -> MQTTSession:
    s = MQTTSession(service, f"127.0.0.1:{port}", "127.0.0.1")
    s.data_received(m.encode(m.Connect(client_id, True, 0)))
    s.conn.data_to_send()
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.mqtt_inprocess")
    p.add_argument("--qos", type=int, default=0, choices=(0, 1))
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prefetch", type=int, default=20)
    p.add_argument("--window", type=int, default=0,
                   help="the subscriber's window exactly (mqtt_prefetch): it fills, as under "
                        "socket load, and most publishes find it full; 0: never full")
    p.add_argument("--profile", action="store_true", help="one more round under cProfile")
    args = p.parse_args(argv)
    config = Config(host="127.0.0.1", port=0, data_dir=tempfile.mkdtemp(prefix="mqttbench-"),
                    memory_limit_bytes=1 << 50, disk_free_limit=0, heartbeat=0)
    # by default the window never stalls a read
    config.mqtt_prefetch = args.window or max(args.prefetch, args.batch * 2)
    broker = Broker(config, MemoryStore())
    service = MQTTService(broker)
    sub = _session(service, "sub", 10000)
    sub.data_received(m.encode(m.Subscribe(1, [("bench/#", args.qos)])))
    sub.conn.data_to_send()
    pubs = [_session(service, f"pub{i}", 10001 + i) for i in range(2)]
    qos = args.qos

    # one read per publisher, made once (a publisher's QoS 1 ids are free again once acked)
    reads = [b"".join(m.encode(m.Publish(f"bench/{p}/t", b"x" * 64, qos, False, False,
                                         i + 1 if qos else None))
                      for i in range(args.batch)) for p in range(len(pubs))]

    def one_round(n: int) -> float:
        done = 0
        t0 = time.process_time()
        while done < n:
            for i, pub in enumerate(pubs):
                pub.data_received(reads[i])
                pub.conn.data_to_send()
                sub.conn.data_to_send()
                if qos:  # the subscriber's PUBACKs, made as cheaply as a client could
                    sub.data_received(b"".join([b"\x40\x02" + pid.to_bytes(2, "big")
                                                for pid in sub.conn.inflight]))
                done += args.batch
        return (time.process_time() - t0) / done * 1e9

    one_round(args.messages // 10)  # warm-up: caches, the queue's structures
    figures = [one_round(args.messages) for _ in range(args.rounds)]
    print(f"QoS {qos}, {args.batch} PUBLISHes per read: "
          f"{statistics.median(figures):,.0f} ns per message (median; rounds: "
          + " · ".join(f"{f:,.0f}" for f in figures) + ")")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(one_round, args.messages)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
