"""Feature costs (issue 14): consistent-hash routing, publisher deduplication, selectors.

    python -m bench.features                          # every case, 6 s each, + RabbitMQ's direct
    python -m bench.features --only filter --duration 3 --repeat 2
    python -m bench.features --targets triomq --markdown /tmp/features.md --json /tmp/features.json

Each case is the bench's ordinary run (``runner.run_workload``: separate producer and consumer
processes, ``workers.py``'s hot loops, the backlog cap, a TrioMQ started fresh for every run)
with a topology the plain ``--exchange-type`` options cannot express: exchange and queue
arguments, message headers, several queues behind one consumer process, consumer arguments.
Those are plugged in for the duration of one run only (``_FeatureRun``):

* ``runner.build_topology`` / ``runner.setup_topology`` declare the case's exchange, queues
  (with arguments) and bindings;
* the workers' ``rawamqp`` is a thin proxy whose ``encode_publish`` builds each pre-encoded
  message with the case's headers (one template per routing key, cycled in every batch) and
  whose ``Connection.basic_consume`` subscribes the consumer to the case's queue(s) with its
  ``x-filter``. The hot loops are untouched.

Messages: 64 bytes, transient, 1 producer, no-ack consumers, unlimited rate (paced only by the
backlog cap). A baseline and its feature case carry the same messages (same headers), so a
ratio shows the cost of the feature itself:

* ``chash``: direct exchange -> 1 queue vs ``x-consistent-hash`` -> 8 queues (weight 1),
  the producer cycling through 128 routing keys, one consumer process consuming all 8 queues;
* ``dedup``: fanout -> 1 queue vs ``x-message-deduplication`` (x-cache-size 100000, memory),
  vs the same with ``x-cache-persistence: disk`` on a durable exchange (against a durable
  fanout), vs a queue with ``x-message-deduplication``. Every message has its own
  ``x-deduplication-header``: the value is the 8 bytes the producer patches per batch
  (a monotonic timestamp) plus the template's number, so nothing is dropped and the figure
  is the cost of the check. (The timestamp then sits in the header, not the body: no
  latency for these cases.)
* ``filter``: one queue, two consumers; without filters vs consumer 0 with
  ``region = 'eu' AND amount > 10 AND kind IN ('a','b')`` and consumer 1 with its
  complement ``NOT (...)``. Half of the messages match (the other half fails a different
  predicate in turn), so each consumer sees 50 % selectivity, every message is still
  delivered and both runs do the same delivery work: the difference is the selector
  evaluation and the selective dispatch path. (An exclusive subscription queue would drop
  the refused half unsent, i.e. do *less* work than the baseline, and hide the cost.)
"""
from __future__ import annotations

import argparse
import contextlib
import shlex
import statistics
import sys
from typing import Any

import rawamqp as ra

from . import runner, workers
from .cli import RABBIT_URL, add_triomq_args, run_on_triomq, run_on_url, write_json
from .runner import DEFAULTS

KEYS = 128  # message templates per producer batch (distinct routing keys / header values)
STAMP = b"\xfe\xed\xfa\xce\xde\xad\xbe\xef"  # placeholder of the per-batch 8 bytes in a header
DEDUP_HEADER = "x-deduplication-header"
SELECTOR = "region = 'eu' AND amount > 10 AND kind IN ('a','b')"
COMPLEMENT = f"NOT ({SELECTOR})"


# ----------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------

def _keys(prefix: str = "m") -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(KEYS)]


def _selector_headers(i: int) -> dict:
    """Even templates match SELECTOR; odd ones fail one of its three predicates in turn."""
    if i % 2 == 0:
        return {"region": "eu", "amount": 50, "kind": "a"}
    miss = (i // 2) % 3
    return {"region": "us" if miss == 0 else "eu", "amount": 5 if miss == 1 else 50,
            "kind": "c" if miss == 2 else "b"}


def _dedup_headers(i: int) -> dict:
    return {DEDUP_HEADER: STAMP + f"-{i:03d}".encode()}


CASES: list[dict[str, Any]] = [
    # group chash
    dict(id="direct", group="chash", title="direct exchange -> 1 queue (baseline)",
         exchange_type="direct", queues=1, bindings="key", keys=["order-0000"]),
    dict(id="chash", group="chash", baseline="direct",
         title="x-consistent-hash -> 8 queues (weight 1), 128 routing keys, 1 consumer on all 8",
         exchange_type="x-consistent-hash", queues=8, bindings="1", keys=_keys("order-")),
    # group dedup: same messages everywhere (a unique x-deduplication-header each)
    dict(id="fanout", group="dedup", title="fanout -> 1 queue (baseline), header on every message",
         exchange_type="fanout", queues=1, keys=_keys(), headers=_dedup_headers, stamp="header"),
    dict(id="dedup-mem", group="dedup", baseline="fanout",
         title="x-message-deduplication exchange, memory cache (x-cache-size 100000) -> 1 queue",
         exchange_type="x-message-deduplication", queues=1, keys=_keys(), headers=_dedup_headers,
         stamp="header", exchange_args={"x-cache-size": 100_000}),
    dict(id="qdedup", group="dedup", baseline="fanout",
         title="fanout -> 1 queue with x-message-deduplication",
         exchange_type="fanout", queues=1, keys=_keys(), headers=_dedup_headers, stamp="header",
         queue_args={"x-message-deduplication": True}),
    dict(id="fanout-durable", group="dedup",
         title="durable fanout -> durable queue (baseline of the disk cache), transient messages",
         exchange_type="fanout", queues=1, keys=_keys(), headers=_dedup_headers, stamp="header",
         durable=True),
    dict(id="dedup-disk", group="dedup", baseline="fanout-durable",
         title="durable x-message-deduplication, x-cache-persistence: disk -> durable queue",
         exchange_type="x-message-deduplication", queues=1, keys=_keys(), headers=_dedup_headers,
         stamp="header", durable=True,
         exchange_args={"x-cache-size": 100_000, "x-cache-persistence": "disk"}),
    # group filter: two consumers on one queue, half of the messages match SELECTOR
    dict(id="nofilter", group="filter", title="1 queue, 2 consumers without x-filter (baseline)",
         exchange_type="fanout", queues=1, consumers=2, keys=_keys(), headers=_selector_headers),
    dict(id="filter", group="filter", baseline="nofilter",
         title="1 queue, consumer 0 x-filter of 3 predicates, consumer 1 its NOT; 50 % match",
         exchange_type="fanout", queues=1, consumers=2, keys=_keys(), headers=_selector_headers,
         filters=[SELECTOR, COMPLEMENT]),
]
GROUPS = ("chash", "dedup", "filter")
RABBIT_CASE = "direct"  # the one case RabbitMQ can run (none of the three plugins installed)


def case(cid: str) -> dict:
    for c in CASES:
        if c["id"] == cid:
            return c
    raise KeyError(cid)


def build_case_topology(c: dict, run_id: str) -> dict:
    """The topology dict the runner and workers expect, plus this module's extras."""
    nq = c["queues"]
    queues = [f"bench-{run_id}-q{j}" for j in range(nq)]
    exchange = f"bench-{run_id}-x"
    kind = c.get("bindings", "")
    bindings = [(q, exchange, c["keys"][0] if kind == "key" else kind) for q in queues]
    headers = c.get("headers")
    messages = {k: (headers(i) if headers else None) for i, k in enumerate(c["keys"])}
    subs: dict[str, list[tuple[str, dict | None]]] = {}
    filters = c.get("filters") or []
    for i in range(c.get("consumers", 1)):
        args = {"x-filter": filters[i]} if i < len(filters) else None
        if i == 0 and nq > 1 and c.get("consumers", 1) == 1:
            subs[f"bench-c{i}"] = [(q, args) for q in queues]  # one process consumes them all
        else:
            subs[f"bench-c{i}"] = [(queues[i % nq], args)]
    return {"exchange": exchange, "type": c["exchange_type"], "queues": queues,
            "publish_keys": [list(c["keys"])] * nq, "bindings": bindings,
            "durable": bool(c.get("durable")), "exchange_args": c.get("exchange_args"),
            "queue_args": c.get("queue_args"), "messages": messages,
            "stamp_header": c.get("stamp") == "header", "subs": subs}


def setup_case_topology(url: str, cfg: dict, topo: dict, quiet: bool = False) -> None:
    c = ra.Connection(url, timeout=cfg["io_timeout"])
    try:
        c.channel_open(1)
        c.exchange_declare(1, topo["exchange"], topo["type"], durable=topo["durable"],
                           arguments=topo["exchange_args"])
        for q in topo["queues"]:
            c.queue_declare(1, q, durable=topo["durable"], arguments=topo["queue_args"])
            c.queue_purge(1, q)
        for q, x, key in topo["bindings"]:
            c.queue_bind(1, q, x, key)
    finally:
        c.close()


def encode_message(exchange: str, routing_key: str, body: bytes, frame_max: int,
                   headers: dict | None, stamp_header: bool) -> tuple[bytes, int]:
    """basic.publish + content header (delivery-mode 1, ``headers``) + body, as one buffer,
    and the offset of the 8 bytes the producer patches per batch: the body's first 8, or
    with ``stamp_header`` the ``STAMP`` placeholder inside a header value."""
    m = ra.method_frame(1, ra.BASIC_PUBLISH,
                        b"\x00\x00" + ra.shortstr(exchange) + ra.shortstr(routing_key) + b"\x00")
    h = ra.content_header(1, len(body),
                          props=ra.basic_properties(headers=headers or None, delivery_mode=1))
    buf = b"".join([m, h, *ra.body_frames(1, body, frame_max)])
    if stamp_header:
        off = buf.find(STAMP)
        if off < 0 or buf.find(STAMP, off + 1) >= 0:
            raise ValueError("the stamp placeholder must occur once in the message")
        return buf, off
    return buf, len(m) + len(h) + 7


class _WorkersRawAMQP:
    """What ``bench.workers`` sees as ``rawamqp`` during one feature run (inherited by the
    forked workers): the real module, except ``encode_publish`` (the case's headers) and
    ``Connection.basic_consume`` (the case's queues and ``x-filter``)."""

    def __init__(self, topo: dict):
        messages, stamp_header, subs = topo["messages"], topo["stamp_header"], topo["subs"]

        def encode_publish(channel, exchange, routing_key, body, frame_max, delivery_mode=1):
            return encode_message(exchange, routing_key, body, frame_max,
                                  messages.get(routing_key), stamp_header)

        class Connection(ra.Connection):
            def basic_consume(self, ch, queue, tag="", no_ack=False, exclusive=False):
                for j, (q, args) in enumerate(subs.get(tag) or [(queue, None)]):
                    self.rpc(ch, 60, 20, b"\x00\x00" + ra.shortstr(q) + ra.shortstr(f"{tag}-{j}")
                             + ra.bits(False, no_ack, exclusive, False) + ra.table(args),
                             ra.BASIC_CONSUME_OK)
                return tag

        self.encode_publish = encode_publish
        self.Connection = Connection

    def __getattr__(self, name):
        return getattr(ra, name)


def _aggregate_keeping_workers(orig):
    def aggregate(result, results, cfg):
        out = orig(result, results, cfg)
        dur = cfg["duration"]
        out["per_consumer_rate"] = [r.get("received", 0) / dur for r in
                                    sorted((r for r in results if r["role"] == "consumer"),
                                           key=lambda r: r["idx"])]
        return out
    return aggregate


@contextlib.contextmanager
def _feature_run(c: dict):
    """Plug the case's topology, messages and subscriptions into the runner for one run."""
    saved = (runner.build_topology, runner.setup_topology, runner._aggregate, workers.ra)
    topos: list[dict] = []

    def build(cfg, run_id):
        topo = build_case_topology(c, run_id)
        workers.ra = _WorkersRawAMQP(topo)
        topos.append(topo)
        return topo

    runner.build_topology = build
    runner.setup_topology = setup_case_topology
    runner._aggregate = _aggregate_keeping_workers(saved[2])
    try:
        yield topos
    finally:
        runner.build_topology, runner.setup_topology, runner._aggregate, workers.ra = saved


def run_case(c: dict, url: str, cfg: dict, broker_pid: int | None, label: str) -> dict:
    workload = {**cfg, "consumers": c.get("consumers", 1), "queues": c["queues"],
                "queue_durable": bool(c.get("durable")), "exchange_type": c["exchange_type"]}
    with _feature_run(c):
        r = runner.run_workload(url, workload, broker_pid=broker_pid, label=label, quiet=cfg["quiet"])
    if c.get("stamp") == "header":  # the body carries no timestamp: no latency
        r["latency_ms"], r["latency_samples"] = {}, 0
    pub, cons = r.get("publish_rate") or 0, r.get("consume_rate") or 0
    # nothing is dropped in any case: deliveries must keep up with publishes (the backlog cap
    # stalls the producer otherwise, e.g. if deduplication dropped messages)
    if pub and cons < 0.9 * pub:
        r["errors"].append(f"consumed {cons:,.0f}/s of {pub:,.0f}/s published: messages lost?")
    return r


# ----------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------

def _median(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None and not r.get("errors")]
    return statistics.median(vals) if vals else None


def summarize(results: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for cid, runs in results.items():
        c = case(cid) if cid != "rabbit-direct" else {**case(RABBIT_CASE), "id": cid,
                                                      "title": "RabbitMQ: direct exchange -> 1 queue",
                                                      "baseline": None}
        row: dict[str, Any] = {"id": cid, "group": c["group"], "title": c["title"],
                               "runs": len(runs), "errors": sum(bool(r.get("errors")) for r in runs)}
        for key in ("publish_rate", "consume_rate", "broker_cpu_pct"):
            row[key] = _median(runs, key)
        per = [r.get("per_consumer_rate") for r in runs if r.get("per_consumer_rate")]
        row["per_consumer_rate"] = ([statistics.median(p[i] for p in per) for i in range(len(per[0]))]
                                    if per else None)
        base = c.get("baseline")
        if base and base in results:
            # run i of a case follows run i of its baseline: the median of those pairs' ratios
            # is less sensitive to the machine's drifting load than a ratio of medians
            for key in ("publish_rate", "consume_rate"):
                pairs = [r[key] / b[key] for r, b in zip(runs, results[base], strict=False)
                         if r.get(key) is not None and b.get(key) and not r.get("errors")
                         and not b.get("errors")]
                name = key.split("_")[0] + "_ratio"
                row[name] = statistics.median(pairs) if pairs else None
                row[name + "s"] = pairs
        rows.append(row)
    return rows


TARGETS = {"chash": 0.9, "dedup-mem": 0.9, "filter": 0.8}


def markdown(rows: list[dict], cmdline: str, cfg: dict, repeat: int) -> str:
    f = lambda v: "n/a" if v is None else f"{v:,.0f}"  # noqa: E731
    out = ["| case | what | published msg/s | delivered msg/s | per consumer msg/s "
           "| broker CPU % | ratio (delivered) | target |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        per = " / ".join(f(v) for v in r["per_consumer_rate"]) if r.get("per_consumer_rate") \
            and len(r["per_consumer_rate"]) > 1 else ""
        ratio = r.get("consume_ratio")
        pairs = r.get("consume_ratios") or []
        spread = f" ({min(pairs):.2f}-{max(pairs):.2f})" if len(pairs) > 1 else ""
        tgt = TARGETS.get(r["id"])
        verdict = "" if tgt is None or ratio is None else (
            f"≥ {tgt:.1f}: {'met' if ratio >= tgt else 'MISSED'}")
        cpu = "n/a" if r.get("broker_cpu_pct") is None else f"{r['broker_cpu_pct']:.0f}"
        out.append(f"| {r['id']} | {r['title']} | {f(r['publish_rate'])} | {f(r['consume_rate'])} "
                   f"| {per} | {cpu} | {'' if ratio is None else f'{ratio:.2f}{spread}'} | {verdict}"
                   + (" ⚠ errors" if r["errors"] else "") + " |")
    out += ["", f"{cfg['duration']:g} s measured after {cfg['warmup']:g} s warm-up, "
            f"median of {repeat} run(s) per case, a fresh TrioMQ per run; 64-byte transient "
            "messages, 1 producer, no-ack consumers. Ratio = delivered msg/s ÷ its baseline's: "
            "the median over the repetitions of (run i ÷ baseline run i), in brackets the "
            "lowest and highest of them.",
            "", f"Command: `{cmdline}`"]
    return "\n".join(out)


# ----------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------

def select_cases(only: str) -> list[dict]:
    want = [w.strip() for w in only.split(",") if w.strip()]
    if not want:
        return list(CASES)
    ids = {c["id"] for c in CASES}
    unknown = [w for w in want if w not in ids and w not in GROUPS]
    if unknown:
        raise ValueError(f"unknown case(s) {unknown}: groups {list(GROUPS)}, cases {sorted(ids)}")
    sel = [c for c in CASES if c["id"] in want or c["group"] in want]
    for c in list(sel):  # a feature case needs its baseline
        b = c.get("baseline")
        if b and all(s["id"] != b for s in sel):
            sel.insert(sel.index(c), case(b))
    return sel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.features", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=6.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--repeat", type=int, default=1, help="runs per case (the table shows medians)")
    p.add_argument("--only", default="", help=f"groups {','.join(GROUPS)} and/or case ids")
    p.add_argument("--targets", default="triomq,rabbitmq",
                   help="triomq and/or rabbitmq (RabbitMQ runs the direct baseline only)")
    p.add_argument("--rabbit-url", default=RABBIT_URL)
    p.add_argument("--max-backlog", type=int, default=DEFAULTS["max_backlog"])
    p.add_argument("--quiet", action="store_true", help="less progress output")
    p.add_argument("--markdown", help="also write the table to this file")
    p.add_argument("--json", help="write every run's full result as JSON")
    add_triomq_args(p)
    a = p.parse_args(argv)
    cmdline = shlex.join([sys.executable, "-m", "bench.features", *(sys.argv[1:] if argv is None
                                                                    else argv)])
    print(f"[bench] command: {cmdline}", flush=True)
    targets = {t.strip() for t in a.targets.split(",") if t.strip()}
    sel = select_cases(a.only)
    cfg = {**DEFAULTS, "duration": a.duration, "warmup": a.warmup, "max_backlog": a.max_backlog,
           "quiet": a.quiet}
    results: dict[str, list[dict]] = {}
    for rep in range(a.repeat):
        for c in sel if "triomq" in targets else []:
            label = f"TrioMQ {c['id']}" + (f" #{rep + 1}" if a.repeat > 1 else "")
            print(f"\n[bench] ===== {label}: {c['title']} =====", flush=True)
            r = run_on_triomq(a, cfg, label=label,
                              job=lambda url, pid, c=c, label=label: run_case(c, url, cfg, pid, label))
            _print_run(r)
            results.setdefault(c["id"], []).append(r)
        if "rabbitmq" in targets and any(c["group"] == "chash" for c in sel):
            label = "RabbitMQ direct" + (f" #{rep + 1}" if a.repeat > 1 else "")
            print(f"\n[bench] ===== {label} =====", flush=True)
            r = run_on_url(a.rabbit_url, cfg, label, job=lambda url, pid, label=label:
                           run_case(case(RABBIT_CASE), url, cfg, pid, label))
            _print_run(r)
            results.setdefault("rabbit-direct", []).append(r)
    rows = summarize(results)
    md = markdown(rows, cmdline, cfg, a.repeat)
    print("\n" + md, flush=True)
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write(md + "\n")
        print(f"[bench] wrote {a.markdown}")
    write_json(a.json, {"command": cmdline, "summary": rows, "runs": results})
    return 1 if any(r.get("errors") for runs in results.values() for r in runs) else 0


def _print_run(r: dict) -> None:
    per = r.get("per_consumer_rate") or []
    cpu = r.get("broker_cpu_pct")
    print(f"[bench] {r.get('label')}: published {r.get('publish_rate') or 0:,.0f}/s, delivered "
          f"{r.get('consume_rate') or 0:,.0f}/s"
          + (f" ({' / '.join(f'{v:,.0f}' for v in per)} per consumer)" if len(per) > 1 else "")
          + ("" if cpu is None else f", broker CPU {cpu:.0f} %")
          + f", producer CPU {r.get('producer_cpu_pct')} %, consumer CPU {r.get('consumer_cpu_pct')} %",
          flush=True)
    for e in r.get("errors") or []:
        print(f"[bench]   ERROR: {e}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

