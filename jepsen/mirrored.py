"""Rounds of load + fault + recovery on an etcd-coordinated cluster with mirrored queues:
a private etcd, ``nodes`` TrioMQ nodes (``--cluster``), a policy ``ha-mode all`` on the
workload's queues. On loopback the faults are processes (``kill9``, ``sigstop``); with
``netns`` every host (etcd, each node) is a network namespace on one bridge
(:mod:`jepsen.netns`) and the network faults are available too:

``kill9``             kill -9 the master of the first queue, restart it after the failover
``sigstop``           SIGSTOP it for ``pause`` seconds, then SIGCONT
``partition-master``  cut it from everything (the other nodes, etcd, the clients) for
                      ``pause`` seconds: an in-sync mirror must be promoted meanwhile
``isolate-mirror``    cut a node that masters none of the queues (a mirror) for ``pause``
                      seconds: it must leave the in-sync sets, and resync after the heal
``slow-links``        every node's link slow and lossy (:meth:`Topology.slow`) for
                      ``pause`` seconds
``restart-etcd``      stop etcd, start it again after ``pause`` seconds on the same data
                      directory: nothing confirmed meanwhile (nacks), confirms resume alone

A round ends when the fault healed and every queue again has a master and all its mirrors
in sync. Clients are given every node's address."""
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
from .netns import Host, Topology
from .nodes import REPO, BrokerProcess, free_port, listening
from .workload import Consumer, History, Producer

log = logging.getLogger("jepsen")
ETCD = shutil.which("etcd") or "/usr/bin/etcd"
PROCESS_NEMESES = ("kill9", "sigstop")
NETWORK_NEMESES = ("partition-master", "isolate-mirror", "slow-links")
MIRRORED_NEMESES = (*PROCESS_NEMESES, *NETWORK_NEMESES, "restart-etcd", "rolling-restart")


def _in(host: Host | None, argv: list[str]) -> list[str]:
    return host.exec_argv(argv) if host is not None else argv


class Etcd(BrokerProcess):
    def __init__(self, workdir: Path, host: Host | None = None):
        self.workdir = workdir
        self.host = host
        self.addr = host.addr if host else "127.0.0.1"
        self.client = 2379 if host else free_port()
        self.peer = 2380 if host else free_port()
        self.proc = None
        self.paused = False

    @property
    def endpoint(self) -> str:
        return f"{self.addr}:{self.client}"

    def start(self) -> None:
        client, peer = f"http://{self.addr}:{self.client}", f"http://{self.addr}:{self.peer}"
        with open(self.workdir / "etcd.log", "ab") as out:
            self.proc = subprocess.Popen(_in(self.host, [
                ETCD, "--name", "j", "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"j={peer}", "--log-level", "warn"]),
                stdout=out, stderr=subprocess.STDOUT)
        self.paused = False
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not start")


class ClusterNode(BrokerProcess):
    def __init__(self, name: str, url: str, secret: Path, workdir: Path, ttl: float,
                 host: Host | None = None):
        self.name = name
        self.url = url
        self.secret = secret
        self.workdir = workdir
        self.ttl = ttl
        self.host = host
        self.addr = host.addr if host else "127.0.0.1"
        self.port = 5672 if host else free_port()  # a namespace has its own ports
        self.http_port = 15672 if host else free_port()
        self.proc = None
        self.paused = False

    def start(self) -> None:
        with open(self.workdir / f"{self.name}.log", "ab") as out:
            self.proc = subprocess.Popen(_in(self.host, [
                sys.executable, "-m", "broker", "run", "--host", self.addr, "--port",
                str(self.port), "--advertise", f"{self.addr}:{self.port}",
                "--data-dir", str(self.workdir / self.name), "--http-port",
                str(self.http_port), "--cluster", self.url, "--node-name", self.name,
                "--cluster-secret-file", str(self.secret), "--cluster-ttl", str(self.ttl),
                # the clients come from the bridge, not from loopback: guest may log in
                *(["--loopback-users", "none"] if self.host else [])]),
                cwd=str(REPO), stdout=out, stderr=subprocess.STDOUT)
        self.paused = False

    def listening(self) -> bool:
        return listening(self.port, self.addr)


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


def _queues(url: str) -> dict:
    return {q["name"]: q for q in cluster_status(url)["queues"]}


def run_mirrored(rounds: int = 2, nemeses: tuple[str, ...] = ("kill9", "sigstop"),
                 nodes: int = 3, producers: int = 3, consumers: int = 2, queues: int = 2,
                 pause: float = 5.0, ttl: float = 2.0, warmup: float = 1.5,
                 workdir: Path | None = None, netns: bool = False,
                 prefix: str = "jm", queue_type: str = "classic", client: str = "pika") -> dict:
    """``queue_type`` quorum: the workload's queues are quorum queues (replicated on
    their member group, majority confirms) instead of classic ones under ha-mode all."""
    needs_net = [k for k in nemeses if k in NETWORK_NEMESES]
    if needs_net and not netns:
        raise ValueError(f"{', '.join(needs_net)} need the network namespaces (netns=True)")
    keep = workdir is not None
    work = Path(workdir or tempfile.mkdtemp(prefix="triomq-jepsen-mirrored-"))
    work.mkdir(parents=True, exist_ok=True)
    secret = work / "secret"
    secret.write_text("jepsen-cluster-secret-0123456789")
    topo = Topology(["etcd", *(f"n{i + 1}" for i in range(nodes))], prefix) if netns else None
    history = History()
    names = [f"jepsen-q{i}" for i in range(queues)]
    members: list[ClusterNode] = []
    clients: list = []
    faults: list[dict] = []
    windows: list[tuple[float, str]] = []
    etcd: Etcd | None = None
    stuck: str | None = None
    try:
        if topo is not None:
            topo.up()
        etcd = Etcd(work, topo.hosts["etcd"] if topo else None)
        etcd.start()
        url = f"etcd://{etcd.endpoint}/jepsen"
        members = [ClusterNode(f"n{i + 1}", url, secret, work, ttl,
                               topo.hosts[f"n{i + 1}"] if topo else None)
                   for i in range(nodes)]
        # the first node seeds the cluster's users; the others join it
        members[0].start()
        _wait("the first node", members[0].listening, 60)
        for m in members[1:]:
            m.start()
        _wait("the nodes", lambda: all(m.listening() for m in members), 60)
        r = httpx.put(f"http://{members[0].addr}:{members[0].http_port}/api/policies/%2F/ha",
                      auth=("guest", "guest"), timeout=10,
                      json={"pattern": "^jepsen-", "definition": {"ha-mode": "all"},
                            "apply-to": "queues"})
        r.raise_for_status()
        time.sleep(1.0)  # the policy reaches every node through etcd
        addresses = [(m.addr, m.port) for m in members]
        arguments = {"x-queue-type": "quorum"} if queue_type == "quorum" else None
        # a quorum queue's group: 3 members (its default), not every node
        replicas = min(nodes, 3) if queue_type == "quorum" else nodes
        producer_class: type = Producer
        consumer_class: type = Consumer
        if client != "pika":
            from .clients import CLIENTS
            producer_class, consumer_class = CLIENTS[client]
        clients = ([producer_class(i, addresses, names, history, arguments=arguments)
                    for i in range(producers)]
                   + [consumer_class(i, addresses, names, history, arguments=arguments)
                      for i in range(consumers)])
        for c in clients:
            c.start()

        def synced():
            view = cluster_status(url)
            live = {n["name"] for n in view["nodes"] if n["health"] == "up"}
            qs = {q["name"]: q for q in view["queues"]}
            ok = len(live) == nodes and all(
                n in qs and qs[n]["master"] and len(qs[n]["in_sync"]) == replicas - 1
                for n in names)
            return qs if ok else None

        t_synced: float | None = None
        try:
            for rnd in range(rounds):
                kind = nemeses[rnd % len(nemeses)]
                qs = _wait("every queue mirrored and in sync", synced, 180, 0.3)
                if t_synced is not None:  # heal -> every mirror in sync again
                    faults[-1]["healed_to_in_sync_s"] = round(time.monotonic() - t_synced, 3)
                time.sleep(warmup)
                windows.append((time.monotonic(), kind))
                if kind == "rolling-restart":
                    fault = _rolling(qs, names, members, url, history, synced)
                else:
                    fault = _round(kind, qs, names, members, etcd, topo, url, history, pause,
                                   ttl)
                fault["round"] = rnd + 1
                faults.append(fault)
                t_synced = fault.pop("t_heal")
                log.info("round %d: %s", rnd + 1, fault)
            if t_synced is not None:
                _wait("every queue mirrored and in sync", synced, 180, 0.3)
                faults[-1]["healed_to_in_sync_s"] = round(time.monotonic() - t_synced, 3)
        except RuntimeError as exc:  # a cluster that does not recover is a finding: report it
            stuck = f"round {len(faults) + 1}: {exc}"
            log.error("%s; client errors: %s", stuck, dict(history.errors.most_common(8)))
            _heal_all(members, etcd, topo)
        time.sleep(warmup)
        workload.finish(clients, history, idle=4.0)
    finally:
        workload.stop(clients)
        for m in members:
            m.stop()
        if etcd is not None:
            etcd.stop()
        if topo is not None:
            topo.down()
    result = check(history, windows)
    result["ok"] = result["ok"] and stuck is None
    result["stuck"] = stuck
    if result["ok"] and not keep:
        shutil.rmtree(work, ignore_errors=True)
    per: dict[str, dict] = {}
    for kind in dict.fromkeys(f["nemesis"] for f in faults):
        mine = [f for f in faults if f["nemesis"] == kind]
        fo = [f["failover_s"] for f in mine if f.get("failover_s") is not None]
        res = [f["confirms_resumed_s"] for f in mine if f.get("confirms_resumed_s") is not None]
        per[kind] = {"rounds": len(mine),
                     "failover_p50_s": percentile(fo, 50), "failover_p99_s": percentile(fo, 99),
                     "confirms_resumed_p50_s": percentile(res, 50),
                     "confirms_resumed_p99_s": percentile(res, 99),
                     **result["by_nemesis"].get(kind, {})}
    failovers = [f["failover_s"] for f in faults if f.get("failover_s") is not None]
    resumed = [f["confirms_resumed_s"] for f in faults if f["confirms_resumed_s"] is not None]
    result.update({
        "topology": f"etcd, {nodes} nodes, "
                    + ("quorum queues" if queue_type == "quorum" else "ha-mode all")
                    + f", {client} clients"
                    + f", TTL {ttl} s"
                    + (f", network namespaces on {topo.subnet}" if topo else ", loopback"),
        "rounds": len(faults), "faults": faults, "workdir": str(work), "nemeses": per,
        "failover_p50_s": percentile(failovers, 50), "failover_p99_s": percentile(failovers, 99),
        "confirms_resumed_p50_s": percentile(resumed, 50),
        "confirms_resumed_p99_s": percentile(resumed, 99),
        "confirms_never_resumed": len(faults) - len(resumed),
    })
    return result


def _rolling(qs: dict, names: list[str], members: list[ClusterNode], url: str,
             history: History, synced) -> dict:
    """Every node in turn stopped cleanly (SIGTERM) and started again, the next one once
    every queue is back in sync (as an upgrade is rolled); the round's failover is the
    longest time a queue had no master."""
    fault: dict = {"nemesis": "rolling-restart", "target": "every node",
                   "queues": sorted(names)}
    t_fault = time.monotonic()
    longest = 0.0
    for m in members:
        t0 = time.monotonic()
        m.stop()
        led = [n for n in names if qs[n]["master"] == m.name]

        def moved(led=led, name=m.name):
            now = _queues(url)
            return all(now.get(n, {}).get("master") not in (None, name) for n in led)
        if led:
            _wait("a new master", moved, 60, 0.1)
            longest = max(longest, time.monotonic() - t0)
        m.start()
        qs = _wait("every queue mirrored and in sync", synced, 180, 0.3)
    t_heal = time.monotonic()
    fault["failover_s"] = round(longest, 3)
    fault["restart_all_s"] = round(t_heal - t_fault, 3)
    gap = _wait("confirms after the fault", lambda: history.confirm_gap(t_fault, t_heal), 60,
                0.05)
    fault["t_heal"] = t_heal
    fault["confirm_gap_s"] = round(gap[0], 3)
    fault["confirms_resumed_s"] = round(gap[1], 3)
    return fault


def _heal_all(members: list[ClusterNode], etcd: Etcd, topo: Topology | None) -> None:
    if topo is not None:
        topo.heal()
    for m in members:
        if m.paused:
            m.resume()
        elif not m.alive:
            m.start()
    if not etcd.alive:
        etcd.start()


def _round(kind: str, qs: dict, names: list[str], members: list[ClusterNode], etcd: Etcd,
           topo: Topology | None, url: str, history: History, pause: float,
           ttl: float) -> dict:
    """One fault, from injection to heal; returns what was measured."""
    masters = {n: qs[n]["master"] for n in names}
    target_name = masters[names[0]]
    if kind == "isolate-mirror":  # prefer a node that masters nothing: a pure mirror
        busy = set(masters.values())
        target_name = next((m.name for m in members if m.name not in busy),
                           next(m.name for m in members if m.name != target_name))
    if kind in ("slow-links", "restart-etcd"):
        target_name = None
    victims = {n for n in names if masters[n] == target_name}
    target = next((m for m in members if m.name == target_name), None)
    fault: dict = {"nemesis": kind, "target": target_name or ("etcd" if kind == "restart-etcd"
                                                              else "all links"),
                   "queues": sorted(victims)}
    nacked_before = len(history.nacked)
    t_fault = time.monotonic()
    if kind == "kill9":
        assert target is not None
        target.kill9()
    elif kind == "sigstop":
        assert target is not None
        target.pause()
    elif kind in ("partition-master", "isolate-mirror"):
        assert topo is not None and target is not None
        topo.isolate(target.name)
    elif kind == "slow-links":
        assert topo is not None
        applied = [topo.slow(m.name) for m in members]
        fault["links"] = applied[0]
    elif kind == "restart-etcd":
        etcd.stop()
    else:
        raise ValueError(f"unknown nemesis {kind}")

    def promoted():
        qs = _queues(url)
        return all(qs.get(n, {}).get("master") not in (None, target_name) for n in victims)

    t_promoted = None
    if victims:
        _wait("a promoted mirror", promoted, ttl + 60, 0.1)
        t_promoted = time.monotonic()
        fault["failover_s"] = round(t_promoted - t_fault, 3)
    if kind == "isolate-mirror":
        others = [n for n in names if n not in victims]

        def dropped():
            qs = _queues(url)
            return all(target_name not in qs[n]["in_sync"] for n in others)
        _wait("the cut mirror out of the in-sync sets", dropped, ttl + 60, 0.1)
        fault["out_of_sync_s"] = round(time.monotonic() - t_fault, 3)
    # heal at the end of the fault's time (kill -9: as soon as a mirror took over)
    if kind != "kill9":
        while time.monotonic() - t_fault < pause:
            time.sleep(0.05)
    t_heal = time.monotonic()
    if kind == "kill9":
        assert target is not None
        target.start()
    elif kind == "sigstop":
        assert target is not None
        target.resume()
    elif kind in NETWORK_NEMESES:
        assert topo is not None
        topo.heal()
    elif kind == "restart-etcd":
        # etcd may serve (and the nodes renew their leases) before start() returns: it is
        # down only until it is being started
        t_starting = t_heal
        etcd.start()
        t_heal = time.monotonic()
        fault["etcd_down_s"] = round(t_heal - t_fault, 3)
        fault["nacked_while_down"] = len(history.nacked) - nacked_before
        # a confirm already on its way when the lease view ended may arrive a little later
        fault["confirmed_while_down"] = _confirmed_between(history, t_fault + ttl + 0.5,
                                                           t_starting)
        last = _last_confirm_before(history, t_starting)
        fault["last_confirm_after_stop_s"] = round(last - t_fault, 3) if last else None
    # confirms must flow again by themselves
    after = t_promoted if t_promoted is not None else t_heal
    gap = _wait("confirms after the fault", lambda: history.confirm_gap(t_fault, after), 60, 0.05)
    fault["t_heal"] = t_heal
    fault["confirm_gap_s"] = round(gap[0], 3)
    fault["confirms_resumed_s"] = round(gap[1], 3)
    if kind == "restart-etcd":
        first = history.first_confirm_after(t_heal)
        fault["confirms_after_etcd_back_s"] = round(first - t_heal, 3) if first else None
    return fault


def _confirmed_between(history: History, t0: float, t1: float) -> int:
    """Confirms that arrived while etcd was certainly gone for longer than the TTL."""
    with history.lock:
        return sum(1 for t in history.confirmed.values() if t0 < t < t1)


def _last_confirm_before(history: History, t: float) -> float | None:
    with history.lock:
        return max((c for c in history.confirmed.values() if c < t), default=None)
