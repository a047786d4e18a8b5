"""After kill -9, the scheduler's recovery reads back a bounded number of messages,
whenever the kill comes: right after a burst (no snapshot of the timer index yet: the
first minute), after a restart that itself recovered from the log, and mid-firing.

Each pending occurrence is described by the timer index (snapshot + index log,
scheduler/indexlog.py), so none is read back and decoded; before the index log, each
of them was (``read back`` = the number scheduled since the last snapshot). The counts
come from the broker's own log line; nothing here depends on timing."""
from __future__ import annotations

import base64
import json
import re
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pika

from broker.scheduler.control import socket_path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "interop-tests"))
from brokerproc import BrokerProc  # noqa: E402

RECOVERED = re.compile(r"scheduler: recovered (\d+) pending scheduled messages \((\d+) read back")
HOUR_MS = 3_600_000


def _recovered(broker: BrokerProc) -> tuple[int, int]:
    """(pending recovered, read back) from the latest start's log (waited for: the
    listener may open before recovery is over)."""
    deadline = time.monotonic() + 120  # a hang guard only
    while True:
        text = broker.log_path.read_text(errors="replace")
        found = RECOVERED.findall(text)
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert found, "no scheduler recovery line in the log:\n" + text[-3000:]
    pending, read_back = found[-1]
    _control_answers(broker)  # serving: a SIGTERM from now on is a clean stop
    return int(pending), int(read_back)


def _control_answers(broker: BrokerProc) -> None:
    path = socket_path(str(broker.data_dir))
    deadline = time.monotonic() + 60  # a hang guard only
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(30)
                s.connect(path)
                s.sendall(json.dumps({"op": "stats"}).encode() + b"\n")
                if s.recv(65536):
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, "the scheduler's control socket never answered"
        time.sleep(0.05)


def _publish(broker: BrokerProc, n: int, tag: str, delay_ms: int | None = None,
             spread_ms: int = 0) -> None:
    """``n`` persistent AMQ_SCHEDULED_DELAY messages to queue ``out``, each confirmed
    (stored) before the next is sent."""
    conn = broker.connect()
    try:
        ch = conn.channel()
        ch.queue_declare("out", durable=True)
        ch.confirm_delivery()
        for i in range(n):
            delay = (delay_ms if delay_ms is not None else HOUR_MS) + (i * spread_ms // max(n, 1))
            ch.basic_publish("", "out", f"{tag}{i}".encode(), pika.BasicProperties(
                delivery_mode=2, headers={"AMQ_SCHEDULED_DELAY": delay,
                                          "sent_ms": int(time.time() * 1000),
                                          "delay": delay}))
    finally:
        conn.close()


def _recovery_phase(broker: BrokerProc) -> dict:
    """The scheduler's phase in /api/overview's recovery progress."""
    req = urllib.request.Request(broker.http_url + "/api/overview", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=30) as resp:
        overview = json.load(resp)
    phases = [p for p in overview["recovery"]["phases"] if p["name"] == "scheduler index of /"]
    assert len(phases) == 1, overview["recovery"]
    return phases[0]


def test_kill9_right_after_a_burst_and_again_reads_nothing_back(tmp_path):
    broker = BrokerProc(tmp_path / "data", http=True).start()
    try:
        for round_, n in enumerate((300, 1200)):
            _publish(broker, n, f"r{round_}-")
            broker.restart(hard=True)  # kill -9, well within the first minute
            pending, read_back = _recovered(broker)
            assert pending == (300 if round_ == 0 else 1500)
            # bounded by a constant, not by what was scheduled since the last snapshot
            assert read_back == 0
            phase = _recovery_phase(broker)  # what the management API says it did
            assert (phase["done"], phase["total"], phase["running"]) == (pending, pending, False)
        broker.restart()  # a clean stop writes the snapshot; the log it covers goes
        assert _recovered(broker) == (1500, 0)
        assert not list((tmp_path / "data" / "journal").glob("scheduler-index.log.*"))[1:]
        # a burst after a clean restart (a snapshot on disk): its log comes after it
        _publish(broker, 400, "r2-")
        broker.restart(hard=True)
        assert _recovered(broker) == (1900, 0)
    finally:
        broker.stop()


def test_kill9_mid_firing_reads_nothing_back_loses_nothing_fires_nothing_early(tmp_path):
    broker = BrokerProc(tmp_path / "data").start()
    try:
        _publish(broker, 500, "far-")  # an hour ahead: stays pending
        n = 400
        _publish(broker, n, "soon-", delay_ms=1500, spread_ms=3000)
        conn = broker.connect()
        ch = conn.channel()
        got: dict[bytes, float] = {}
        early: list[bytes] = []

        def on_message(c, m, props, body):
            now = time.time()
            due = (props.headers["sent_ms"] + props.headers["delay"]) / 1000.0
            if now < due - 0.002:  # the publisher's due time (ms) bounds the broker's from below
                early.append(body)
            got.setdefault(body, now)

        ch.basic_consume("out", on_message, auto_ack=True)
        deadline = time.monotonic() + 60
        while len(got) < n // 4 and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.05)
        assert n // 4 <= len(got) < n, "kill -9 not mid-firing"
        broker.kill()  # mid-firing
        try:
            conn.close()
        except Exception:
            pass
        broker.start()
        pending, read_back = _recovered(broker)
        assert read_back == 0
        assert pending >= 500
        conn = broker.connect()
        ch = conn.channel()
        ch.basic_consume("out", on_message, auto_ack=True)
        deadline = time.monotonic() + 120
        while len(got) < n and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
        conn.close()
        assert sorted(got) == sorted(f"soon-{i}".encode() for i in range(n))
        assert not early
    finally:
        broker.stop()
