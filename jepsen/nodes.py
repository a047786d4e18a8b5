"""Broker processes sharing one SQL store (ActiveMQ's shared-store master/slave): every
node runs with ``--sql-standby``; the one holding the store's lease listens, the others
wait without listening and take over when the lease is freed or runs out."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


class BrokerProcess:
    """kill -9, SIGSTOP / SIGCONT and a clean stop of one broker subprocess (``proc``)."""

    proc: subprocess.Popen | None = None
    paused = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.alive:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            if self.paused:
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


class Node(BrokerProcess):
    def __init__(self, name: str, store_url: str, workdir: Path, sql_args: list[str]):
        self.name = name
        self.store_url = store_url
        self.workdir = Path(workdir)
        self.sql_args = sql_args
        self.port = free_port()  # kept across restarts: clients have a fixed address list
        self.proc = None
        self.paused = False
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"---- start {self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port",
                 str(self.port), "--data-dir", str(self.workdir / self.name), "--http-port", "0",
                 "--store", self.store_url, "--sql-standby", *self.sql_args],
                cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT)
        self.paused = False

    def standby_ready(self) -> bool:
        """Started and waiting for the lease (it logged so since its latest start)."""
        if not self.alive or self.paused or listening(self.port):
            return False  # a standby does not listen
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return "standby: waiting for the lease" in text.rsplit(f"---- start {self.starts}\n", 1)[-1]

    @property
    def serving(self) -> bool:
        return self.alive and not self.paused and listening(self.port)


class SharedStoreCluster:
    """``size`` nodes on one store URL; ``master()`` is the one listening."""

    def __init__(self, store_url: str, workdir: Path, size: int = 2,
                 sql_args: list[str] | None = None):
        self.nodes = [Node(f"n{i + 1}", store_url, workdir, sql_args or []) for i in range(size)]

    @property
    def addresses(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    def start(self, timeout: float = 60.0) -> Node:
        self.nodes[0].start()
        master = self.wait_master(timeout)
        for n in self.nodes[1:]:
            n.start()
        return master

    def master(self) -> Node | None:
        for n in self.nodes:
            if n.serving:
                return n
        return None

    def wait_master(self, timeout: float, exclude: Node | None = None) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for n in self.nodes:
                if n is not exclude and n.serving:
                    return n
            time.sleep(0.05)
        raise RuntimeError(f"no broker serves after {timeout:.0f} s; logs in "
                           f"{self.nodes[0].workdir}")

    def wait_standbys(self, timeout: float) -> None:
        """Until every node but the master is up and waiting for the lease (a fault before
        that would find nobody to take over)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            master = self.master()
            if master is not None and all(n.standby_ready() for n in self.nodes if n is not master):
                return
            time.sleep(0.1)
        raise RuntimeError(f"standbys not ready after {timeout:.0f} s; logs in "
                           f"{self.nodes[0].workdir}")

    def wait_exit(self, node: Node, timeout: float) -> float | None:
        """Seconds until ``node`` exits (a deposed master must), None if it did not."""
        t0 = time.monotonic()
        while node.alive and time.monotonic() - t0 < timeout:
            time.sleep(0.05)
        return None if node.alive else time.monotonic() - t0

    def heal(self) -> None:
        """Every node that exited (killed, or deposed after a pause) starts again as a
        standby; paused ones are resumed."""
        for n in self.nodes:
            if n.paused:
                n.resume()
        for n in self.nodes:
            if not n.alive:
                n.start()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
