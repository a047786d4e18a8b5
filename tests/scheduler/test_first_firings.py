"""A fresh broker's first delayed messages cost what later ones do: no one-time work
(an import, a table build) on the path that schedules and fires them.

Checked by what is imported, not by timing: a lazy import there (numpy's took 0.15 s
quiet, 0.3 s loaded) delays the publishes behind it, which the broker's own firing
lateness does not show, but every message's end-to-end lateness does."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pika

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "interop-tests"))
from brokerproc import free_port  # noqa: E402

ENGINE_SCRIPT = textwrap.dedent("""
    import random, sys
    from broker.scheduler.engine import TimerEngine
    from broker.scheduler.slots import K_DELAY, SlotTable

    class Timers:
        def now(self):
            return 0.0
        def call_at(self, when, fn):
            return None

    clock = [1000.0]
    fired = []
    def fire(t, slot, due, now):
        fired.append(due)
        t.release(slot)

    tables = [SlotTable(0, "/")]
    e = TimerEngine(Timers(), lambda: clock[0], tables, fire)
    before = set(sys.modules)
    rnd = random.Random(7)
    t = tables[0]
    for rounds in range(3):
        for _ in range(2000):
            slot = t.alloc()
            t.kind[slot] = K_DELAY
            t.due[slot] = due = clock[0] + rnd.uniform(0.5, 2.5)
            e.push(t, slot, due)
            e.head_due()  # what arming the broker's timer does after each publish
        clock[0] += 3.0
        while e.run_due():
            pass
    assert len(fired) == 6000 and fired == sorted(fired), len(fired)
    print(sorted(set(sys.modules) - before))
""")


def test_engine_schedules_and_fires_without_importing_anything():
    out = subprocess.run([sys.executable, "-c", ENGINE_SCRIPT], cwd=str(REPO_ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "imported while scheduling/firing: " + out.stdout


def _wait_for_port(port: int, proc: subprocess.Popen, deadline: float) -> None:
    import socket

    while True:
        assert proc.poll() is None, "broker exited"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "broker did not start"
            time.sleep(0.1)


def test_fresh_broker_imports_nothing_for_its_first_delayed_messages(tmp_path):
    """``-X importtime`` logs every import as it happens: after a warm-up that uses the
    connection, channel, queue and consumer paths with a plain message, the first
    delayed messages (scheduled, fired, routed, delivered) must import nothing."""
    port = free_port()
    log = tmp_path / "broker.err"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "broker", "run", "--host", "127.0.0.1",
             "--port", str(port), "--http-port", "0", "--data-dir", str(tmp_path / "data"),
             "--log-level", "WARNING"],
            cwd=str(REPO_ROOT), stdout=subprocess.DEVNULL, stderr=err)
    try:
        _wait_for_port(port, proc, time.monotonic() + 120)
        conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, credentials=pika.PlainCredentials("guest", "guest"),
            blocked_connection_timeout=60))
        ch = conn.channel()
        ch.exchange_declare("first.delayed", "x-delayed-message",
                            arguments={"x-delayed-type": "direct"})
        ch.queue_declare("first.q")
        ch.queue_bind("first.q", "first.delayed", "k")
        got: list[bytes] = []
        ch.basic_consume("first.q", lambda c, m, p, body: got.append(body), auto_ack=True)

        def receive(n: int, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while len(got) < n and time.monotonic() < deadline:
                conn.process_data_events(time_limit=0.2)
            assert len(got) == n, f"received {len(got)} of {n}"

        # warm-up: everything but the scheduler (a plain message through the same queue)
        ch.basic_publish("", "first.q", b"plain")
        receive(1, 60)
        mark = log.stat().st_size
        n = 200
        for i in range(n):
            ch.basic_publish("first.delayed", "k", b"%d" % i,
                             pika.BasicProperties(headers={"x-delay": 20 + i % 200}))
        receive(1 + n, 120)
        conn.close()
        late_imports = [line for line in log.read_bytes()[mark:].decode().splitlines()
                        if line.startswith("import time:")]
        assert not late_imports, "imported by the first delayed messages:\n" + \
            "\n".join(late_imports[-20:])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
