"""Stream arguments (RabbitMQ 3.10's texts): ``x-max-age`` and
``x-stream-max-segment-size-bytes`` on declare, ``x-stream-offset`` and the 3.13 filter
arguments on basic.consume."""
from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from .args import ArgumentError, non_neg_int, register_queue_argument, text_arg

if TYPE_CHECKING:
    from ..streams import log

# RabbitMQ's units of x-max-age and of x-stream-offset intervals (rabbit_amqqueue)
_UNITS = {"Y": 365 * 86400, "M": 30 * 86400, "D": 86400, "h": 3600, "m": 60, "s": 1}
_AGE = re.compile(r"^(\d+)([YMDhms])$")


def age_seconds(text: str) -> int | None:
    """``7D``, ``1h``... in seconds; None if it is not one (or is zero)."""
    match = _AGE.match(text)
    if match is None or int(match.group(1)) == 0:
        return None
    return int(match.group(1)) * _UNITS[match.group(2)]


def max_age(name: str, value: object) -> str:
    text = text_arg(name, value)
    if age_seconds(text) is None:
        raise ArgumentError(name, "invalid_max_age")
    return text


register_queue_argument("x-max-age", max_age)
register_queue_argument("x-stream-max-segment-size-bytes", non_neg_int)


class OffsetSpecError(ValueError):
    """An x-stream-offset RabbitMQ cannot read (its channel crashes: 541)."""


def offset_spec(value: object, now: float | None = None) -> str | int | log.Timestamp:
    """The log's start (``"first"``, ``"last"``, ``"next"``, an offset, or a
    ``log.Timestamp``) for an ``x-stream-offset`` consumer argument; absent: ``"next"``."""
    from ..amqp.fields import Timestamp as AmqpTimestamp
    from ..streams.log import Timestamp
    if value is None:
        return "next"
    if isinstance(value, AmqpTimestamp):  # seconds since the epoch
        return Timestamp(int(value) * 1000)
    if isinstance(value, bool):
        raise OffsetSpecError(value)
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return value
        seconds = age_seconds(value)
        if seconds is not None:
            now = time.time() if now is None else now
            return Timestamp(int((now - seconds) * 1000))
    raise OffsetSpecError(value)


def stream_filter(arguments: dict[str, Any]) -> tuple[frozenset[str], bool] | None:
    """``x-stream-filter`` (a value or a list of values) and ``x-stream-match-unfiltered``
    of a consumer (RabbitMQ 3.13), or None without a filter."""
    raw = arguments.get("x-stream-filter")
    if raw is None:
        return None
    values = raw if isinstance(raw, list) else [raw]
    texts = frozenset(v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v)
                      for v in values)
    return texts, arguments.get("x-stream-match-unfiltered") is True
