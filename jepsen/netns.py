"""Hosts as Linux network namespaces on one bridge, for network faults with ``tc netem``.

One namespace per host (``etcd``, ``n1`` .. ``nN``), each joined to a bridge in the root
namespace by a veth pair; the clients stay in the root namespace, which holds the bridge's
address. Addresses come from a free ``10.77.X.0/24``. An isolated host's link is down
(neither hears nor is heard: TCP connections stall, as with a pulled cable); a slow link is a
qdisc on both ends of its veth.

Names carry the run's prefix and its pid (interface names are at most 15 characters), so
a CI test and a developer's run never collide, and a later run with the same prefix removes
what a crashed one left (namespaces, bridge, the processes inside)."""
from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

IP = shutil.which("ip") or "/usr/sbin/ip"
TC = shutil.which("tc") or "/usr/sbin/tc"
_LOCK = "/tmp/triomq-jepsen-netns.lock"  # held while picking a subnet and creating links


def unavailable() -> str | None:
    """Why namespaces cannot be used here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in (IP, TC):
        if not os.path.exists(tool):
            return f"{tool} (iproute2) is not installed"
    probe = f"jpprobe{os.getpid() % 100000}"
    try:
        _run(IP, "netns", "add", probe)
    except RuntimeError as exc:
        return f"cannot create a network namespace: {exc}"
    _run(IP, "netns", "del", probe, check=False)
    return None


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p


def _pid_alive(pid: int) -> bool:
    """Running (a zombie, killed but not yet reaped by its parent, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Host:
    name: str       # logical: "etcd", "n1", ...
    netns: str      # namespace name
    addr: str       # its address on the bridge
    outer: str      # veth end on the bridge (root namespace)
    inner: str      # veth end inside the namespace

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace (``ip netns exec`` execs it: same pid)."""
        return [IP, "netns", "exec", self.netns, *argv]


class Topology:
    """Create with ``up()``, always ``down()`` (also from a ``finally``)."""

    def __init__(self, hosts: list[str], prefix: str = "jm"):
        if not re.fullmatch(r"[a-z]{1,4}", prefix):
            raise ValueError("prefix: 1-4 lower-case letters")
        self.prefix = prefix
        self.tag = f"{prefix}{os.getpid()}"  # <= 4 + 7 characters, + "br" or "h9"
        self.names = hosts
        self.hosts: dict[str, Host] = {}
        self.bridge = f"{self.tag}br"
        self.gateway = ""
        self.subnet = ""

    # ---- life cycle ----
    def up(self) -> Topology:
        with open(_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            clean_stale(self.prefix)
            self.down()  # a run with our pid, long dead, may have left the same names
            third = self._free_subnet()
            self.subnet = f"10.77.{third}.0/24"
            self.gateway = f"10.77.{third}.254"
            _run(IP, "link", "add", self.bridge, "type", "bridge")
            _run(IP, "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run(IP, "link", "set", self.bridge, "up")
            for i, name in enumerate(self.names):
                h = Host(name, f"{self.tag}-{name}", f"10.77.{third}.{i + 1}",
                         f"{self.tag}h{i}", f"{self.tag}p{i}")
                self.hosts[name] = h
                _run(IP, "netns", "add", h.netns)
                _run(IP, "link", "add", h.outer, "type", "veth", "peer", "name", h.inner)
                _run(IP, "link", "set", h.inner, "netns", h.netns)
                _run(IP, "link", "set", h.outer, "master", self.bridge, "up")
                _run(IP, "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.inner)
                _run(IP, "-n", h.netns, "link", "set", h.inner, "up")
                _run(IP, "-n", h.netns, "link", "set", "lo", "up")
        return self

    def _free_subnet(self) -> int:
        used = set(re.findall(r"10\.77\.(\d+)\.", _run(IP, "-o", "addr").stdout))
        for third in range(1, 250):
            if str(third) not in used:
                return third
        raise RuntimeError("no free 10.77.X.0/24")

    def down(self) -> None:
        remove(self.tag)

    # ---- faults ----
    def _qdisc(self, h: Host, spec: list[str] | None) -> None:
        """``spec`` as the root qdisc of both ends of the host's link (None: the default)."""
        for argv, dev in (([TC], h.outer), ([IP, "netns", "exec", h.netns, TC], h.inner)):
            if spec is None:
                _run(*argv, "qdisc", "del", "dev", dev, "root", check=False)
            else:
                _run(*argv, "qdisc", "replace", "dev", dev, "root", *spec)

    def isolate(self, name: str) -> None:
        """Pull the host's cable: its link is down (both ends lose carrier), so nothing
        reaches it or leaves it; connections to it stall until their peers time out."""
        _run(IP, "link", "set", self.hosts[name].outer, "down")

    def slow(self, name: str) -> str:
        """A slow, lossy link both ways: netem delay 60 ms ± 30 ms and 2 % loss where the
        kernel has netem; else (kernels without sch_netem, such as this CI's) a token bucket
        of 512 kbit/s whose queue holds 150 ms: delay under load, tail drops beyond it.
        Returns what was applied."""
        h = self.hosts[name]
        try:
            self._qdisc(h, ["netem", "delay", "60ms", "30ms", "loss", "2%"])
            return "netem delay 60ms 30ms loss 2%"
        except RuntimeError as exc:
            if "unknown" not in str(exc):
                raise
        self._qdisc(h, ["tbf", "rate", "512kbit", "burst", "4kb", "latency", "150ms"])
        return "tbf rate 512kbit burst 4kb latency 150ms"

    def heal(self, name: str | None = None) -> None:
        for h in ([self.hosts[name]] if name else list(self.hosts.values())):
            _run(IP, "link", "set", h.outer, "up")
            self._qdisc(h, None)


def _kill_inside(netns: str) -> None:
    pids = _run(IP, "netns", "pids", netns, check=False).stdout.split()
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(int(pid), sig)
            except (ProcessLookupError, ValueError):
                pass
    deadline = time.monotonic() + 5
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _pid_alive(int(p))]
        time.sleep(0.05)


def remove(tag: str) -> None:
    """Everything named ``tag...``: processes in its namespaces, namespaces, links."""
    for line in _run(IP, "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if ns.startswith(f"{tag}-"):
            _kill_inside(ns)
            _run(IP, "netns", "del", ns, check=False)
    for link in re.findall(r"^\d+: ([^:@]+)", _run(IP, "-o", "link").stdout, re.M):
        if link.startswith(tag) and re.fullmatch(r"br|h\d+", link[len(tag):]):
            _run(IP, "link", "del", link, check=False)


def clean_stale(prefix: str) -> None:
    """Remove what runs with ``prefix`` whose process is gone left behind."""
    names = _run(IP, "netns", "list", check=False).stdout.split()
    names += re.findall(r"^\d+: ([^:@]+)", _run(IP, "-o", "link").stdout, re.M)
    tags = set()
    for name in names:
        m = re.fullmatch(rf"({prefix}(\d+))(-\w+|br|h\d+)", name)
        if m:
            tags.add((m.group(1), int(m.group(2))))
    for tag, pid in tags:
        if pid != os.getpid() and not _pid_alive(pid):
            remove(tag)
