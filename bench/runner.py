"""Run one workload against one broker: set up the topology, fork producer and
consumer processes, synchronise their start, collect and aggregate results,
tear everything down."""
from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import time
from array import array

import rawamqp as ra

from . import procinfo
from .workers import CTL_ABORT, CTL_T0, consumer_main, producer_main

DEFAULTS = dict(
    producers=1, consumers=1, size=64, persistent=False, confirms=False,
    confirm_window=256, manual_ack=False, prefetch=500, ack_every=1, ack_multiple=True,
    rate=0, duration=10.0, warmup=1.0, exchange_type="direct", bindings=1, queues=1,
    queue_durable=False, publish_batch=128, max_backlog=10_000, io_timeout=30.0,
    drain_timeout=2.0,
)

WORKLOAD_KEYS = list(DEFAULTS)


def _log(msg, quiet=False):
    if not quiet:
        print(f"[bench] {msg}", flush=True)


def build_topology(cfg: dict, run_id: str) -> dict:
    et = cfg["exchange_type"]
    nq = max(1, cfg["queues"])
    queues = [f"bench-{run_id}-q{j}" for j in range(nq)]
    if et == "default":
        return {"exchange": "", "queues": queues, "publish_keys": queues, "bindings": []}
    exchange = f"bench-{run_id}-{et}"
    nb = max(cfg["bindings"], nq)
    if et == "topic":
        # distinct patterns; publishing "bench.k{j}.x" matches only "bench.k{j}.*"
        bindings = [(queues[i % nq], exchange, f"bench.k{i}.*") for i in range(nb)]
        keys = [f"bench.k{j}.x" for j in range(nq)]
    elif et == "direct":
        bindings = [(queues[i % nq], exchange, f"bench.k{i}") for i in range(nb)]
        keys = [f"bench.k{j}" for j in range(nq)]
    elif et == "topic-mix":
        bindings, keys = topic_mix(cfg["bindings"], exchange, queues)
        return {"exchange": exchange, "type": "topic", "queues": queues, "publish_keys": keys,
                "bindings": bindings}
    elif et == "fanout":
        bindings = [(q, exchange, "") for q in queues]
        keys = ["" for _ in queues]
    else:
        raise ValueError(f"unknown exchange type {et}")
    return {"exchange": exchange, "type": et, "queues": queues, "publish_keys": keys,
            "bindings": bindings}


TOPIC_LEVELS = ("dbg", "inf", "wrn", "err", "ftl")


def topic_mix(n: int, exchange: str, queues: list[str], keys_per_queue: int = 64, seed: int = 13):
    """A realistic topic workload: `n` distinct patterns over keys `rNN.sNNN.lvl` (region,
    service, level): 60 % exact keys, 30 % with one `*`, 10 % with `#`, plus `#.lvl` for every
    level so that every key is routed. Patterns go round-robin to the queues; each queue gets
    `keys_per_queue` equally long publish keys, so with one queue every publish is one delivery."""
    import random

    rnd = random.Random(seed)
    regions, services = [f"r{i:02d}" for i in range(50)], [f"s{i:03d}" for i in range(200)]
    patterns = [f"#.{lv}" for lv in TOPIC_LEVELS][:n]
    seen = set(patterns)
    shapes = ["{r}.{s}.{v}"] * 6 + ["{r}.{s}.*", "{r}.*.{v}", "*.{s}.{v}", "{r}.#"]
    while len(patterns) < n:
        pat = rnd.choice(shapes).format(r=rnd.choice(regions), s=rnd.choice(services),
                                        v=rnd.choice(TOPIC_LEVELS))
        if pat not in seen:
            seen.add(pat)
            patterns.append(pat)
    bindings = [(queues[i % len(queues)], exchange, pat) for i, pat in enumerate(patterns)]
    keys = [[f"{rnd.choice(regions)}.{rnd.choice(services)}.{rnd.choice(TOPIC_LEVELS)}"
             for _ in range(keys_per_queue)] for _ in queues]
    return bindings, keys


def setup_topology(url, cfg, topo, quiet=False):
    c = ra.Connection(url, timeout=cfg["io_timeout"])
    try:
        c.channel_open(1)
        if topo["exchange"]:
            c.exchange_declare(1, topo["exchange"], topo["type"], durable=cfg["queue_durable"])
        for q in topo["queues"]:
            c.queue_declare(1, q, durable=cfg["queue_durable"])
            c.queue_purge(1, q)
        if topo["bindings"]:
            t = time.monotonic()
            n = len(topo["bindings"])
            c.queue_bind_many(1, topo["bindings"], timeout=max(120.0, n / 500),
                              progress=None if quiet or n < 20000 else
                              (lambda d: _log(f"  bound {d}/{n}")))
            dt = time.monotonic() - t
            if n > 1:
                _log(f"created {n} bindings in {dt:.1f}s ({n / max(dt, 1e-9):,.0f}/s)", quiet)
            topo["bind_seconds"] = dt
    finally:
        c.close()


def teardown_topology(url, cfg, topo, quiet=False):
    try:
        c = ra.Connection(url, timeout=30.0)
    except Exception as e:
        _log(f"WARNING: cleanup could not connect: {e}", quiet)
        return
    try:
        c.channel_open(1)
        for q in topo["queues"]:
            try:
                c.queue_delete(1, q, timeout=60.0)
            except ra.ChannelClosed as e:
                _log(f"WARNING: queue.delete {q}: {e}", quiet)
                c.channel_open(1)
        if topo["exchange"]:
            try:
                c.exchange_delete(1, topo["exchange"])
            except ra.ChannelClosed as e:
                _log(f"WARNING: exchange.delete: {e}", quiet)
    except Exception as e:
        _log(f"WARNING: cleanup failed: {e}", quiet)
    finally:
        c.close()


def percentiles(values_ns: array, ps=(50, 95, 99, 99.9)):
    if not values_ns:
        return {f"p{p}": None for p in ps} | {"max": None, "mean": None}
    s = sorted(values_ns)
    n = len(s)
    out = {}
    for p in ps:
        k = min(n - 1, max(0, round(p / 100 * n + 0.5) - 1))
        out[f"p{p}"] = s[k] / 1e6
    out["max"] = s[-1] / 1e6
    out["mean"] = sum(s) / n / 1e6
    return out


def run_workload(url: str, cfg: dict, broker_pid: int | None = None, label: str = "",
                 quiet: bool = False) -> dict:
    cfg = {**DEFAULTS, **cfg, "url": url}
    run_id = f"{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    topo = build_topology(cfg, run_id)
    _log(f"{label} setup: exchange={topo['exchange'] or '(default)'} "
         f"queues={len(topo['queues'])} bindings={len(topo['bindings'])}", quiet)
    ctx = mp.get_context("fork")
    ctl = ctx.RawArray("d", 2)
    pub_counts = ctx.RawArray("q", max(1, cfg["producers"]))
    cons_counts = ctx.RawArray("q", max(1, cfg["consumers"]))
    start_evt = ctx.Event()
    resq = ctx.Queue()
    procs = []
    result = {"label": label, "url": url, "config": {k: cfg[k] for k in WORKLOAD_KEYS},
              "errors": []}
    results: list = []
    try:
        setup_topology(url, cfg, topo, quiet)
        result["bind_seconds"] = topo.get("bind_seconds")
        for i in range(cfg["consumers"]):
            procs.append(ctx.Process(target=consumer_main, name=f"bench-consumer-{i}",
                                     args=(i, cfg, topo, ctl, start_evt, resq, pub_counts, cons_counts),
                                     daemon=True))
        for i in range(cfg["producers"]):
            procs.append(ctx.Process(target=producer_main, name=f"bench-producer-{i}",
                                     args=(i, cfg, topo, ctl, start_evt, resq, pub_counts, cons_counts),
                                     daemon=True))
        for p in procs:
            p.start()
        ready = 0
        deadline = time.monotonic() + 60
        while ready < len(procs):
            try:
                msg = resq.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError("workers did not become ready within 60s") from None
                dead = [p.name for p in procs if not p.is_alive()]
                if dead and resq.empty():
                    raise RuntimeError(f"worker(s) died during setup: {dead}") from None
                continue
            if msg[0] == "ready":
                ready += 1
            else:
                results.append(msg[1])
                raise RuntimeError(msg[1].get("error") or "worker ended during setup")

        t0 = time.monotonic() + 0.2
        ctl[CTL_T0] = t0
        start_evt.set()
        warm = t0 + cfg["warmup"]
        t_end = warm + cfg["duration"]
        _log(f"{label} running {cfg['warmup']:g}s warm-up + {cfg['duration']:g}s measurement ...", quiet)
        cpu0 = None
        time.sleep(max(0.0, warm - time.monotonic()))
        if broker_pid:
            cpu0 = procinfo.cpu_seconds(broker_pid)
        peak_kb = 0
        # watch progress / early worker death; sample the broker's RSS for its peak in the window
        while time.monotonic() < t_end:
            time.sleep(min(0.25, max(0.0, t_end - time.monotonic())))
            if broker_pid:
                peak_kb = max(peak_kb, procinfo.rss_kb(broker_pid) or 0)
            try:
                while True:
                    m = resq.get_nowait()
                    if m[0] == "result":
                        results.append(m[1])
            except queue_mod.Empty:
                pass
            if any(r.get("error") for r in results):
                break
        if broker_pid:
            cpu1 = procinfo.cpu_seconds(broker_pid)
            result["broker_cpu_pct"] = (100.0 * (cpu1 - cpu0) / cfg["duration"]
                                        if cpu0 is not None and cpu1 is not None else None)
            result["broker_rss_mb"] = (procinfo.rss_kb(broker_pid) or 0) / 1024 or None
            result["broker_hwm_mb"] = (procinfo.rss_kb(broker_pid, "VmHWM") or 0) / 1024 or None
            result["broker_rss_peak_mb"] = max(peak_kb / 1024, result["broker_rss_mb"] or 0) or None
            result["broker_pid"] = broker_pid
        # collect
        deadline = time.monotonic() + cfg["drain_timeout"] + cfg["io_timeout"] + 10
        while len(results) < len(procs) and time.monotonic() < deadline:
            try:
                m = resq.get(timeout=0.5)
            except queue_mod.Empty:
                if all(not p.is_alive() for p in procs) and resq.empty():
                    break
                continue
            if m[0] == "result":
                results.append(m[1])
        if len(results) < len(procs):
            result["errors"].append(f"only {len(results)}/{len(procs)} workers reported")
    except Exception as e:
        result["errors"].append(f"{type(e).__name__}: {e}")
        ctl[CTL_ABORT] = 1
        start_evt.set()
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
        teardown_topology(url, cfg, topo, quiet)

    return _aggregate(result, results, cfg)


def _aggregate(result, results, cfg):
    dur = cfg["duration"]
    prods = [r for r in results if r["role"] == "producer"]
    cons = [r for r in results if r["role"] == "consumer"]
    for r in results:
        if r.get("error"):
            result["errors"].append(r["error"])
            result.setdefault("tracebacks", []).append(r.get("traceback"))
            if os.environ.get("BENCH_DEBUG"):
                print(r.get("traceback"), flush=True)
    sent = sum(r.get("sent", 0) for r in prods)
    confirmed = sum(r.get("confirmed", 0) for r in prods)
    received = sum(r.get("received", 0) for r in cons)
    lat = array("q")
    for r in cons:
        if r.get("lat"):
            lat.frombytes(r["lat"])
    result.update(
        publish_rate=sent / dur,
        confirm_rate=(confirmed / dur) if cfg["confirms"] else None,
        consume_rate=received / dur,
        sent=sent, confirmed=confirmed if cfg["confirms"] else None, received=received,
        nacked=sum(r.get("nacked", 0) for r in prods) if cfg["confirms"] else None,
        unconfirmed=sum(r.get("unconfirmed", 0) for r in prods) if cfg["confirms"] else None,
        latency_ms=percentiles(lat), latency_samples=len(lat),
        producer_cpu_pct=[round(100 * r["cpu"] / dur, 1) for r in prods if "cpu" in r],
        consumer_cpu_pct=[round(100 * r["cpu"] / dur, 1) for r in cons if "cpu" in r],
    )
    return result
