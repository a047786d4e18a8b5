"""Where the broker's CPU time per message goes, by phase (parse, route, enqueue, deliver,
write, confirm, ...), sampled with py-spy while a `bench run` workload runs.

    python -m bench.phases [--seconds 6] [--rate 200] -- --confirms --manual-ack

starts TrioMQ on a free port, starts `python -m bench run` against it with the arguments
after ``--``, samples the broker's main thread with ``py-spy record --format raw`` (Python
stacks, idle samples dropped) once the warm-up is over, and prints a markdown table: each
phase's share of the samples and its microseconds per message, from the broker's CPU time per
message that `bench run` measured. Sampling at 200 Hz costs the broker under 1 % (py-spy reads
the process from outside).

A sample goes to the phase of the *innermost* frame that names one (``RULES``, scanned from
the leaf up), so a delivery made while enqueueing counts as delivery and the properties
decoded while reading a frame count as parse. Native code (the kernel's recv/send) is
attributed to the Python frame that called it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter

from .procinfo import TrioMQProcess

# (phase, function-name pattern) -- the name as py-spy prints it, before " (file:line)"
RULES: list[tuple[str, re.Pattern]] = [(phase, re.compile(pattern)) for phase, pattern in [
    ("write: frames out to the socket", r"^(ConnectionHandler\._writer|send_buffers|"
                                        r"ServerConnection\.buffers_to_send)$"),
    ("confirm: basic.ack to publishers", r"^(Channel\.confirm_decided|Session\.flush_confirms|"
                                         r"Session\.confirms_pending|Channel\.flush_confirms)$"),
    ("ack: consumers' basic.ack settled", r"^(Channel\.on_basic_ack|Channel\._settle|"
                                          r"Queue\.ack|Queue\.settled)$"),
    ("deliver: consumer chosen, deliver frames", r"^(Queue\.dispatch|Channel\.deliver|"
                                                 r"ServerConnection\.deliver|deliver_frames)$"),
    ("enqueue: queue state", r"^Queue\.enqueue$"),
    ("route: exchange, bindings", r"^(VirtualHost\.route|Publishing\.publish|"
                                  r"\w*Exchange\.route)$"),
    ("publish: checks, hooks, message object", r"^(Channel\.on_publish|Channel\.publish)$"),
    ("parse: frames in, method dispatch", r"^(ServerConnection\.receive_data|"
                                          r"Session\.data_received|Session\._handle_events|"
                                          r"Channel\.handle)$"),
    ("read: socket recv", r"^ConnectionHandler\._reader$"),
    ("trio: scheduler, epoll", r"^(unrolled_run|EpollIOManager\.\w+|run)$"),
]]
OTHER = "other"
ORDER = [*(phase for phase, _ in reversed(RULES)), OTHER]
_FRAME = re.compile(r"^(.*?) \((.*):(\d+)\)$")


def classify(stack: str) -> str | None:
    """The phase of one folded stack (root first, ';'-separated); None for another thread."""
    frames = stack.split(";")
    names = []
    for f in frames:
        m = _FRAME.match(f)
        names.append(m.group(1) if m else f)
    if any(n.startswith("Thread.") or n == "WorkerThread._work" for n in names[:6]):
        return None  # trio's thread cache / other threads, not the event loop
    for name in reversed(names):
        for phase, pattern in RULES:
            if pattern.match(name):
                return phase
    return OTHER


def tally(raw_path: str) -> Counter:
    counts: Counter = Counter()
    with open(raw_path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            phase = classify(stack)
            if phase is not None:
                counts[phase] += int(n)
    return counts


def _bench_json(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    return data["result"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m bench.phases", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=int, default=6, help="sampled seconds (after warm-up)")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--json", help="write the table as JSON")
    p.add_argument("--raw", help="keep py-spy's folded stacks in this file")
    args = p.parse_args(argv)
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if spy is None:
        p.error("py-spy not found: pip install -e '.[bench]'")
    tmp = tempfile.mkdtemp(prefix="triomq-phases-")
    raw, out = os.path.join(tmp, "stacks.txt"), os.path.join(tmp, "bench.json")
    warmup = 1.0
    duration = args.seconds + 2.0
    try:
        with TrioMQProcess(quiet=True) as broker:
            load = subprocess.Popen(
                [sys.executable, "-m", "bench", "run", "--url", broker.url, "--duration",
                 str(duration), "--warmup", str(warmup), "--json", out, *extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(warmup + 1.5)  # connections set up, warm-up over
            subprocess.run([spy, "record", "--format", "raw", "-r", str(args.rate), "-d",
                            str(args.seconds), "-o", raw, "--pid", str(broker.pid)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if load.wait(duration + 60) != 0:
                print("bench run failed", file=sys.stderr)
                return 1
        counts = tally(raw)
        result = _bench_json(out)
        if args.raw:
            shutil.copy(raw, args.raw)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rate = result.get("consume_rate") or result.get("publish_rate") or 0.0
    cpu = result.get("broker_cpu_pct")
    total = sum(counts.values()) or 1
    us_per_msg = (cpu / 100.0 / rate * 1e6) if cpu and rate else None
    rows = []
    for phase in ORDER:
        share = counts.get(phase, 0) / total
        rows.append({"phase": phase, "share": share,
                     "us_per_msg": share * us_per_msg if us_per_msg else None})
    print(f"workload: bench run {' '.join(extra)}; {rate:,.0f} msg/s consumed, broker CPU "
          f"{cpu} %, {us_per_msg:.2f} µs CPU per message; {total} samples" if us_per_msg else
          f"workload: bench run {' '.join(extra)}; {total} samples")
    print()
    print("| phase | share of the event loop's samples | µs per message |")
    print("|---|---:|---:|")
    for r in rows:
        us = f"{r['us_per_msg']:.2f}" if r["us_per_msg"] is not None else "n/a"
        print(f"| {r['phase']} | {r['share'] * 100:.1f} % | {us} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": extra, "rate": rate, "broker_cpu_percent": cpu,
                       "us_per_msg": us_per_msg, "samples": total, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
