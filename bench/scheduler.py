"""Scheduler benchmark: memory with many pending delayed messages, and firing precision.

    python -m bench.scheduler                       # 1,000,000 pending, 10,000/s due for 10 s
    python -m bench.scheduler --pending 100000 --rate 5000 --seconds 5
    python -m bench.scheduler --store sqlite:////tmp/b.db --persistent
    python -m bench.scheduler --persistent --store journal --restart   # + recovery time / RSS
    python -m bench.scheduler --persistent --store journal --kill      # the same after kill -9
    python -m bench.scheduler --fresh                  # a fresh broker's first delayed messages

--fresh measures what a freshly started broker does with its very first delayed
messages: 2,000 published at once (--fresh-count) with a random x-delay of 0.5-2.5 s
(--fresh-min-delay/--fresh-max-delay), lateness = receive - (send time + x-delay),
no phase 1 and no warm-up publish before them.

Phase 1 fills the broker with --pending delayed messages due in an hour (they
stay pending: the heap's size) and reports the broker's RSS before and after.
Phase 2 publishes rate*seconds messages whose due times are spaced exactly
1/rate apart, starting after all of them are published, and a consumer
measures lateness = receive time - due time, where the due time is computed by
the publisher *before* sending (the broker's own due time is later by the
network delay, so a negative value would be a message delivered early).

Everything goes over AMQP to a broker subprocess (memory store unless --store).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import rawamqp as ra

from .procinfo import REPO_ROOT, free_port, rss_kb

EXCHANGE = "bench.delayed"
FAR_KEY = "far"
DUE_KEY = "due"


def publish_frames(exchange: str, key: str, body: bytes, delay_ms: int, persistent: bool) -> bytes:
    m = ra.method_frame(1, 60, 40, b"\x00\x00" + ra.shortstr(exchange) + ra.shortstr(key) + b"\x00")
    props = ra.table({"x-delay": delay_ms}) + bytes((2 if persistent else 1,))
    h = ra.frame(ra.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, len(body), 0x3000) + props)
    return m + h + ra.frame(ra.FRAME_BODY, 1, body)


def control(data_dir: str, op: str = "stats") -> dict:
    from broker.scheduler.control import socket_path
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(60)
        s.connect(socket_path(data_dir))
        s.sendall(json.dumps({"op": op}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def wait_pending(data_dir: str, want: int, timeout: float) -> dict:
    deadline = time.time() + timeout
    while True:
        st = control(data_dir)["stats"]
        if st["pending"] >= want or time.time() > deadline:
            return st
        time.sleep(0.2)


class Consumer(threading.Thread):
    def __init__(self, url: str, queue: str, expected: int, timeout: float):
        super().__init__(daemon=True)
        self.conn = ra.Connection(url)
        self.conn.channel_open(1)
        self.conn.basic_consume(1, queue, no_ack=True)
        self.expected = expected
        self.timeout = timeout
        self.lateness: list[float] = []

    def run(self) -> None:
        conn = self.conn
        deadline = time.monotonic() + self.timeout
        late = self.lateness
        try:
            while len(late) < self.expected:
                ftype, _ch, payload = conn._next_frame(deadline)
                if ftype == ra.FRAME_BODY:
                    late.append(time.time() - float(payload))
        except (TimeoutError, ConnectionError):
            pass


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100.0 * len(values)))]


def declare(pub) -> None:
    pub.channel_open(1)
    args = ra.table({"x-delayed-type": "direct"})
    pub.rpc(1, 40, 10, b"\x00\x00" + ra.shortstr(EXCHANGE) + ra.shortstr("x-delayed-message")
            + ra.bits(False, False, False, False, False) + args, ra.EXCHANGE_DECLARE_OK)
    for q, key in (("bench.far", FAR_KEY), ("bench.due", DUE_KEY)):
        pub.queue_declare(1, q)
        pub.queue_bind(1, q, EXCHANGE, key)


def precision_phase(a, url: str, pub, data_dir: str) -> dict:
    """Phase 2: messages falling due at ``a.rate`` per second; their lateness."""
    n = int(a.rate * a.seconds)
    consumer = Consumer(url, "bench.due", n, timeout=a.seconds + 120)
    consumer.start()
    # Pre-load, paced below the broker's ingest capacity (so receive lag stays small and
    # the publisher's due time is a tight lower bound of the broker's), messages whose
    # due times are spaced exactly 1/rate apart starting once all are published; then
    # they fall due at `rate` per second with nothing else going on.
    per_tick = max(1, a.ingest_rate // 100)
    ingest_s = n / a.ingest_rate
    start = time.time() + ingest_s + 1.0
    tick0 = time.time()
    i = 0
    k = 0
    max_behind = 0.0
    while i < n:
        target = tick0 + k * 0.01
        now = time.time()
        if now < target:
            time.sleep(target - now)
        else:
            max_behind = max(max_behind, now - target)
        t_pub = time.time()
        m = min(per_tick, n - i)
        frames = []
        for j in range(i, i + m):
            delay_ms = max(1, int((start + j / a.rate - t_pub) * 1000) + 1)
            intended = t_pub + delay_ms / 1000.0  # not later than the broker's due time
            frames.append(publish_frames(EXCHANGE, DUE_KEY, b"%.6f" % intended, delay_ms,
                                         a.persistent))
        pub.send(b"".join(frames))
        i += m
        k += 1
    result: dict = {"preload_s": round(time.time() - tick0, 2),
                    "published_before_first_due": time.time() < start,
                    "publisher_max_behind_ms": round(max_behind * 1000, 1)}
    consumer.join()
    late = consumer.lateness
    result.update({
        "due_messages": n,
        "received": len(late),
        "early": sum(1 for x in late if x < 0),
        "lateness_ms": {k: round(v * 1000, 2) for k, v in (
            ("min", min(late) if late else float("nan")), ("p50", pct(late, 50)),
            ("p90", pct(late, 90)), ("p99", pct(late, 99)), ("p999", pct(late, 99.9)),
            ("max", max(late) if late else float("nan")))},
    })
    return result


class StampedConsumer(Consumer):
    """Keeps (receive time, body) for bodies of the form ``b"<due> <index>"``."""

    def run(self) -> None:
        conn = self.conn
        deadline = time.monotonic() + self.timeout
        got = self.got = []
        try:
            while len(got) < self.expected:
                ftype, _ch, payload = conn._next_frame(deadline)
                if ftype == ra.FRAME_BODY:
                    got.append((time.time(), payload))
        except (TimeoutError, ConnectionError):
            pass


class ConfirmReader(threading.Thread):
    """The publisher's Basic.Ack times by delivery tag: the broker has taken the message in
    (scheduled it) by then, so confirm time + x-delay bounds the broker's due time."""

    def __init__(self, conn, expected: int, timeout: float):
        super().__init__(daemon=True)
        self.conn = conn
        self.expected = expected
        self.timeout = timeout
        self.acked: list[float] = []  # index = delivery tag - 1

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        acked = self.acked
        try:
            while len(acked) < self.expected:
                ftype, _ch, payload = self.conn._next_frame(deadline)
                if ftype != ra.FRAME_METHOD or payload[:4] != b"\x00\x3c\x00\x50":
                    continue
                tag, flags = struct.unpack_from(">QB", payload, 4)
                now = time.time()
                upto = tag if flags & 1 else max(tag, len(acked) + 1)
                acked.extend([now] * (upto - len(acked)))
        except (TimeoutError, ConnectionError):
            pass


def _ms(values: list[float]) -> dict:
    return {k: round(v * 1000, 2) for k, v in (
        ("min", min(values) if values else float("nan")), ("p50", pct(values, 50)),
        ("p90", pct(values, 90)), ("p99", pct(values, 99)), ("p999", pct(values, 99.9)),
        ("max", max(values) if values else float("nan")))}


def fresh_phase(a, url: str, pub) -> dict:
    """The very first delayed messages a fresh broker sees: random delays, sent in one burst."""
    import random

    rnd = random.Random(a.seed)
    n = a.fresh_count
    consumer = StampedConsumer(url, "bench.due", n, timeout=a.fresh_max_delay + 120)
    consumer.start()
    confirms = None
    if a.confirms:
        pub.confirm_select(1)
        confirms = ConfirmReader(pub, n, timeout=a.fresh_max_delay + 120)
        confirms.start()
    frames = []
    sent: list[tuple[float, float]] = []  # (send time, x-delay s)
    t_first = time.time()
    for i in range(n):
        delay_ms = rnd.randint(int(a.fresh_min_delay * 1000), int(a.fresh_max_delay * 1000))
        t_pub = time.time()
        sent.append((t_pub, delay_ms / 1000.0))
        frames.append(publish_frames(EXCHANGE, DUE_KEY, b"%.6f %d" % (t_pub + delay_ms / 1000.0, i),
                                     delay_ms, a.persistent))
        if len(frames) == 100:
            pub.send(b"".join(frames))
            frames.clear()
    if frames:
        pub.send(b"".join(frames))
    send_s = time.time() - t_first
    consumer.join()
    late = []
    idx = []
    for t_recv, body in consumer.got:
        due, i = body.split()
        late.append(t_recv - float(due))
        idx.append(int(i))
    result = {
        "send_s": round(send_s, 3),
        "due_messages": n,
        "received": len(late),
        "early": sum(1 for x in late if x < 0),
        "lateness_ms": _ms(late),
        # lateness by the message's place in the burst: growth = the broker's intake of it
        "p50_by_send_quarter_ms": [round(pct([x for x, i in zip(late, idx, strict=True)
                                              if q * n // 4 <= i < (q + 1) * n // 4], 50) * 1000, 2)
                                   for q in range(4)],
    }
    if confirms is not None:
        confirms.join()
        acked = confirms.acked
        result["intake_ms"] = _ms([acked[i] - sent[i][0] for i in range(min(len(acked), n))])
        result["after_confirm_ms"] = _ms([t_recv - (acked[i] + sent[i][1])
                                          for (t_recv, _b), i in zip(consumer.got, idx, strict=True)
                                          if i < len(acked)])
    return result


def report(result: dict, p99_limit_ms: float, as_json: bool = False) -> int:
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    ok = result["early"] == 0 and result["received"] == result["due_messages"] \
        and result["lateness_ms"]["p99"] <= p99_limit_ms
    print("RESULT:", "PASS" if ok else "FAIL", f"(none early, all received, p99 <= {p99_limit_ms:g} ms)")
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=1_000_000, help="messages kept pending (phase 1)")
    ap.add_argument("--rate", type=int, default=10_000, help="messages falling due per second")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the due window")
    ap.add_argument("--ingest-rate", type=int, default=12_000,
                    help="publish pace while pre-loading phase 2 (below ingest capacity)")
    ap.add_argument("--body", type=int, default=64, help="body size of phase-1 messages")
    ap.add_argument("--store", default="memory", help="broker --store (default memory)")
    ap.add_argument("--persistent", action="store_true", help="delivery_mode 2")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--restart", action="store_true",
                    help="then stop the broker (SIGTERM), start it again on the same data dir and "
                         "report the recovery time and RSS with the pending messages back, "
                         "then run the precision phase again")
    ap.add_argument("--kill", action="store_true",
                    help="as --restart, but stop the broker with kill -9")
    ap.add_argument("--fresh", action="store_true",
                    help="only the first delayed messages of a freshly started broker "
                         "(random delays; lateness must hold from the first message)")
    ap.add_argument("--fresh-count", type=int, default=2000)
    ap.add_argument("--fresh-min-delay", type=float, default=0.5, help="seconds")
    ap.add_argument("--fresh-max-delay", type=float, default=2.5, help="seconds")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--confirms", action="store_true",
                    help="with --fresh: publisher confirms, to split the lateness into the "
                         "broker's intake (send -> confirm) and what follows the confirm")
    a = ap.parse_args(argv)

    data_dir = tempfile.mkdtemp(prefix="triomq-bench-sched-")
    port = free_port()
    pre = os.environ.get("BENCH_BROKER_PRELUDE")
    launcher = (["-c", pre + "; from broker.cli import main; import sys; sys.exit(main(sys.argv[1:]))"]
                if pre else ["-m", "broker"])
    cmd = [sys.executable, *launcher, "run", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", data_dir, "--store", a.store, "--log-level", "WARNING",
           "--memory-limit", str(1 << 40)]
    proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT))
    url = f"amqp://guest:guest@127.0.0.1:{port}/"
    result: dict = {"command": " ".join(sys.argv), "broker": " ".join(cmd[1:]),
                    "pending": a.pending, "rate": a.rate, "seconds": a.seconds,
                    "persistent": a.persistent, "store": a.store}
    try:
        for _ in range(200):
            try:
                pub = ra.Connection(url)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit("broker did not start")
        declare(pub)
        if a.fresh:
            result = {"command": result["command"], "broker": result["broker"],
                      "mode": "fresh", "fresh_count": a.fresh_count,
                      "delay_s": [a.fresh_min_delay, a.fresh_max_delay],
                      "persistent": a.persistent, "store": a.store,
                      "loadavg": os.getloadavg()[0]}
            result.update(fresh_phase(a, url, pub))
            result["broker_max_lateness_ms"] = control(data_dir)["stats"]["max_lateness_ms"]
            pub.close()
            return report(result, 10.0, a.json)
        time.sleep(0.5)
        rss0 = rss_kb(proc.pid)
        result["rss_start_mb"] = round(rss0 / 1024, 1)

        # ---- phase 1: many pending -----------------------------------------
        t0 = time.time()
        body = b"x" * a.body
        batch = []
        for i in range(a.pending):
            batch.append(publish_frames(EXCHANGE, FAR_KEY, body, 3_600_000 + i % 600_000,
                                        a.persistent))
            if len(batch) == 2000:
                pub.send(b"".join(batch))
                batch.clear()
        if batch:
            pub.send(b"".join(batch))
        st = wait_pending(data_dir, a.pending, timeout=600)
        fill_s = time.time() - t0
        time.sleep(1.0)
        rss1 = rss_kb(proc.pid)
        result.update({
            "fill_seconds": round(fill_s, 1),
            "fill_rate_per_s": round(a.pending / fill_s) if fill_s else None,
            "pending_reported": st["pending"],
            "rss_after_fill_mb": round(rss1 / 1024, 1),
            "bytes_per_pending": round((rss1 - rss0) * 1024 / max(1, a.pending)),
        })

        # ---- phase 2: precision at `rate` per second -----------------------
        result.update(precision_phase(a, url, pub, data_dir))
        rss2 = rss_kb(proc.pid)
        result.update({"rss_end_mb": round(rss2 / 1024, 1),
                       "broker_stats": control(data_dir)["stats"]})
        pub.close()
        if a.restart or a.kill:
            if a.kill:
                time.sleep(2.0)  # let the last batch reach the journal (confirms are not awaited)
                proc.kill()
            else:
                proc.terminate()
            proc.wait(300)
            t0 = time.time()
            proc = subprocess.Popen(cmd, cwd=str(REPO_ROOT))
            st = None
            while time.time() - t0 < 900:
                try:
                    st = control(data_dir)["stats"]
                    break
                except OSError:
                    time.sleep(0.2)
            recovered_s = time.time() - t0
            time.sleep(1.0)
            rss3 = rss_kb(proc.pid)
            result.update({
                "restart_how": "kill -9" if a.kill else "SIGTERM",
                "restart_recovery_s": round(recovered_s, 2),
                "restart_pending": st["pending"] if st else None,
                "restart_rss_mb": round(rss3 / 1024, 1),
                "restart_bytes_per_pending": round((rss3 - rss0) * 1024 / max(1, a.pending)),
            })
            # the same precision phase again: lateness after the restart
            pub = ra.Connection(url)
            declare(pub)  # the bench's exchange and queues are transient
            after = precision_phase(a, url, pub, data_dir)
            pub.close()
            result["after_restart"] = {k: after[k] for k in (
                "due_messages", "received", "early", "lateness_ms", "publisher_max_behind_ms")}
            # the broker's own firing lateness: apart from delivery and the bench's clients
            result["after_restart"]["broker_max_lateness_ms"] = \
                control(data_dir)["stats"]["max_lateness_ms"]
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(data_dir, ignore_errors=True)

    if a.json:
        print(json.dumps(result, indent=2))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")
    ok = result["early"] == 0 and result["received"] == result["due_messages"] \
        and result["lateness_ms"]["p99"] <= 50
    after = result.get("after_restart")
    if after is not None:
        ok = ok and after["early"] == 0 and after["received"] == after["due_messages"] \
            and result["restart_pending"] == a.pending

    print("RESULT:", "PASS" if ok else "FAIL", "(none early, all received, p99 <= 50 ms)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
