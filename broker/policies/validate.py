"""Validation of policies and operator policies, apart from what they do.

Texts are RabbitMQ 3.10's (``rabbit_policies``, ``rabbit_mirror_queue_misc``,
``rabbit_policy``), so the management API can answer ``400 {"error": "bad_request",
"reason": "Validation failed\\n\\n<text>\\n"}`` as RabbitMQ does. Values are the JSON
values a definition holds (int, float, str, bool, list, dict).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ..queues.stream_args import age_seconds
from ..queues.types import QUEUE_APPLY_TO


class PolicyError(ValueError):
    """A policy that is refused; ``text`` is RabbitMQ's explanation, ``key`` the offending
    field or definition key (None when the error is about the whole definition)."""

    def __init__(self, text: str, key: str | None = None):
        super().__init__(text)
        self.text = text
        self.key = key

    @property
    def reason(self) -> str:
        """The management API's ``reason`` for a 400, as RabbitMQ words it."""
        return f"Validation failed\n\n{self.text}\n"


class PolicyNotFound(LookupError):
    """No policy (or operator policy) of that name in that vhost."""


class VhostNotFound(LookupError):
    """The vhost does not exist (RabbitMQ's HTTP API: 404 ``vhost_not_found``)."""


# RabbitMQ 3.12+ (4.x): a queue type's own value (classic_queues, quorum_queues, streams)
# selects only queues of that type; "queues" every queue
APPLY_TO = (*QUEUE_APPLY_TO, "exchanges", "all")


def erl(value: Any) -> str:
    """A JSON value as RabbitMQ prints it in these texts (``~p`` of the decoded term)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'<<"{value}">>'
    if isinstance(value, list):
        return "[" + ",".join(erl(v) for v in value) + "]"
    if isinstance(value, dict):
        return "[" + ",".join(f"{{{erl(k)},{erl(v)}}}" for k, v in value.items()) + "]"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, float) else str(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_neg_int(what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if _is_int(value) and value >= 0 else f"{erl(value)} is not a valid {what}"
    return check


def _positive_int(what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if _is_int(value) and value >= 1 else f"{erl(value)} is not a valid {what}"
    return check


def _text(what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) else f"{erl(value)} is not a valid {what}"
    return check


def _choice(choices: tuple, text: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if value in choices and isinstance(value, str) else text % erl(value)
    return check


def _audit(value: Any) -> str | None:
    # this broker's key (broker/audit): on/off for the queues and exchanges it matches
    return None if isinstance(value, bool) else f"{erl(value)} is not a valid audit value"


def _message_groups(value: Any) -> str | None:
    return None if isinstance(value, bool) else \
        f"{erl(value)} is not a valid message-groups value"


def _queue_version(value: Any) -> str | None:
    return None if _is_int(value) and value in (1, 2) else \
        f"{erl(value)} is not a valid queue-version value"


def _any(value: Any) -> str | None:
    return None  # checked with the other ha-* keys, as a whole (see _ha_problem)


def _max_age(value: Any) -> str | None:
    ok = isinstance(value, str) and age_seconds(value) is not None
    return None if ok else f"{erl(value)} is not a valid max age"


def _segment_size(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else f"{erl(value)} is not a valid segment size"


# key -> check(value) -> RabbitMQ's text or None
POLICY_KEYS: dict[str, Callable[[Any], str | None]] = {
    "message-ttl": _non_neg_int("message TTL"),
    "expires": _positive_int("queue expiry"),
    "max-length": _non_neg_int("maximum length"),
    "max-length-bytes": _non_neg_int("maximum length in bytes"),
    "max-in-memory-length": _non_neg_int("maximum memory in bytes"),
    "max-in-memory-bytes": _non_neg_int("maximum memory in bytes"),
    "overflow": _choice(("drop-head", "reject-publish", "reject-publish-dlx"),
                        "%s is not a valid overflow value"),
    "dead-letter-exchange": _text("dead letter exchange name"),
    "dead-letter-routing-key": _text("dead letter routing key"),
    "delivery-limit": _non_neg_int("delivery limit"),
    "consumer-timeout": _non_neg_int("consumer timeout"),  # ms (RabbitMQ 3.12+)
    "alternate-exchange": _text("alternate exchange name"),
    "queue-mode": _choice(("default", "lazy"), "%s is not a valid queue-mode value"),
    "queue-version": _queue_version,
    "queue-master-locator": _choice(("min-masters", "client-local", "random"),
                                    "%s invalid queue-master-locator value"),
    "audit": _audit,
    # this broker's key (queues/message_groups.py): ActiveMQ's JMSXGroupID groups on the
    # queues it matches, as the x-message-groups argument
    "message-groups": _message_groups,
    "max-age": _max_age,  # streams
    "stream-max-segment-size-bytes": _segment_size,
    "ha-mode": _any,
    "ha-params": _any,
    "ha-sync-mode": _any,
    "ha-sync-batch-size": _any,
    "ha-promote-on-shutdown": _any,
    "ha-promote-on-failure": _any,
}
# check(policies, index, policy) run before a policy is stored (PolicyError refuses it), for
# keys whose validity depends on the entities the policy would apply to
POLICY_CHECKS: list[Callable[[Any, int, Any], None]] = []
# What an operator policy may set (RabbitMQ 3.10's operator_policy_validator registry).
OPERATOR_POLICY_KEYS = frozenset({
    "message-ttl", "expires", "max-length", "max-length-bytes", "max-in-memory-length",
    "max-in-memory-bytes", "delivery-limit",
})

HA_KEYS = ("ha-mode", "ha-params", "ha-sync-mode", "ha-sync-batch-size",
           "ha-promote-on-shutdown", "ha-promote-on-failure")


def _ha_problem(definition: dict) -> tuple[str, str] | None:
    """The ha-* keys are checked together (``rabbit_mirror_queue_misc:validate_policy``):
    (key, text) of the first problem, or None."""
    if not any(k in definition for k in HA_KEYS):
        return None
    mode = definition.get("ha-mode")
    if mode is None:
        return ("ha-mode", "ha-mode must be specified to specify ha-params, ha-sync-mode or "
                           "ha-promote-on-shutdown")
    if mode not in ("all", "exactly", "nodes"):
        return ("ha-mode", f"{erl(mode)} is not a valid ha-mode value")
    params = definition.get("ha-params")
    if mode == "all" and "ha-params" in definition:
        return ("ha-params", 'ha-mode="all" does not take parameters')
    if mode == "exactly" and not (isinstance(params, int) and not isinstance(params, bool)
                                  and params > 0):
        return ("ha-params", f'ha-mode="exactly" takes an integer, '
                             f'{"none" if params is None else erl(params)} given')
    if mode == "nodes":
        if not isinstance(params, list):
            return ("ha-params", f'ha-mode="nodes" takes a list, '
                                 f'{"none" if params is None else erl(params)} given')
        if not params:
            return ("ha-params", 'ha-mode="nodes" list must be non-empty')
        for node in params:
            if not isinstance(node, str):
                return ("ha-params", f'ha-mode="nodes" takes a list of strings, '
                                     f'{erl(params)} was not a string')
    sync = definition.get("ha-sync-mode")
    if sync is not None and sync not in ("manual", "automatic"):
        return ("ha-sync-mode", f'ha-sync-mode must be "manual" or "automatic", got {erl(sync)}')
    batch = definition.get("ha-sync-batch-size")
    if batch is not None and not (_is_int(batch) and batch > 0):
        return ("ha-sync-batch-size",
                f"ha-sync-batch-size takes an integer greater than 0, {erl(batch)} given")
    for key in ("ha-promote-on-shutdown", "ha-promote-on-failure"):
        value = definition.get(key)
        if value is not None and value not in ("always", "when-synced"):
            return (key, f'{key} must be "always" or "when-synced", got {erl(value)}')
    return None


def validate_definition(definition: Any, operator: bool = False) -> dict:
    """Check a policy's definition; returns it (a new dict). Raises PolicyError naming
    the key: unknown keys first (all of them, as RabbitMQ lists them), then each key's
    value in name order, then the ha-* keys together."""
    if not isinstance(definition, dict):
        raise PolicyError(f"definition should be a JSON object, actually was {erl(definition)}",
                          "definition")
    if not definition:
        raise PolicyError("no policy provided", "definition")
    allowed = OPERATOR_POLICY_KEYS if operator else POLICY_KEYS
    unknown = sorted(k for k in definition if k not in allowed)
    if unknown:
        listed = ",".join(f"{{{erl(k)},{erl(definition[k])}}}" for k in unknown)
        raise PolicyError(f"[{listed}] are not recognised policy settings", unknown[0])
    for key in sorted(definition):
        problem = POLICY_KEYS[key](definition[key])
        if problem:
            raise PolicyError(problem, key)
    ha = _ha_problem(definition)
    if ha is not None:
        key, text = ha
        # RabbitMQ words a bad ha-params after the ha-mode it does not fit; say which key it is
        raise PolicyError(text if text.startswith(key) else f"{key}: {text}", key)
    return dict(definition)


def compile_pattern(pattern: Any) -> re.Pattern:
    """A policy's pattern (an unanchored regular expression over the entity name)."""
    if not isinstance(pattern, str):
        raise PolicyError(f"pattern should be a binary but was {erl(pattern)}", "pattern")
    try:
        return re.compile(pattern)
    except re.error as exc:
        pos = (exc.pos or 0) + 1
        raise PolicyError(f'pattern should be regular expression but is invalid: '
                          f'{{"{exc.msg}",{pos}}}', "pattern") from None


def validate_apply_to(apply_to: Any) -> str:
    if apply_to not in APPLY_TO or not isinstance(apply_to, str):
        raise PolicyError(f"apply-to '{apply_to}' unrecognised; should be one of: 'queues', "
                          f"'classic_queues', 'quorum_queues', 'streams', 'exchanges', or "
                          f"'all'", "apply-to")
    return apply_to


def validate_priority(priority: Any) -> int | float:
    if isinstance(priority, bool) or not isinstance(priority, (int, float)):
        raise PolicyError(f"priority should be a number, actually was {erl(priority)}",
                          "priority")
    return priority


def validate_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise PolicyError(f"name should be a non-empty string, actually was {erl(name)}", "name")
    return name
