"""Management API figures (docs/performance-management.md).

    python -m bench.management                  # both figures, TrioMQ and RabbitMQ
    python -m bench.management --figure list --queues 10000
    python -m bench.management --figure dashboard --duration 20

``list``: N queues declared over AMQP in a fresh vhost, then ``GET /api/queues/{vhost}?page=1
&page_size=100`` timed (median and max of ``--requests`` calls after one warm-up call) on
each broker. RabbitMQ's stats database lists new queues a few seconds after they are
declared: the bench waits until its ``total_count`` reaches N.

``dashboard``: the bench's confirm+ack workload (1 producer with publisher confirms, 1
consumer with manual acks, 64 B, direct exchange) on the same broker process, alone and with
a dashboard polling what the web console polls (overview, queues page 1, connections,
channels, exchanges) every ``--poll`` seconds, ``--repeat`` alternating pairs; the ratio of
the means is the cost. The time the broker took to answer one poll round is printed too:
divided by the poll interval it bounds the cost independently of the machine's noise.
Temporary vhosts on RabbitMQ are named ``bench-mgmt-<id>`` and deleted after.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from urllib.parse import quote

import httpx

import rawamqp as ra

from . import procinfo
from .entities import _declare_frame, _pipeline
from .runner import run_workload

RABBIT_HTTP = "http://127.0.0.1:15672"
RABBIT_AMQP = "127.0.0.1:5672"
WORKLOAD = dict(confirms=True, manual_ack=True, size=64, producers=1, consumers=1)
DASHBOARD = ["/api/overview", "/api/queues?page=1&page_size=100", "/api/connections",
             "/api/channels", "/api/exchanges"]


def _declare_many(amqp: str, vhost: str, n: int, prefix: str) -> float:
    c = ra.Connection(f"amqp://guest:guest@{amqp}/{quote(vhost, safe='')}", timeout=120.0)
    try:
        c.channel_open(1)
        t = time.monotonic()
        _pipeline(c, 1, [_declare_frame(f"{prefix}-{i:05d}") for i in range(n)],
                  ra.QUEUE_DECLARE_OK)
        return time.monotonic() - t
    finally:
        c.close()


def list_figure(http: str, amqp: str, n: int, requests: int, label: str) -> dict:
    vhost = f"bench-mgmt-{uuid.uuid4().hex[:8]}"
    api = httpx.Client(base_url=http, auth=("guest", "guest"), timeout=120)
    api.put(f"/api/vhosts/{vhost}", json={}).raise_for_status()
    api.put(f"/api/permissions/{vhost}/guest", json={"configure": ".*", "write": ".*",
                                                     "read": ".*"})
    try:
        declare_s = _declare_many(amqp, vhost, n, "q")
        path = f"/api/queues/{quote(vhost, safe='')}?page=1&page_size=100"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # RabbitMQ's stats arrive later than the queues
            if api.get(path).json().get("total_count") == n:
                break
            time.sleep(1.0)
        times = []
        for i in range(requests + 1):
            t = time.perf_counter()
            r = api.get(path)
            dt = time.perf_counter() - t
            r.raise_for_status()
            assert len(r.json()["items"]) == 100
            if i:  # the first call warms caches up
                times.append(dt)
        out = {"broker": label, "queues": n, "declare_s": round(declare_s, 2),
               "median_s": statistics.median(times), "max_s": max(times), "requests": requests}
        print(f"[bench] {label}: /api/queues page 1 of {n}: median {out['median_s'] * 1000:.0f} ms, "
              f"max {out['max_s'] * 1000:.0f} ms", flush=True)
        return out
    finally:
        api.delete(f"/api/vhosts/{vhost}")
        api.close()


def _poller(http: str, interval: float, stop: threading.Event, counts: list) -> None:
    """counts: [requests, seconds spent waiting for answers]"""
    with httpx.Client(base_url=http, auth=("guest", "guest"), timeout=30) as api:
        while not stop.is_set():
            for path in DASHBOARD:
                t = time.perf_counter()
                api.get(path).raise_for_status()
                counts[1] += time.perf_counter() - t
                counts[0] += 1
            stop.wait(interval)


def idle_round_figure(http: str, rounds: int, label: str) -> dict:
    """What one dashboard poll round costs the broker when nothing else runs: the time its
    answers take (server work plus loopback round trips) — divided by the poll interval, an
    upper bound of the share of the broker's loop a dashboard takes."""
    with httpx.Client(base_url=http, auth=("guest", "guest"), timeout=30) as api:
        for path in DASHBOARD:
            api.get(path).raise_for_status()
        times = []
        for _ in range(rounds):
            t = time.perf_counter()
            for path in DASHBOARD:
                api.get(path).raise_for_status()
            times.append(time.perf_counter() - t)
    out = {"broker": label, "round_ms": 1000 * statistics.median(times), "rounds": rounds}
    print(f"[bench] {label}: one idle poll round ({len(DASHBOARD)} requests) takes "
          f"{out['round_ms']:.1f} ms (median of {rounds}): {out['round_ms'] / 50:.2f} % of a "
          f"5 s interval", flush=True)
    return out


def dashboard_figure(http: str, amqp_url: str, pid, duration: float, poll: float,
                     label: str, repeat: int) -> dict:
    """Alone and polled runs alternate (A B B A ...), so drift from other load on the
    machine falls on both; the ratio is of the means."""
    workload = dict(WORKLOAD, duration=duration)
    rates: dict[str, list[float]] = {"alone": [], "polled": []}
    counts = [0, 0.0]
    for i in range(repeat):
        for kind in (("alone", "polled") if i % 2 == 0 else ("polled", "alone")):
            stop = threading.Event()
            t = threading.Thread(target=_poller, args=(http, poll, stop, counts), daemon=True)
            if kind == "polled":
                t.start()
            try:
                r = run_workload(amqp_url, workload, broker_pid=pid, label=label, quiet=True)
            finally:
                stop.set()
                if kind == "polled":
                    t.join(30)
            rates[kind].append(r["confirm_rate"])
    alone, polled = statistics.mean(rates["alone"]), statistics.mean(rates["polled"])
    out = {"broker": label, "alone": alone, "polled": polled, "ratio": polled / alone,
           "runs": rates, "requests": counts[0],
           "answer_ms_per_round": 1000 * counts[1] / max(1, counts[0]) * len(DASHBOARD)}
    print(f"[bench] {label}: confirm+ack alone {alone:,.0f} msg/s, with a dashboard every "
          f"{poll:g} s {polled:,.0f} msg/s (ratio {out['ratio']:.3f}; runs {rates}; "
          f"{counts[0]} requests, {out['answer_ms_per_round']:.1f} ms of answers per poll "
          f"round)", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.management",
                                description=__doc__.split("\n")[0])
    p.add_argument("--figure", choices=("list", "dashboard", "idle-round", "both"),
                   default="both")
    p.add_argument("--targets", default="triomq,rabbitmq")
    p.add_argument("--queues", type=int, default=10_000)
    p.add_argument("--requests", type=int, default=5)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--poll", type=float, default=5.0)
    p.add_argument("--repeat", type=int, default=2, help="alone/polled pairs (alternating)")
    a = p.parse_args(argv)
    print(f"[bench] command: {sys.executable} -m bench.management {' '.join(argv or sys.argv[1:])}")
    results = []
    if "triomq" in a.targets:
        http_port = procinfo.free_port()
        b = procinfo.TrioMQProcess(store="memory", extra_args=["--http-port", str(http_port)])
        b.start()
        try:
            http = f"http://127.0.0.1:{http_port}"
            if a.figure in ("list", "both"):
                results.append(list_figure(http, f"127.0.0.1:{b.port}", a.queues, a.requests,
                                           "TrioMQ"))
            if a.figure in ("idle-round", "both"):
                results.append(idle_round_figure(http, 20, "TrioMQ"))
            if a.figure in ("dashboard", "both"):
                results.append(dashboard_figure(http, b.url, b.pid, a.duration, a.poll, "TrioMQ",
                                                a.repeat))
        finally:
            b.stop()
    if "rabbitmq" in a.targets:
        if a.figure in ("list", "both"):
            results.append(list_figure(RABBIT_HTTP, RABBIT_AMQP, a.queues, a.requests,
                                       "RabbitMQ"))
        if a.figure in ("idle-round", "both"):
            results.append(idle_round_figure(RABBIT_HTTP, 20, "RabbitMQ"))
        if a.figure in ("dashboard", "both"):
            results.append(dashboard_figure(RABBIT_HTTP, f"amqp://guest:guest@{RABBIT_AMQP}/",
                                            None, a.duration, a.poll, "RabbitMQ", a.repeat))
    for r in results:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
