"""Audit trail benchmarks (docs/performance-audit.md).

    python -m bench.audit overhead [--duration 8] [--modes transient,persistent]
    python -m bench.audit generate --events 10000000 --out /tmp/trail
    python -m bench.audit jobs --input /tmp/trail [--jobs reconcile,sequence,...] [--master URL]

``overhead``: the confirm+ack workload of scenario 2 (1 producer, 1 consumer, 64 B,
confirms with a 256 window, manual acks, unlimited rate) on a fresh TrioMQ without and with
``--audit-dir`` (every queue audited, the block policy: a writer that cannot keep up slows
publishers, so the rate is the honest cost), then on the local RabbitMQ; ``persistent``
adds delivery-mode 2 and a durable queue (TrioMQ's journal, fsync before confirm).

``generate``: N events of realistic shape written by the broker's own writer code
(``RollingWriter``: the batch encoder, deflate, hourly partitions, 64 MiB files) over
two hours of one node: most messages published, delivered, acked; some redelivered,
rejected to a DLX and consumed there, expired, dropped by max-length, unroutable, never
settled (unaccounted); producers with x-seq, a few gaps and duplicates.

``jobs``: each job once in one Spark session (``spark.audit.cli.run_job``), with its time
and events/s.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import shlex
import shutil
import sys
import tempfile
import time

from .cli import RABBIT_URL, run_on_triomq, run_on_url
from .runner import DEFAULTS


def _workload(mode: str, duration: float) -> dict:
    w = dict(DEFAULTS, confirms=True, manual_ack=True, duration=duration)
    if mode == "persistent":
        w.update(persistent=True, queue_durable=True)
    return w


def _triomq_args(extra: list[str]):
    return argparse.Namespace(broker_python=sys.executable, store=None,
                              broker_arg=["--http-port", "0", *extra], startup_timeout=60.0,
                              broker_module="broker")


def _trail_check(root: str) -> str:
    """What the audited run left: events in the Avro files, holes in the sequence, events
    the policy dropped (``audit_dropped``), frames still in the spool. A run with holes or
    drops does not count."""
    from broker.audit.reader import FileReader
    from broker.audit.spool import read_frames, segments
    seqs, dropped = [], 0
    for d, _, fs in os.walk(root):
        for f in fs:
            if f.endswith(".avro"):
                for block in FileReader(os.path.join(d, f)).rows_iter(("seq", "event", "count")):
                    for seq, event, count in block:
                        seqs.append(seq)
                        if event == "audit_dropped":
                            dropped += count or 0
    seqs.sort()
    # the bench stops the broker's process group: the converter gets SIGTERM too and leaves
    # the rest in the spool (converted at the next start); count those events as well
    last = seqs[-1] if seqs else 0
    spooled = 0
    for seg in segments(root):
        for _, first, count, _, _ in read_frames(seg):
            new = first + count - 1 - max(last, first - 1)
            if new > 0:
                seqs.extend(range(max(first, last + 1), first + count))
                spooled += new
                last = first + count - 1
    seqs.sort()
    holes = sum(1 for a, b in itertools.pairwise(seqs) if b != a + 1)
    return (f"{len(seqs) - spooled:,} events in Avro files + {spooled:,} still spooled, seq "
            f"{seqs[0] if seqs else 0}-{seqs[-1] if seqs else 0}, {holes} holes, "
            f"{dropped} dropped")


def _median(runs: list[dict]) -> dict:
    """The run with the median consume rate."""
    return sorted(runs, key=lambda r: r.get("consume_rate") or 0)[len(runs) // 2]


def cmd_overhead(a) -> int:
    rows = []
    for mode in a.modes.split(","):
        w = _workload(mode, a.duration)
        plains, auditeds, rabbits, sizes = [], [], [], []
        for _ in range(a.repeat):  # interleaved, so drift hits both alike
            trail = tempfile.mkdtemp(prefix="bench-audit-")
            try:
                plains.append(run_on_triomq(_triomq_args([]), w, label="TrioMQ"))
                auditeds.append(run_on_triomq(_triomq_args(["--audit-dir", trail]), w,
                                              label="TrioMQ + audit"))
                sizes.append(sum(os.path.getsize(os.path.join(d, f))
                                 for d, _, fs in os.walk(trail) for f in fs))
                check = _trail_check(trail)
                auditeds[-1]["trail_check"] = check
                print(f"[bench] trail: {check}", flush=True)
            finally:
                shutil.rmtree(trail, ignore_errors=True)
            rabbits.append(run_on_url(RABBIT_URL, w, label="RabbitMQ"))
        rows.append((mode, _median(plains), _median(auditeds), _median(rabbits), max(sizes)))
        for p_, a_, r_ in zip(plains, auditeds, rabbits, strict=True):
            print(f"[bench] {mode}: TrioMQ {p_.get('consume_rate') or 0:,.0f}, audited "
                  f"{a_.get('consume_rate') or 0:,.0f}, RabbitMQ {r_.get('consume_rate') or 0:,.0f}",
                  flush=True)
    print(f"\ncommand: {shlex.join([sys.executable, '-m', 'bench.audit', *sys.argv[1:]])}\n")
    print("| workload | TrioMQ cons/s | TrioMQ + audit cons/s | audit cost | broker CPU % "
          "plain / audited | trail MB | RabbitMQ cons/s | audited ÷ RabbitMQ |")
    print("|---|---|---|---|---|---|---|---|")
    status = 0
    for mode, p, au, r, size in rows:
        pr, ar, rr = (x.get("consume_rate") or 0 for x in (p, au, r))
        cost = 1 - ar / pr if pr else float("nan")
        print(f"| {mode}, confirms + manual acks, 1p/1c, 64 B | {pr:,.0f} | {ar:,.0f} | "
              f"{cost:.1%} | {p.get('broker_cpu_pct', 0) or 0:.0f} / "
              f"{au.get('broker_cpu_pct', 0) or 0:.0f} | {size / 1e6:.1f} | {rr:,.0f} | "
              f"{ar / rr if rr else float('nan'):.2f} |")
        for x in (p, au, r):
            if x.get("errors"):
                status = 1
                print(f"errors ({x.get('label')}): {x['errors']}")
    return status


def _generate(out: str, total: int, node: str = "bench", seed: int = 7) -> dict:
    from broker.audit import events as E
    from broker.audit.writer import RollingWriter
    rnd = random.Random(seed)
    w = RollingWriter(out, node, 64 << 20, 1e9, "deflate", 1)
    t = time.time() - 7200.0
    step = 7200.0 / total
    queues = [f"orders.{r}" for r in ("eu", "us", "apac", "latam")]
    conn = "10.0.0.7:53211"
    seqs = {f"svc-{i}": 0 for i in range(8)}
    batch: list = []
    n = 0
    msg = 0
    counts = {"messages": 0, "unaccounted": 0, "gaps": 0, "duplicates": 0}
    dtag = 0
    while n < total:
        msg += 1
        counts["messages"] += 1
        q = queues[msg & 3]
        producer = f"svc-{msg & 7}"
        seqs[producer] += 1
        if rnd.random() < 0.0001:  # a message lost before the broker: a gap
            seqs[producer] += 1
            counts["gaps"] += 1
        props = {"message_id": f"{producer}-{seqs[producer]}", "app_id": "orders",
                 "delivery_mode": 2,
                 "headers": {"x-producer": producer, "x-seq": seqs[producer],
                             "x-ref-key": f"order-{msg // 3}"}}
        t += step * 4
        r = rnd.random()
        if r < 0.02:
            batch.append((E.PUB, t, "/", "orders", "order.created", msg, props, 512, True,
                          "shop", conn, 1, msg, [], "unroutable"))
            n += 1
            continue
        batch.append((E.PUB, t, "/", "orders", "order.created", msg, props, 512, True, "shop",
                      conn, 1, msg, [q], "routed"))
        dtag += 1
        if r < 0.04:
            batch.append((E.LEFT, t + 0.5, "/", q, msg, "dropped", "maxlen", None))
            n += 2
            continue
        if r < 0.06:
            batch.append((E.LEFT, t + 30, "/", q, msg, "expired", "expired", "dlx"))
            n += 2
            continue
        if r < 0.0601:
            counts["unaccounted"] += 1
            n += 1
            continue
        batch.append((E.DEL, t + 0.002, "/", q, msg, "ctag-1", dtag, False, 1, conn, 2))
        if r < 0.11:  # redelivered once
            batch.append((E.LEFT, t + 0.2, "/", q, msg, "requeued", None, None))
            dtag += 1
            batch.append((E.DEL, t + 0.21, "/", q, msg, "ctag-2", dtag, True, 2, conn, 3))
            n += 2
        if r < 0.14:  # rejected to the DLX, consumed there
            batch.append((E.REJ, t + 0.25, "/", q, msg, "ctag-2", dtag, conn, 3, False,
                          "rejected"))
            batch.append((E.ENQ, t + 0.25, "/", "orders.dlq", msg + 1, props))
            batch.append((E.LEFT, t + 0.25, "/", q, msg, "dead_lettered", "rejected", "dlx"))
            dtag += 1
            batch.append((E.DEL, t + 0.3, "/", "orders.dlq", msg + 1, "ctag-9", dtag, False, 1,
                          conn, 4))
            batch.append((E.ACK, t + 0.31, "/", "orders.dlq", msg + 1, "ctag-9", dtag, conn, 4))
            msg += 1
            n += 7
            continue
        if r < 0.1402 and seqs[producer] > 1:  # a duplicate publish of the same number
            counts["duplicates"] += 1
        batch.append((E.ACK, t + 0.004, "/", q, msg, "ctag-1", dtag, conn, 2))
        n += 3
        if len(batch) >= 20000:
            w.write(batch)
            batch = []
    if batch:
        w.write(batch)
    w.close()
    counts["events"] = w.encoder.seq - 1
    return counts


def cmd_generate(a) -> int:
    t0 = time.monotonic()
    counts = _generate(a.out, a.events)
    dt = time.monotonic() - t0
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(a.out) for f in fs)
    print(f"generated {counts['events']:,} events ({counts['messages']:,} messages) in "
          f"{dt:.1f} s ({counts['events'] / dt:,.0f} events/s), {size / 1e6:.0f} MB; "
          f"unaccounted {counts['unaccounted']}, gaps {counts['gaps']}")
    return 0


def _mix(n: int) -> list:
    """n messages of the confirm+ack workload: published, delivered, acked."""
    from broker.audit import events as E
    out: list = []
    t = time.time()
    props = {"delivery_mode": 1}
    for i in range(n):
        out.append((E.PUB, t, "/", "bench-x", "bench-k", i, props, 64, False, "guest",
                    "127.0.0.1:40000", 1, i, ["bench-q"], "routed"))
        out.append((E.DEL, t, "/", "bench-q", i, "ctag", i, False, 1, "127.0.0.1:40001", 1))
        out.append((E.ACK, t, "/", "bench-q", i, "ctag", i, "127.0.0.1:40001", 1))
    return out


def cmd_codec(a) -> int:
    """Per-event cost of each step: the broker's serialisation, the converter's loading,
    fastavro's writer vs the batch encoder."""
    import gc
    import io
    import pickle

    import fastavro

    from broker.audit import events as E
    from broker.audit.encoder import BatchEncoder
    from broker.audit.spool import dumps as spool_dumps
    from broker.audit.spool import loads as spool_loads
    batch = _mix(a.messages)
    n = len(batch)
    gc.disable()  # as the converter does; the broker's drain runs with it on
    t0 = time.perf_counter()
    pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
    pdumps = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = spool_dumps(batch)
    mdumps = time.perf_counter() - t0
    t0 = time.perf_counter()
    spool_loads(data)
    loads = time.perf_counter() - t0
    schema = fastavro.parse_schema(E.load_schema())
    records = [E.to_record(ev, "n", i) for i, ev in enumerate(batch)]
    t0 = time.perf_counter()
    fastavro.writer(io.BytesIO(), schema, records, codec="null", validator=False)
    fast = time.perf_counter() - t0
    enc = BatchEncoder("n", 1)
    t0 = time.perf_counter()
    enc.encode(batch)
    ours = time.perf_counter() - t0
    gc.enable()
    print(f"{n:,} events (published, delivered, acked per message), µs per event: "
          f"pickle.dumps {pdumps / n * 1e6:.2f}, spool.dumps (marshal) {mdumps / n * 1e6:.2f} "
          f"(broker), spool.loads {loads / n * 1e6:.2f}, fastavro.writer {fast / n * 1e6:.2f} "
          f"(records prepared beforehand), batch encoder {ours / n * 1e6:.2f}")
    return 0


def _hotpath_cpu(messages: int, audit_dir: str | None, persistent: bool) -> float:
    """Broker CPU seconds for ``messages`` confirm+ack round trips through real sessions
    (no sockets: the client side is pre-encoded frames), and the drain's pickling."""
    import gc

    from broker.amqp import spec
    from broker.amqp.codec import method_frame
    from broker.broker import Broker
    from broker.config import AuditSettings, Config
    from tests.support import SessionClient, publish_frames
    data = tempfile.mkdtemp(prefix="bench-hot-")
    try:
        broker = Broker(Config(data_dir=data, audit=AuditSettings(dir=audit_dir)))
        pub = SessionClient(broker, peer="127.0.0.1:40000")
        cons = SessionClient(broker, peer="127.0.0.1:40001")
        pub.open_channel(1)
        cons.open_channel(1)
        pub.ok(1, spec.Confirm.Select(), spec.Confirm.SelectOk)
        pub.declare_queue(1, "hot")
        cons.ok(1, spec.Basic.Qos(prefetch_count=500), spec.Basic.QosOk)
        cons.consume(1, "hot", tag="c1")
        props = {"delivery_mode": 2} if persistent else {}
        frames = publish_frames(1, b"x" * 64, "", "hot", False, props, pub.conn.frame_max)
        batch = 100
        chunk = frames * batch
        trail = broker.audit
        gc.collect()
        t0 = time.process_time()
        acked = 0
        for i in range(messages // batch):
            pub.session.data_received(chunk)
            pub.conn.data_to_send()
            cons.conn.data_to_send()
            acked += batch
            cons.session.data_received(method_frame(1, spec.Basic.Ack(acked, True)))
            if trail is not None and i % 20 == 19:  # the drain task's share: every 2,000
                trail._take_frames()
        return time.process_time() - t0
    finally:
        shutil.rmtree(data, ignore_errors=True)


# per confirmed and acked message with auditing off: route_message (begin_route, published),
# deliver, _settle (per item)
_OFF_CHECKS = 4


def _hooks_off_ns() -> float:
    """ns that the trail's tests cost per message when auditing is off (timeit of the
    exact test on a real channel, times the tests per message)."""
    import timeit

    from broker.broker import Broker
    from broker.config import Config
    from tests.support import SessionClient
    data = tempfile.mkdtemp(prefix="bench-hot-off-")
    try:
        client = SessionClient(Broker(Config(data_dir=data)), peer="127.0.0.1:40002")
        client.open_channel(1)
        ch = client.session.channels[1]
        n = 2_000_000
        test = min(timeit.repeat("if ch.audit is not None: pass", globals={"ch": ch},
                                 number=n, repeat=5))
        empty = min(timeit.repeat("pass", number=n, repeat=5))
        return max(test - empty, 0.0) / n * 1e9 * _OFF_CHECKS
    finally:
        shutil.rmtree(data, ignore_errors=True)


def cmd_hotpath(a) -> int:
    """Broker CPU per message with and without the trail (the part load cannot distort)."""
    trail = tempfile.mkdtemp(prefix="bench-hot-trail-")
    try:
        print("| workload | plain µs/msg | audited µs/msg | cost |")
        print("|---|---|---|---|")
        for persistent in (False, True):
            plain, audited = [], []
            for _ in range(a.repeat):
                plain.append(_hotpath_cpu(a.messages, None, persistent))
                audited.append(_hotpath_cpu(a.messages, trail, persistent))
            # the minimum of interleaved runs: load only ever adds CPU time
            p, q = min(plain), min(audited)
            print(f"| {'persistent (memory store)' if persistent else 'transient'}, confirms + "
                  f"manual acks, 64 B | {p / a.messages * 1e6:.2f} | "
                  f"{q / a.messages * 1e6:.2f} | {q / p - 1:.1%} |", flush=True)
        off_ns, plain_us = _hooks_off_ns(), p / a.messages * 1e6
        print(f"\nauditing off: the hooks are {_OFF_CHECKS} `channel.audit is not None` tests per "
              f"message, {off_ns:.1f} ns together = {off_ns / 1000 / plain_us:.2%} of the "
              f"plain {plain_us:.2f} µs/msg (queue observers: the empty list's truth test, "
              f"there before the trail)")
    finally:
        shutil.rmtree(trail, ignore_errors=True)
    print(f"\ncommand: {shlex.join([sys.executable, '-m', 'bench.audit', *sys.argv[1:]])}")
    return 0


def cmd_jobs(a) -> int:
    from spark.audit.cli import run_job, spark_session
    spark = spark_session(a.master)
    rows = []
    try:
        for job in a.jobs.split(","):
            args = argparse.Namespace(input=a.input, from_us=None, to_us=None, window=60,
                                      grace=60.0, producer_key="auto", message_id=None,
                                      ref_key="order-12345", msg=None, consumer=None)
            out = tempfile.mkdtemp(prefix="bench-audit-jobs-")
            t0 = time.monotonic()
            result, status = run_job(spark, job, args, out)
            dt = time.monotonic() - t0
            shutil.rmtree(out, ignore_errors=True)
            rows.append((job, result["events"], dt, status))
            print(f"[bench] {job}: {result['events']:,} events in {dt:.1f} s "
                  f"({result['events'] / dt:,.0f} events/s), exit status {status}", flush=True)
    finally:
        spark.stop()
    print(f"\ncommand: {shlex.join([sys.executable, '-m', 'bench.audit', *sys.argv[1:]])}\n")
    print("| job | events | seconds (read + job) | events/s |")
    print("|---|---|---|---|")
    for job, n, dt, _ in rows:
        print(f"| {job} | {n:,} | {dt:.1f} | {n / dt:,.0f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.audit")
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--duration", type=float, default=8.0)
    o.add_argument("--modes", default="transient,persistent")
    o.add_argument("--repeat", type=int, default=1, help="interleaved runs; medians reported")
    g = sub.add_parser("generate")
    g.add_argument("--events", type=int, default=10_000_000)
    g.add_argument("--out", required=True)
    j = sub.add_parser("jobs")
    j.add_argument("--input", required=True)
    j.add_argument("--jobs", default="reconcile,sequence,latency,deadletters,track")
    j.add_argument("--master", default=None)
    h = sub.add_parser("hotpath")
    h.add_argument("--messages", type=int, default=100_000)
    h.add_argument("--repeat", type=int, default=3)
    c = sub.add_parser("codec")
    c.add_argument("--messages", type=int, default=20000)
    a = p.parse_args(argv)
    return {"overhead": cmd_overhead, "generate": cmd_generate, "jobs": cmd_jobs,
            "codec": cmd_codec, "hotpath": cmd_hotpath}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
