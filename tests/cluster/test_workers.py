"""``broker run --workers N``: N processes behind the same AMQP and management ports that
clients see as one broker. Real supervisor, real etcd (started by it), real pika."""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pika
import pytest
from brokerproc import REPO_ROOT

from .etcdproc import ETCD

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Workers:
    def __init__(self, tmp_path, n: int = 2):
        self.port, self.http = _free_port(), _free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "broker", "run", "--workers", str(n), "--host",
             "127.0.0.1", "--port", str(self.port), "--http-port", str(self.http),
             "--stream-port", "0", "--log-level", "WARNING", "--data-dir", str(tmp_path / "d")],
            cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, TRIOMQ_STREAM_PORT="0"))
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "workers listening" in line:
                self.pids = [int(p) for p in line.split("(pids ")[1].rstrip(")\n").split()]
                break
        else:
            raise AssertionError(f"the workers did not start: {self.proc.wait()}")
        assert len(self.pids) == n

    def get(self, path: str):
        auth = base64.b64encode(b"guest:guest").decode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.http}{path}",
                                         headers={"Authorization": f"Basic {auth}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


@pytest.fixture
def workers(tmp_path):
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        w.stop()


def _private_port(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
    except OSError:
        return None
    return int(argv[argv.index("--private-port") + 1]) if "--private-port" in argv else None


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _client_ports(pid: int, port: int) -> set[int]:
    """The client-side ports of the established connections ``pid`` serves on ``port``."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in list(f)[1:]:
                cols = row.split()
                local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
                if state == "01" and inode in inodes and int(local.split(":")[1], 16) == port:
                    found.add(int(remote.split(":")[1], 16))
    return found


def _by_process(w: Workers, conns) -> dict[int, list]:
    owner = {}
    for pid in w.pids:
        for client_port in _client_ports(pid, w.port):
            owner[client_port] = pid
    groups: dict[int, list] = {pid: [] for pid in w.pids}
    for c in conns:
        local = c._impl._transport._sock.getsockname()[1]
        groups[owner[local]].append(c)
    return groups


def _connect(w: Workers):
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", w.port,
                                                             blocked_connection_timeout=60))


def _known_on(conn, name: str, expect_locked: bool, timeout: float = 30.0) -> None:
    """Wait until ``conn``'s process knows ``name`` (the registration travels through etcd
    after the declare-ok): a passive declare answers, or 405 for another connection's
    exclusive queue (not 404)."""
    deadline = time.monotonic() + timeout
    while True:
        ch = conn.channel()
        try:
            ch.queue_declare(name, passive=True)
            assert not expect_locked, f"{name}: no 405 for another connection's exclusive queue"
            ch.close()
            return
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 405 and expect_locked:
                return
            assert exc.reply_code == 404, exc
        assert time.monotonic() < deadline, f"{name} is not known on the other process"
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_connections_spread_and_a_queue_is_reached_from_every_process(workers):
    conns = [_connect(workers) for _ in range(20)]
    try:
        groups = _by_process(workers, conns)
        assert all(groups.values()), {p: len(g) for p, g in groups.items()}
        (a, *_), (b, *_) = groups.values()
        # declared on process A (client-local: A owns it), used from process B
        a.channel().queue_declare("wq", durable=True)
        _known_on(b, "wq", expect_locked=False)  # its definition comes through etcd
        ch = b.channel()
        ch.queue_declare("wq", durable=True, passive=True)
        ch.confirm_delivery()
        for i in range(50):  # each basic_publish waits for its confirm
            ch.basic_publish("", "wq", str(i).encode(),
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
        got = []  # a consumer on B of the queue A owns (basic.get is not forwarded)
        for method, _props, body in ch.consume("wq", inactivity_timeout=30):
            assert method is not None, f"no delivery after {got}"
            ch.basic_ack(method.delivery_tag)
            got.append(int(body))
            if len(got) == 50:
                break
        ch.cancel()
        assert got == list(range(50))
        # a consumer on A for publishes from B
        ch.basic_publish("", "wq", b"via-consumer", mandatory=True)
        ca = a.channel()
        for method, _props, body in ca.consume("wq", inactivity_timeout=30):
            assert method is not None, "no delivery"
            ca.basic_ack(method.delivery_tag)
            assert body == b"via-consumer"
            break
        ca.cancel()
        # the management API answers the same from every process
        seen = {tuple(sorted((q["name"], q.get("durable")) for q in workers.get("/api/queues")))
                for _ in range(12)}
        assert seen == {(("wq", True),)}
        users = {tuple(sorted(u["name"] for u in workers.get("/api/users"))) for _ in range(6)}
        assert len(users) == 1
    finally:
        for c in conns:
            if c.is_open:
                c.close()


@pytest.mark.timeout(120)
def test_sigterm_stops_every_child_and_kill_9_leaves_none(tmp_path):
    w = Workers(tmp_path / "a")
    w.proc.send_signal(signal.SIGTERM)
    assert w.proc.wait(60) == 0
    assert not any(_alive(p) for p in w.pids)
    w = Workers(tmp_path / "b")
    w.proc.kill()
    w.proc.wait()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in w.pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in w.pids)


@pytest.mark.timeout(60)
def test_workers_refuses_what_it_does_not_share(tmp_path):
    out = subprocess.run([sys.executable, "-m", "broker", "run", "--workers", "2",
                          "--mqtt-port", "0", "--data-dir", str(tmp_path)],
                         cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--mqtt-port" in out.stderr and "--workers 1" in out.stderr


@pytest.mark.timeout(180)
def test_a_crashed_worker_is_started_again_and_serves(tmp_path):
    w = Workers(tmp_path)
    try:
        conn = _connect(w)
        conn.channel().queue_declare("kept", durable=True)
        conn.close()
        victim = w.pids[0]
        os.kill(victim, signal.SIGKILL)
        assert w.proc.stdout is not None
        for line in w.proc.stdout:
            if "starting it again" in line:
                assert f"pid {victim}" in line
                break
        else:
            raise AssertionError(f"the supervisor exited: {w.proc.wait()}")
        assert w.proc.poll() is None
        # the new process serves: 20 connections land on both processes again
        deadline = time.monotonic() + 60
        while True:
            with open(f"/proc/{w.proc.pid}/task/{w.proc.pid}/children") as f:
                children = [int(p) for p in f.read().split()]
            new = [p for p in children if p not in w.pids and _private_port(p)]
            if new and _listening(_private_port(new[0])):
                break
            assert time.monotonic() < deadline, "the restarted worker does not listen"
            time.sleep(0.2)
        w.pids = [new[0], w.pids[1]]
        conns = [_connect(w) for _ in range(20)]
        try:
            groups = _by_process(w, conns)
            assert all(groups.values()), {p: len(g) for p, g in groups.items()}
            for c in conns:
                c.channel().queue_declare("kept", durable=True, passive=True)
        finally:
            for c in conns:
                if c.is_open:
                    c.close()
    finally:
        w.stop()
