"""Rounds of load + fault + recovery on an etcd-coordinated cluster with mirrored queues:
a private etcd, ``nodes`` TrioMQ nodes (``--cluster``), a policy ``ha-mode all`` on the
workload's queues; the fault hits the master of the first queue (kill -9, or SIGSTOP for
``pause`` seconds); the round ends when an in-sync mirror was promoted for every queue the
faulty node mastered and confirms flow again. Clients are given every node's address."""
from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx

from . import workload
from .checker import check, percentile
from .nodes import REPO, BrokerProcess, free_port, listening
from .workload import Consumer, History, Producer

log = logging.getLogger("jepsen")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"


class Etcd:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.client = free_port()
        self.peer = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        client, peer = f"http://127.0.0.1:{self.client}", f"http://127.0.0.1:{self.peer}"
        with open(self.workdir / "etcd.log", "ab") as out:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "j", "--data-dir", str(self.workdir / "etcd"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"j={peer}", "--log-level", "warn"],
                stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class ClusterNode(BrokerProcess):
    def __init__(self, name: str, url: str, secret: Path, workdir: Path, ttl: float):
        self.name = name
        self.url = url
        self.secret = secret
        self.workdir = workdir
        self.ttl = ttl
        self.port = free_port()
        self.http_port = free_port()
        self.proc = None
        self.paused = False

    def start(self) -> None:
        with open(self.workdir / f"{self.name}.log", "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port",
                 str(self.port), "--data-dir", str(self.workdir / self.name), "--http-port",
                 str(self.http_port), "--cluster", self.url, "--node-name", self.name,
                 "--cluster-secret-file", str(self.secret), "--cluster-ttl", str(self.ttl)],
                cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT)
        self.paused = False


def cluster_status(url: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "broker", "cluster", "status", "--cluster", url,
                        "--json"], cwd=str(REPO), capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip())
    return json.loads(p.stdout)


def _wait(what: str, check, timeout: float, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
            value = None
        if value:
            return value
        time.sleep(every)
    raise RuntimeError(f"timed out waiting for {what}")


def run_mirrored(rounds: int = 2, nemeses: tuple[str, ...] = ("kill9", "sigstop"),
                 nodes: int = 3, producers: int = 3, consumers: int = 2, queues: int = 2,
                 pause: float = 5.0, ttl: float = 2.0, warmup: float = 1.5,
                 workdir: Path | None = None) -> dict:
    keep = workdir is not None
    work = Path(workdir or tempfile.mkdtemp(prefix="triomq-jepsen-mirrored-"))
    work.mkdir(parents=True, exist_ok=True)
    secret = work / "secret"
    secret.write_text("jepsen-cluster-secret-0123456789")
    etcd = Etcd(work)
    history = History()
    names = [f"jepsen-q{i}" for i in range(queues)]
    members: list[ClusterNode] = []
    clients: list = []
    faults: list[dict] = []
    try:
        etcd.start()
        url = f"etcd://127.0.0.1:{etcd.client}/jepsen"
        members = [ClusterNode(f"n{i + 1}", url, secret, work, ttl) for i in range(nodes)]
        # the first node seeds the cluster's users; the others join it
        members[0].start()
        _wait("the first node", lambda: listening(members[0].port), 60)
        for m in members[1:]:
            m.start()
        _wait("the nodes", lambda: all(listening(m.port) for m in members), 60)
        r = httpx.put(f"http://127.0.0.1:{members[0].http_port}/api/policies/%2F/ha",
                      auth=("guest", "guest"), timeout=10,
                      json={"pattern": "^jepsen-", "definition": {"ha-mode": "all"},
                            "apply-to": "queues"})
        r.raise_for_status()
        time.sleep(1.0)  # the policy reaches every node through etcd
        addresses = [("127.0.0.1", m.port) for m in members]
        clients = ([Producer(i, addresses, names, history) for i in range(producers)]
                   + [Consumer(i, addresses, names, history) for i in range(consumers)])
        for c in clients:
            c.start()
        for rnd in range(rounds):
            kind = nemeses[rnd % len(nemeses)]

            def synced():
                view = cluster_status(url)
                live = {n["name"] for n in view["nodes"] if n["health"] == "up"}
                qs = {q["name"]: q for q in view["queues"]}
                ok = len(live) == nodes and all(
                    n in qs and qs[n]["master"] and len(qs[n]["in_sync"]) == nodes - 1
                    for n in names)
                return qs if ok else None
            qs = _wait("every queue mirrored and in sync", synced, 120, 0.3)
            time.sleep(warmup)
            target_name = qs[names[0]]["master"]
            victims = {n for n in names if qs[n]["master"] == target_name}
            target = next(m for m in members if m.name == target_name)
            t_fault = time.monotonic()
            if kind == "kill9":
                target.kill9()
            else:
                target.pause()

            def promoted():
                view = cluster_status(url)
                qs = {q["name"]: q for q in view["queues"]}
                return all(qs.get(n, {}).get("master") not in (None, target_name)  # noqa: B023
                           for n in victims)  # noqa: B023
            _wait("a promoted mirror", promoted, ttl + 60, 0.1)
            t_promoted = time.monotonic()
            deadline = t_promoted + 30
            gap = history.confirm_gap(t_fault, t_promoted)
            while gap is None and time.monotonic() < deadline:
                time.sleep(0.05)
                gap = history.confirm_gap(t_fault, t_promoted)
            if kind == "kill9":
                target.start()
            else:
                while time.monotonic() - t_fault < pause:
                    time.sleep(0.05)
                target.resume()
            fault = {"round": rnd + 1, "nemesis": kind, "old": target_name,
                     "queues": sorted(victims),
                     "failover_s": round(t_promoted - t_fault, 3),
                     "confirm_gap_s": round(gap[0], 3) if gap else None,
                     "confirms_resumed_s": round(gap[1], 3) if gap else None}
            faults.append(fault)
            log.info("round %d: %s", rnd + 1, fault)
        time.sleep(warmup)
        workload.finish(clients, history, idle=4.0)
    finally:
        workload.stop(clients)
        for m in members:
            m.stop()
        etcd.stop()
    result = check(history)
    if result["ok"] and not keep:
        shutil.rmtree(work, ignore_errors=True)
    failovers = [f["failover_s"] for f in faults]
    resumed = [f["confirms_resumed_s"] for f in faults if f["confirms_resumed_s"] is not None]
    result.update({
        "topology": f"etcd, {nodes} nodes, ha-mode all, TTL {ttl} s",
        "rounds": len(faults), "faults": faults, "workdir": str(work),
        "failover_p50_s": percentile(failovers, 50), "failover_p99_s": percentile(failovers, 99),
        "confirms_resumed_p50_s": percentile(resumed, 50),
        "confirms_resumed_p99_s": percentile(resumed, 99),
        "confirms_never_resumed": len(faults) - len(resumed),
    })
    return result
