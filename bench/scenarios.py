"""Predefined scenarios (`python -m bench scenarios`)."""
from __future__ import annotations

import time

from .runner import DEFAULTS

# id, title, workload overrides
SCENARIOS = [
    ("1", "transient, no-ack, 1p/1c, 64 B, unlimited rate",
     dict(size=64)),
    ("2", "confirms + manual acks, 1p/1c, 64 B, unlimited rate",
     dict(size=64, confirms=True, manual_ack=True)),
    ("3", "latency at fixed 1,000 msg/s, confirms + manual acks, 1p/1c, 64 B",
     dict(size=64, confirms=True, manual_ack=True, rate=1000)),
    ("4a", "topic exchange, 10 bindings, no-ack, 1p/1c, 64 B",
     dict(size=64, exchange_type="topic", bindings=10)),
    ("4b", "topic exchange, 100,000 bindings, no-ack, 1p/1c, 64 B",
     dict(size=64, exchange_type="topic", bindings=100_000)),
    ("5", "persistent 64 B, durable queue, confirms + manual acks, 1p/1c",
     dict(size=64, persistent=True, queue_durable=True, confirms=True, manual_ack=True)),
    # Overload: producers are not paced by the bench (no backlog cap), only by the broker's
    # confirms and flow control (docs/performance.md "Flow control").
    ("6a", "overload: confirms + manual acks, 2p/2c, 64 B, unlimited rate, no backlog cap",
     dict(size=64, producers=2, consumers=2, confirms=True, manual_ack=True, max_backlog=0)),
    ("6b", "overload as 6a, consumers' prefetch 50",
     dict(size=64, producers=2, consumers=2, confirms=True, manual_ack=True, max_backlog=0,
          prefetch=50)),
]


def add_args(p):
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per scenario")
    p.add_argument("--warmup", type=float, default=DEFAULTS["warmup"])
    p.add_argument("--targets", default="triomq,rabbitmq",
                   help="comma list of triomq,rabbitmq")
    p.add_argument("--only", default="", help="comma list of scenario ids, e.g. 1,3,4 (4 = 4a+4b)")
    p.add_argument("--rabbit-url", default="amqp://guest:guest@127.0.0.1:5672/")
    p.add_argument("--topic-bindings", type=int, default=100_000,
                   help="binding count of scenario 4b")
    p.add_argument("--json", help="write all results as JSON")
    p.add_argument("--markdown", help="also write the markdown table to this file")


def _cell_rate(r, key):
    if not r or r.get(key) is None:
        return "failed" if r and r.get("errors") else "n/a"
    v = f"{r[key]:,.0f}"
    return v + (" ⚠" if r.get("errors") else "")


def _cell_lat(r):
    lat = (r or {}).get("latency_ms") or {}
    if lat.get("p50") is None:
        return "n/a"
    f = lambda v: f"{v:.2f}" if v < 100 else f"{v:,.0f}"  # noqa: E731
    return f"{f(lat['p50'])} / {f(lat['p95'])} / {f(lat['p99'])}"


def _ratio(a, b, key):
    if not a or not b or a.get(key) is None or not b.get(key):
        return "n/a"
    return f"{a[key] / b[key]:.2f}"


def markdown(rows, targets, duration, cmdline) -> str:
    tq, rb = "triomq" in targets, "rabbitmq" in targets
    hdr = ["#", "scenario"]
    if tq:
        hdr += ["TrioMQ pub/s", "TrioMQ cons/s", "TrioMQ p50/p95/p99 ms", "TrioMQ RSS MB"]
    if rb:
        hdr += ["RabbitMQ pub/s", "RabbitMQ cons/s", "RabbitMQ p50/p95/p99 ms"]
    if tq and rb:
        hdr += ["cons/s TrioMQ÷RabbitMQ"]
    out = ["| " + " | ".join(hdr) + " |", "|" + "|".join("---" for _ in hdr) + "|"]
    res = {}
    for sid, title, t, r in rows:
        res[sid] = (t, r)
        cells = [sid, title]
        if tq:
            rss = (t or {}).get("broker_rss_mb")
            cells += [_cell_rate(t, "publish_rate"), _cell_rate(t, "consume_rate"), _cell_lat(t),
                      "n/a" if rss is None else f"{rss:,.0f}"]
        if rb:
            cells += [_cell_rate(r, "publish_rate"), _cell_rate(r, "consume_rate"), _cell_lat(r)]
        if tq and rb:
            cells += [_ratio(t, r, "consume_rate")]
        out.append("| " + " | ".join(cells) + " |")
    if "4a" in res and "4b" in res:
        parts = []
        for i, name in ((0, "TrioMQ"), (1, "RabbitMQ")):
            a, b = res["4a"][i], res["4b"][i]
            if a and b and a.get("consume_rate") and b.get("consume_rate") is not None:
                parts.append(f"{name} {b['consume_rate'] / a['consume_rate']:.2f}")
        if parts:
            out.append("")
            out.append("Scenario 4 — consume throughput with many bindings ÷ with 10 bindings: "
                       + ", ".join(parts) + ".")
    out.append("")
    out.append(f"{duration:g} s measured per run after warm-up; pub/s = messages written "
               "(with confirms, see JSON for confirmed/s); latency measured at the consumer from a "
               "CLOCK_MONOTONIC timestamp in the body; RSS = TrioMQ VmRSS at the end of the run. "
               "⚠ = the run reported errors.")
    out.append("")
    out.append(f"Command: `{cmdline}`")
    return "\n".join(out)


def cmd_scenarios(a):
    from .cli import command_line, print_compare, run_on_triomq, run_on_url, write_json

    cmdline = command_line()
    print(f"[bench] command: {cmdline}")
    targets = [t.strip().lower() for t in a.targets.split(",") if t.strip()]
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    sel = []
    for sid, title, over in SCENARIOS:
        if only and sid not in only and sid.rstrip("ab") not in only:
            continue
        over = dict(over)
        if sid == "4b":
            over["bindings"] = a.topic_bindings
            title = f"topic exchange, {a.topic_bindings:,} bindings, no-ack, 1p/1c, 64 B"
        sel.append((sid, title, over))
    rows = []
    for sid, title, over in sel:
        workload = {**DEFAULTS, **over, "duration": a.duration, "warmup": a.warmup}
        print(f"\n[bench] ===== scenario {sid}: {title} =====", flush=True)
        t = r = None
        if "triomq" in targets:
            t = run_on_triomq(a, workload, label=f"TrioMQ #{sid}")
            time.sleep(1.0)
        if "rabbitmq" in targets:
            r = run_on_url(a.rabbit_url, workload, label=f"RabbitMQ #{sid}")
        print_compare(t, r)
        rows.append((sid, title, t, r))
    md = markdown(rows, targets, a.duration, cmdline)
    print("\n" + md)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md + "\n")
        print(f"[bench] wrote {a.markdown}")
    write_json(a.json, {"command": cmdline, "scenarios": [
        {"id": sid, "title": title, "triomq": t, "rabbitmq": r} for sid, title, t, r in rows]})
    return 0
