"""Restart after kill -9: time to listening and to the first delivery, at several moments.

    .venv/bin/python -m bench.recovery [--messages 1000000] [--burst 200000] [--size 16]
                                       [--store URL] [--keep DIR] [--priorities N]

1. build the backlog: for the journal (default) the data dir is written offline
   (segments of ``--messages`` persistent enqueues to the durable queue ``backlog``,
   plus a checkpoint covering them, as a clean stop leaves it) -- publishing 10M
   messages through a client would take most of an hour; for ``--store`` (SQL), and
   for a priority queue (``--priorities N``: x-max-priority N - 1, message i at
   priority i % N, bursts too), the messages are published with confirms;
2. moment "checkpoint": start the broker, then kill -9 it at once (nothing to replay
   after the checkpoint);
3. moment "burst": start it, publish ``--burst`` more persistent messages with confirms
   (the journal appends them after the checkpoint), kill -9 right after the last confirm;
4. moment "drain": start it, consume and ack ``--burst`` messages (removals after the
   checkpoint; the journal may compact while they land), kill -9 right after;
5. after each kill: restart, report
   - restart to listening: an AMQP handshake completes (the port accepts earlier, but a
     connection is only served once recovery ends),
   - restart to serving: on a new connection, a passive declare of the recovered queue
     answers and a transient message published to it is confirmed,
   - restart to first delivery: a basic.get returns a recovered message,
   the queue count (less the transient probe), the broker's RSS and the recovery lines
   of its log. The count must be exact.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import pika

import rawamqp as ra
from broker.persistence import journal_format as jf
from broker.persistence.records import _MSG_HEAD, QueueDef

from .backlog import publish
from .procinfo import TrioMQProcess, free_port, rss_kb

QUEUE = "backlog"
SETTLE = 10.0  # seconds after the first delivery for the "settled" RSS


def build_journal(data_dir: str, n: int, size: int, checkpoint: bool = True) -> None:
    """A journal data dir holding ``n`` persistent ``size``-byte messages in ``QUEUE``,
    with the checkpoint a clean stop would have written (every entry in it), or none
    (a restart replays every record)."""
    import json
    from array import array

    jdir = os.path.join(data_dir, "journal")
    os.makedirs(jdir, exist_ok=True)
    qid = 1
    props = ra.basic_properties(delivery_mode=2)
    names = bytes((0,)) + bytes((len(QUEUE),)) + QUEUE.encode()
    body = b"x" * size
    enq = jf.ENQ
    seg, off = 1, 0
    f = open(os.path.join(jdir, jf.seg_name(seg)), "wb")  # noqa: SIM115
    out = bytearray()
    locs = array("q")

    def rec(rtype: int, payload: bytes) -> int:
        nonlocal seg, off, f, out
        r = jf.pack_record(rtype, payload)
        if off and off + len(r) > jf.SEGMENT_SIZE:
            f.write(out)
            f.close()
            out = bytearray()
            seg, off = seg + 1, 0
            f = open(os.path.join(jdir, jf.seg_name(seg)), "wb")  # noqa: SIM115
        loc = (seg << 32) | off
        out += r
        off += len(r)
        if len(out) > 8 << 20:
            f.write(out)
            out = bytearray()
        return loc

    qdef = QueueDef("/", QUEUE, True, False, {})
    rec(jf.T_QUEUE, jf.pack_queue(qdef, qid))
    nan = float("nan")
    for i in range(1, n + 1):
        payload = b"".join((enq.pack(qid, i, nan, 0, size, 0),
                            _MSG_HEAD.pack(i, len(names), len(props)), names, props, body))
        locs.append(rec(jf.T_ENQ, payload))
    f.write(out)
    f.close()
    if not checkpoint:
        return
    head = json.dumps({"seg": seg, "off": off, "next_qid": qid + 1, "format": jf.FORMAT_VERSION,
                       "max_msg_id": n, "time": time.time()}).encode()
    seqs = array("q", range(1, n + 1))
    exps = array("d", [nan]) * n
    blens = array("I", [size]) * n
    flags = array("B", bytes(n))
    with open(os.path.join(jdir, "checkpoint"), "wb") as ck:
        ck.write(jf.pack_record(jf.T_CKPT_HEAD, head))
        ck.write(jf.pack_record(jf.T_QUEUE, jf.pack_queue(qdef, qid)))
        if n:
            ck.write(jf.pack_record(jf.T_CKPT_QUEUE, b"".join(
                [jf.QSEQ.pack(qid, n)] + [c.tobytes() for c in (seqs, locs, exps, blens, flags)])))
        ck.write(jf.pack_record(jf.T_CKPT_END, b""))


def start(data_dir: str, store: str | None, extra: list[str]) -> tuple[TrioMQProcess, float]:
    """Start the broker; seconds until an AMQP handshake completes (polled every 20 ms)."""
    hport = free_port()
    p = TrioMQProcess(store=store, data_dir=data_dir, startup_timeout=600,
                      extra_args=["--http-port", str(hport), *extra])
    p.http_port = hport  # type: ignore[attr-defined]
    p.log_path = os.path.join(data_dir, f"broker-{p.port}.log")
    p._log = open(p.log_path, "wb")  # noqa: SIM115
    env = dict(os.environ)
    import subprocess
    t0 = time.monotonic()
    p.proc = subprocess.Popen(p.cmd, stdout=p._log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    deadline = t0 + 600
    while time.monotonic() < deadline:
        if p.proc.poll() is not None:
            raise RuntimeError(f"broker exited during startup:\n{p.log_tail()}")
        try:
            c = ra.Connection(p.url, timeout=2.0)
        except Exception:
            time.sleep(0.02)
            continue
        took = time.monotonic() - t0
        c.close(timeout=5.0)
        return p, took
    kill(p)
    raise RuntimeError("broker did not listen within 600 s")


def phases(p: TrioMQProcess) -> str:
    """The broker's recovery phases (``/api/overview``): name, units done, seconds."""
    import base64
    import json
    import urllib.request
    req = urllib.request.Request(
        f"http://127.0.0.1:{p.http_port}/api/overview",  # type: ignore[attr-defined]
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=60) as r:
        rec = json.load(r).get("recovery")
    if rec is None:  # a broker from before recovery progress (a before/after run)
        return "n/a"
    # a phase still running when this is read (the SQL store's index past each queue's
    # first window is read while the broker serves) says so
    return ", ".join(f"{ph['name']} {ph['done']:,} {ph['unit']} {ph['elapsed']:.2f} s"
                     + (" (running)" if ph.get("running") else "") for ph in rec["phases"])


def serving(p: TrioMQProcess, t0: float) -> float:
    """Seconds from ``t0`` until the recovered queue is served: its passive declare answers
    and a transient publish to it is confirmed (the probe stays at the queue's tail and is
    lost at the next kill -9)."""
    conn = pika.BlockingConnection(pika.URLParameters(p.url + "?blocked_connection_timeout=600"
                                                      "&socket_timeout=600"))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUEUE, durable=True, passive=True)
    ch.basic_publish("", QUEUE, b"probe", mandatory=True)  # raises unless confirmed
    took = time.monotonic() - t0
    conn.close()
    return took


def first_delivery(p: TrioMQProcess, t0: float) -> tuple[float, int]:
    """Seconds from ``t0`` until a basic.get returns a message (requeued), and the count."""
    conn = pika.BlockingConnection(pika.URLParameters(p.url + "?blocked_connection_timeout=600"
                                                      "&socket_timeout=600"))
    ch = conn.channel()
    while True:
        method, _props, _body = ch.basic_get(QUEUE)
        if method is not None:
            took = time.monotonic() - t0
            ch.basic_nack(method.delivery_tag, requeue=True)
            break
        time.sleep(0.01)
    count = ch.queue_declare(QUEUE, durable=True, passive=True).method.message_count
    conn.close()
    return took, count


def drain(p: TrioMQProcess, n: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(p.url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2000)
    got = 0
    for method, _props, _body in ch.consume(QUEUE, inactivity_timeout=120):
        if method is None:
            raise RuntimeError(f"drain stalled after {got}")
        got += 1  # noqa: SIM113 (acks every 500th)
        if got % 500 == 0 or got == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got == n:
            break
    ch.cancel()
    conn.close()


def kill(p: TrioMQProcess) -> None:
    if p.proc is not None and p.proc.poll() is None:
        os.killpg(p.proc.pid, signal.SIGKILL)
        p.proc.wait(30)
    if p._log:
        p._log.close()
        p._log = None


_LOG = re.compile(r"(journal:|recover|postgres|sql)", re.I)


def restart(data_dir: str, store: str | None, extra: list[str], moment: str,
            expected: int, rss_before: int) -> dict:
    t0 = time.monotonic()
    p, listening = start(data_dir, store, extra)
    try:
        served = serving(p, t0)
        delivery, count = first_delivery(p, t0)
        count -= 1  # the transient probe serving() published
        rss = rss_kb(p.proc.pid) or 0
        done = phases(p)
        # the checkpoint a restart writes after replaying holds a copy of the index while
        # it is written: RSS once that is over
        time.sleep(SETTLE)
        settled = rss_kb(p.proc.pid) or 0
    finally:
        kill(p)
    with open(p.log_path, errors="replace") as f:
        lines = [ln.strip() for ln in f if _LOG.search(ln)]
    row = {"moment": moment, "listening": listening, "serving": served, "first_delivery": delivery,
           "count": count, "expected": expected, "rss_mb": rss // 1024,
           "rss_before_mb": rss_before // 1024, "rss_settled_mb": settled // 1024}
    print(f"  {moment}: listening after {listening:.2f} s, serving after {served:.2f} s, "
          f"first delivery after "
          f"{delivery:.2f} s, count {count:,} (expected {expected:,}), RSS {rss // 1024} MB "
          f"(before the kill: {rss_before // 1024} MB, {SETTLE:g} s later: {settled // 1024} MB)",
          flush=True)
    print(f"    phases: {done}", flush=True)
    for ln in lines[-6:]:
        print("    log:", ln[:220], flush=True)
    row["phases"] = done
    return row


def _difference(row: dict) -> str:
    """Nothing when the count is exact; acks are not confirmed to a consumer, so after a
    drain those not yet written at the kill come back (more than expected: redelivered);
    fewer than expected would be a loss."""
    extra = row["count"] - row["expected"]
    if extra == 0:
        return ""
    if extra > 0:
        return f" (+{extra:,}: acks not yet written at the kill, redelivered)"
    return f" (LOST {-extra:,}!)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--burst", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=16)
    ap.add_argument("--store", default=None, help="--store for the broker (default: the journal); "
                                                  "'pg': a scratch PostgreSQL database on "
                                                  "127.0.0.1:5432, dropped afterwards")
    ap.add_argument("--keep", default=None, help="data dir to use and keep (default: a temp dir)")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker argument")
    ap.add_argument("--priorities", type=int, default=0,
                    help="a priority queue of that many levels (published, not built offline)")
    args = ap.parse_args(argv)
    print("Command: `" + " ".join([os.path.basename(sys.executable), "-m", "bench.recovery"]
                                  + (argv if argv is not None else sys.argv[1:])) + "`", flush=True)
    data_dir = args.keep or tempfile.mkdtemp(prefix="triomq-recovery-")
    extra = args.broker_arg
    rows = []
    drop = None
    if args.store == "pg":
        from .store_names import _scratch_pg
        args.store, drop = _scratch_pg("127.0.0.1", 5432)
    try:
        # the same start on an empty data dir: what a restart costs besides recovery
        empty = tempfile.mkdtemp(prefix="triomq-recovery-empty-")
        try:
            p, empty_start = start(empty, None, [])
            kill(p)
        finally:
            shutil.rmtree(empty, ignore_errors=True)
        print(f"empty journal broker: listening after {empty_start:.2f} s "
              f"(load average {os.getloadavg()[0]:.1f})", flush=True)
        t = time.monotonic()
        prio = args.priorities
        if args.store is None and not prio:
            build_journal(data_dir, args.messages, args.size)
            print(f"built a journal of {args.messages:,} messages offline in "
                  f"{time.monotonic() - t:.1f} s", flush=True)
        else:
            p, _ = start(data_dir, args.store, extra)
            try:
                c = ra.Connection(p.url, timeout=60)
                c.channel_open(1)
                c.queue_declare(1, QUEUE, durable=True,
                                arguments={"x-max-priority": prio - 1} if prio else None)
                c.close()
                publish(p.url, QUEUE, args.messages, args.size, priorities=prio)
            finally:
                p.stop()
            print(f"published {args.messages:,} messages in {time.monotonic() - t:.1f} s", flush=True)
        expected = args.messages
        # moment 1: killed right after starting from a checkpoint / clean state
        p, _ = start(data_dir, args.store, extra)
        first_delivery(p, time.monotonic())
        before = rss_kb(p.proc.pid) or 0
        kill(p)
        rows.append(restart(data_dir, args.store, extra, "after a clean checkpoint", expected,
                            before))
        # moment 2: killed right after a burst of confirmed publishes
        p, _ = start(data_dir, args.store, extra)
        try:
            publish(p.url, QUEUE, args.burst, args.size, priorities=prio)
            before = rss_kb(p.proc.pid) or 0
        finally:
            kill(p)
        expected += args.burst
        rows.append(restart(data_dir, args.store, extra, f"after a burst of {args.burst:,}",
                            expected, before))
        # moment 3: killed right after draining (acks: removals; compaction may run)
        p, _ = start(data_dir, args.store, extra)
        try:
            drain(p, args.burst)
            before = rss_kb(p.proc.pid) or 0
        finally:
            kill(p)
        expected -= args.burst
        rows.append(restart(data_dir, args.store, extra, f"after draining {args.burst:,}",
                            expected, before))
    finally:
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
        if drop is not None:
            drop()
    print(f"\nempty broker start: {empty_start:.2f} s")
    print("| moment | restart to listening | to serving | to first delivery | count | "
          "RSS before kill / "
          f"at first delivery / {SETTLE:g} s later | recovery phases |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['moment']} | {r['listening']:.2f} s | {r['serving']:.2f} s | "
              f"{r['first_delivery']:.2f} s | "
              f"{r['count']:,}{_difference(r)} | "
              f"{r['rss_before_mb']} / {r['rss_mb']} / {r['rss_settled_mb']} MB | "
              f"{r['phases']} |")
    return 0 if all(r["count"] >= r["expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
