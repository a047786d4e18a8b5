"""Field-table codec micro-benchmark: decode/encode of typical publish properties
(what the basic.publish/deliver paths run per message) and of deep tables.

    .venv/bin/python -m bench.field_codec [--module broker.amqp.fields] [--seconds 1]

Prints one markdown row per case: operations per second, best of 5 rounds. Pass
``--module`` a copy of an older fields.py (importable name) to compare versions.
"""
from __future__ import annotations

import argparse
import importlib
import time


def cases(f):
    celery_like = {
        "lang": "py", "task": "proj.tasks.add", "id": "6f1c6b2e-4a1e-4d2b-9f0e-3d2c1b0a9f8e",
        "shadow": None, "eta": None, "expires": None, "group": None, "group_index": None,
        "retries": 0, "timelimit": [None, None], "root_id": "6f1c6b2e", "parent_id": None,
        "argsrepr": "(2, 2)", "kwargsrepr": "{}", "origin": "gen1234@host",
        "ignore_result": False,
    }
    small = {"x-trace": "abc", "n": 42}
    deep: object = {}
    for _ in range(18_000):
        deep = {"k": deep}
    props_small = {"content_type": "application/json", "delivery_mode": 2, "headers": small}
    props_celery = {"content_type": "application/json", "content_encoding": "utf-8",
                    "delivery_mode": 2, "priority": 0, "correlation_id": "6f1c6b2e",
                    "reply_to": "b3c1", "headers": celery_like}
    raw_small = f.encode_properties(props_small)
    raw_celery = f.encode_properties(props_celery)
    raw_nohdr = f.encode_properties({"delivery_mode": 2})
    t_celery = f.encode_table(celery_like)
    out: list = [
        ("decode_properties, no headers", lambda: f.decode_properties(raw_nohdr), 1),
        ("decode_properties, 2 headers", lambda: f.decode_properties(raw_small), 1),
        ("decode_properties, Celery's 17 headers", lambda: f.decode_properties(raw_celery), 1),
        ("encode_properties, Celery's 17 headers", lambda: f.encode_properties(props_celery), 1),
        ("decode_table, Celery's 17 headers", lambda: f.decode_table(t_celery, 0), 1),
    ]
    try:
        t_deep = f.encode_table({"d": deep})
        out.append(("decode_table, 18,000 deep", lambda: f.decode_table(t_deep, 0), 18_000))
        out.append(("encode_table, 18,000 deep", lambda: f.encode_table({"d": deep}), 18_000))
    except (RecursionError, f.FieldError):
        out.append(("decode_table, 18,000 deep", None, 0))
        out.append(("encode_table, 18,000 deep", None, 0))
    return out


def measure(fns, seconds: float, batch: int = 50) -> list[float]:
    """Best rate of each function over 20 short rounds, the functions taking turns in
    every round (so a burst of other load hits them alike)."""
    best = [0.0] * len(fns)
    for _ in range(20):
        for k, fn in enumerate(fns):
            if fn is None:
                continue
            n = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds / 20
            while True:
                for _ in range(batch):
                    fn()
                n += batch
                t = time.perf_counter()
                if t >= deadline:
                    break
            best[k] = max(best[k], n / (t - t0))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", default="broker.amqp.fields",
                    help="comma-separated: each case is timed on every module, interleaved")
    ap.add_argument("--seconds", type=float, default=1.0, help="per case and module")
    a = ap.parse_args()
    mods = [importlib.import_module(m) for m in a.module.split(",")]
    table = [cases(f) for f in mods]
    print("| case | " + " | ".join(f"{m} ops/s" for m in a.module.split(",")) + " |")
    print("|---|" + "---|" * len(mods))
    for row in zip(*table, strict=True):
        fns = [fn for _name, fn, _levels in row]
        rates = measure(fns, a.seconds, 1 if max(lv for *_x, lv in row) > 1 else 50)
        cells = ["refused (recursion)" if fn is None else f"{r:,.0f}"
                 for fn, r in zip(fns, rates, strict=True)]
        print(f"| {row[-1][0]} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
