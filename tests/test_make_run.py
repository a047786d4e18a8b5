"""``make run`` says what it does in its first lines: the AMQP address, the data directory,
where the management HTTP API listens (15672 unless ARGS moves it) and how to pass options
(ARGS=). The broker command is replaced by ``echo`` (PY=echo) so nothing starts, and VENV
points at a directory whose ``.installed`` is new, so that the setup step has nothing to do
(never touching the shared .venv)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


@pytest.fixture
def make_run(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").touch()

    def run(*args: str) -> list[str]:
        p = subprocess.run(["make", "--no-print-directory", "-s", "run", "PY=echo",
                            f"VENV={venv}", *args],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.splitlines()
    return run


def test_first_lines_name_the_ports_and_args(make_run):
    first, second, command = make_run("PORT=5679", "DATA=/tmp/triomq-make-run")[:3]
    assert first.startswith("TrioMQ: AMQP on 0.0.0.0:5679, data in /tmp/triomq-make-run")
    assert "management HTTP API and console on port 15672" in first
    assert "ARGS" in second and "--http-port" in second
    assert command.startswith("-m broker run --host 0.0.0.0 --port 5679")


def test_args_moving_the_http_port_are_not_contradicted(make_run):
    first, _second, command = make_run("ARGS=--http-port 15999")[:3]
    assert "15672" not in first and "--http-port ARGS gives" in first
    assert command.endswith("--http-port 15999")
