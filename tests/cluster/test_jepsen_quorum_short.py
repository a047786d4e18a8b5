"""The short CI version of the fault harness on quorum queues (``python -m jepsen --topology
mirrored --queue-type quorum`` runs many rounds): a private etcd, three nodes, the
workload's queues declared as quorum queues (3 members, majority confirms), pika producers
with confirms and consumers with acks given every address; kill -9 the leader of the
queues, then SIGSTOP the next one. Nothing confirmed may be lost, nothing nacked
delivered, and an in-sync member takes over within the lease TTL plus a few seconds."""
from __future__ import annotations

import os

import pytest

from jepsen.mirrored import ETCD, run_mirrored


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd is not installed")
def test_quorum_failover_loses_nothing_confirmed():
    result = run_mirrored(rounds=2, nemeses=("kill9", "sigstop"), nodes=3, producers=2,
                          consumers=2, queues=2, pause=4.0, ttl=2.0, queue_type="quorum")
    print(f"\n[jepsen quorum short] {result}")
    assert "quorum queues" in result["topology"]
    assert result["lost"] == 0, result["lost_ids"]
    assert result["nacked_delivered"] == 0
    assert result["confirmed"] > 100
    for fault in result["faults"]:
        assert fault["failover_s"] <= 2.0 + 8.0, fault  # TTL + a few s (shared machine)


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd is not installed")
def test_quorum_rolling_restart_with_kombu_loses_nothing_confirmed():
    """kombu (confirm_publish, a failover list of URLs) as the workload's client through a
    rolling restart of the three nodes: each stopped cleanly and started again, the next
    once every queue is back in sync."""
    result = run_mirrored(rounds=1, nemeses=("rolling-restart",), nodes=3, producers=2,
                          consumers=1, queues=2, pause=4.0, ttl=2.0, queue_type="quorum",
                          client="kombu")
    print(f"\n[jepsen quorum kombu rolling] {result}")
    assert "kombu clients" in result["topology"]
    assert result["stuck"] is None
    assert result["lost"] == 0, result["lost_ids"]
    assert result["nacked_delivered"] == 0
    assert result["confirmed"] > 100
    assert result["faults"][0]["nemesis"] == "rolling-restart"
