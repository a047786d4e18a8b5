"""The self-contained HTML report: tables from the summary, matplotlib charts inlined."""
from __future__ import annotations

import base64
import html
import io


def _chart(draw) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
    try:
        if not draw(ax):
            return "<p><em>no data</em></p>"
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    finally:
        plt.close(fig)
    return f'<img alt="chart" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _table(rows: list[dict], columns: list[str] | None = None, limit: int = 200) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in columns)
                   + "</tr>" for r in rows[:limit])
    more = f"<p>… {len(rows) - limit} more</p>" if len(rows) > limit else ""
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.3f}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


def _latency_chart(lat: dict):
    def draw(ax):
        buckets = lat.get("by_queue_bucket", [])
        rows = [r for r in buckets if r["metric"] == "publish_to_ack"]
        if not rows:
            rows = [r for r in buckets if r["metric"] == "publish_to_first_delivery"]
        if not rows:
            return False
        width = lat.get("bucket_seconds", 3600)
        # labels: the bucket's start, as much of it as the width needs
        cut = slice(11, 19) if width < 60 else slice(5, 16)
        by_queue: dict = {}
        for r in rows:
            by_queue.setdefault(f"{r['vhost']}{r['queue']}", []).append(r)
        for name, rs in sorted(by_queue.items())[:8]:
            rs.sort(key=lambda r: r["bucket"])
            starts = [r["bucket"][cut] for r in rs]
            for q, style in (("p50_ms", "-"), ("p99_ms", "--")):
                ax.plot(starts, [r[q] for r in rs], style, marker="o", label=f"{name} {q[:3]}")
        ax.set_ylabel("ms (publish → ack)")
        ax.set_yscale("symlog")
        ax.legend(fontsize=7)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
        ax.set_title(f"Latency percentiles per {_width(width)}")
        return True
    return draw


def _width(seconds: int) -> str:
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= n and seconds % n == 0:
            return unit if seconds == n else f"{seconds // n} {unit}s"
    return "second" if seconds == 1 else f"{seconds} seconds"


def _deadletter_chart(dl: dict):
    def draw(ax):
        reasons = dl.get("by_reason") or {}
        if not reasons:
            return False
        names = sorted(reasons)
        ax.bar(names, [reasons[n] for n in names], color="#b5523b")
        ax.set_title("Dead letters by reason")
        return True
    return draw


def _reconcile_chart(rec: dict):
    def draw(ax):
        q = rec.get("queues") or {}
        keys = ["acked", "dead_lettered", "expired", "dropped", "rejected", "settled_other",
                "purged", "deleted", "unaccounted"]
        vals = [q.get(k, 0) for k in keys]
        if not any(vals):
            return False
        colors = ["#4c8c4a"] * 8 + ["#c0392b"]
        ax.barh(keys, vals, color=colors)
        ax.set_title("Final state of every queue copy")
        return True
    return draw


def write_html(result: dict, path: str) -> None:
    rec = result.get("reconcile", {})
    seq = result.get("sequence", {})
    lat = result.get("latency", {})
    dl = result.get("deadletters", {})
    verdict = ("OK" if not result.get("exit_status") else
               "THE TRAIL IS INCOMPLETE: the counts below miss events" if result.get("incomplete")
               else "ATTENTION: unaccounted messages or sequence gaps")
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>TrioMQ audit report</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse;font-size:13px;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "th{background:#eee}.bad{color:#c0392b}.ok{color:#4c8c4a}</style></head><body>",
        "<h1>TrioMQ audit report</h1>",
        f"<p>Input <code>{html.escape(str(result.get('input')))}</code>: "
        f"{result.get('events')} events; {result.get('seconds')} s. "
        f"<strong class='{'bad' if result.get('exit_status') else 'ok'}'>{verdict}</strong></p>",
        "<h2 class='bad'>Missing from the trail</h2>" if result.get("incomplete") else "",
        _table(result.get("incomplete", []), ["node", "from_seq", "to_seq", "missing", "file",
                                              "why"]) if result.get("incomplete") else "",
        "<h2>Reconciliation</h2>", _chart(_reconcile_chart(rec)),
        "<h3>Publishes</h3>", _table([rec.get("publishes", {})]),
        "<h3>Queue copies</h3>", _table([rec.get("queues", {})]),
        f"<h3 class='{'bad' if rec.get('unaccounted') else 'ok'}'>Unaccounted messages: "
        f"{rec.get('unaccounted', 0)}</h3>",
        _table(rec.get("unaccounted_messages", [])),
        "<h3>Stream copies</h3>",
        _table([{k: v for k, v in rec["streams"].items() if k != "consumers"}]
               if rec.get("streams") else []),
        "<h3>Stream consumers</h3>", _table((rec.get("streams") or {}).get("consumers", [])),
        "<h3>The trail itself</h3>", _table((rec.get("trail") or {}).get("nodes", [])),
        "<h2>Producer sequences</h2>", _table(seq.get("producers", [])),
        f"<h3 class='{'bad' if seq.get('gaps') else 'ok'}'>Gaps ({seq.get('missing', 0)} "
        f"missing)</h3>", _table(seq.get("gaps", [])),
        "<h3>Duplicate publishes</h3>", _table(seq.get("duplicates", [])),
        "<h3>Out of order</h3>", _table(seq.get("out_of_order", [])),
        "<h3>Acked more than once</h3>", _table(seq.get("acked_more_than_once", [])),
        "<h2>Latency</h2>", _chart(_latency_chart(lat)), _table(lat.get("overall", [])),
        _table(lat.get("by_queue_bucket", [])),
        "<h2>Dead letters</h2>", _chart(_deadletter_chart(dl)),
        _table(dl.get("by_reason_queue_hour", [])),
        "<h3>Time before dead-lettering</h3>", _table(dl.get("time_before_dead_letter", [])),
        "<h3>Top routing keys</h3>", _table(dl.get("top_routing_keys", [])),
        "<h2>Damaged input</h2>",
        _table(result.get("problems", []), ["file", "offset", "kind", "detail"]),
        "</body></html>"]
    with open(path, "w") as f:
        f.write("".join(parts))
