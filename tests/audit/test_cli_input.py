"""``python -m spark.audit`` refuses bad input with one line and exit status 2, before Spark."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from broker.audit import events
from broker.audit.encoder import BatchEncoder, ContainerFile
from broker.audit.reader import VERSION_KEY

ROOT = __file__.rsplit("/tests/", 1)[0]


def run(*args):
    p = subprocess.run([sys.executable, "-m", "spark.audit", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stderr.strip().splitlines()


@pytest.mark.parametrize("option,value,text", [
    ("--from", "yesterday", "--from 'yesterday': not a time"),
    ("--to", "2026-13-40", "--to '2026-13-40': not a time"),
])
def test_invalid_time(tmp_path, option, value, text):
    code, lines = run("reconcile", "--input", str(tmp_path), "--output", str(tmp_path / "o"),
                      option, value)
    assert code == 2
    assert lines == [f"spark.audit: error: {text} (ISO 8601 like 2026-11-24T09:00:00Z, or "
                     "seconds since the epoch)"]


def test_from_after_to(tmp_path):
    code, lines = run("sequence", "--input", str(tmp_path), "--output", str(tmp_path / "o"),
                      "--from", "2026-11-24T10:00:00Z", "--to", "2026-11-24T09:00:00")
    assert code == 2
    assert len(lines) == 1 and "is not before --to" in lines[0]


def test_no_files(tmp_path):
    (tmp_path / "dt=2026-11-24").mkdir()
    code, lines = run("latency", "--input", str(tmp_path), "--output", str(tmp_path / "o"))
    assert (code, lines) == (2, [f"spark.audit: error: --input {tmp_path}: no audit files "
                                 "(*.avro) there"])
    code, lines = run("latency", "--input", str(tmp_path / "nope"), "--output", str(tmp_path))
    assert code == 2 and lines[0].endswith("no such file or directory")


def test_unknown_schema_version_names_the_file(tmp_path):
    path = tmp_path / "part-1.avro"
    f = ContainerFile(str(path), json.dumps(events.load_schema()), "null",
                      {VERSION_KEY: "9"})
    f.write_block(1, BatchEncoder("n", 1).encode([(events.TRAIL, 1.0, "node_started", None,
                                                   None)]))
    f.close()
    code, lines = run("report", "--input", str(tmp_path), "--output", str(tmp_path / "o"))
    assert code == 2
    assert lines == [f"spark.audit: error: {path}: audit schema version 9 is newer than this "
                     f"reader's ({events.SCHEMA_VERSION}); upgrade the jobs"]
