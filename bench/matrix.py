"""`python -m bench matrix`: every scenario on TrioMQ (started fresh for each row) and on
RabbitMQ in one run; a markdown table and JSON with the TrioMQ÷RabbitMQ ratio of every
figure, and a PNG chart of throughput and p99 latency."""
from __future__ import annotations

import json
import os
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field

from . import entities
from .runner import DEFAULTS
from .scenarios import SCENARIOS

KiB, MiB = 1024, 1024 * 1024
FULL_SIZES = {"connections": 10_000, "queues": 100_000, "consumers": 1_000}
# the default keeps the whole matrix near 10 minutes; --full-scale runs the sizes
DEFAULT_SIZES = {"connections": 1_000, "queues": 10_000, "consumers": 1_000}


@dataclass
class Metric:
    name: str
    key: str          # dotted path into the result dict
    kind: str         # "rate" (higher is better), "ms", "mb", "kb", "ratio" (lower is better)
    scale: float = 1.0


@dataclass
class Row:
    id: str
    title: str
    metrics: list[Metric]
    workload: dict = field(default_factory=dict)
    job: str = ""     # "" = a bench workload; else the name of a function in bench.entities
    size: int = 0     # entity count for job rows

    @property
    def throughput(self) -> Metric | None:
        return next((m for m in self.metrics if m.kind == "rate"), None)

    @property
    def p99(self) -> Metric | None:
        """Every workload row measures latency (shown in the chart even when not in the table)."""
        return None if self.job else P99


PUB = Metric("publish msg/s", "publish_rate", "rate")
CONS = Metric("consume msg/s", "consume_rate", "rate")
P50 = Metric("latency p50 ms", "latency_ms.p50", "ms")
P99 = Metric("latency p99 ms", "latency_ms.p99", "ms")
PEAK = Metric("broker peak RSS MB", "broker_rss_peak_mb", "mb")


def _large(size, ack):
    big = size >= MiB
    over = dict(size=size, max_backlog=100 if big else 1000, publish_batch=2 if big else 8)
    if ack:
        over.update(confirms=True, manual_ack=True, confirm_window=16 if big else 64,
                    prefetch=20 if big else 100)
    return over


def build_rows(topic_bindings: int = 100_000, sizes: dict | None = None) -> list[Row]:
    sizes = {**DEFAULT_SIZES, **(sizes or {})}
    rows = []
    for sid, title, over in SCENARIOS:
        if sid.rstrip("ab") not in ("1", "2", "3", "4"):
            continue
        over = dict(over)
        if sid == "4b":
            over["bindings"] = topic_bindings
            title = f"topic exchange, {topic_bindings:,} bindings, no-ack, 1p/1c, 64 B"
        rows.append(Row(sid, title, [PUB, CONS, P50, P99, PEAK], over))
    rows.append(Row("sat", "saturation: 2p/2c, confirms + manual acks, 64 B, unlimited rate",
                    [Metric("confirmed msg/s", "confirm_rate", "rate"), CONS, P50, P99, PEAK],
                    dict(size=64, producers=2, consumers=2, confirms=True, manual_ack=True)))
    for size, tag, label in ((64 * KiB, "64k", "64 KiB"), (MiB, "1m", "1 MiB")):
        for ack in (True, False):
            mode = "confirms + manual acks" if ack else "no-ack"
            rows.append(Row(f"large-{tag}-{'ack' if ack else 'noack'}",
                            f"large messages {label}, {mode}, 1p/1c",
                            [CONS, Metric("consume MB/s", "consume_rate", "rate", size / 1e6), P50, PEAK],
                            _large(size, ack)))
    for nq in (10, 100):
        rows.append(Row(f"fanout-{nq}", f"fan-out: 1 publisher, fanout exchange, {nq} queues, "
                        f"{nq} consumers, no-ack, 64 B",
                        [Metric("deliveries/s", "consume_rate", "rate"), PUB, PEAK],
                        dict(size=64, exchange_type="fanout", queues=nq, consumers=nq)))
    rows.append(Row("topic-10k", "topic exchange, 10,000 bindings `region.service.level` with "
                    "`*`/`#`, 64 mixed keys, no-ack, 1p/1c",
                    [CONS, P99, PEAK], dict(size=64, exchange_type="topic-mix", bindings=10_000)))
    entity_rows = (
        ("conns", "connections", "idle_connections",
         "{n:,} idle connections, 1 channel + 1 consumer each (at most 80 % of the broker's "
         "open-files limit)",
         [Metric("connections opened/s", "open_rate", "rate"),
          Metric("connections held", "connections", "count"),
          Metric("RSS KB per connection", "rss_per_conn_kb", "kb")]),
        ("queues", "queues", "many_queues", "{n:,} queues declared (then deleted)",
         [Metric("queue.declare/s", "declare_rate", "rate"),
          Metric("queue.delete/s", "delete_rate", "rate"),
          Metric("RSS KB per queue", "rss_per_queue_kb", "kb")]),
        ("consumers", "consumers", "many_consumers",
         "{n:,} consumers on one queue, prefetch 1, manual acks",
         [CONS, Metric("deliveries max/min per consumer", "fairness_max_min", "ratio"),
          Metric("consumers with 0 deliveries", "idle_consumers", "count")]),
    )
    for rid, size_key, job, title, metrics in entity_rows:
        n = sizes[size_key]
        rows.append(Row(rid, title.format(n=n), metrics, job=job, size=n))
    return rows


def select_rows(rows: list[Row], only: str = "", skip: str = "") -> list[Row]:
    """`only`/`skip`: comma lists of row ids or prefixes: `4` = 4a+4b, `large` = every
    large-* row, `large-1m` = both 1 MiB rows, `fanout`, ..."""
    def matches(row, tok):
        return row.id == tok or row.id.startswith(tok + "-") or (tok.isdigit() and
                                                                 row.id.rstrip("ab") == tok)

    def parse(s):
        toks = [t.strip() for t in s.split(",") if t.strip()]
        bad = [t for t in toks if not any(matches(r, t) for r in rows)]
        if bad:
            raise ValueError(f"unknown row(s) {', '.join(bad)}; rows: {', '.join(r.id for r in rows)}")
        return toks

    want, drop = parse(only), parse(skip)
    return [r for r in rows if (not want or any(matches(r, t) for t in want))
            and not any(matches(r, t) for t in drop)]


# ----------------------------------------------------------------------------
# values, table, JSON, chart
# ----------------------------------------------------------------------------

def value(result: dict | None, m: Metric):
    v = result
    for part in m.key.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return None if v is None else v * m.scale


def ratio(a, b):
    return None if a is None or not b else a / b


def fmt(v, kind: str) -> str:
    if v is None:
        return "n/a"
    if kind == "rate":
        return f"{v:,.0f}" if v >= 100 else f"{v:,.1f}"
    if kind == "ms":
        return f"{v:.2f}" if v < 100 else f"{v:,.0f}"
    if kind == "count":
        return f"{v:,.0f}"
    if kind == "ratio":
        return f"{v:.2f}"
    return f"{v:,.1f}"


def table_rows(rows: list[Row], results: dict) -> list[dict]:
    """One dict per (row, metric): the values of both brokers and their ratio."""
    out = []
    for row in rows:
        t, r = results.get(row.id, (None, None))
        for m in row.metrics:
            vt, vr = value(t, m), value(r, m)
            out.append({"row": row.id, "title": row.title, "metric": m.name, "kind": m.kind,
                        "triomq": vt, "rabbitmq": vr, "ratio": ratio(vt, vr),
                        "errors": bool((t or {}).get("errors") or (r or {}).get("errors"))})
    return out


def markdown(rows: list[Row], results: dict, cmdline: str, duration: float) -> str:
    out = ["| row | scenario | metric | TrioMQ | RabbitMQ | TrioMQ÷RabbitMQ |",
           "|---|---|---|---|---|---|"]
    last = None
    for tr in table_rows(rows, results):
        title = tr["title"] if tr["row"] != last else ""
        last = tr["row"]
        warn = " ⚠" if tr["errors"] and title else ""
        ratio_s = "n/a" if tr["ratio"] is None else f"{tr['ratio']:.2f}"
        out.append(f"| {tr['row']} | {title}{warn} | {tr['metric']} | {fmt(tr['triomq'], tr['kind'])} "
                   f"| {fmt(tr['rabbitmq'], tr['kind'])} | {ratio_s} |")
    out += ["", f"{duration:g} s measured per workload row after the warm-up. For rates a ratio above 1 "
            "means TrioMQ is faster; for latency, RSS and max/min a ratio below 1 means TrioMQ is better. "
            "Latency is measured at the consumer from a CLOCK_MONOTONIC timestamp in the body. Peak RSS "
            "is the largest VmRSS sampled every 0.25 s during the window (RabbitMQ: beam.smp). "
            "⚠ = a run reported errors (see the JSON).", "", f"Command: `{cmdline}`"]
    return "\n".join(out)


def chart(rows: list[Row], results: dict, path: str, title: str = "TrioMQ vs RabbitMQ") -> str | None:
    """Grouped bars per row: throughput (log scale) and p99 latency; returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for label, pick in (("throughput (per s, log)", lambda r: r.throughput),
                        ("latency p99 (ms, log)", lambda r: r.p99)):
        ids, tq, rb = [], [], []
        for row in rows:
            m = pick(row)
            if m is None:
                continue
            t, r = results.get(row.id, (None, None))
            vt, vr = value(t, m), value(r, m)
            if vt is None and vr is None:
                continue
            ids.append(row.id)
            tq.append(vt or 0)
            rb.append(vr or 0)
        if ids:
            panels.append((label, ids, tq, rb))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8, 0.7 * len(rows) + 3), 4.2 * len(panels)),
                             squeeze=False)
    for ax, (label, ids, tq, rb) in zip(axes[:, 0], panels, strict=True):
        xs = range(len(ids))
        ax.bar([x - 0.2 for x in xs], tq, 0.4, label="TrioMQ", color="#3b7dd8")
        ax.bar([x + 0.2 for x in xs], rb, 0.4, label="RabbitMQ", color="#f28e2b")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(ids, rotation=30, ha="right")
        if any(v > 0 for v in tq + rb):
            ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(rows, results, cmdline, duration, md_path, json_path=None, png_path=None):
    """Write the markdown table, the JSON (default: next to the markdown) and the chart."""
    base = os.path.splitext(md_path)[0]
    json_path, png_path = json_path or base + ".json", png_path or base + ".png"
    md = markdown(rows, results, cmdline, duration)
    with open(md_path, "w") as f:
        f.write(md + f"\n\n![TrioMQ vs RabbitMQ]({os.path.basename(png_path)})\n")
    payload = {"command": cmdline, "duration": duration, "table": table_rows(rows, results),
               "rows": [{"id": r.id, "title": r.title, "triomq": results.get(r.id, (None, None))[0],
                         "rabbitmq": results.get(r.id, (None, None))[1]} for r in rows]}
    with open(json_path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
    written = chart(rows, results, png_path)
    return md, json_path, written


# ----------------------------------------------------------------------------
# command
# ----------------------------------------------------------------------------

def add_args(p):
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per workload row")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--only", default="", help="comma list of rows or prefixes (e.g. 1,4,large,fanout-10)")
    p.add_argument("--skip", default="", help="comma list of rows or prefixes to leave out")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--rabbit-url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--topic-bindings", type=int, default=100_000, help="binding count of row 4b")
    p.add_argument("--scale-factor", type=float, default=1.0,
                   help="multiplies the entity counts (default 1,000 connections, 10,000 queues, "
                        "1,000 consumers; connections are capped by the file-descriptor limit)")
    p.add_argument("--full-scale", action="store_true",
                   help="the issue's full sizes: 10,000 connections, 100,000 queues, 1,000 consumers")
    p.add_argument("--connections", type=int, help="idle connections (overrides the scale)")
    p.add_argument("--declare-queues", type=int, help="queues declared (overrides the scale)")
    p.add_argument("--queue-consumers", type=int, help="consumers on one queue (overrides the scale)")
    p.add_argument("--markdown", default=os.path.join(tempfile.gettempdir(), "triomq-bench-matrix.md"),
                   help="markdown table; the JSON and PNG are written next to it (same name)")
    p.add_argument("--json", help="JSON path (default: the markdown's, .json)")


def entity_sizes(a, fd_limit: int) -> tuple[dict, list[str]]:
    base = FULL_SIZES if a.full_scale else DEFAULT_SIZES
    sizes = {k: max(1, round(v * a.scale_factor)) for k, v in base.items()}
    for k, opt in (("connections", a.connections), ("queues", a.declare_queues),
                   ("consumers", a.queue_consumers)):
        if opt:
            sizes[k] = opt
    notes = []
    cap = fd_limit - 512   # this process holds one socket per connection, so does the broker
    if sizes["connections"] > cap:
        notes.append(f"idle connections capped at {cap:,} by the file-descriptor limit {fd_limit:,} "
                     f"(asked for {sizes['connections']:,})")
        sizes["connections"] = max(1, cap)
    return sizes, notes


def _job(row: Row, duration: float, warmup: float):
    fn = getattr(entities, row.job)
    if row.job == "many_consumers":
        return lambda url, pid: fn(url, row.size, duration, warmup)
    return lambda url, pid: fn(url, row.size, pid)


def _guarded(job):
    def run(url, pid):
        try:
            r = job(url, pid)
        except Exception as e:
            return {"errors": [f"{type(e).__name__}: {e}"], "traceback": traceback.format_exc()}
        r.setdefault("errors", [])
        return r
    return run


def cmd_matrix(a):
    from .cli import command_line, run_on_triomq, run_on_url

    def _interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)   # clean up (TrioMQ, RabbitMQ names) on kill too
    fd_limit = entities.raise_fd_limit()
    sizes, notes = entity_sizes(a, fd_limit)
    rows = select_rows(build_rows(a.topic_bindings, sizes), a.only, a.skip)
    if a.list:
        for r in rows:
            print(f"{r.id:<16} {r.title}")
        return 0
    cmdline = command_line()
    print(f"[bench] command: {cmdline}")
    for n in notes:
        print(f"[bench] NOTE: {n}")
    print(f"[bench] {len(rows)} rows: {', '.join(r.id for r in rows)}", flush=True)
    results: dict = {}
    t_start = time.monotonic()
    status = 0
    try:
        for row in rows:
            print(f"\n[bench] ===== {row.id}: {row.title} =====", flush=True)
            workload = {**DEFAULTS, **row.workload, "duration": a.duration, "warmup": a.warmup}
            job = _guarded(_job(row, a.duration, a.warmup)) if row.job else None
            t = run_on_triomq(a, workload, label=f"TrioMQ {row.id}", job=job)
            results[row.id] = (t, None)
            time.sleep(1.0)
            r = run_on_url(a.rabbit_url, workload, label=f"RabbitMQ {row.id}", job=job)
            results[row.id] = (t, r)
            for lab, res in (("TrioMQ", t), ("RabbitMQ", r)):
                for e in (res or {}).get("errors") or []:
                    print(f"[bench] {lab} {row.id} ERROR: {e}")
            for tr in table_rows([row], results):
                ratio_s = "n/a" if tr["ratio"] is None else f"{tr['ratio']:.2f}"
                print(f"  {tr['metric']:<34} {fmt(tr['triomq'], tr['kind']):>12} "
                      f"{fmt(tr['rabbitmq'], tr['kind']):>12} {ratio_s:>8}", flush=True)
    except KeyboardInterrupt:
        print("\n[bench] interrupted: writing the rows measured so far")
        rows = [r for r in rows if r.id in results]
        status = 130
    md, json_path, png = write_outputs(rows, results, cmdline, a.duration, a.markdown, a.json)
    print("\n" + md)
    print(f"\n[bench] {len(rows)} rows in {time.monotonic() - t_start:.0f}s; wrote {a.markdown}, "
          f"{json_path}" + (f", {png}" if png else ""))
    if not status and any((res or {}).get("errors") for pair in results.values() for res in pair):
        status = 1
    return status

