"""Avro-validated exchanges: the ``x-avro-schema`` exchange argument and the ``avro-schema``
policy key.

An exchange with a schema (its own ``x-avro-schema`` argument, else the ``avro-schema`` key
of the policy that applies to it; both the schema as JSON text) refuses publishes whose
body does not conform, every protocol's (the publish path's schema stage raises the 406,
which each origin answers in its own way); the AMQP channel checks first, to nack it in
confirm mode, otherwise it closes the channel with 406 PRECONDITION_FAILED naming the
field. A body is read as JSON when the message's
content_type is ``application/json`` (validated, stored unchanged), else as Avro binary
(schemaless, one record). Only exchanges with arguments or a policy pay for it: the channel
tests ``x.arguments or x.effective_policy_definition`` (usually both empty) before calling
``exchange_problem``.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .. import errors
from ..errors import Resource
from ..policies.validate import POLICY_CHECKS, POLICY_KEYS, PolicyError
from .avro import SchemaError, ValidationFailed, backward_problem, compiled

if TYPE_CHECKING:
    from ..vhost import VirtualHost

ARG = "x-avro-schema"
POLICY_KEY = "avro-schema"
JSON_TYPES = ("application/json", "text/json")


def _policy_problem(value) -> str | None:
    if not isinstance(value, str):
        return f"{value!r} is not a valid Avro schema (a JSON text)"
    try:
        compiled(value)
    except SchemaError as exc:
        return str(exc)
    return None


POLICY_KEYS.setdefault(POLICY_KEY, _policy_problem)


def _policy_evolution(policies, index: int, policy) -> None:
    """A policy whose ``avro-schema`` would replace the schema an exchange validates with
    now must be BACKWARD compatible with it, as a topic's new schema version must
    (messages written with the old schema are still in the queues): PolicyError naming the
    exchange otherwise. Exchanges with their own ``x-avro-schema`` argument keep it and
    are not affected; neither are those where another policy keeps precedence."""
    new = policy.definition.get(POLICY_KEY)
    vhost = policies.services.vhosts.get(policy.vhost)
    if index != 0 or not isinstance(new, str) or vhost is None:
        return
    for x in list(vhost.exchanges.values()):
        if not x.name or schema_text(x.arguments) is not None \
                or not policy.applies("exchange", x.name):
            continue
        old = x.effective_policy_definition.get(POLICY_KEY)
        if not isinstance(old, str) or old == new:
            continue
        current = x.policy
        if current is not None and current != policy.name:
            priority = policies.get_policy(policy.vhost, current)["priority"]
            if (-priority, current) < (-policy.priority, policy.name):
                continue  # the current policy still wins for this exchange
        problem = evolution_problem(old, new)
        if problem:
            raise PolicyError(f"avro-schema: not backward compatible with the schema exchange "
                              f"'{x.name}' in vhost '{policy.vhost}' validates with now: "
                              f"{problem}", POLICY_KEY)


if _policy_evolution not in POLICY_CHECKS:
    POLICY_CHECKS.append(_policy_evolution)


def schema_text(arguments: dict) -> str | None:
    value = arguments.get(ARG)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def validate_arguments(arguments: dict, resource: Resource) -> None:
    """406 for an ``x-avro-schema`` that is not a string holding a valid Avro schema."""
    if ARG not in arguments:
        return
    text = schema_text(arguments)
    if text is None:
        raise errors.precondition_failed("invalid arg '%s' for %s: {unacceptable_type,%s}", ARG,
                                         resource, type(arguments[ARG]).__name__)
    try:
        compiled(text)
    except SchemaError as exc:
        raise errors.precondition_failed("invalid arg '%s' for %s: %s", ARG, resource, exc) from None


def exchange_problem(x, body: bytes, properties: dict) -> str | None:
    """Why ``body`` does not conform to exchange ``x``'s schema (its argument first, then its
    policy's key), or None (also when it has none)."""
    text = schema_text(x.arguments)
    if text is None:
        value = x.effective_policy_definition.get(POLICY_KEY)
        text = value if isinstance(value, str) else None
    return None if text is None else _problem(text, body, properties)


def body_problem(arguments: dict, body: bytes, properties: dict) -> str | None:
    """Why ``body`` does not conform to the schema in ``arguments``, or None (also without one)."""
    text = schema_text(arguments)
    if text is None:
        return None
    return _problem(text, body, properties)


def _problem(text: str, body: bytes, properties: dict) -> str | None:
    schema = compiled(text)
    content_type = properties.get("content_type")
    try:
        if content_type and content_type.split(";")[0].strip().lower() in JSON_TYPES:
            try:
                datum = json.loads(body)
            except (ValueError, RecursionError) as exc:
                return f"invalid JSON: {exc}"
            schema.validate(datum)
        else:
            schema.check_binary(body)
    except ValidationFailed as exc:
        return str(exc)
    return None


def publish_refused(vhost: VirtualHost, exchange_name: str, problem: str):
    """The 406 a channel raises for a body that does not conform (outside confirm mode)."""
    return errors.precondition_failed("message rejected by the Avro schema of %s: %s",
                                      vhost.exchange_resource(exchange_name), problem)


def evolution_problem(old_text: str | None, new_text: str) -> str | None:
    """None if ``new_text`` may replace ``old_text`` (valid and BACKWARD compatible)."""
    try:
        new = compiled(new_text)
    except SchemaError as exc:
        return str(exc)
    if old_text is None:
        return None
    return backward_problem(compiled(old_text), new)
