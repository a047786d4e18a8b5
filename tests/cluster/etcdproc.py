"""A real etcd (/usr/bin/etcd) a test owns: its own data dir and free ports, stopped,
paused (SIGSTOP) and resumed by the test, never a shared instance."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdProc:
    def __init__(self, base: Path):
        self.base = Path(base)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str = "test") -> str:
        return f"etcd://{self.endpoint}/{prefix}"

    def start(self, timeout: float = 20.0) -> EtcdProc:
        self.base.mkdir(parents=True, exist_ok=True)
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.base / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [ETCD, "--name", "t", "--data-dir", str(self.base / "data"),
                 "--listen-client-urls", client, "--advertise-client-urls", client,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"t={peer}", "--log-level", "warn"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {(self.base / 'etcd.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as resp:
                    if b"true" in resp.read():
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("etcd did not become healthy")

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
