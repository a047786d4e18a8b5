"""The Spark jobs never pass bad input silently: trails written with the broker's own Avro
writer (``ContainerFile`` + ``BatchEncoder``, one block per batch), then damaged as disks
and crashes damage them, and ``python -m spark.audit``'s ``main`` run on them in one local
Spark session (the JVM starts once for the module).

- a torn file, a missing file, an unreadable and an empty file: exit status 3 ("the trail
  is incomplete") and one line per gap naming the node, the missing seq range and the file;
- a torn tail whose events the converter wrote again into the next file loses nothing:
  exit 0, the damage still named on stderr;
- a range without events: a warning with the trail's own span;
- without PySpark: one line naming the extra to install, exit 2;
- the reconcile summary has the copies still queued at the end; latency buckets follow the
  range (seconds for a short run, not one dot per hour).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from broker.audit import events
from broker.audit.encoder import BatchEncoder, ContainerFile
from broker.audit.reader import VERSION_KEY, FileReader

ROOT = __file__.rsplit("/tests/", 1)[0]
T = 1_795_500_000.0  # 2026-11-24T06:00Z
PER_BATCH = 100  # messages: 300 events less the last one's ack (it stays queued)
pytestmark = [pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17"),
              pytest.mark.timeout(600)]  # a JVM's start and the jobs on a loaded machine


def batch(k: int) -> list:
    """Batch ``k``: messages k*100+1 .. k*100+100 published to q, delivered, acked but the
    last; 2 s after batch k-1."""
    out: list = []
    for i in range(PER_BATCH):
        msg = k * PER_BATCH + i + 1
        ts = T + 2 * k + i * 0.001
        out.append((events.PUB, ts, "/", "x", "k", msg, {"message_id": f"m{msg}"}, 10, True,
                    "guest", "c", 1, msg, ["q"], "routed"))
        out.append((events.DEL, ts + 0.0002, "/", "q", msg, "ctag", msg, False, 1, "c", 1))
        if i != PER_BATCH - 1:
            out.append((events.ACK, ts + 0.0004, "/", "q", msg, "ctag", msg, "c", 1))
    return out


EVENTS = 3 * PER_BATCH - 1


def first_seq(k: int) -> int:
    return k * EVENTS + 1


def write_file(root, node: str, ks: list[int]) -> tuple[str, list[int]]:
    """A trail file of node ``node`` holding batches ``ks`` (consecutive); its path and the
    byte offset of each block."""
    directory = os.path.join(str(root), "dt=2026-11-24", "hour=06", f"node={node}")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"part-{first_seq(ks[0]):020d}.avro")
    f = ContainerFile(path, json.dumps(events.load_schema()), "deflate",
                      {VERSION_KEY: str(events.SCHEMA_VERSION)})
    enc = BatchEncoder(node, first_seq(ks[0]))
    offsets = []
    for k in ks:
        offsets.append(f.size)
        f.write_block(EVENTS, enc.encode(batch(k)))
    f.close()
    return path, offsets


def cut(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(at)


@pytest.fixture(scope="module")
def spark():
    from spark.audit.cli import spark_session
    session = spark_session("local[2]", "triomq-audit-incomplete-tests")
    yield session
    session.stop()


def run(spark, capsys, *args) -> tuple[int, list[str], list[str]]:
    from spark.audit.cli import main
    code = main(list(args), spark=spark)
    out, err = capsys.readouterr()
    return code, out.strip().splitlines(), err.strip().splitlines()


def rec_rows(spark, out) -> list[dict]:
    return [r.asDict() for r in spark.read.parquet(str(out / "o" / "reconcile" / "by_queue"))
            .collect()]


def test_whole_trail_still_queued_and_latency_buckets(spark, capsys, tmp_path):
    trail = tmp_path / "trail"
    for ks in ([0, 1], [2, 3], [4]):
        write_file(trail, "n1", ks)
    code, out, err = run(spark, capsys, "reconcile", "--input", str(trail),
                         "--output", str(tmp_path / "o"))
    assert code == 0, err
    summary = json.loads((tmp_path / "o" / "reconcile.json").read_text())
    assert summary["incomplete"] == [] and summary["problems"] == []
    rec = summary["reconcile"]
    # the last message of each batch was delivered, never acked: still queued, and within
    # --grace of the end, not unaccounted
    assert (rec["still_queued_at_end"], rec["unaccounted"]) == (5, 0)
    assert {r["still_queued_at_end"] for r in rec_rows(spark, tmp_path)} == {5}
    assert out == [f"reconcile: {5 * EVENTS} events in {summary['seconds']} s; unaccounted: 0; "
                   "still queued at the end: 5"]
    assert any(line.startswith("spark.audit: reading the trail (") for line in err)
    code, out, err = run(spark, capsys, "latency", "--input", str(trail),
                         "--output", str(tmp_path / "o"))
    assert code == 0, err
    lat = json.loads((tmp_path / "o" / "latency.json").read_text())["latency"]
    # 8.1 s of events: 1 s buckets (9 of them), not one hour
    assert lat["bucket_seconds"] == 1
    acks = [r for r in lat["by_queue_bucket"] if r["metric"] == "publish_to_ack"]
    assert [r["bucket"] for r in acks] == ["2026-11-24T06:00:00Z", "2026-11-24T06:00:02Z",
                                           "2026-11-24T06:00:04Z", "2026-11-24T06:00:06Z",
                                           "2026-11-24T06:00:08Z"]
    assert [r["count"] for r in acks] == [PER_BATCH - 1] * 5


def test_damaged_and_missing_files_fail_with_their_own_status(spark, capsys, tmp_path):
    trail = tmp_path / "trail"
    write_file(trail, "n1", [0, 1])
    torn, offsets = write_file(trail, "n1", [2, 3])
    missing, _ = write_file(trail, "n1", [4, 5])
    write_file(trail, "n1", [6])
    garbage, _ = write_file(trail, "n1", [7])
    write_file(trail, "n1", [8])
    empty = os.path.join(os.path.dirname(torn), f"part-{first_seq(9):020d}.avro")
    # batch 3's block cut at 60 %, the next file gone, batch 7's header overwritten,
    # and the newest file empty (opened for batch 9, nothing reached the disk)
    size = os.path.getsize(torn)
    cut(torn, offsets[1] + (size - offsets[1]) * 6 // 10)
    os.remove(missing)
    with open(garbage, "r+b") as f:
        f.write(b"Obj\x01\xff\xff\xff")
    open(empty, "wb").close()
    # node n2: a file missing between two whole ones, nothing damaged
    write_file(trail, "n2", [0])
    lost, _ = write_file(trail, "n2", [1])
    write_file(trail, "n2", [2])
    os.remove(lost)
    code, out, err = run(spark, capsys, "reconcile", "--input", str(trail),
                         "--output", str(tmp_path / "o"))
    assert code == 3, (out, err)
    errors = [line for line in err if line.startswith("spark.audit: error: trail incomplete: ")]
    gaps = [line.split(": ", 3)[3] for line in errors]
    assert len(gaps) == 4, err
    assert gaps[0].startswith(f"node n1: seq {first_seq(3)}-{first_seq(6) - 1} "
                              f"({3 * EVENTS} events) missing: {torn}: truncated at byte "
                              f"{offsets[1]} ")
    assert gaps[1].startswith(f"node n1: seq {first_seq(7)}-{first_seq(8) - 1} ({EVENTS} "
                              f"events) missing: {garbage}: unreadable (bad header at byte 0 ")
    assert gaps[2] == (f"node n1: seq {first_seq(9)} onwards missing: {empty}: unreadable "
                       "(bad header at byte 0 (empty file (0 bytes)))")
    assert gaps[3] == (f"node n2: seq {first_seq(1)}-{first_seq(2) - 1} ({EVENTS} events) "
                       f"missing: no file holds them: between part-{first_seq(0):020d}.avro "
                       f"and part-{first_seq(2):020d}.avro (a file missing)")
    assert "TRAIL INCOMPLETE: 4 gap(s) in the sequence (exit status 3)" in out[0]
    summary = json.loads((tmp_path / "o" / "reconcile.json").read_text())
    assert [(g["node"], g["from_seq"], g["to_seq"]) for g in summary["incomplete"]] == [
        ("n1", first_seq(3), first_seq(6) - 1), ("n1", first_seq(7), first_seq(8) - 1),
        ("n1", first_seq(9), None), ("n2", first_seq(1), first_seq(2) - 1)]
    assert summary["exit_status"] == 3


def test_torn_tail_written_again_loses_nothing(spark, capsys, tmp_path):
    """A converter killed mid-block: the torn block's frame is converted again into a new
    file at the next start. The damage is named, the trail is whole: exit 0."""
    trail = tmp_path / "trail"
    first, offsets = write_file(trail, "n1", [0, 1, 2])
    cut(first, offsets[2] + 100)
    write_file(trail, "n1", [2, 3])
    reader = FileReader(first)
    assert len(list(reader)) == 2 * EVENTS and [p.kind for p in reader.problems] == ["truncated"]
    code, out, err = run(spark, capsys, "reconcile", "--input", str(trail),
                         "--output", str(tmp_path / "o"))
    assert code == 0, err
    assert [line for line in err if "warning" in line or "error" in line] == [
        f"spark.audit: warning: damaged input skipped: file:{first} @ {offsets[2]}: truncated "
        "(100 bytes of a torn tail)"]
    assert out[0].startswith(f"reconcile: {4 * EVENTS} events in ")


def test_range_without_events_warns(spark, capsys, tmp_path):
    trail = tmp_path / "trail"
    write_file(trail, "n1", [0])
    code, out, err = run(spark, capsys, "sequence", "--input", str(trail), "--output",
                         str(tmp_path / "o"), "--from", "2026-11-23T00:00:00Z",
                         "--to", "2026-11-23T01:00:00Z", "--quiet")
    assert code == 0
    assert err == ["spark.audit: warning: no events in the range [2026-11-23T00:00:00.000000Z, "
                   f"2026-11-23T01:00:00.000000Z) of {trail}; the trail's blocks start from "
                   "2026-11-24T06:00:00.000000Z to 2026-11-24T06:00:00.000000Z"]
    assert out[0].startswith("sequence: 0 events in ")


def test_without_pyspark_names_the_extra(tmp_path):
    (tmp_path / "part-1.avro").write_bytes(b"")
    code = ("import sys; sys.modules['pyspark'] = None; from spark.audit.cli import main; "
            f"sys.exit(main(['reconcile', '--input', {str(tmp_path)!r}, '--output', 'o']))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        "spark.audit: error: pyspark not installed; the audit jobs need PySpark, pyarrow and "
        "pandas: pip install -e '.[audit]' (or pip install 'triomq[audit]'), and Java 17"]
