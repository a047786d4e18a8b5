"""``python -m bench.stream_cluster``: confirmed publish throughput of a stream replicated
on 3 TrioMQ nodes against a 1-replica stream on the same cluster, in one run.

A private etcd and three TrioMQ nodes with ``--cluster`` and a Stream-protocol listener
each (the followers copy the leader's log over it), on one machine: nodes, etcd and the
client share its cores and its one disk. Clients on the leader's node (node1):

* **publish**: ``-n`` persistent messages with confirms over AMQP 0-9-1 (pika), at most
  ``--window`` unconfirmed; a 3-replica stream confirms once 2 of 3 logs committed the
  chunk, a 1-replica stream once its own log did;
* **confirm latency**: ``--latency-n`` publishes one at a time, p50 / p99;
* **broker CPU**: CPU seconds of the three TrioMQ processes over the publish, per 1,000
  messages (from /proc).

Each stream is measured twice, alternately (x1, x3, x1, x3), to show the noise.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pika

from .cluster import Procs, _free_port
from .procinfo import cpu_seconds
from .quorum import _publish

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def measure(url: str, queue: str, args, pids: list[int]) -> dict:
    body = b"x" * args.size
    c0 = _cpu(pids)
    seconds = _publish(url, queue, args.n, args.window, body)
    cpu = _cpu(pids) - c0
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    lat = []
    for _ in range(args.latency_n):
        t0 = time.perf_counter()
        ch.basic_publish("", queue, body, PERSISTENT)
        lat.append((time.perf_counter() - t0) * 1000)
    conn.close()
    lat.sort()
    return {"publish_msgs_per_s": args.n / seconds, "confirm_ms_p50": statistics.median(lat),
            "confirm_ms_p99": lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))],
            "broker_cpu_s_per_1000": cpu / args.n * 1000}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stream_cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=20000)
    p.add_argument("--window", type=int, default=200)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--latency-n", type=int, default=200)
    args = p.parse_args(argv)
    print("command: " + " ".join([os.path.basename(sys.executable), "-m", "bench.stream_cluster",
                                  *(argv if argv is not None else sys.argv[1:])]))
    work = Path(tempfile.mkdtemp(prefix="triomq-bench-streams-"))
    procs = Procs(work)
    out: dict = {}
    try:
        cluster = procs.etcd()
        urls, pids = {}, []
        for i in (1, 2, 3):
            name = f"node{i}"
            port, proc = procs.broker(name, ["--cluster", cluster, "--node-name", name,
                                             "--stream-port", str(_free_port())])
            urls[name] = f"amqp://guest:guest@127.0.0.1:{port}/"
            pids.append(proc.pid)
        url = urls["node1"]
        conn = pika.BlockingConnection(pika.URLParameters(url))
        ch = conn.channel()
        ch.queue_declare("bench-s3", durable=True, arguments={
            "x-queue-type": "stream", "x-initial-cluster-size": 3})
        ch.queue_declare("bench-s1", durable=True, arguments={
            "x-queue-type": "stream", "x-initial-cluster-size": 1})
        conn.close()
        deadline = time.monotonic() + 60
        while not all("replicating from node 'node1'" in (work / f"node{i}.log").read_text()
                      for i in (2, 3)):
            if time.monotonic() > deadline:
                raise RuntimeError("the followers did not start copying")
            time.sleep(0.2)
        for queue, label in (("bench-s1", "stream x1"), ("bench-s3", "stream x3"),
                             ("bench-s1", "stream x1 (again)"),
                             ("bench-s3", "stream x3 (again)")):
            out[label] = measure(url, queue, args, pids)
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.n} persistent messages of {args.size} B over AMQP 0-9-1, confirm window "
          f"{args.window}, client on the leader's node")
    print("| stream | publish msg/s | confirm p50 ms | confirm p99 ms | "
          "TrioMQ CPU s / 1000 msg (3 nodes) |")
    print("|---|---|---|---|---|")
    for label, r in out.items():
        print(f"| {label} | {r['publish_msgs_per_s']:.0f} | {r['confirm_ms_p50']:.2f} | "
              f"{r['confirm_ms_p99']:.2f} | {r['broker_cpu_s_per_1000']:.3f} |")
    for a_, b_ in (("stream x3", "stream x1"), ("stream x3 (again)", "stream x1 (again)")):
        if a_ in out and b_ in out:
            print(f"ratio {a_} / {b_}: publish "
                  f"{out[a_]['publish_msgs_per_s'] / out[b_]['publish_msgs_per_s']:.2f}, "
                  f"CPU per message "
                  f"{out[a_]['broker_cpu_s_per_1000'] / out[b_]['broker_cpu_s_per_1000']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
