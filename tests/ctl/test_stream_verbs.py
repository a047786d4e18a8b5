"""rabbitmq-streams' replica verbs on the command line (the real ``python -m broker ctl``):
their arguments, usage errors and an unreachable broker's exit status. What they do on a
cluster: tests/cluster/test_stream_members.py."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "broker", "ctl", *args], cwd=str(REPO_ROOT),
                          capture_output=True, text=True, timeout=60)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nobody listens there


@pytest.mark.parametrize("verb", ["add_replica", "delete_replica"])
def test_replica_verbs_take_a_stream_and_a_node(verb):
    p = ctl(verb, "s")  # the node is missing
    assert p.returncode == 64, p.stdout + p.stderr
    assert "the following arguments are required: node" in p.stderr
    p = ctl("--url", f"http://127.0.0.1:{closed_port()}", verb, "-p", "v", "s", "n2")
    assert p.returncode == 69, p.stdout + p.stderr  # unreachable: as rabbitmqctl
    assert "unable to reach the broker" in p.stderr
    banner = {"add_replica": "Adding a replica for queue s on node n2...",
              "delete_replica": "Removing a replica of queue s on node n2..."}[verb]
    assert p.stdout.splitlines() == [banner]
