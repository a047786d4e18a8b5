"""The trail's completeness from its blocks' sequence runs (spark/audit/integrity.py), and
how the report shows it: no Spark, the blocks and problems as the reader reports them."""
from __future__ import annotations

from spark.audit import report
from spark.audit.integrity import gaps, line

D = "file:/t/dt=2026-11-24/hour=06/node=n1/"


def _block(name: str, offset: int, first: int, count: int, ts: int) -> tuple:
    return (D + name, offset, "n1", first, count, ts)


BLOCKS = [_block("part-1.avro", 100, 1, 10, 1_000), _block("part-1.avro", 900, 11, 10, 2_000),
          _block("part-31.avro", 100, 31, 10, 4_000), _block("part-41.avro", 100, 41, 10, 5_000)]


def test_a_hole_is_named_and_limited_to_the_range():
    (gap,) = gaps(BLOCKS, [])
    assert gap == {"node": "n1", "from_seq": 21, "to_seq": 30, "missing": 10,
                   "file": "/t/dt=2026-11-24/hour=06/node=n1",
                   "why": "no file holds them: between part-1.avro and part-31.avro "
                          "(a file missing)"}
    assert line(gap) == ("node n1: seq 21-30 (10 events) missing: no file holds them: "
                         "between part-1.avro and part-31.avro (a file missing)")
    # the hole's events are before 2,000 < ts < 4,000: a range after it, or before it, is whole
    assert gaps(BLOCKS, [], from_us=4_500) == []
    assert gaps(BLOCKS, [], to_us=1_500) == []
    assert len(gaps(BLOCKS, [], from_us=3_000, to_us=4_500)) == 1


def test_lost_end_and_damage_that_loses_nothing():
    torn_last = [(D + "part-41.avro", 500, "truncated", "7 bytes of a torn tail")]
    full = [*BLOCKS[:2], _block("part-21.avro", 100, 21, 10, 3_000), *BLOCKS[2:]]
    (gap,) = gaps(full, torn_last)
    assert (gap["from_seq"], gap["to_seq"], gap["missing"]) == (51, None, None)
    assert line(gap) == ("node n1: seq 51 onwards missing: /t/dt=2026-11-24/hour=06/node=n1/"
                         "part-41.avro: truncated at byte 500 (7 bytes of a torn tail) after "
                         "its last good block")
    # a torn tail in the middle whose events the next file holds: nothing lost
    assert gaps(full, [(D + "part-21.avro", 900, "truncated", "3 bytes")]) == []
    # an unreadable file whose numbers are all elsewhere: nothing lost either
    assert gaps(full, [(D + "part-25.avro", 0, "bad header", "junk")]) == []


def test_report_shows_what_is_missing(tmp_path):
    (gap,) = gaps(BLOCKS, [])
    result = {"input": "/t", "events": 40, "seconds": 1.0, "exit_status": 3,
              "incomplete": [gap], "problems": [],
              "latency": {"bucket_seconds": 10, "overall": [], "by_queue_bucket": [
                  {"metric": "publish_to_ack", "vhost": "/", "queue": "q", "count": 1,
                   "bucket": f"2026-11-24T06:00:{s}Z", "p50_ms": 1.0, "p95_ms": 2.0,
                   "p99_ms": 3.0, "max_ms": 4.0} for s in ("00", "10", "20")]}}
    report.write_html(result, str(tmp_path / "r.html"))
    html = (tmp_path / "r.html").read_text()
    assert "THE TRAIL IS INCOMPLETE" in html and "Missing from the trail" in html
    assert "a file missing" in html and html.count("<img") == 1  # the latency chart
