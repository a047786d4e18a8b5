"""kill -9 of an audited broker loses at most the last batch; the next run says so."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pika
import pytest

from broker.audit.reader import FileReader
from broker.audit.writer import node_files

ROOT = __file__.rsplit("/tests/", 1)[0]


def _start(base, port):
    log = open(base / f"broker-{port}.log", "w")  # noqa: SIM115 - the process owns it
    p = subprocess.Popen(
        [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(base / "data"), "--store", "memory", "--http-port", "0",
         "--audit-dir", str(base / "trail"), "--audit-node", "crash"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            assert p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_kill_9_keeps_what_was_spooled(tmp_path):
    port = _port()
    broker = _start(tmp_path, port)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("crash-q")
    for i in range(50):
        ch.basic_publish("", "crash-q", b"x", pika.BasicProperties(message_id=f"c-{i}"))
    time.sleep(0.5)  # several drain periods: every publish is spooled
    broker.send_signal(signal.SIGKILL)
    broker.wait(10)
    port = _port()
    broker = _start(tmp_path, port)
    time.sleep(0.3)
    broker.send_signal(signal.SIGTERM)
    assert broker.wait(60) == 0
    records = [r for f in node_files(str(tmp_path / "trail"), "crash") for r in FileReader(f)]
    published = sorted(r["message_id"] for r in records if r["event"] == "published")
    assert published == sorted(f"c-{i}" for i in range(50))
    seqs = sorted(r["seq"] for r in records)
    assert seqs == list(range(1, len(seqs) + 1))  # gapless across the crash
    started = [r["detail"] for r in sorted(records, key=lambda r: r["seq"])
               if r["event"] == "node_started"]
    assert started == ["first run",
                       "previous run did not stop cleanly: its unsent tail is lost"]
    assert [r["event"] for r in records].count("node_stopped") == 1
