"""Validation of queue arguments, apart from the features that act on them.

Texts follow RabbitMQ's: ``invalid arg 'x-max-length' for queue 'q' in vhost '/':
{value_negative,-1}`` and the ``inequivalent arg`` family for redeclarations.
Validators are registered per argument so later features (retry, delivery
limits) add theirs without touching this table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..amqp.fields import Long, Timestamp


class ArgumentError(ValueError):
    """An invalid value; ``detail`` is RabbitMQ's Erlang-term style reason."""

    def __init__(self, name: str, detail: str):
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


def amqp_type_name(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, Long):
        return "long"
    if isinstance(value, int):
        return "signedint" if -2**31 <= value < 2**31 else "long"
    if isinstance(value, (bytes, str)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


def _as_text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def _erl(value: object) -> str:
    if isinstance(value, (bytes, str)):
        return f'<<"{_as_text(value)}">>'
    return str(value)


def int_arg(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(name, f'"expected integer, got {amqp_type_name(value)}"')
    return value


def non_neg_int(name: str, value: object) -> int:
    value = int_arg(name, value)
    if value < 0:
        raise ArgumentError(name, f"{{value_negative,{value}}}")
    return value


def positive_int(name: str, value: object) -> int:
    value = non_neg_int(name, value)
    if value == 0:
        raise ArgumentError(name, "{value_zero,0}")
    return value


def text_arg(name: str, value: object) -> str:
    text = _as_text(value)
    if text is None:
        raise ArgumentError(name, f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return text


def one_of(*choices: str, reason: str | None = None) -> Callable[[str, object], str]:
    def check(name: str, value: object) -> str:
        text = text_arg(name, value)
        if text not in choices:
            raise ArgumentError(name, reason or f"{{invalid_value,{_erl(value)}}}")
        return text
    return check


class TypeArgumentError(ArgumentError):
    """RabbitMQ words a wrong type for some arguments differently (whole text given)."""


def exchange_name_arg(name: str, value: object) -> str:
    text = _as_text(value)
    if text is None:
        raise TypeArgumentError(name, amqp_type_name(value))
    return text


def bool_arg(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(name, f"{{unacceptable_type,{amqp_type_name(value)}}}")
    return value


def max_priority(name: str, value: object) -> int:
    value = non_neg_int(name, value)
    if value > 255:
        raise ArgumentError(name, f"{{max_value_exceeded,{value}}}")
    return value


# The longest x-message-ttl, x-expires and per-message expiration RabbitMQ accepts, in ms
# (ten years: rabbit_misc:check_expiry; 3.10 refuses 315360000001 with {value_too_large,N}).
MAX_EXPIRY_MS = 315_360_000_000


def message_ttl(name: str, value: object) -> int:
    value = non_neg_int(name, value)
    if value > MAX_EXPIRY_MS:
        raise ArgumentError(name, f"{{value_too_large,{value}}}")
    return value


def expires(name: str, value: object) -> int:
    value = positive_int(name, value)
    if value > MAX_EXPIRY_MS:
        raise ArgumentError(name, f"{{value_too_large,{value}}}")
    return value


QUEUE_TYPE_NAMES = ("classic", "quorum", "stream")  # what queues/types.py defines


def queue_type_arg(name: str, value: object) -> str:
    text = text_arg(name, value)
    if text not in QUEUE_TYPE_NAMES:
        raise ArgumentError(name, f'"unsupported queue type \'{text}\'"')
    return text


#: A validator: (argument name, value) -> the normalised value; raises ArgumentError.
Validator = Callable[[str, Any], Any]

# name -> validator returning the normalised value
QUEUE_ARGUMENTS: dict[str, Validator] = {
    "x-message-ttl": message_ttl,
    "x-expires": expires,
    "x-max-length": non_neg_int,
    "x-max-length-bytes": non_neg_int,
    "x-overflow": one_of("drop-head", "reject-publish", "reject-publish-dlx",
                         reason="invalid_overflow"),
    "x-dead-letter-exchange": exchange_name_arg,
    "x-dead-letter-routing-key": exchange_name_arg,
    "x-max-priority": max_priority,
    "x-single-active-consumer": bool_arg,
    "x-queue-type": queue_type_arg,
    "x-queue-mode": one_of("default", "lazy"),
    # the message-deduplication plugin's queue argument (queues/dedup.py); like every
    # plugin argument it is outside RabbitMQ's equivalence list
    "x-message-deduplication": bool_arg,
}

# Arguments whose values must match on redeclaration (RabbitMQ's equivalence list).
EQUIVALENCE_CHECKED = frozenset({
    "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow",
    "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-priority",
    "x-single-active-consumer", "x-queue-type",
})


def register_queue_argument(name: str, validator: Validator, equivalence: bool = True) -> None:
    global EQUIVALENCE_CHECKED
    QUEUE_ARGUMENTS[name] = validator
    if equivalence:
        EQUIVALENCE_CHECKED = EQUIVALENCE_CHECKED | {name}


@dataclass
class QueueOptions:
    """Normalised view of a queue's arguments, read by the feature modules."""
    message_ttl: int | None = None
    expires: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    # quorum queues: two levels (0-4 normal, 5+ high) served 2:1 (``priority.py``)
    two_level_priority: bool = False
    single_active_consumer: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


_OPTION_FIELDS = {
    "x-message-ttl": "message_ttl",
    "x-expires": "expires",
    "x-max-length": "max_length",
    "x-max-length-bytes": "max_length_bytes",
    "x-overflow": "overflow",
    "x-dead-letter-exchange": "dead_letter_exchange",
    "x-dead-letter-routing-key": "dead_letter_routing_key",
    "x-max-priority": "max_priority",
    "x-single-active-consumer": "single_active_consumer",
}


def parse_queue_arguments(arguments: dict[str, Any]) -> QueueOptions:
    """Validate and normalise; raises ArgumentError naming the first bad argument."""
    opts = QueueOptions()
    for name, value in (arguments or {}).items():
        validator = QUEUE_ARGUMENTS.get(name)
        if validator is None:
            continue  # RabbitMQ ignores arguments it does not know
        normalised = validator(name, value)
        attr = _OPTION_FIELDS.get(name)
        if attr is not None:
            setattr(opts, attr, normalised)
        else:
            opts.extra[name] = normalised
    if opts.dead_letter_routing_key is not None and opts.dead_letter_exchange is None:
        raise ArgumentError("x-dead-letter-routing-key", "routing_key_but_no_dlx_defined")
    return opts


def describe(value: object, verbose: bool = False) -> str:
    """RabbitMQ: plain 'v' when both sides have a value, typed when the other side is none."""
    if value is None:
        return "none"
    shown = _as_text(value)
    if shown is None:
        shown = str(value).lower() if isinstance(value, bool) else str(value)
    if verbose:
        return f"the value '{shown}' of type '{amqp_type_name(value)}'"
    return f"'{shown}'"


def equivalence_mismatch(current: dict[str, Any], received: dict[str, Any]) -> str | None:
    """Name and texts of the first checked argument that differs, as RabbitMQ words it."""
    for name in sorted(EQUIVALENCE_CHECKED):
        a, b = current.get(name), received.get(name)
        if name == "x-queue-type" and (b is None or _norm(a or "classic") == _norm(b)):
            continue  # RabbitMQ 4: no type is the queue's own; none is classic
        if _norm(a) != _norm(b):
            return f"inequivalent arg '{name}' for queue '{{queue}}' in vhost '{{vhost}}': " \
                   f"received {describe(b, a is None)} but current is {describe(a, b is None)}"
    return None


def _norm(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


# Policy keys as RabbitMQ 3.10's classic queue resolves them against its x- arguments
# (rabbit_amqqueue_process:process_args_policy): the lower value wins for these...
_POLICY_MIN = (("message-ttl", "message_ttl"), ("expires", "expires"),
               ("max-length", "max_length"), ("max-length-bytes", "max_length_bytes"))
# ...and the queue's own argument wins for these.
_POLICY_ARG_WINS = (("overflow", "overflow"), ("dead-letter-exchange", "dead_letter_exchange"),
                    ("dead-letter-routing-key", "dead_letter_routing_key"))


def with_policy(base: QueueOptions, arguments: dict[str, Any],
                definition: dict[str, Any]) -> QueueOptions:
    """The options a queue runs with: ``base`` (parsed from its ``arguments``) combined
    with a policy ``definition`` (already validated, operator policy merged in). Numeric
    limits take the lower of argument and policy; overflow and dead-lettering keep the
    argument when there is one; ``delivery-limit`` takes the lower, in ``extra``."""
    if not definition:
        return base
    opts = replace(base, extra=dict(base.extra))
    for key, attr in _POLICY_MIN:
        value = definition.get(key)
        if value is not None:
            have = getattr(base, attr)
            setattr(opts, attr, value if have is None else min(have, value))
    for key, attr in _POLICY_ARG_WINS:
        value = definition.get(key)
        if value is not None and "x-" + key not in arguments:
            setattr(opts, attr, value)
    limit = definition.get("delivery-limit")
    if limit is not None:
        have = base.extra.get("x-delivery-limit")
        opts.extra["x-delivery-limit"] = limit if have is None else min(have, limit)
    groups = definition.get("message-groups")
    if groups is not None and "x-message-groups" not in arguments:
        opts.extra["x-message-groups"] = groups  # (the argument wins, as for overflow)
    return opts
