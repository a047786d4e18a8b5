"""The benchmark matrix's row selection and its table / JSON / chart writing (no broker)."""
import argparse
import json

import pytest

from bench import matrix
from bench.runner import topic_mix


def _rows():
    return matrix.build_rows(topic_bindings=1000, sizes={"connections": 50, "queues": 100, "consumers": 10})


def _ids(rows):
    return [r.id for r in rows]


def _results():
    t = {"publish_rate": 1000.0, "consume_rate": 900.0, "latency_ms": {"p50": 1.0, "p99": 4.0},
         "broker_rss_peak_mb": 40.0, "errors": []}
    r = {"publish_rate": 500.0, "consume_rate": 450.0, "latency_ms": {"p50": 2.0, "p99": 2.0},
         "broker_rss_peak_mb": 400.0, "errors": []}
    conns_t = {"open_rate": 2000.0, "connections": 50, "rss_per_conn_kb": 20.0, "errors": []}
    conns_r = {"errors": ["TimeoutError: boom"]}
    return {"1": (t, r), "conns": (conns_t, conns_r)}


def test_rows_cover_every_scenario():
    ids = _ids(_rows())
    for want in ("1", "2", "3", "4a", "4b", "sat", "large-64k-ack", "large-64k-noack", "large-1m-ack",
                 "large-1m-noack", "fanout-10", "fanout-100", "topic-10k", "conns", "queues", "consumers"):
        assert want in ids
    assert len(set(ids)) == len(ids)


def test_select_only_and_skip():
    rows = _rows()
    assert _ids(matrix.select_rows(rows, only="4")) == ["4a", "4b"]
    assert _ids(matrix.select_rows(rows, only="large-1m")) == ["large-1m-ack", "large-1m-noack"]
    assert _ids(matrix.select_rows(rows, only="1,fanout-10")) == ["1", "fanout-10"]
    sel = _ids(matrix.select_rows(rows, skip="large,4b,conns"))
    assert "4a" in sel and "4b" not in sel and "conns" not in sel
    assert not any(i.startswith("large") for i in sel)
    assert _ids(matrix.select_rows(rows, only="fanout", skip="fanout-100")) == ["fanout-10"]
    assert matrix.select_rows(rows) == rows


def test_select_rejects_unknown_rows():
    with pytest.raises(ValueError, match="nope"):
        matrix.select_rows(_rows(), only="1,nope")
    with pytest.raises(ValueError, match="large-2m"):
        matrix.select_rows(_rows(), skip="large-2m")


def test_entity_sizes_scale_override_and_fd_cap():
    a = argparse.Namespace(full_scale=False, scale_factor=0.5, connections=None, declare_queues=None,
                           queue_consumers=77)
    sizes, notes = matrix.entity_sizes(a, fd_limit=100_000)
    assert sizes == {"connections": 500, "queues": 5000, "consumers": 77} and not notes
    a.full_scale, a.scale_factor = True, 1.0
    sizes, notes = matrix.entity_sizes(a, fd_limit=4096)
    assert sizes["queues"] == 100_000 and sizes["connections"] == 4096 - 512 and notes


def test_table_values_and_ratios():
    rows = matrix.select_rows(_rows(), only="1,conns")
    tab = matrix.table_rows(rows, _results())
    by = {(t["row"], t["metric"]): t for t in tab}
    assert by[("1", "consume msg/s")]["ratio"] == pytest.approx(2.0)
    assert by[("1", "latency p99 ms")]["ratio"] == pytest.approx(2.0)
    assert by[("conns", "RSS KB per connection")]["rabbitmq"] is None
    assert by[("conns", "RSS KB per connection")]["ratio"] is None
    assert by[("conns", "connections held")]["errors"]


def test_large_rows_report_megabytes():
    row = next(r for r in _rows() if r.id == "large-1m-noack")
    mb = next(m for m in row.metrics if m.name == "consume MB/s")
    assert matrix.value({"consume_rate": 100.0}, mb) == pytest.approx(100 * 1024 * 1024 / 1e6)
    assert row.workload["size"] == 1024 * 1024 and row.workload["max_backlog"] <= 100


def test_markdown(tmp_path):
    rows = matrix.select_rows(_rows(), only="1,conns")
    md = matrix.markdown(rows, _results(), "python -m bench matrix --only 1,conns", 5)
    lines = md.splitlines()
    assert lines[0] == "| row | scenario | metric | TrioMQ | RabbitMQ | TrioMQ÷RabbitMQ |"
    assert "| 1 | transient, no-ack, 1p/1c, 64 B, unlimited rate | publish msg/s | 1,000 | 500 | 2.00 |" in lines
    assert "| 1 |  | latency p50 ms | 1.00 | 2.00 | 0.50 |" in lines
    conns = [ln for ln in lines if ln.startswith("| conns |")]
    assert "⚠" in conns[0] and "n/a" in conns[0]
    assert "Command: `python -m bench matrix --only 1,conns`" in md


def test_write_outputs(tmp_path):
    rows = matrix.select_rows(_rows(), only="1,2,conns")
    res = _results()
    res["2"] = (None, None)    # a row that produced nothing still gets table lines
    md_path = tmp_path / "m.md"
    md, json_path, png = matrix.write_outputs(rows, res, "cmd", 5, str(md_path))
    assert md_path.read_text().startswith(md)
    assert "![TrioMQ vs RabbitMQ](m.png)" in md_path.read_text()
    data = json.loads((tmp_path / "m.json").read_text())
    assert json_path == str(tmp_path / "m.json")
    assert data["command"] == "cmd" and [r["id"] for r in data["rows"]] == ["1", "2", "conns"]
    assert data["rows"][0]["triomq"]["consume_rate"] == 900.0
    assert {t["row"] for t in data["table"]} == {"1", "2", "conns"}
    assert png == str(tmp_path / "m.png")
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chart_without_values_writes_nothing(tmp_path):
    rows = matrix.select_rows(_rows(), only="queues")
    assert matrix.chart(rows, {}, str(tmp_path / "x.png")) is None
    assert not (tmp_path / "x.png").exists()


def test_topic_mix_is_distinct_and_routes_every_key():
    import re

    bindings, keys = topic_mix(2000, "ex", ["q0"])
    pats = [b[2] for b in bindings]
    assert len(pats) == len(set(pats)) == 2000
    assert len({len(k) for k in keys[0]}) == 1      # equally long keys: one publish template size

    def rx(p):
        return re.compile("^" + re.escape(p).replace(r"\*", "[^.]+").replace(r"\#", ".*") + "$")

    for k in keys[0]:
        assert any(rx(p).match(k) for p in pats)
