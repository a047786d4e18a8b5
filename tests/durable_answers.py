"""What the tests of declares answered once durable share (docs/durability.md, "What a
declare-ok means"): an in-process broker on the journal whose disk a test holds (the group
commit's write waits until released), and a broker process whose journal writes are slow
once asked, to kill -9 right after an answer.

``python -m tests.durable_answers AMQP_PORT STOMP_PORT HTTP_PORT DATA_DIR MQTT_PORT``: that
broker process; while ``DATA_DIR/slow-disk`` exists, each journal write first sleeps ``SLOW``
seconds (so an answer sent before the write would be lost by a kill -9 in that time).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import trio

from broker.broker import Broker
from broker.config import Config
from broker.listeners.amqp import Server, run_server
from broker.persistence import open_store

REPO = Path(__file__).resolve().parent.parent
SLOW = 2.0  # seconds each journal write sleeps while DATA_DIR/slow-disk exists


class HeldDisk:
    """The journal's writes wait (a disk that does not answer) until ``release``."""

    def __init__(self, store) -> None:
        self.released = threading.Event()
        write = store._write_chunks

        def held(chunks) -> None:
            self.released.wait(30)
            write(chunks)
        store._write_chunks = held

    def release(self) -> None:
        self.released.set()


async def journal_broker(nursery, tmp_path, **config):
    """(broker, server, store, AMQP port): the real server on the journal in ``tmp_path``,
    in the test's nursery, with ``config``'s listeners (``stomp_port=0``, ...)."""
    data = str(tmp_path / "data")
    cfg = Config(host="127.0.0.1", port=0, data_dir=data, memory_limit_bytes=1 << 50,
                 disk_free_limit=0, heartbeat=0, **config)
    store = open_store("journal", data, cfg.flush, cfg.journal)
    broker = Broker(cfg, store)
    server = Server(broker)
    port = await nursery.start(server.serve, "127.0.0.1", 0)
    return broker, server, store, port


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (held open together: never the same one twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class SlowDiskBroker:
    """The broker process of ``main`` (AMQP, STOMP, HTTP and MQTT ports), killed with -9."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = self.stomp_port = self.http_port = self.mqtt_port = 0
        self.proc: subprocess.Popen | None = None
        self.log = data_dir.parent / "broker.log"

    def start(self) -> None:
        """On ports free now (a restart's may differ); again on new ones when another
        process took one of them in between."""
        for _ in range(5):
            self.port, self.stomp_port, self.http_port, self.mqtt_port = _free_ports(4)
            if self._start():
                return
        raise AssertionError(f"no free ports: {self.log.read_text()}")

    def _start(self) -> bool:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.durable_answers", str(self.port),
                 str(self.stomp_port), str(self.http_port), str(self.data_dir),
                 str(self.mqtt_port)],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not all(_reachable(p) for p in (self.port, self.stomp_port, self.http_port,
                                              self.mqtt_port)):
            if self.proc.poll() is not None and "address already in use" in \
                    self.log.read_text():
                return False
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"broker did not start: {self.log.read_text()}")
            time.sleep(0.05)
        return True

    def slow_disk(self, slow: bool) -> None:
        flag = self.data_dir / "slow-disk"
        if slow:
            flag.touch()
        else:
            flag.unlink(missing_ok=True)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def crash_and_restart(self) -> None:
        """kill -9 now, then a restart on a disk no longer slow."""
        self.kill9()
        self.slow_disk(False)
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def queue_exists(self, name: str) -> bool:
        import pika
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
        try:
            conn.channel().queue_declare(name, passive=True)
            return True
        except pika.exceptions.ChannelClosedByBroker:
            return False
        finally:
            if conn.is_open:
                conn.close()


def main() -> None:
    port, stomp_port, http_port, data_dir, mqtt_port = sys.argv[1:6]
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = Config(host="127.0.0.1", port=int(port), data_dir=data_dir,
                    stomp_port=int(stomp_port), http_port=int(http_port),
                    mqtt_port=int(mqtt_port),
                    http_host="127.0.0.1", disk_free_limit=0)
    os.makedirs(data_dir, exist_ok=True)
    store = open_store("journal", data_dir, config.flush, config.journal)
    write = store._write_chunks
    flag = os.path.join(data_dir, "slow-disk")

    def slow(chunks) -> None:
        if os.path.exists(flag):
            time.sleep(SLOW)
        write(chunks)
    store._write_chunks = slow
    trio.run(run_server, Broker(config, store), config.host, config.port)


if __name__ == "__main__":
    main()
