"""``make cluster`` (``python -m broker.cluster.local``): each node has its own management
port, printed with the ``ctl`` line that reaches it; a policy set through node 1's port
reaches node 2's; a management port in use is refused in one line (``ctl`` would configure
whatever listens there). Real etcd, real nodes."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from brokerproc import REPO_ROOT

from .etcdproc import ETCD


def free_run(n: int) -> int:
    """The first of ``n`` consecutive free ports."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for port in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
        if ok:
            return base
    raise AssertionError("no free port run")


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", *args], cwd=str(REPO_ROOT),
                          capture_output=True, text=True, timeout=30)


@pytest.mark.timeout(120)
def test_local_cluster_nodes_have_management_ports(tmp_path):
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (make system-deps)")
    amqp, http = free_run(2), free_run(2)
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "broker.cluster.local", "--nodes", "2", "--port", str(amqp),
         "--http-port", str(http), "--dir", str(tmp_path / "c"), "--etcd", ETCD],
        cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 90
        assert proc.stdout is not None
        while not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
        out = "".join(lines)
        assert f"node1: amqp://guest:guest@127.0.0.1:{amqp}/   management " \
               f"http://127.0.0.1:{http}/" in out, out
        assert f"node2: amqp://guest:guest@127.0.0.1:{amqp + 1}/   management " \
               f"http://127.0.0.1:{http + 1}/" in out, out
        assert f"python -m broker ctl --url http://127.0.0.1:{http} " in out, out
        # the policy the docs tell you to set, through the printed ctl line
        p = cli("ctl", "--url", f"http://127.0.0.1:{http}", "set_policy", "ha", "^ha\\.",
                '{"ha-mode":"all"}', "--apply-to", "queues")
        assert p.returncode == 0, p.stdout + p.stderr

        def on_node2() -> bool:
            r = httpx.get(f"http://127.0.0.1:{http + 1}/api/policies/%2F/ha",
                          auth=("guest", "guest"))
            return r.status_code == 200 and r.json()["definition"] == {"ha-mode": "all"}
        deadline = time.monotonic() + 10
        while not on_node2():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert re.search(r"node2\s+up", out), out
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_management_port_in_use_is_refused(tmp_path):
    if not os.path.exists(ETCD):
        pytest.skip("etcd is not installed (make system-deps)")
    amqp = free_run(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run(
            [sys.executable, "-m", "broker.cluster.local", "--nodes", "2", "--port", str(amqp),
             "--http-port", str(port), "--dir", str(tmp_path / "c"), "--etcd", ETCD],
            cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stderr.strip() == (f"triomq: error: management port {port} is in use (pick "
                                f"another with --http-port)"), p.stderr
