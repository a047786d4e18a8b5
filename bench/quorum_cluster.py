"""``python -m bench.quorum_cluster``: a quorum queue replicated on 3 TrioMQ nodes against the
same queue unreplicated, in one run, with RabbitMQ's single-node quorum queue as reference.

A private etcd and three TrioMQ nodes with ``--cluster`` (one machine: the nodes, etcd and
the clients share its cores and its one disk). Per queue, clients on the leader's node:

* **publish**: ``-n`` persistent messages with confirms, at most ``--window`` unconfirmed;
* **consume**: the same messages with manual acks (prefetch 200);
* **confirm latency**: ``--latency-n`` publishes one at a time (each waits for its
  confirm), p50 / p99;
* **confirm+ack**: the publish and the consume timed together, msg/s (the ratio x3 / x1
  of this is the replication issue's figure);
* **broker CPU**: CPU seconds of the TrioMQ processes (all three nodes) over the publish
  and consume, per 1,000 messages (from /proc);
* **the disk**: an 8 KiB append + fsync on the nodes' disk, 100 times, before and after
  the four measurements (x3 waits for three fsync streams on the one disk, x1 for one).

Queues: ``quorum x3`` (x-quorum-initial-group-size 3: confirmed once a majority has it on
disk), ``quorum x1`` (group size 1 on the same cluster: no replica, the unreplicated
baseline) and, when ``--rabbit-url`` answers, RabbitMQ's quorum queue -- a single
RabbitMQ node here, so it replicates to nobody: it is the one-node reference, not a
3-node one.

``--failover N``: N rounds of kill -9 of the quorum x3 queue's leader while a client on
another node publishes one message at a time; the time from the kill to the first
confirm after it (the leader's lease TTL is ``--ttl``), then the old leader is restarted
and waits to be in sync again. ``--catch-up``: a follower stopped, ``--missed``
messages published while it is away on top of a queue of ``-n`` (then of 5 x ``-n``), the
follower restarted; what the leader sent it and the time from its start to in sync.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pika

from .cluster import Procs
from .procinfo import cpu_seconds
from .quorum import _consume, _publish

REPO = Path(__file__).resolve().parent.parent
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def _status(cluster: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "broker", "cluster", "status", "--cluster",
                        cluster, "--json"], cwd=str(REPO), capture_output=True, text=True,
                       timeout=30)
    return json.loads(p.stdout) if p.returncode == 0 else {}


def _view(cluster: str, queue: str) -> dict:
    for q in _status(cluster).get("queues", []):
        if q["name"] == queue:
            return q
    return {}


def _wait(cluster: str, queue: str, check, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        view = _view(cluster, queue)
        if view and check(view):
            return view
        if time.monotonic() > deadline:
            raise RuntimeError(f"queue {queue}: not as expected after {timeout:.0f} s: {view}")
        time.sleep(0.2)


def fsync_ms(directory: Path, rounds: int = 100) -> dict:
    """The disk under the nodes' data, now: p50 / p90 ms of an 8 KiB append and fsync (a
    quorum x3 publish waits for three such streams on this one disk, x1 for one)."""
    path = directory / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(rounds):
            os.write(fd, b"x" * 8192)
            t0 = time.perf_counter()
            os.fsync(fd)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return {"p50": _pct(times, 50), "p90": _pct(times, 90)}


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def measure(url: str, queue: str, args, pids: list[int]) -> dict:
    body = b"x" * args.size
    c0 = _cpu(pids)
    each0 = [cpu_seconds(pid) or 0.0 for pid in pids]
    t0 = time.perf_counter()
    pub = _publish(url, queue, args.n, args.window, body)
    # per node over the publish alone: the leader's cost and each follower's
    each = [((cpu_seconds(pid) or 0.0) - t) / args.n * 1e6
            for pid, t in zip(pids, each0, strict=True)]
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    con = _consume(ch, queue, args.n)
    both = time.perf_counter() - t0  # publish with confirms, then consume with acks
    cpu = _cpu(pids) - c0
    ch.confirm_delivery()
    lat = []
    for _ in range(args.latency_n):
        t0 = time.perf_counter()
        ch.basic_publish("", queue, body, PERSISTENT)
        lat.append((time.perf_counter() - t0) * 1000)
    ch.queue_purge(queue)
    conn.close()
    return {"publish_msgs_per_s": args.n / pub, "consume_msgs_per_s": args.n / con,
            "confirm_ack_msgs_per_s": args.n / both,
            "confirm_ms_p50": statistics.median(lat), "confirm_ms_p99": _pct(lat, 99),
            "broker_cpu_s_per_1000": cpu / args.n * 1000 if pids else None,
            "publish_cpu_us_per_msg_by_node": [round(x) for x in each]}


def _declare(url: str, queue: str, arguments: dict) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments=arguments)
    conn.close()


def failover(args, cluster: str, nodes: dict, procs: Procs, queue: str) -> list[float]:
    times = []
    for _ in range(args.failover):
        leader = _wait(cluster, queue, lambda v: len(v["in_sync"]) == 2)["master"]
        other = next(n for n in nodes if n != leader)
        conn = pika.BlockingConnection(pika.URLParameters(nodes[other]["url"]))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", queue, b"warm", PERSISTENT)
        nodes[leader]["proc"].kill()
        nodes[leader]["proc"].wait()
        t0 = time.monotonic()
        while True:
            try:
                ch.basic_publish("", queue, b"f", PERSISTENT)
                break
            except pika.exceptions.NackError:
                time.sleep(0.02)
            except pika.exceptions.AMQPError:
                conn = pika.BlockingConnection(pika.URLParameters(nodes[other]["url"]))
                ch = conn.channel()
                ch.confirm_delivery()
        times.append(time.monotonic() - t0)
        conn.close()
        _restart(procs, nodes, leader, cluster)
    return times


def _restart(procs: Procs, nodes: dict, name: str, cluster: str) -> None:
    port, proc = procs.broker(name, nodes[name]["argv"])
    nodes[name].update(proc=proc, url=f"amqp://guest:guest@127.0.0.1:{port}/", pid=proc.pid)


def catch_up(args, cluster: str, nodes: dict, procs: Procs, work: Path, size: int) -> dict:
    queue = f"bench-catchup-{size}"
    _declare(nodes["node1"]["url"], queue, {"x-queue-type": "quorum"})
    leader = _wait(cluster, queue, lambda v: len(v["in_sync"]) == 2)["master"]
    follower = sorted(n for n in nodes if n != leader)[0]
    url = nodes[leader]["url"]
    _publish(url, queue, size, args.window, b"x" * args.size)
    _wait(cluster, queue, lambda v: len(v["in_sync"]) == 2)
    nodes[follower]["proc"].kill()
    nodes[follower]["proc"].wait()
    _wait(cluster, queue, lambda v: follower not in v["in_sync"])
    _publish(url, queue, args.missed, args.window, b"y" * args.size)
    t0 = time.monotonic()
    _restart(procs, nodes, follower, cluster)
    _wait(cluster, queue, lambda v: follower in v["in_sync"])
    seconds = time.monotonic() - t0
    log = (work / f"{leader}.log").read_text(errors="replace")
    line = [x.split("INFO ")[-1] for x in log.splitlines()
            if f"queue '{queue}': mirror '{follower}' catches up" in x]
    purge = pika.BlockingConnection(pika.URLParameters(url))
    purge.channel().queue_delete(queue)
    purge.close()
    return {"queue_messages": size + args.missed, "missed": args.missed,
            "start_to_in_sync_s": seconds, "leader_log": line[-1] if line else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quorum_cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=5000)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--latency-n", type=int, default=300)
    p.add_argument("--ttl", type=float, default=2.0, help="the nodes' --cluster-ttl")
    p.add_argument("--failover", type=int, default=0, metavar="ROUNDS")
    p.add_argument("--catch-up", action="store_true")
    p.add_argument("--missed", type=int, default=1000)
    p.add_argument("--rabbit-url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--json", default=None, metavar="FILE")
    args = p.parse_args(argv)
    print("command: " + " ".join([os.path.basename(sys.executable), "-m", "bench.quorum_cluster",
                                  *(argv if argv is not None else sys.argv[1:])]))
    work = Path(tempfile.mkdtemp(prefix="triomq-bench-quorum-"))
    procs = Procs(work)
    out: dict = {}
    try:
        cluster = procs.etcd()
        nodes: dict = {}
        for i in (1, 2, 3):
            name = f"node{i}"
            argv_ = ["--cluster", cluster, "--node-name", name, "--cluster-ttl", str(args.ttl)]
            nodes[name] = {"argv": argv_}
            _restart(procs, nodes, name, cluster)
        pids = [n["pid"] for n in nodes.values()]
        url = nodes["node1"]["url"]
        _declare(url, "bench-q3", {"x-queue-type": "quorum"})
        _declare(url, "bench-q1", {"x-queue-type": "quorum", "x-quorum-initial-group-size": 1})
        _wait(cluster, "bench-q3", lambda v: v["in_sync"] == ["node2", "node3"])
        out["fsync_ms_before"] = fsync_ms(work)
        for queue, label in (("bench-q1", "quorum x1"), ("bench-q3", "quorum x3"),
                             ("bench-q1", "quorum x1 (again)"),
                             ("bench-q3", "quorum x3 (again)")):
            out[label] = measure(url, queue, args, pids)
        out["fsync_ms_after"] = fsync_ms(work)
        if args.rabbit_url:
            try:
                _declare(args.rabbit_url, "bench-qq-ref", {"x-queue-type": "quorum"})
                out["RabbitMQ quorum, 1 node"] = measure(args.rabbit_url, "bench-qq-ref", args,
                                                         [])
                conn = pika.BlockingConnection(pika.URLParameters(args.rabbit_url))
                conn.channel().queue_delete("bench-qq-ref")
                conn.close()
            except (pika.exceptions.AMQPError, OSError) as exc:
                print(f"RabbitMQ reference skipped: {exc}")
        if args.failover:
            times = failover(args, cluster, nodes, procs, "bench-q3")
            out["failover_s"] = {"rounds": len(times), "p50": statistics.median(times),
                                 "max": max(times), "all": times}
        if args.catch_up:  # the same missed messages behind a queue 5 times larger
            out["catch_up"] = [catch_up(args, cluster, nodes, procs, work, size)
                               for size in (args.n, 5 * args.n)]
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.n} persistent messages of {args.size} B, confirm window {args.window}, "
          f"clients on the leader's node")
    print("| queue | publish msg/s | consume msg/s | confirm p50 ms | confirm p99 ms | "
          "TrioMQ CPU s / 1000 msg |")
    print("|---|---|---|---|---|---|")
    for label, r in out.items():
        if not isinstance(r, dict) or "publish_msgs_per_s" not in r:
            continue
        cpu = r["broker_cpu_s_per_1000"]
        print(f"| {label} | {r['publish_msgs_per_s']:.0f} | {r['consume_msgs_per_s']:.0f} | "
              f"{r['confirm_ms_p50']:.2f} | {r['confirm_ms_p99']:.2f} | "
              f"{'-' if cpu is None else f'{cpu:.3f}'} |")
    for label, r in out.items():
        if isinstance(r, dict) and r.get("publish_cpu_us_per_msg_by_node"):
            print(f"{label}: publish CPU per message by node (node1 leads), us: "
                  f"{r['publish_cpu_us_per_msg_by_node']}")
    for a_, b_ in (("quorum x3", "quorum x1"), ("quorum x3 (again)", "quorum x1 (again)")):
        if a_ in out and b_ in out:
            print(f"ratio {a_} / {b_}: publish "
                  f"{out[a_]['publish_msgs_per_s'] / out[b_]['publish_msgs_per_s']:.2f}, "
                  f"consume {out[a_]['consume_msgs_per_s'] / out[b_]['consume_msgs_per_s']:.2f}, "
                  f"confirm+ack {out[a_]['confirm_ack_msgs_per_s'] / out[b_]['confirm_ack_msgs_per_s']:.2f}")
    for key in ("fsync_ms_before", "fsync_ms_after"):
        if key in out:
            print(f"{key}: 8 KiB append + fsync on the nodes' disk, p50 {out[key]['p50']:.2f} "
                  f"p90 {out[key]['p90']:.2f} ms")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if "failover_s" in out:
        f = out["failover_s"]
        print(f"failover (kill -9 of the leader -> first confirm on another node), TTL "
              f"{args.ttl:g} s, {f['rounds']} rounds: p50 {f['p50']:.2f} s, max {f['max']:.2f} s")
    for c in out.get("catch_up", []):
        print(f"catch-up: {c['missed']} missed of {c['queue_messages']}: in sync "
              f"{c['start_to_in_sync_s']:.2f} s after the restart; {c['leader_log']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
