"""Where a queue's mirrors go: ha-mode placement, the ha-params check of policies, and
which queues are replicated on a member group instead (quorum queues). Not the
replication itself (``mirror_master.py``, ``mirror_copy.py``)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..queues.queue import Queue

log = logging.getLogger("broker.cluster.mirror")


# which mirrors keep their slot under ha-mode exactly: in sync first, then those on their
# way, then the failed (they resync anyway), then new nodes
_KEEP = {"in_sync": 0, "syncing": 1, "probing": 1, "manual": 1, "failed": 2}


def wanted_mirrors(definition: dict, master: str, live: list[str],
                   current: dict[str, str] | None = None) -> list[str]:
    """The nodes that should mirror a queue mastered on ``master`` under the policy
    ``definition`` (ha-mode all | exactly | nodes), among the ``live`` nodes. ``current``:
    the mirrors now and their states; under ``exactly`` they keep their slots (an in-sync
    mirror is never evicted for a node that comes back), new nodes fill what is free in
    name order."""
    mode = definition.get("ha-mode")
    others = sorted(n for n in live if n != master)
    if mode == "all":
        return others
    if mode == "exactly":
        count = definition.get("ha-params")
        if not isinstance(count, int) or count < 1:
            return []
        states = current or {}
        others.sort(key=lambda n: (_KEEP.get(states.get(n, ""), 3), n))
        return sorted(others[:count - 1])
    if mode == "nodes":
        names = definition.get("ha-params")
        if not isinstance(names, list):
            return []
        return [n for n in others if n in {str(x) for x in names}]
    return []


def check_ha_nodes(policies, index: int, policy) -> None:
    """A policy's ``ha-mode: nodes`` list may name only members of the running cluster
    (refused naming ha-params). A node without a cluster takes any names, as RabbitMQ
    does (it never checks them: names of no node are ignored when mirrors are placed)."""
    from ..policies.validate import PolicyError
    definition = policy.definition
    if "ha-mode" in definition and policy.name not in _WARNED:
        _WARNED.add(policy.name)
        log.warning("policy %r: classic queue mirroring (ha-mode) is deprecated, as in "
                    "RabbitMQ 3.13 (removed in 4.0): declare quorum queues "
                    "(x-queue-type: quorum) instead (docs/cluster.md)", policy.name)
    if definition.get("ha-mode") != "nodes":
        return
    members = policies.services.store.known_members()
    params = definition.get("ha-params")
    if members is None or not isinstance(params, list):
        return
    unknown = [n for n in params if isinstance(n, str) and n not in members]
    if unknown:
        raise PolicyError(f"ha-params: {', '.join(repr(n) for n in unknown)} "
                          f"{'is not a member' if len(unknown) == 1 else 'are not members'} "
                          f"of this cluster (members: {', '.join(sorted(members))})",
                          "ha-params")


_WARNED: set[str] = set()  # policies whose deprecation was logged (once per process)


def _register_check() -> None:
    from ..policies.validate import POLICY_CHECKS
    if check_ha_nodes not in POLICY_CHECKS:
        POLICY_CHECKS.append(check_ha_nodes)


_register_check()


def replica_group(queue: Queue) -> bool:
    """A queue the cluster replicates on a member group with majority confirms (its
    type's ``initial_group_size`` argument: quorum queues), not by ha-* policies."""
    return queue.queue_type.name == "quorum"
