"""Restart after kill -9: the work left to recovery is bounded, its progress is visible, and
nothing confirmed is lost (issue 33).

A real broker process (``python -m broker run``) on the journal, killed with SIGKILL at
several moments. What a restart read is taken from the broker itself: the phases of
``/api/overview``'s ``recovery`` key (records of log replayed after the checkpoint).
"""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pika
import pytest

import rawamqp as ra
from bench.recovery import QUEUE as BUILT_QUEUE
from bench.recovery import build_journal

REPO = Path(__file__).resolve().parents[2]
QUEUE = "bounded"
CKPT_RECORDS = 3000
WINDOW = 500  # unconfirmed publishes in flight at most
# Records a restart may replay: those since the last checkpoint (CKPT_RECORDS), plus what
# was appended while that checkpoint was being written (a window), twice for slack. Before
# the record-count trigger a kill after N publishes replayed all N (64 MiB of log).
BOUND = 2 * CKPT_RECORDS + 2 * WINDOW
HANG = 120.0  # hang guard only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, data_dir: Path, *extra: str):
        self.port, self.hport = _free_port(), _free_port()
        self.log = data_dir / f"broker-{self.port}.log"
        self._out = open(self.log, "wb")  # noqa: SIM115 (closed in kill)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "run", "--host", "127.0.0.1", "--port",
             str(self.port), "--http-port", str(self.hport), "--data-dir", str(data_dir),
             "--journal-checkpoint-records", str(CKPT_RECORDS), *extra],
            cwd=str(REPO), stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if self.recovery()["ready"]:
                    return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        raise AssertionError("broker not ready: " + self.log.read_text()[-3000:])

    def http(self, path: str, method: str = "GET", body: bytes | None = None):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.hport}{path}", method=method, data=body,
            headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                     "content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)

    def recovery(self) -> dict:
        return self.http("/api/overview")["recovery"]

    def replayed(self) -> int:
        phases = {p["name"]: p for p in self.recovery()["phases"]}
        return phases["journal log"]["done"]

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(HANG)
        self._out.close()


@pytest.fixture
def procs():
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def _start(procs, data_dir: Path, *extra: str) -> Proc:
    for _attempt in range(5):
        p = Proc(data_dir, *extra)
        procs.append(p)
        # a port picked free can be taken by another process before the broker binds it:
        # the broker then stops (AMQP) or runs without its HTTP API; start it again
        deadline = time.monotonic() + HANG
        while time.monotonic() < deadline:
            text = p.log.read_text(errors="replace")
            if f"127.0.0.1:{p.port}: address already in use" in text \
                    or f"127.0.0.1:{p.hport} (HTTP): address already in use" in text:
                break
            if p.proc.poll() is not None:
                raise AssertionError(text[-3000:])
            try:
                if p.recovery()["ready"]:
                    return p
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.05)
        else:
            raise AssertionError("broker not ready: " + p.log.read_text()[-3000:])
        p.kill()
    raise AssertionError("no free ports after 5 attempts")


def _publish_frames(body: bytes, priority: int | None, exchange: str = "",
                    headers: dict | None = None, message_id: str | None = None,
                    routing_key: str = QUEUE) -> bytes:
    if priority is None and not exchange and headers is None and message_id is None:
        return ra.encode_publish(1, "", routing_key, body, 131072, delivery_mode=2)[0]
    m = ra.method_frame(1, ra.BASIC_PUBLISH, b"\x00\x00" + ra.shortstr(exchange)
                        + ra.shortstr(routing_key) + b"\x00")
    h = ra.content_header(1, len(body), props=ra.basic_properties(
        delivery_mode=2, priority=priority, headers=headers, message_id=message_id))
    return b"".join([m, h, *ra.body_frames(1, body, 131072)])


def _frames(i: int, priority_of, exchange: str, dedup: bool, half: bool) -> bytes:
    if half:  # a half message, transaction id t<i>, no check-back within the test
        return _publish_frames(b"m%d" % i, None, exchange, {
            "x-transaction": "prepare", "x-transaction-timeout": 3_600_000},
            message_id=f"t{i}")
    return _publish_frames(b"m%d" % i, None if priority_of is None else priority_of(i),
                           exchange, {"x-deduplication-header": f"d{i}"} if dedup else None)


def publish(url: str, first: int, n: int, priority_of=None, exchange: str = "",
            dedup: bool = False, half: bool = False, decide: str | None = None) -> None:
    """Persistent messages with bodies ``m<i>`` for i in [first, first + n) (priority
    ``priority_of(i)`` if given; with ``dedup`` an ``x-deduplication-header`` of
    ``d<i>``; ``half``: prepared half messages; ``decide``: that decision on the
    transactions t<i>), every one confirmed before this returns (at most WINDOW in
    flight)."""
    c = ra.Connection(url, timeout=HANG)
    c.channel_open(1)
    c.confirm_select(1)
    sock = c.sock
    buf = bytearray(c.buf)
    sent = acked = 0
    fh, cm = struct.Struct(">BHI"), struct.Struct(">HH")
    while acked < n:
        if sent < n and sent - acked < WINDOW:
            k = min(n - sent, WINDOW - (sent - acked))
            sock.sendall(b"".join(
                _publish_frames(b"", None, "amq.triomq.transaction",
                                message_id=f"t{first + sent + j}", routing_key=decide)
                if decide else _frames(first + sent + j, priority_of, exchange, dedup, half)
                for j in range(k)))
            sent += k
            continue
        data = sock.recv(1 << 20)
        assert data, "broker closed the connection"
        buf += data
        pos = 0
        while len(buf) - pos >= 8:
            ftype, _ch, size = fh.unpack_from(buf, pos)
            if len(buf) - pos < 8 + size:
                break
            if ftype == 1:
                method = cm.unpack_from(buf, pos + 7)
                assert method != (60, 120), "a publish was nacked"
                if method == (60, 80):
                    tag, multiple = struct.unpack_from(">QB", buf, pos + 11)
                    acked = tag if multiple & 1 else max(acked, tag)
            pos += 8 + size
        del buf[:pos]
    c.close()


def consume(url: str, n: int | None = None) -> list[bytes]:
    """Bodies of ``n`` messages (all there are, if None), acked."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    bodies: list[bytes] = []
    timeout = 5 if n is None else HANG  # (None: the queue is drained when nothing comes)
    for method, _props, body in ch.consume(QUEUE, inactivity_timeout=timeout):
        if method is None:
            break
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if n is not None and len(bodies) == n:
            break
    ch.cancel()
    conn.close()
    return bodies


def declare(url: str, queue: str = QUEUE, arguments: dict | None = None) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    count = conn.channel().queue_declare(queue, durable=True,
                                         arguments=arguments).method.message_count
    conn.close()
    return count


def test_kill_9_replays_a_bounded_log_and_loses_nothing(tmp_path, procs):
    """Killed right after a burst of confirmed publishes many checkpoint intervals long,
    right after a restart, and right after acking a drain: each restart replays at most
    BOUND records (independent of how much was written since the broker started), and
    every confirmed message comes back exactly once."""
    n = 10 * CKPT_RECORDS
    p = _start(procs, tmp_path)
    declare(p.url)
    publish(p.url, 0, n)
    p.kill()  # right after the last confirm: a burst of ten checkpoint intervals

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    assert declare(p.url) == n
    p.kill()  # right after a restart (which checkpoints what it replayed)

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    assert declare(p.url) == n
    drained = consume(p.url, n // 2)  # acks: a delivered and a remove record each
    p.kill()

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    rest = consume(p.url)
    everything = {b"m%d" % i for i in range(n)}
    # acks are not confirmed to a consumer: one not yet on disk at the kill comes back
    assert len(rest) == len(set(rest)), "a message came back twice"
    assert set(rest) | set(drained) == everything
    assert len(rest) >= n - len(drained)
    assert len(drained) == len(set(drained))


def test_kill_9_priority_queue_replays_a_bounded_log(tmp_path, procs):
    """The same bound for a priority queue (its checkpoint carries the entries' levels):
    killed after a burst of ten checkpoint intervals and after acking half of it, each
    restart replays at most BOUND records, and the rest comes back complete, highest
    priority first."""
    n = 10 * CKPT_RECORDS
    args = {"x-max-priority": 9}
    levels = {b"m%d" % i: i % 10 for i in range(n)}
    p = _start(procs, tmp_path)
    declare(p.url, arguments=args)
    publish(p.url, 0, n, priority_of=lambda i: i % 10)
    p.kill()

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    assert declare(p.url, arguments=args) == n
    drained = consume(p.url, n // 2)
    p.kill()

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    rest = consume(p.url)
    assert len(rest) == len(set(rest)), "a message came back twice"
    assert set(rest) | set(drained) == set(levels)
    got = [levels[b] for b in rest]
    assert got == sorted(got, reverse=True), "not highest priority first after the restart"


def test_kill_9_dedup_disk_cache_replays_a_bounded_log(tmp_path, procs):
    """A deduplication exchange with its cache on disk (an internal queue of markers):
    killed after a burst of ten checkpoint intervals of new values, and again right after
    the restart, each restart replays at most BOUND records, and the cache is whole: the
    values published before the kill are still dropped, a new one passes."""
    n = 10 * CKPT_RECORDS
    p = _start(procs, tmp_path)
    conn = pika.BlockingConnection(pika.URLParameters(p.url))
    ch = conn.channel()
    ch.exchange_declare("dedup", "x-message-deduplication", durable=True, arguments={
        "x-cache-size": 2 * n, "x-cache-persistence": "disk"})
    ch.queue_declare(QUEUE, durable=True)
    ch.queue_bind(QUEUE, "dedup")
    conn.close()
    publish(p.url, 0, n, exchange="dedup", dedup=True)
    p.kill()

    for _ in range(2):
        p = _start(procs, tmp_path)
        assert p.replayed() <= BOUND, p.recovery()
        assert declare(p.url) == n
        p.kill()  # right after a restart

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    publish(p.url, n - 500, 501, exchange="dedup", dedup=True)  # 500 repeats, 1 new value
    assert declare(p.url) == n + 1


def test_kill_9_half_messages_replay_a_bounded_log(tmp_path, procs):
    """Half messages (prepared, undecided) held across kill -9: after a burst of ten
    checkpoint intervals of prepares, and after committing part of them, each restart
    replays at most BOUND records; the held ones stay held (nothing reaches the queue
    before its commit) and a commit after the restart delivers exactly its messages."""
    n = 10 * CKPT_RECORDS
    p = _start(procs, tmp_path)
    declare(p.url)
    publish(p.url, 0, n, half=True)
    p.kill()

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    assert declare(p.url) == 0
    publish(p.url, 0, n // 2, decide="commit")
    p.kill()  # right after the commits were confirmed

    p = _start(procs, tmp_path)
    assert p.replayed() <= BOUND, p.recovery()
    assert declare(p.url) == n // 2
    publish(p.url, n // 2, 10, decide="commit")
    assert declare(p.url) == n // 2 + 10
    got = consume(p.url)
    assert sorted(got) == sorted(b"m%d" % i for i in range(n // 2 + 10))


def test_progress_is_visible_while_a_long_recovery_runs(tmp_path, procs):
    """A journal of 300,000 messages and no checkpoint (every record to replay): while it
    is read back the HTTP API answers with the phases at once, a write sent meanwhile
    waits and is served once recovery ends (as an AMQP client connecting meanwhile is
    let in then), and nothing is lost."""
    n = 300_000
    build_journal(str(tmp_path), n, 8, checkpoint=False)
    p = Proc(tmp_path)
    procs.append(p)
    seen_running: dict | None = None
    refused = None
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        assert p.proc.poll() is None, p.log.read_text()[-3000:]
        try:
            rec = p.recovery()
        except (OSError, urllib.error.URLError):
            time.sleep(0.02)
            continue
        if rec["ready"]:
            break
        if seen_running is None and any(ph["running"] for ph in rec["phases"]):
            seen_running = rec
            req = urllib.request.Request(
                f"http://127.0.0.1:{p.hport}/api/queues/%2F/other", method="PUT", data=b"{}",
                headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                         "content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    # answered: recovery must be over by now
                    refused = (r.status, p.recovery())
            except urllib.error.HTTPError as exc:
                refused = (exc.code, json.load(exc))
            # a client connecting now waits for the end of recovery, then works
            assert declare(p.url, BUILT_QUEUE) == n
        time.sleep(0.02)
    assert seen_running is not None, "recovery was never seen running"
    assert seen_running["active"] is True and seen_running["ready"] is False
    assert refused is not None and refused[0] == 201, refused
    assert refused[1]["ready"] is True, "a write was served before recovery ended"
    p.wait_ready()
    phases = {ph["name"]: ph for ph in p.recovery()["phases"]}
    assert phases["journal log"]["done"] == n + 1  # the queue's record and every enqueue
    assert not any(ph["running"] for ph in phases.values())
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{p.hport}/metrics", timeout=30).read()
    assert b"triomq_recovery_active 0.0" in metrics
    assert b'triomq_recovery_phase_done{phase="journal log",unit="records"} 300001.0' in metrics
    log = p.log.read_text()
    if phases["journal log"]["elapsed"] > 1.5:  # a second passed during replay: logged
        assert "recovering: journal log:" in log
    assert declare(p.url, BUILT_QUEUE) == n
