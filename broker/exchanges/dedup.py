"""x-message-deduplication: the exchange of RabbitMQ's message-deduplication plugin.

A message carrying the header ``x-deduplication-header`` is routed only if no message with
the same value went through this exchange within the cache TTL; otherwise it is dropped
(not routed: the publisher is still confirmed, and a mandatory one is returned). Messages
without the header always pass. Like the plugin's exchange it routes as a fanout.

Arguments, as the plugin: ``x-cache-size`` (required, a positive integer: at most that many
values are remembered, the oldest forgotten first), ``x-cache-ttl`` (optional, milliseconds;
a message's own ``x-cache-ttl`` header overrides it), ``x-cache-persistence`` (``memory``,
the default; ``disk`` is refused: the cache is not written to the store yet).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .base import Binding, Exchange

DEDUP_HEADER = "x-deduplication-header"
TTL_HEADER = "x-cache-ttl"


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _whole(value: Any) -> int | None:
    """A positive whole number from an int or a numeric string (the plugin accepts both)."""
    value = _text(value)
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    return value if isinstance(value, int) and value > 0 else None


class MessageDeduplicationExchange(Exchange):
    type_name = "x-message-deduplication"
    clock: Callable[[], float] = staticmethod(time.monotonic)  # tests substitute a fake clock

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cache_size = _whole(self.arguments.get("x-cache-size")) or 1
        ttl = self.arguments.get("x-cache-ttl")
        self.cache_ttl = _whole(ttl) if ttl is not None else None  # ms, None: no expiry
        self._seen: OrderedDict[Any, float] = OrderedDict()  # value -> expiry (monotonic s)
        self.dropped = 0

    @classmethod
    def argument_problem(cls, arguments: dict) -> str | None:
        if _whole(arguments.get("x-cache-size")) is None:
            return "x-cache-size must be a positive integer (the deduplication cache's size)"
        ttl = arguments.get("x-cache-ttl")
        if ttl is not None and _whole(ttl) is None:
            return "x-cache-ttl must be a positive integer (milliseconds)"
        persistence = _text(arguments.get("x-cache-persistence", "memory"))
        if persistence == "disk":
            return "x-cache-persistence 'disk' is not supported (the cache is kept in memory)"
        if persistence != "memory":
            return f"x-cache-persistence must be 'memory', got {persistence!r}"
        return None

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    def is_duplicate(self, headers: dict | None) -> bool:
        """Whether a message with these headers repeats one seen within the TTL; a new
        value is remembered (so this is called once per message, by ``route``)."""
        if not headers:
            return False
        value = headers.get(DEDUP_HEADER)
        if value is None:
            return False
        key = _text(value)
        if isinstance(key, (dict, list)):
            key = repr(key)
        now = self.clock()
        seen = self._seen
        expiry = seen.get(key)
        if expiry is not None:
            if expiry > now:
                return True
            del seen[key]
        own = headers.get(TTL_HEADER)
        ttl = _whole(own) if own is not None else self.cache_ttl
        seen[key] = now + ttl / 1000 if ttl else float("inf")
        if len(seen) > self.cache_size:
            seen.popitem(last=False)
        return False

    def route(self, routing_key: str, headers: dict | None,
              properties: dict | None = None) -> list:
        if self.is_duplicate(headers):
            self.dropped += 1
            return []
        return [b.destination for b in self.bindings.values()]
