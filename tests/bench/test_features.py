"""`python -m bench.features` keeps working: every case, a tiny duration, against TrioMQ."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

import rawamqp as ra
from bench import features
from bench.procinfo import TrioMQProcess

ROOT = Path(__file__).resolve().parents[2]


def test_select_cases_adds_baselines():
    assert [c["id"] for c in features.select_cases("chash")] == ["direct", "chash"]
    assert [c["id"] for c in features.select_cases("dedup-disk")] == ["fanout-durable", "dedup-disk"]
    assert len(features.select_cases("")) == len(features.CASES)


def test_selector_headers_match_half():
    from types import SimpleNamespace

    from broker.queues.selector import compile_selector

    match, other = compile_selector(features.SELECTOR), compile_selector(features.COMPLEMENT)
    msgs = [SimpleNamespace(properties={"headers": features._selector_headers(i)},
                            routing_key="", exchange="") for i in range(features.KEYS)]
    assert sum(match(m) for m in msgs) == features.KEYS // 2
    assert all(match(m) != other(m) for m in msgs)


def test_dedup_header_is_what_the_broker_checks():
    """The producer's template carries the header the exchange deduplicates on: the same
    template (same stamp) twice is one message, two templates are two."""
    with TrioMQProcess(quiet=True) as broker:
        c = ra.Connection(broker.url, timeout=10)
        try:
            c.channel_open(1)
            c.exchange_declare(1, "feat-dedup", "x-message-deduplication",
                               arguments={"x-cache-size": 10})
            c.queue_declare(1, "feat-q")
            c.queue_bind(1, "feat-q", "feat-dedup", "")
            frames = [features.encode_message("feat-dedup", "", b"x" * 64, c.frame_max,
                                              features._dedup_headers(i), True)[0]
                      for i in (0, 0, 1)]
            c.send(b"".join(frames))
            c.send(b"".join(frames))
            c.queue_declare(1, "feat-probe")  # a round trip: the publishes are routed
            assert c.queue_declare(1, "feat-q")[1] == 2
        finally:
            c.close()


@pytest.mark.slow  # 17 s: every bench case once; `make test-slow` (and `make bench`) run it
def test_features_command_runs_every_case(tmp_path):
    out = tmp_path / "features.json"
    md = tmp_path / "features.md"
    p = subprocess.run(
        [sys.executable, "-m", "bench.features", "--duration", "0.4", "--warmup", "0.2",
         "--targets", "triomq", "--quiet", "--json", str(out), "--markdown", str(md)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = {r["id"]: r for r in data["summary"]}
    assert set(rows) == {c["id"] for c in features.CASES}
    for r in rows.values():
        assert r["errors"] == 0 and r["consume_rate"] > 0, r
    for cid in ("chash", "dedup-mem", "dedup-disk", "qdedup", "filter"):
        assert rows[cid]["consume_ratio"] > 0
    a, b = rows["filter"]["per_consumer_rate"]  # each consumer gets its half
    assert 0.3 < a / (a + b) < 0.7
    assert "| filter |" in md.read_text()
