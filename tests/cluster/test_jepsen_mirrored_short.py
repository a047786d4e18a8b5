"""The short CI version of the mirrored-queue fault harness (``python -m jepsen --topology
mirrored`` runs many rounds): a private etcd, three nodes, a ``ha-mode all`` policy, pika
producers with confirms and consumers with acks given every address; kill -9 the master of
the queues, then SIGSTOP the next one. Nothing confirmed may be lost, nothing nacked
delivered, and an in-sync mirror is promoted within the lease TTL plus a few seconds. With
network namespaces (root and iproute2; skipped without), the same under a partition of the
master and an etcd restart."""
from __future__ import annotations

import os

import pytest

from jepsen.mirrored import ETCD, run_mirrored


@pytest.mark.timeout(240)
@pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd is not installed")
# slow (26 s): mirrored queues are deprecated; CI has their kill -9 failover in test_mirroring
# and the harness' kill9/sigstop rounds on quorum queues (`make test-slow` runs this one)
@pytest.mark.slow
def test_mirrored_failover_loses_nothing_confirmed():
    result = run_mirrored(rounds=2, nemeses=("kill9", "sigstop"), nodes=3, producers=2,
                          consumers=2, queues=2, pause=4.0, ttl=2.0)
    print(f"\n[jepsen mirrored short] {result}")
    assert result["lost"] == 0, result["lost_ids"]
    assert result["nacked_delivered"] == 0
    assert result["confirmed"] > 100
    for fault in result["faults"]:
        assert fault["failover_s"] <= 2.0 + 8.0, fault  # TTL + a few s (shared machine)


def _netns_unavailable() -> str | None:
    from jepsen.netns import unavailable
    return unavailable() if os.path.exists(ETCD) else "etcd is not installed"


@pytest.mark.timeout(240)
def test_mirrored_partition_and_etcd_restart_lose_nothing_confirmed():
    """etcd and the nodes in their own network namespaces: the master of the queues is cut
    from everything (the other nodes, etcd, its clients) for 5 s, then etcd is stopped for
    5 s and started again on its data. A mirror is promoted within the TTL plus a few
    seconds; while etcd is gone nothing is confirmed (the nodes are fenced) and confirms
    resume by themselves once it is back."""
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    result = run_mirrored(rounds=2, nemeses=("partition-master", "restart-etcd"), nodes=3,
                          producers=2, consumers=2, queues=2, pause=5.0, ttl=2.0,
                          netns=True, prefix="jt")
    print(f"\n[jepsen mirrored netns short] {result}")
    assert result["lost"] == 0, result["lost_ids"]
    assert result["nacked_delivered"] == 0
    assert result["confirmed"] > 100
    assert all(n["lost"] == 0 for n in result["nemeses"].values())
    partition, restart = result["faults"]
    assert partition["nemesis"] == "partition-master" and partition["queues"], partition
    assert partition["failover_s"] <= 2.0 + 8.0, partition
    assert partition["healed_to_in_sync_s"] < 60, partition  # the old master resynced
    assert restart["nemesis"] == "restart-etcd", restart
    assert restart["confirmed_while_down"] == 0, restart
    assert restart["confirms_after_etcd_back_s"] is not None, restart
    assert restart["confirms_after_etcd_back_s"] < 15, restart


@pytest.mark.timeout(60)
def test_netns_leftovers_of_a_dead_run_are_removed():
    """A run that died (its pid gone) left a namespace with a process in it and a bridge:
    the next run with the same prefix removes them; its own go at ``down()``."""
    import subprocess

    from jepsen.netns import IP, Topology
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    dead = subprocess.Popen(["true"])
    dead.wait()
    tag = f"jx{dead.pid}"
    subprocess.run([IP, "netns", "add", f"{tag}-n1"], check=True)
    subprocess.run([IP, "link", "add", f"{tag}br", "type", "bridge"], check=True)
    sleeper = subprocess.Popen([IP, "netns", "exec", f"{tag}-n1", "sleep", "60"])
    try:
        topo = Topology(["n1", "n2"], prefix="jx").up()
        try:
            names = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
            links = subprocess.run([IP, "-o", "link"], capture_output=True, text=True).stdout
            assert f"{tag}-n1" not in names and f"{tag}br" not in links
            assert sleeper.wait(5) != 0  # killed with its namespace
            assert f"{topo.tag}-n2" in names and topo.bridge in links
        finally:
            topo.down()
        names = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
        assert topo.tag not in names
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run([IP, "netns", "del", f"{tag}-n1"], capture_output=True)
        subprocess.run([IP, "link", "del", f"{tag}br"], capture_output=True)
