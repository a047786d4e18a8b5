"""The short CI version of the mirrored-queue fault harness (``python -m jepsen --topology
mirrored`` runs many rounds): a private etcd, three nodes, a ``ha-mode all`` policy, pika
producers with confirms and consumers with acks given every address; kill -9 the master of
the queues, then SIGSTOP the next one. Nothing confirmed may be lost, nothing nacked
delivered, and an in-sync mirror is promoted within the lease TTL plus a few seconds."""
from __future__ import annotations

import os

import pytest

from jepsen.mirrored import ETCD, run_mirrored


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd is not installed")
def test_mirrored_failover_loses_nothing_confirmed():
    result = run_mirrored(rounds=2, nemeses=("kill9", "sigstop"), nodes=3, producers=2,
                          consumers=2, queues=2, pause=4.0, ttl=2.0)
    print(f"\n[jepsen mirrored short] {result}")
    assert result["lost"] == 0, result["lost_ids"]
    assert result["nacked_delivered"] == 0
    assert result["confirmed"] > 100
    for fault in result["faults"]:
        assert fault["failover_s"] <= 2.0 + 8.0, fault  # TTL + a few s (shared machine)
