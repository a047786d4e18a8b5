"""A TrioMQ subprocess a test owns, for restarts and kill -9 (shared by the suites that
start their own brokers: durability, scheduler, retry, deduplication, half messages,
consumer groups)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProc:
    """A TrioMQ subprocess on a fixed data dir that can be stopped, killed and restarted.

    ``store``: the ``--store`` URL (None: the default journal); ``extra``: more arguments.
    Each start gets a free port and a log file of its own (``log()`` reads the latest)."""

    def __init__(self, data_dir: Path, store: str | None = None, extra=(), env=None,
                 http: bool = False, mqtt: bool = False, wait_ports=(), stream: bool = False):
        self.env = dict(os.environ, **(env or {}))
        self.wait_ports = tuple(wait_ports)  # fixed ports set in ``extra`` (e.g. TLS listeners)
        self.mqtt = mqtt  # also listen for MQTT on a free port (mqtt_port)
        self.mqtt_port = 0
        self.stream = stream  # also listen for the Stream protocol on a free port
        self.stream_port = 0
        self.http = http  # serve the management HTTP API on a free port (http_port)
        self.http_port = 0
        self.data_dir = Path(data_dir)
        self.store = store
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.n = 0

    @property
    def store_args(self) -> list[str]:
        return ["--store", self.store] if self.store else []

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}-broker-{self.n}.log"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port",
                str(self.port), "--data-dir", str(self.data_dir), *self.store_args,
                "--http-port", str(self.http_port), "--stream-port", str(self.stream_port),
                *self.mqtt_args, *self.extra]

    @property
    def mqtt_args(self) -> list[str]:
        return ["--mqtt-port", str(self.mqtt_port)] if self.mqtt else []

    def start(self, timeout: float = 60.0) -> BrokerProc:
        self.n += 1
        self.port = free_port()
        self.http_port = free_port() if self.http else 0  # 0: no HTTP listener
        self.mqtt_port = free_port() if self.mqtt else 0
        self.stream_port = free_port() if self.stream else 0  # 0: none (never 5552)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), cwd=str(REPO_ROOT), stdout=log,
                                         stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"broker exited with {self.proc.returncode}:\n{self.log()}", pytrace=False)
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
                for port in (self.mqtt_port, self.stream_port, *self.wait_ports):
                    if port:
                        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"broker did not listen within {timeout}s:\n{self.log()}", pytrace=False)
            time.sleep(0.05)

    def start_expect_failure(self, timeout: float = 30.0) -> tuple[int, str]:
        self.n += 1
        self.port = free_port()
        self.http_port = free_port() if self.http else 0
        p = subprocess.run(self.command(), cwd=str(REPO_ROOT), capture_output=True, text=True,
                           timeout=timeout, env=self.env)
        return p.returncode, p.stderr

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def stop(self, hard: bool = False) -> None:
        """SIGTERM (a clean stop), or SIGKILL with ``hard``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        self.stop(hard=True)

    def restart(self, hard: bool = False) -> BrokerProc:
        self.stop(hard=hard)
        return self.start()

    def connect(self) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.port, connection_attempts=3, retry_delay=0.2, socket_timeout=10,
            blocked_connection_timeout=30, heartbeat=0))
