"""The short CI version of the fault harness (``python -m jepsen`` runs many rounds): two
brokers sharing one PostgreSQL store (ActiveMQ's shared-store master/slave), pika producers
with confirms and consumers with acks given both addresses; kill -9 the master, then
SIGSTOP the new one past its lease. Nothing confirmed may be lost, nothing nacked delivered,
and a standby serves within 10 s of each fault."""
from __future__ import annotations

import socket

import pytest

from jepsen.runner import run


def _pg_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.timeout(240)
@pytest.mark.skipif(not _pg_up(), reason="PostgreSQL not reachable on 127.0.0.1:5432")
def test_shared_store_failover_loses_nothing_confirmed():
    result = run(rounds=2, nemeses=("kill9", "sigstop"), producers=3, consumers=2, queues=2,
                 pause=4.0, lease=3.0, renew=0.5)
    print(f"\n[jepsen short] {result}")
    assert result["lost"] == 0, result["lost_ids"]
    assert result["nacked_delivered"] == 0
    assert result["confirmed"] > 100
    assert result["confirms_never_resumed"] == 0
    for fault in result["faults"]:
        assert fault["takeover_s"] <= 10, fault
        assert fault["new"] != fault["old"], fault
