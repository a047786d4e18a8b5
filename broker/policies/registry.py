"""Policies and operator policies per vhost, as RabbitMQ 3.10 keeps them.

One policy applies to an entity: the highest-priority policy whose pattern matches its
name (``re.search``, unanchored) and whose apply-to covers its kind; ties go to the
first name in order. Policies are never merged with each other. An operator policy is
chosen the same way among operator policies and caps the policy: for a key both set,
the lower value wins (RabbitMQ's merge strategy for every operator policy key). How the
result combines with a queue's own x- arguments is the queue's business
(``queues/args.with_policy``).

Every change is applied to the existing queues and exchanges of the vhost at once
(through their own ``apply_policy``), stored through the store's metadata seam (kinds
``policy`` and ``operator_policy``), then announced to ``on_change`` callbacks.
"""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .validate import (
    POLICY_CHECKS,
    PolicyError,
    PolicyNotFound,
    VhostNotFound,
    compile_pattern,
    validate_apply_to,
    validate_definition,
    validate_name,
    validate_priority,
)

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..services import PolicyServices
    from ..vhost import VirtualHost

log = logging.getLogger("broker.policies")

POLICY_KIND = "policy"
OPERATOR_POLICY_KIND = "operator_policy"


@dataclass
class Policy:
    vhost: str
    name: str
    pattern: str
    apply_to: str
    definition: dict
    priority: int | float
    regex: re.Pattern = field(repr=False, compare=False)

    def applies(self, kind: str, name: str, queue_type: Any = None) -> bool:
        """``kind``: "queue" or "exchange"; ``queue_type`` (queues/types.py) a queue's
        type, which a type's own apply-to (``quorum_queues``...) selects."""
        return (self.apply_to == "all" or self.apply_to == kind + "s"
                or (queue_type is not None and self.apply_to == queue_type.policy_apply_to)) \
            and self.regex.search(name) is not None

    def as_dict(self) -> dict:
        """RabbitMQ's JSON shape (GET /api/policies, definitions' "policies")."""
        return {"vhost": self.vhost, "name": self.name, "pattern": self.pattern,
                "apply-to": self.apply_to, "definition": dict(self.definition),
                "priority": self.priority}

    def as_parameter(self) -> dict:
        """An operator policy in definitions (RabbitMQ keeps them as runtime parameters)."""
        return {"value": {"pattern": self.pattern, "definition": dict(self.definition),
                          "priority": self.priority, "apply-to": self.apply_to},
                "vhost": self.vhost, "component": OPERATOR_POLICY_KIND, "name": self.name}


class MissingKey(PolicyError):
    """A policy body without a required field; RabbitMQ's reason is ``[{key_missing,K}]``."""

    @property
    def reason(self) -> str:
        return f"[{{key_missing,{self.key}}}]"


def parse_policy(vhost: str, name: Any, body: Any, operator: bool = False) -> Policy:
    """A policy from its JSON body (``pattern``, ``definition``, optional ``apply-to``
    and ``priority``, RabbitMQ's defaults "all" and 0). Raises PolicyError naming the
    field; unknown fields of the body are ignored, as RabbitMQ does."""
    validate_name(name)
    if not isinstance(body, dict):
        raise PolicyError(f"policy should be a JSON object, actually was {body!r}", None)
    for key in ("pattern", "definition"):
        if key not in body:
            raise MissingKey(f"{key} is missing", key)
    apply_to = validate_apply_to(body.get("apply-to", "all"))
    priority = validate_priority(body.get("priority", 0))
    regex = compile_pattern(body["pattern"])
    definition = validate_definition(body["definition"], operator=operator)
    return Policy(vhost, name, body["pattern"], apply_to, definition, priority, regex)


def merge_operator(definition: dict, operator: dict) -> dict:
    """A policy's definition capped by an operator policy's: the lower value of a key
    both set (every operator policy key is a limit), the other keys of both as they are."""
    merged = dict(definition)
    for key, value in operator.items():
        have = merged.get(key)
        merged[key] = value if have is None else min(have, value)
    return merged


def _meta_key(vhost: str, name: str) -> str:
    return json.dumps([vhost, name], ensure_ascii=False)


class Policies:
    """``broker.policies``: the policies and operator policies of every vhost.

    Methods raise ``PolicyError`` (a ValueError; ``.reason`` is the management API's
    400 text, ``.key`` the offending field), ``PolicyNotFound`` or ``VhostNotFound``
    (LookupErrors, 404); nothing changes when they raise. Everything runs on the
    broker's loop, synchronously.
    """

    def __init__(self, services: PolicyServices):
        self.services = services
        # vhost name -> policy name -> Policy; index 0 policies, 1 operator policies
        self._tables: tuple[dict[str, dict[str, Policy]], dict[str, dict[str, Policy]]] = ({}, {})
        self._ranked: dict[tuple[int, str], list[Policy]] = {}  # cache, by priority
        # callables(vhost_name) run after the policies of a vhost changed (and were applied)
        self.on_change: list[Callable[[str], None]] = []

    # ---- policies ----
    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict, *,
                   priority: int | float = 0, apply_to: str = "all") -> dict:
        """Create or replace; returns the policy as RabbitMQ lists it."""
        return self.put_policy(vhost, name, {"pattern": pattern, "definition": definition,
                                             "priority": priority, "apply-to": apply_to})

    def put_policy(self, vhost: str, name: str, body: Any) -> dict:
        """PUT /api/policies/{vhost}/{name} with its JSON ``body``."""
        return self._put(0, vhost, name, body)

    def clear_policy(self, vhost: str, name: str) -> None:
        self._clear(0, vhost, name)

    def get_policy(self, vhost: str, name: str) -> dict:
        return self._get(0, vhost, name)

    def list_policies(self, vhost: str | None = None) -> list[dict]:
        return self._list(0, vhost)

    # ---- operator policies ----
    def set_operator_policy(self, vhost: str, name: str, pattern: str, definition: dict, *,
                            priority: int | float = 0, apply_to: str = "all") -> dict:
        return self.put_operator_policy(vhost, name, {
            "pattern": pattern, "definition": definition, "priority": priority,
            "apply-to": apply_to})

    def put_operator_policy(self, vhost: str, name: str, body: Any) -> dict:
        return self._put(1, vhost, name, body)

    def clear_operator_policy(self, vhost: str, name: str) -> None:
        self._clear(1, vhost, name)

    def get_operator_policy(self, vhost: str, name: str) -> dict:
        return self._get(1, vhost, name)

    def list_operator_policies(self, vhost: str | None = None) -> list[dict]:
        return self._list(1, vhost)

    # ---- what applies ----
    def effective(self, vhost_name: str, kind: str, name: str,
                  queue_type: Any = None) -> tuple[str | None, str | None, dict]:
        """(policy name, operator policy name, merged definition) for the queue or
        exchange ``name`` (``kind`` "queue" | "exchange"), whether or not it exists;
        ``queue_type``: a queue's type (None: only type-independent policies match)."""
        policy = self._match(0, vhost_name, kind, name, queue_type)
        operator = self._match(1, vhost_name, kind, name, queue_type)
        definition = policy.definition if policy is not None else {}
        if operator is not None:
            definition = merge_operator(definition, operator.definition)
        return (policy.name if policy is not None else None,
                operator.name if operator is not None else None, dict(definition))

    def queue_added(self, vhost: VirtualHost, queue: Queue) -> None:
        """Called by the vhost for each new queue (declared or recovered)."""
        self._apply_queue(vhost, queue)

    def exchange_added(self, vhost: VirtualHost, exchange) -> None:
        """Called by the vhost for each exchange a client declared."""
        self._apply_exchange(vhost, exchange)

    def apply_all(self, vhost_name: str) -> None:
        """Bring every queue and exchange of the vhost in line with its policies."""
        vhost = self.services.vhosts.get(vhost_name)
        if vhost is None:
            return
        vhost.policies = self
        for q in list(vhost.queues.values()):
            if not q.internal:
                self._apply_queue(vhost, q)
        for x in list(vhost.exchanges.values()):
            self._apply_exchange(vhost, x)

    def vhost_added(self, vhost_name: str) -> None:
        """A new vhost: its queues and exchanges will ask for their policy."""
        vhost = self.services.vhosts.get(vhost_name)
        if vhost is not None:
            vhost.policies = self

    def vhost_deleted(self, vhost_name: str) -> None:
        """The vhost is gone: its policies and operator policies go with it."""
        for index in (0, 1):
            table = self._tables[index].pop(vhost_name, None)
            self._ranked.pop((index, vhost_name), None)
            for name in table or ():
                self._forget(index, vhost_name, name)

    # ---- definitions ----
    def export(self, vhost: str | None = None) -> dict:
        """RabbitMQ's definitions shape: "policies", and operator policies as
        "parameters" of component "operator_policy"."""
        return {"policies": self._list(0, vhost),
                "parameters": [p.as_parameter() for p in self._all(1, vhost)]}

    def check_import(self, defs: dict, vhosts_to_come: Iterable[str] = ()) -> list:
        """Validate the "policies" and operator-policy "parameters" of ``defs`` without
        changing anything; returns what ``import_`` would apply. ``vhosts_to_come``
        (and the vhosts listed in ``defs``) count as existing. Raises PolicyError naming
        the item, or VhostNotFound."""
        if not isinstance(defs, dict):
            raise PolicyError("definitions should be a JSON object", None)
        known = set(self.services.vhosts) | set(vhosts_to_come)
        for v in defs.get("vhosts") or ():
            if isinstance(v, dict) and isinstance(v.get("name"), str):
                known.add(v["name"])
        items: list[tuple[int, Policy]] = []
        policies = defs.get("policies") or []
        params = [p for p in defs.get("parameters") or []
                  if isinstance(p, dict) and p.get("component") == OPERATOR_POLICY_KIND]
        if not isinstance(policies, list):
            raise PolicyError("policies should be a list", "policies")
        for index, entries in ((0, policies), (1, params)):
            for item in entries:
                if not isinstance(item, dict):
                    raise PolicyError(f"policy should be a JSON object, actually was {item!r}")
                body = item if index == 0 else item.get("value")
                vhost, name = item.get("vhost"), item.get("name")
                if not isinstance(vhost, str):
                    raise MissingKey("vhost is missing", "vhost")
                try:
                    policy = parse_policy(vhost, name, body, operator=bool(index))
                except PolicyError as exc:
                    raise type(exc)(f"{exc.text} (policy '{name}' in vhost '{vhost}')",
                                    exc.key) from None
                if vhost not in known:
                    raise VhostNotFound(vhost)
                items.append((index, policy))
        return items

    def import_(self, defs: dict, vhosts_to_come: Iterable[str] = ()) -> int:
        """Import the policies of definitions: all of them or, if any is invalid,
        none (raises as ``check_import``). Returns how many were set."""
        items = self.check_import(defs, vhosts_to_come)
        touched: set[str] = set()
        for _index, policy in items:
            if policy.vhost not in self.services.vhosts:
                raise VhostNotFound(policy.vhost)  # the caller did not create it after all
        for index, policy in items:
            self._store(index, policy)
            touched.add(policy.vhost)
        for vhost in sorted(touched):
            self._changed(vhost)
        return len(items)

    # ---- recovery (Store.save_meta records) ----
    def restore(self, index: int, value: dict) -> None:
        body = {k: value.get(k) for k in ("pattern", "definition", "priority", "apply-to")}
        policy = parse_policy(value["vhost"], value["name"], body, operator=bool(index))
        self._tables[index].setdefault(policy.vhost, {})[policy.name] = policy
        self._ranked.pop((index, policy.vhost), None)

    def recovered(self) -> None:
        """After the store recreated queues and exchanges: apply what was restored."""
        for vhost in sorted(set(self._tables[0]) | set(self._tables[1])):
            self.apply_all(vhost)

    # ---- internals ----
    def _put(self, index: int, vhost: str, name: str, body: Any) -> dict:
        policy = parse_policy(vhost, name, body, operator=bool(index))
        if vhost not in self.services.vhosts:
            raise VhostNotFound(vhost)
        for check in POLICY_CHECKS:
            check(self, index, policy)
        self._store(index, policy)
        self._changed(vhost)
        return policy.as_dict()

    def _store(self, index: int, policy: Policy) -> None:
        self._tables[index].setdefault(policy.vhost, {})[policy.name] = policy
        self._ranked.pop((index, policy.vhost), None)
        self.services.store.save_meta((POLICY_KIND, OPERATOR_POLICY_KIND)[index],
                                    _meta_key(policy.vhost, policy.name), policy.as_dict())

    def _clear(self, index: int, vhost: str, name: str) -> None:
        table = self._tables[index].get(vhost)
        if not table or name not in table:
            raise PolicyNotFound(name)
        del table[name]
        if not table:
            del self._tables[index][vhost]
        self._ranked.pop((index, vhost), None)
        self._forget(index, vhost, name)
        self._changed(vhost)

    def _forget(self, index: int, vhost: str, name: str) -> None:
        self.services.store.delete_meta((POLICY_KIND, OPERATOR_POLICY_KIND)[index],
                                      _meta_key(vhost, name))

    def _get(self, index: int, vhost: str, name: str) -> dict:
        policy = self._tables[index].get(vhost, {}).get(name)
        if policy is None:
            raise PolicyNotFound(name)
        return policy.as_dict()

    def _all(self, index: int, vhost: str | None) -> list[Policy]:
        tables = self._tables[index]
        names = [vhost] if vhost is not None else sorted(tables)
        return [p for v in names for _, p in sorted(tables.get(v, {}).items())]

    def _list(self, index: int, vhost: str | None) -> list[dict]:
        return [p.as_dict() for p in self._all(index, vhost)]

    def _rank(self, index: int, vhost: str) -> list[Policy]:
        ranked = self._ranked.get((index, vhost))
        if ranked is None:
            table = self._tables[index].get(vhost, {})
            ranked = sorted(table.values(), key=lambda p: (-p.priority, p.name))
            self._ranked[(index, vhost)] = ranked
        return ranked

    def _match(self, index: int, vhost: str, kind: str, name: str,
               queue_type: Any = None) -> Policy | None:
        for policy in self._rank(index, vhost):
            if policy.applies(kind, name, queue_type):
                return policy
        return None

    def _apply_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        policy, operator, definition = self.effective(vhost.name, "queue", queue.name,
                                                      queue.queue_type)
        if (policy, operator, definition) != (queue.policy, queue.operator_policy,
                                              queue.effective_policy_definition):
            queue.apply_policy(policy, operator, definition)

    def _apply_exchange(self, vhost: VirtualHost, exchange) -> None:
        if exchange.name == "":
            return  # the default exchange takes no policy (nor an alternate exchange)
        policy, _operator, definition = self.effective(vhost.name, "exchange", exchange.name)
        if (policy, definition) != (exchange.policy, exchange.effective_policy_definition):
            exchange.apply_policy(policy, definition)

    def _changed(self, vhost: str) -> None:
        self.apply_all(vhost)
        for callback in list(self.on_change):
            try:
                callback(vhost)
            except Exception:
                log.exception("policy change callback failed for vhost %r", vhost)
