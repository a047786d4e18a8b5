"""Command line: `python -m bench run|compare|scenarios ...`."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from urllib.parse import urlparse

from . import procinfo
from .runner import DEFAULTS, run_workload

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/"


# ----------------------------------------------------------------------------
# options
# ----------------------------------------------------------------------------

def add_workload_args(p: argparse.ArgumentParser, duration_default=DEFAULTS["duration"]):
    g = p.add_argument_group("workload")
    g.add_argument("--producers", type=int, default=DEFAULTS["producers"], help="producer processes")
    g.add_argument("--consumers", type=int, default=DEFAULTS["consumers"], help="consumer processes")
    g.add_argument("--size", type=int, default=DEFAULTS["size"], help="message body bytes (>=8 for latency)")
    g.add_argument("--persistent", action="store_true", help="delivery-mode 2")
    g.add_argument("--confirms", action="store_true", help="publisher confirms (confirm.select)")
    g.add_argument("--confirm-window", type=int, default=DEFAULTS["confirm_window"],
                   help="max unconfirmed messages per producer")
    g.add_argument("--manual-ack", action="store_true", help="consume with manual acks (default no-ack)")
    g.add_argument("--prefetch", type=int, default=DEFAULTS["prefetch"],
                   help="basic.qos prefetch-count for manual-ack consumers (0 = unlimited)")
    g.add_argument("--ack-every", type=int, default=DEFAULTS["ack_every"],
                   help="send an ack once at least N deliveries are unacked, checked after each "
                        "read chunk (1 = one ack per chunk); clamped to prefetch/2")
    g.add_argument("--no-ack-multiple", dest="ack_multiple", action="store_false",
                   help="ack every delivery individually instead of multiple=true")
    g.add_argument("--rate", type=float, default=DEFAULTS["rate"],
                   help="total publish rate msg/s across producers (0 = unlimited)")
    g.add_argument("--duration", type=float, default=duration_default, help="measured seconds")
    g.add_argument("--warmup", type=float, default=DEFAULTS["warmup"], help="unmeasured seconds first")
    g.add_argument("--exchange-type", choices=["direct", "topic", "topic-mix", "fanout", "default"],
                   default=DEFAULTS["exchange_type"])
    g.add_argument("--bindings", type=int, default=DEFAULTS["bindings"],
                   help="number of distinct bindings (direct: bench.k{i}; topic: bench.k{i}.*); "
                        "the routing key matches exactly one")
    g.add_argument("--queues", type=int, default=DEFAULTS["queues"],
                   help="queues (producer/consumer i uses queue i %% N; bindings spread over them)")
    g.add_argument("--queue-durable", action="store_true", help="durable queue (and exchange)")
    g.add_argument("--publish-batch", type=int, default=DEFAULTS["publish_batch"],
                   help="messages written per send() call when unthrottled")
    g.add_argument("--max-backlog", type=int, default=DEFAULTS["max_backlog"],
                   help="producers pause while published-consumed exceeds this (0 = never)")
    g.add_argument("--io-timeout", type=float, default=DEFAULTS["io_timeout"],
                   help="socket timeout for broker I/O")
    g.add_argument("--drain-timeout", type=float, default=DEFAULTS["drain_timeout"],
                   help="seconds producers wait for outstanding confirms after the run")


def workload_from_args(a) -> dict:
    return {k: getattr(a, k) for k in DEFAULTS}


def add_triomq_args(p):
    g = p.add_argument_group("TrioMQ started by the bench")
    g.add_argument("--store", default=None, help="passed to `python -m broker run --store`")
    g.add_argument("--broker-python", default=sys.executable,
                   help="interpreter for `-m broker` (default: this one)")
    g.add_argument("--broker-arg", action="append", default=[],
                   help="extra argument for the broker command line (repeatable)")
    g.add_argument("--startup-timeout", type=float, default=30.0)
    g.add_argument("--broker-module", default="broker",
                   help="module run as `python -m MODULE run --host --port --data-dir` (default broker)")


# ----------------------------------------------------------------------------
# formatting
# ----------------------------------------------------------------------------

def _num(v, fmt="{:,.0f}"):
    return "n/a" if v is None else fmt.format(v)


def _ms(v):
    return "n/a" if v is None else (f"{v:.2f}" if v < 100 else f"{v:,.0f}")


def metrics(r: dict) -> list[tuple[str, object, str]]:
    """(name, value, kind) rows; kind decides formatting and ratio meaning."""
    if r is None:
        return []
    lat = r.get("latency_ms") or {}
    rows = [
        ("publish msg/s", r.get("publish_rate"), "rate"),
        ("confirmed msg/s", r.get("confirm_rate"), "rate"),
        ("consume msg/s", r.get("consume_rate"), "rate"),
        ("latency p50 ms", lat.get("p50"), "ms"),
        ("latency p95 ms", lat.get("p95"), "ms"),
        ("latency p99 ms", lat.get("p99"), "ms"),
        ("latency max ms", lat.get("max"), "ms"),
        ("broker RSS MB", r.get("broker_rss_mb"), "mb"),
        ("broker peak RSS MB", r.get("broker_hwm_mb"), "mb"),
        ("broker sampled peak RSS MB", r.get("broker_rss_peak_mb"), "mb"),
        ("broker CPU %", r.get("broker_cpu_pct"), "pct"),
        ("producer CPU % (max)", max(r["producer_cpu_pct"]) if r.get("producer_cpu_pct") else None, "pct"),
        ("consumer CPU % (max)", max(r["consumer_cpu_pct"]) if r.get("consumer_cpu_pct") else None, "pct"),
    ]
    if r.get("bind_seconds") and r["config"]["bindings"] > 1:
        rows.append(("binding setup s", r["bind_seconds"], "s"))
    return rows


def _fmt(v, kind):
    if v is None:
        return "n/a"
    if kind == "rate":
        return f"{v:,.0f}"
    if kind == "ms":
        return _ms(v)
    if kind in ("mb", "pct", "s"):
        return f"{v:,.1f}"
    return str(v)


def print_single(r: dict):
    rows = metrics(r)
    w = max(len(n) for n, _, _ in rows)
    print(f"\n== {r['label'] or r['url']} ==")
    for name, v, kind in rows:
        print(f"  {name:<{w}}  {_fmt(v, kind):>12}")
    _print_problems(r)


def _print_problems(r):
    if r is None:
        return
    for e in r.get("errors") or []:
        print(f"  ERROR: {e}")
    if r.get("nacked"):
        print(f"  WARNING: {r['nacked']} publishes were nacked")
    if r.get("unconfirmed"):
        print(f"  NOTE: {r['unconfirmed']} publishes still unconfirmed after the drain timeout")
    pc = r.get("producer_cpu_pct") or []
    if pc and max(pc) > 90 and not r["config"]["rate"]:
        print("  NOTE: a producer process was >90% CPU: the load generator may be the bottleneck;"
              " try --producers 2")


def print_compare(a: dict | None, b: dict | None, la="TrioMQ", lb="RabbitMQ"):
    ra_, rb = dict((n, (v, k)) for n, v, k in metrics(a)), dict((n, (v, k)) for n, v, k in metrics(b))
    names = [n for n, _, _ in metrics(a or b)] if (a or b) else []
    for n in (ra_ if a else rb):
        if n not in names:
            names.append(n)
    for n in rb:
        if n not in names:
            names.append(n)
    w = max([len(n) for n in names] + [6])
    print(f"\n{'metric':<{w}}  {la:>12}  {lb:>12}  {la + '/' + lb:>16}")
    print("-" * (w + 48))
    for n in names:
        va, kind = ra_.get(n, (None, None))
        vb, kind2 = rb.get(n, (None, kind))
        kind = kind or kind2
        if va is None and vb is None:
            continue
        ratio = f"{va / vb:.2f}x" if (va is not None and vb) else "n/a"
        print(f"{n:<{w}}  {_fmt(va, kind):>12}  {_fmt(vb, kind):>12}  {ratio:>16}")
    for lab, r in ((la, a), (lb, b)):
        if r and (r.get("errors") or r.get("nacked") or r.get("unconfirmed")):
            print(f"[{lab}]")
            _print_problems(r)


def command_line() -> str:
    return shlex.join([sys.executable, "-m", "bench", *sys.argv[1:]])


def write_json(path, payload):
    if not path:
        return
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
    print(f"[bench] wrote {path}")


def _port_of(url):
    return urlparse(url).port or 5672


# ----------------------------------------------------------------------------
# targets
# ----------------------------------------------------------------------------

def run_on_triomq(a, workload, label="TrioMQ", quiet=False, job=None):
    """Start TrioMQ, run `workload` on it (or `job(url, pid) -> result dict`), stop it."""
    b = procinfo.TrioMQProcess(python=a.broker_python, store=a.store, extra_args=a.broker_arg,
                               startup_timeout=a.startup_timeout, module=a.broker_module)
    print(f"[bench] starting TrioMQ: {' '.join(shlex.quote(x) for x in b.cmd)}", flush=True)
    try:
        b.start()
    except Exception as e:
        b.stop()
        print(f"[bench] ERROR: {e}", flush=True)
        return {"label": label, "url": b.url, "config": workload, "errors": [str(e)],
                "broker_cmd": b.cmd}
    try:
        r = (job(b.url, b.pid) if job else
             run_workload(b.url, workload, broker_pid=b.pid, label=label, quiet=quiet))
        r["broker_cmd"] = b.cmd
        if b.proc.poll() is not None:
            r["errors"].append(f"TrioMQ exited with {b.proc.returncode}; log tail:\n{b.log_tail()}")
        elif r["errors"]:
            tail = b.log_tail(15)
            if tail:
                r["broker_log_tail"] = tail
                print(f"[bench] TrioMQ log tail:\n{tail}")
        return r
    finally:
        b.stop()


def run_on_url(url, workload, label, measure_pid=True, quiet=False, job=None):
    """Run `workload` (or `job(url, pid) -> result dict`) on a running broker."""
    pid = None
    host = urlparse(url).hostname
    if measure_pid and host in ("127.0.0.1", "localhost", "::1"):
        pid = procinfo.pid_listening_on(_port_of(url))
    r = job(url, pid) if job else run_workload(url, workload, broker_pid=pid, label=label, quiet=quiet)
    # VmHWM of a long-running broker we did not start says nothing about this run
    r.pop("broker_hwm_mb", None)
    return r


# ----------------------------------------------------------------------------
# sub-commands
# ----------------------------------------------------------------------------

def cmd_run(a):
    workload = workload_from_args(a)
    cmdline = command_line()
    print(f"[bench] command: {cmdline}")
    if a.start_triomq:
        r = run_on_triomq(a, workload)
    else:
        r = run_on_url(a.url, workload, label=a.url, measure_pid=not a.no_broker_stats)
    print_single(r)
    print(f"\ncommand: {cmdline}")
    write_json(a.json, {"command": cmdline, "result": r})
    return 1 if r.get("errors") else 0


def cmd_compare(a):
    workload = workload_from_args(a)
    cmdline = command_line()
    print(f"[bench] command: {cmdline}")
    t = run_on_triomq(a, workload)
    time.sleep(1.0)
    r = run_on_url(a.rabbit_url, workload, label="RabbitMQ", measure_pid=not a.no_broker_stats)
    print_compare(t, r)
    print(f"\ncommand: {cmdline}")
    write_json(a.json, {"command": cmdline, "triomq": t, "rabbitmq": r})
    return 1 if (t.get("errors") or r.get("errors")) else 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench",
                                description="AMQP 0-9-1 load generator for TrioMQ vs RabbitMQ")
    sub = p.add_subparsers(dest="cmd", required=True)

    pr = sub.add_parser("run", help="run one workload against one broker")
    tg = pr.add_mutually_exclusive_group()
    tg.add_argument("--url", default=RABBIT_URL, help=f"existing broker (default {RABBIT_URL})")
    tg.add_argument("--start-triomq", action="store_true", help="start TrioMQ on a free port")
    pr.add_argument("--no-broker-stats", action="store_true",
                    help="do not look up the broker process by port for RSS/CPU")
    add_workload_args(pr)
    add_triomq_args(pr)
    pr.add_argument("--json", help="write results as JSON")
    pr.set_defaults(func=cmd_run)

    pc = sub.add_parser("compare", help="same workload on TrioMQ (started here) then RabbitMQ")
    pc.add_argument("--rabbit-url", default=RABBIT_URL)
    pc.add_argument("--no-broker-stats", action="store_true")
    add_workload_args(pc)
    add_triomq_args(pc)
    pc.add_argument("--json", help="write results as JSON")
    pc.set_defaults(func=cmd_compare)

    from . import scenarios
    ps = sub.add_parser("scenarios", help="predefined scenarios, markdown table")
    scenarios.add_args(ps)
    add_triomq_args(ps)
    ps.set_defaults(func=scenarios.cmd_scenarios)

    from . import matrix
    pm = sub.add_parser("matrix", help="every scenario on TrioMQ and RabbitMQ: table, JSON, chart")
    matrix.add_args(pm)
    add_triomq_args(pm)
    pm.set_defaults(func=matrix.cmd_matrix)

    a = p.parse_args(argv)
    if getattr(a, "size", 64) < 8:
        print("[bench] NOTE: --size < 8: no room for the timestamp, latency not measured")
    try:
        return a.func(a)
    except KeyboardInterrupt:
        print("\n[bench] interrupted")
        return 130
