"""Scheduler restart after kill -9, at the moments that used to be the worst.

    python -m bench.scheduler_crash --pending 1000000 --store journal
    python -m bench.scheduler_crash --pending 1000000 --store postgresql --moments burst
    python -m bench.scheduler_crash --pending 100000 --moments burst,first-minute,firing --json

For each moment a fresh broker (its own data dir; with ``--store postgresql`` a scratch
database on 127.0.0.1:5432, created and dropped) is filled with ``--pending`` persistent
messages scheduled an hour ahead (``AMQ_SCHEDULED_DELAY`` on the default exchange, into a
durable queue), then killed with SIGKILL:

* ``burst``: right after the fill (the last message confirmed: everything is durable);
  the process is younger than a minute or so, no snapshot of the timer index was ever
  written;
* ``first-minute``: the fill, a clean restart (the snapshot is written at the stop), then
  a burst of ``--pending // 5`` more, killed within the new process's first minute;
* ``firing``: the fill, then ``--firing`` messages falling due over ``--firing-seconds``
  while a consumer receives them; killed when about half of them were received.

Before each kill a probe is scheduled ``PROBE_MS`` ahead (confirmed); the restart waits
until it is overdue. Reported per moment: restart to listening (TCP accepts), to the
first delivery of a scheduled message (the probe or a firing message: the consumer
connects as soon as the port accepts), to recovered (the scheduler's control socket
answers with every pending message back), the recovery log line (read back / index log
records), RSS before the kill and after recovery, and for ``firing`` the messages lost
and delivered early (none may be).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import rawamqp as ra

from .procinfo import REPO_ROOT, free_port, rss_kb
from .scheduler import control

FAR_QUEUE = "bench.crash.far"
DUE_QUEUE = "bench.crash.due"
PROBE_MS = 1500
HOUR_MS = 3_600_000
BASIC_ACK = (60, 80)
RECOVERED = re.compile(r"scheduler: recovered (\d+) pending scheduled messages \((\d+) read back"
                       r"[^;)]*(?:; (\d+) index log records read)?\)(?: in ([0-9.]+) s)?")
JOURNAL = re.compile(r"journal: loaded \d+ segments, replayed (\d+) records after checkpoint "
                     r".* in ([0-9.]+)s")


def publish_frames(ch: int, key: str, body: bytes, delay_ms: int) -> bytes:
    """A persistent publish to the default exchange with AMQ_SCHEDULED_DELAY."""
    m = ra.method_frame(ch, 60, 40, b"\x00\x00" + ra.shortstr("") + ra.shortstr(key) + b"\x00")
    props = ra.table({"AMQ_SCHEDULED_DELAY": delay_ms}) + bytes((2,))
    h = ra.frame(ra.FRAME_HEADER, ch, struct.pack(">HHQH", 60, 0, len(body), 0x3000) + props)
    return m + h + ra.frame(ra.FRAME_BODY, ch, body)


class Broker:
    def __init__(self, store_url: str, data_dir: str):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.cmd = [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port",
                    str(self.port), "--data-dir", data_dir, "--store", store_url,
                    "--http-port", "0", "--stream-port", "0", "--memory-limit", str(1 << 40)]
        self.proc: subprocess.Popen | None = None
        self.n = 0
        self.started = 0.0

    @property
    def log_path(self) -> str:
        return os.path.join(os.path.dirname(self.data_dir), f"broker-{self.n}.log")

    def start(self) -> None:
        self.n += 1
        with open(self.log_path, "wb") as log:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(self.cmd, cwd=str(REPO_ROOT), stdout=log,
                                         stderr=subprocess.STDOUT)

    def wait_listening(self, timeout: float = 900) -> float:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"broker exited: see {self.log_path}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return time.monotonic() - self.started
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("broker did not listen") from None
                time.sleep(0.01)

    def wait_recovered(self, want: int, timeout: float = 900) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if control(self.data_dir)["stats"]["pending"] >= want:
                    return time.monotonic() - self.started
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise SystemExit("scheduler did not recover everything")

    def wait_serving(self, timeout: float = 900) -> tuple[float, int]:
        """(seconds from start until the scheduler's control socket answers -- it opens
        once recovery is over --, pending count then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pending = control(self.data_dir)["stats"]["pending"]
                return time.monotonic() - self.started, pending
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        raise SystemExit("the scheduler's control socket never answered")

    def recovery_line(self) -> dict:
        with open(self.log_path, errors="replace") as f:
            text = f.read()
        found = RECOVERED.findall(text)
        if not found:
            return {}
        pending, read_back, logged, secs = found[-1]
        out = {"recovered": int(pending), "read_back": int(read_back),
               "index_log_records": int(logged) if logged else None,
               "scheduler_rebuild_s": float(secs) if secs else None}
        journal = JOURNAL.findall(text)
        if journal:  # the journal's own share (its log replay), for comparison
            out["journal_replayed_records"] = int(journal[-1][0])
            out["journal_load_s"] = float(journal[-1][1])
        return out

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(300)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def connect(url: str) -> ra.Connection:
    for _ in range(600):
        try:
            return ra.Connection(url, timeout=600)
        except (OSError, ra.AMQPError):
            time.sleep(0.05)
    raise SystemExit("cannot connect")


def declare(pub: ra.Connection) -> None:
    pub.channel_open(1)
    pub.queue_declare(1, FAR_QUEUE, durable=True)
    pub.queue_declare(1, DUE_QUEUE, durable=True)
    pub.channel_open(2)
    pub.confirm_select(2)


def fill(b: Broker, pub: ra.Connection, n: int, start_index: int, already: int) -> float:
    t0 = time.monotonic()
    body = b"x" * 64
    batch = []
    for i in range(start_index, start_index + n):
        batch.append(publish_frames(1, FAR_QUEUE, body, HOUR_MS + i % 600_000))
        if len(batch) == 2000:
            pub.send(b"".join(batch))
            batch.clear()
    if batch:
        pub.send(b"".join(batch))
    b.wait_recovered(already + n)
    return time.monotonic() - t0


def probe(pub: ra.Connection) -> float:
    """Schedule the probe PROBE_MS ahead and wait for its confirm: everything published
    before it on this connection is durable too (the journal writes in order)."""
    pub.send(publish_frames(2, DUE_QUEUE, b"%.6f probe" % (time.time() + PROBE_MS / 1000),
                            PROBE_MS))
    pub.wait(2, BASIC_ACK, timeout=600)
    return time.time() + PROBE_MS / 1000


class Receiver(threading.Thread):
    """Bodies ``b"<due> <name>"`` from DUE_QUEUE: (receive time, due, name)."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.got: list[tuple[float, float, bytes]] = []
        self.first_at: float | None = None
        self.stop = False
        self.conn: ra.Connection | None = None

    def run(self) -> None:
        try:
            self.conn = conn = connect(self.url)
            conn.channel_open(1)
            conn.basic_consume(1, DUE_QUEUE, no_ack=True)
            while not self.stop:
                try:
                    ftype, _ch, payload = conn._next_frame(time.monotonic() + 0.2)
                except TimeoutError:
                    continue
                if ftype == ra.FRAME_BODY:
                    now = time.time()
                    if self.first_at is None:
                        self.first_at = time.monotonic()
                    due, _sp, name = payload.partition(b" ")
                    self.got.append((now, float(due), name))
        except (ConnectionError, OSError, ra.AMQPError):
            pass


def firing_phase(b: Broker, pub: ra.Connection, count: int, seconds: float) -> Receiver:
    recv = Receiver(b.url)
    recv.start()
    start = time.time() + 2.0
    frames = []
    for i in range(count):
        due = start + i * seconds / count
        delay_ms = int((due - time.time()) * 1000) + 1
        frames.append(publish_frames(1, DUE_QUEUE, b"%.6f f%d" % (time.time() + delay_ms / 1000, i),
                                     delay_ms))
        if len(frames) == 1000:
            pub.send(b"".join(frames))
            frames.clear()
    pub.send(b"".join(frames))
    while len(recv.got) < count // 2:
        time.sleep(0.01)
    return recv


def run_moment(a, moment: str, store: str, workdir: str) -> dict:
    data_dir = os.path.join(workdir, "data")
    b = Broker(store, data_dir)
    out: dict = {"moment": moment, "pending": a.pending}
    recv_before = None
    try:
        b.start()
        out["empty_start_to_listening_s"] = round(b.wait_listening(), 2)  # the floor
        pub = connect(b.url)
        declare(pub)
        out["fill_s"] = round(fill(b, pub, a.pending, 0, 0), 1)
        expected = a.pending
        if moment == "first-minute":
            pub.close()
            b.stop()
            b.start()
            b.wait_recovered(expected)
            pub = connect(b.url)
            declare(pub)
            extra = a.pending // 5
            fill(b, pub, extra, a.pending, expected)
            expected += extra
            out["burst_after_restart"] = extra
        elif moment == "firing":
            recv_before = firing_phase(b, pub, a.firing, a.firing_seconds)
        due_at = probe(pub)
        expected_probe = 1
        out["process_age_at_kill_s"] = round(time.monotonic() - b.started, 1)
        out["rss_before_kill_mb"] = round((rss_kb(b.proc.pid) or 0) / 1024, 1)
        b.kill()
        if recv_before is not None:
            recv_before.stop = True
            recv_before.join(5)
        try:
            pub.abort()
        except Exception:
            pass
        wait = due_at - time.time() + 0.05
        if wait > 0:
            time.sleep(wait)  # the probe is overdue when the broker starts
        b.start()
        recv = Receiver(b.url)
        listening = b.wait_listening()
        recv.start()
        deadline = time.monotonic() + 900
        while recv.first_at is None and time.monotonic() < deadline:
            time.sleep(0.005)
        first = recv.first_at - b.started if recv.first_at else None
        recovered, _pending = b.wait_serving()
        time.sleep(1.0)
        out.update({
            "restart_to_listening_s": round(listening, 2),
            "restart_to_first_delivery_s": round(first, 2) if first is not None else None,
            "restart_to_recovered_s": round(recovered, 2),
            "rss_after_recovery_mb": round((rss_kb(b.proc.pid) or 0) / 1024, 1),
            **b.recovery_line(),
        })
        if moment != "firing" and "recovered" in out:  # (firing: some fired before the kill)
            out["lost_pending"] = expected + 1 - out["recovered"]  # + 1: the probe
        if moment == "firing":
            deadline = time.monotonic() + 120
            names = {f"f{i}".encode() for i in range(a.firing)}
            while time.monotonic() < deadline:
                seen = {g[2] for g in recv_before.got + recv.got}
                if names <= seen:
                    break
                time.sleep(0.2)
            got = recv_before.got + recv.got
            seen = {g[2] for g in got}
            out["firing"] = {"count": a.firing, "lost": len(names - seen),
                             "early": sum(1 for now, due, _n in got if now < due - 0.001),
                             "repeated": len(got) - len(seen)}
        recv.stop = True
        recv.join(5)
        out["probe_received"] = any(g[2] == b"probe" for g in recv.got) and expected_probe
    finally:
        b.stop()
    return out


def scratch_pg():
    import psycopg
    name = "triomq_bench_" + secrets.token_hex(6)

    def admin(sql: str) -> None:
        with psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres",
                             autocommit=True, connect_timeout=5) as c:
            c.execute(sql)
    admin(f'CREATE DATABASE "{name}"')
    return (f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}",
            lambda: admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=1_000_000)
    ap.add_argument("--store", default="journal", help="journal or postgresql (scratch db)")
    ap.add_argument("--moments", default="burst,first-minute,firing")
    ap.add_argument("--firing", type=int, default=20_000, help="messages falling due (firing)")
    ap.add_argument("--firing-seconds", type=float, default=4.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    results = {"command": " ".join(["python -m bench.scheduler_crash", *sys.argv[1:]]),
               "loadavg": os.getloadavg()[0], "moments": []}
    for moment in a.moments.split(","):
        workdir = tempfile.mkdtemp(prefix="triomq-bench-crash-")
        drop = None
        try:
            store = "journal"
            if a.store == "postgresql":
                store, drop = scratch_pg()
            r = run_moment(a, moment, store, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            if drop is not None:
                drop()
        results["moments"].append(r)
        if not a.json:
            print(json.dumps(r), flush=True)
    results["loadavg_end"] = os.getloadavg()[0]
    if a.json:
        print(json.dumps(results, indent=2))
    ok = all((r.get("restart_to_listening_s") or 99) <= 3.0 and not r.get("lost_pending") and
             r.get("firing", {}).get("lost", 0) == 0 and r.get("firing", {}).get("early", 0) == 0
             for r in results["moments"])
    print("RESULT:", "PASS" if ok else "FAIL", "(listening <= 3 s after kill -9, none lost or early)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
