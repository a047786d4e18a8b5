"""``python -m broker scheduled``: a tool that reads a store never creates one."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def scheduled(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "scheduled", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("action", ["list", "stats", "remove-all"])
def test_a_mistyped_data_dir_is_one_clear_line_and_creates_nothing(tmp_path, action):
    typo = tmp_path / "dtaa"
    r = scheduled(action, "--data-dir", str(typo))
    assert r.returncode == 2, r
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "holds no journal" in lines[0] and str(typo) in lines[0], r.stderr
    assert not typo.exists()


def test_an_empty_data_dir_gets_no_journal(tmp_path):
    r = scheduled("list", "--data-dir", str(tmp_path))
    assert r.returncode == 2 and "holds no journal" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_memory_store_has_nothing_offline(tmp_path):
    r = scheduled("list", "--data-dir", str(tmp_path), "--store", "memory")
    assert r.returncode == 2 and "memory store keeps nothing" in r.stderr, r.stderr


def test_a_database_without_the_store(tmp_path):
    db = tmp_path / "empty.db"
    import sqlite3
    sqlite3.connect(db).close()
    r = scheduled("list", "--data-dir", str(tmp_path), "--store", f"sqlite:///{db}")
    assert r.returncode == 2 and "holds no TrioMQ store" in r.stderr, r.stderr


def test_a_missing_sqlite_file_is_not_created(tmp_path):
    db = tmp_path / "typo.db"
    r = scheduled("list", "--data-dir", str(tmp_path), "--store", f"sqlite:///{db}")
    assert r.returncode == 2 and "no SQLite database" in r.stderr, r.stderr
    assert not db.exists()
