"""Policies and operator policies (RabbitMQ's), at ``broker.policies``.

``install(broker, services)`` is called from ``Broker.__init__``: it creates the registry
(``registry.Policies``, on the vhosts and store of ``services.PolicyServices``), lets the
vhosts ask it for the policy of each new queue and exchange, follows vhosts created and
deleted in ``broker.access`` (a deleted vhost's policies go with it), takes its stored
records back at recovery (metadata kinds ``policy`` and ``operator_policy``) and applies
them once queues and exchanges are recreated.
Validation (``validate``) is apart from behaviour; the queue and the exchange
reconfigure themselves (``Queue.apply_policy``, ``Exchange.apply_policy``).
See docs/policies.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .registry import MissingKey, Policies, Policy, merge_operator, parse_policy
from .validate import (
    OPERATOR_POLICY_KEYS,
    POLICY_KEYS,
    PolicyError,
    PolicyNotFound,
    VhostNotFound,
    validate_definition,
)

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import PolicyServices

__all__ = [
    "OPERATOR_POLICY_KEYS",
    "POLICY_KEYS",
    "MissingKey",
    "Policies",
    "Policy",
    "PolicyError",
    "PolicyNotFound",
    "VhostNotFound",
    "install",
    "merge_operator",
    "parse_policy",
    "validate_definition",
]


def install(broker: Broker, services: PolicyServices) -> Policies:
    policies = Policies(services)
    broker.policies = policies
    for vhost in broker.vhosts.values():
        vhost.policies = policies
    restorers = broker.meta_restorers
    restorers["policy"] = lambda _key, value: policies.restore(0, value)
    restorers["operator_policy"] = lambda _key, value: policies.restore(1, value)
    access = broker.access  # broker/security: vhosts come and go there
    access.on_vhost_added.append(policies.vhost_added)
    access.on_vhost_deleted.append(policies.vhost_deleted)
    broker.recovery_hooks.append(policies.recovered)
    return policies
