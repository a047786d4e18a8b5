"""``python -m bench.cluster``: does a 2-node cluster on one machine serve more than one node?

Two queues under confirm + ack load, each with its own producers and consumers (the bench's
worker processes, ``bench.runner.run_workload``), measured twice in the same run:

* **one node**: both workloads against one TrioMQ (no cluster);
* **two nodes**: a private etcd and two TrioMQ nodes with ``--cluster``; each workload
  declares its queue on, and connects to, its own node (the queue's home), as clients of a
  cluster spread by placement would.

The aggregate delivered rate of the two, and the ratio. The load generator shares the
machine's cores with the brokers, so the ratio is a lower bound of what separate machines get.

``--mirrored``: one queue under the same load on a 3-node cluster, clients on its master,
first unmirrored, then mirrored on all 3 nodes (policy ``ha-mode all``), in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from .runner import run_workload

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.3):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port} after {timeout:.0f} s")


class Procs:
    def __init__(self, work: Path):
        self.work = work
        self.procs: list[subprocess.Popen] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.work / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def broker(self, name: str, extra: list[str]) -> tuple[int, subprocess.Popen]:
        port = _free_port()
        proc = self.spawn(name, [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1",
                                 "--port", str(port), "--data-dir", str(self.work / name),
                                 "--http-port", "0", *extra])
        _wait_port(port, proc)
        return port, proc

    def etcd(self) -> str:
        client, peer = _free_port(), _free_port()
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        proc = self.spawn("etcd", [
            etcd, "--name", "b", "--data-dir", str(self.work / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{client}",
            "--advertise-client-urls", f"http://127.0.0.1:{client}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"b=http://127.0.0.1:{peer}", "--log-level", "warn"])
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=1):
                    return f"etcd://127.0.0.1:{client}/bench"
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("etcd did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        for proc in reversed(self.procs):  # brokers before etcd
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


def _parallel(urls: list[str], cfg: dict, label: str) -> list[dict]:
    """One workload per URL, started together; their measured windows coincide within the
    set-up time of the workers."""
    results: list[dict] = [{} for _ in urls]

    def one(i: int) -> None:
        results[i] = run_workload(urls[i], cfg, label=f"{label}[{i}]", quiet=True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _rate(results: list[dict]) -> float:
    return sum((r.get("consume_rate") or 0.0) for r in results)


def mirrored(args, cfg: dict, work: Path, procs: Procs) -> dict:
    """Unmirrored, then mirrored on 3 nodes: the same workload on node1 (the master)."""
    import httpx
    cluster = procs.etcd()
    http = _free_port()
    port1 = procs.broker("node1", ["--cluster", cluster, "--node-name", "node1",
                                   "--http-port", str(http)])[0]
    for i in (2, 3):
        procs.broker(f"node{i}", ["--cluster", cluster, "--node-name", f"node{i}"])
    url = f"amqp://guest:guest@127.0.0.1:{port1}/"
    plain = run_workload(url, cfg, label="unmirrored", quiet=True)
    r = httpx.put(f"http://127.0.0.1:{http}/api/policies/%2F/ha", auth=("guest", "guest"),
                  json={"pattern": "^bench-", "definition": {"ha-mode": "all"},
                        "apply-to": "queues"}, timeout=10)
    r.raise_for_status()
    time.sleep(1.0)
    mirrored_run = run_workload(url, cfg, label="mirrored x3", quiet=True)
    one = plain.get("consume_rate") or 0.0
    three = mirrored_run.get("consume_rate") or 0.0
    return {"unmirrored_msgs_per_s": one, "mirrored3_msgs_per_s": three,
            "ratio": three / one if one else None, "unmirrored": plain, "mirrored3": mirrored_run,
            "errors": plain.get("errors", []) + mirrored_run.get("errors", [])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--producers", type=int, default=1, help="per queue")
    p.add_argument("--consumers", type=int, default=1, help="per queue")
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--persistent", action="store_true",
                   help="persistent messages (each node's journal fsyncs; one disk here)")
    p.add_argument("--rabbit-url", default="amqp://guest:guest@127.0.0.1:5672/",
                   help="the reference: the same two workloads on one RabbitMQ node, in the "
                        "same run ('' skips it)")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--mirrored", action="store_true",
                   help="one queue on a 3-node cluster: unmirrored, then mirrored on all 3")
    args = p.parse_args(argv)
    cfg = {"producers": args.producers, "consumers": args.consumers, "size": args.size,
           "confirms": True, "manual_ack": True, "queue_durable": True,
           "persistent": args.persistent, "exchange_type": "default", "queues": 1,
           "duration": args.duration, "warmup": 2.0}
    print("command: " + " ".join([os.path.basename(sys.executable), "-m", "bench.cluster",
                                  *(argv if argv is not None else sys.argv[1:])]))
    work = Path(tempfile.mkdtemp(prefix="triomq-bench-cluster-"))
    out: dict = {"config": cfg}
    procs = Procs(work)
    if args.mirrored:
        try:
            res = mirrored(args, cfg, work, procs)
        finally:
            procs.stop()
            shutil.rmtree(work, ignore_errors=True)
        print(f"1 queue, confirm + ack, {args.size} B, "
              f"{'persistent' if args.persistent else 'transient'}, "
              f"{args.producers}P/{args.consumers}C, {args.duration:g} s, clients on the master")
        print(f"  unmirrored       : {res['unmirrored_msgs_per_s']:10.0f} msg/s delivered")
        print(f"  mirrored (3 nodes): {res['mirrored3_msgs_per_s']:10.0f} msg/s delivered   "
              f"ratio {res['ratio'] or 0:.2f}")
        if res["errors"]:
            print("  errors: " + "; ".join(res["errors"][:5]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=2, default=str)
        return 1 if res["errors"] else 0
    try:
        port, _ = procs.broker("single", [])
        url = f"amqp://guest:guest@127.0.0.1:{port}/"
        single = _parallel([url, url], cfg, "one node")
        procs.stop()
        cluster = procs.etcd()
        ports = [procs.broker(f"node{i}", ["--cluster", cluster, "--node-name", f"node{i}"])[0]
                 for i in (1, 2)]
        double = _parallel([f"amqp://guest:guest@127.0.0.1:{pt}/" for pt in ports], cfg,
                           "two nodes")
    finally:
        procs.stop()
        shutil.rmtree(work, ignore_errors=True)
    rabbit: list[dict] = []
    if args.rabbit_url:
        rabbit = _parallel([args.rabbit_url, args.rabbit_url], cfg, "rabbitmq")
        out["rabbitmq_one_node_msgs_per_s"] = _rate(rabbit)
        out["rabbitmq"] = rabbit
    errors = [e for r in single + double + rabbit for e in r.get("errors", [])]
    one, two = _rate(single), _rate(double)
    out.update({"one_node_msgs_per_s": one, "two_nodes_msgs_per_s": two,
                "ratio": two / one if one else None, "errors": errors,
                "one_node": single, "two_nodes": double})
    print(f"2 queues, confirm + ack, {args.size} B, "
          f"{'persistent' if args.persistent else 'transient'}, "
          f"{args.producers}P/{args.consumers}C per queue, {args.duration:g} s")
    print(f"  one node : {one:10.0f} msg/s delivered")
    print(f"  two nodes: {two:10.0f} msg/s delivered   ratio {out['ratio'] or 0:.2f}")
    if rabbit:
        print(f"  RabbitMQ 3.10, one node (reference): {_rate(rabbit):10.0f} msg/s delivered")
    if errors:
        print("  errors: " + "; ".join(errors[:5]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
