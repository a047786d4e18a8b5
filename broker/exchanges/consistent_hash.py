"""x-consistent-hash: RabbitMQ's consistent-hash exchange plugin contract.

A binding's routing key is its *weight* (a positive integer): the binding owns that many
buckets. A message goes to the one destination whose bucket its hash falls into, so the
same key always reaches the same queue while the bindings stay the same — the basis of
partitioned, per-key ordered consumption (Hermes' partition keys, Kafka's partitions).

What is hashed: the routing key, or with the exchange argument ``hash-header`` that header's
value, or with ``hash-property`` that message property (``message_id``, ``correlation_id``
or ``timestamp``). A message without the header or property is not routed (it goes to the
alternate exchange or is returned if mandatory).

Buckets are chosen with jump consistent hashing (Lamping & Veach) over the bucket list, as
the plugin does since 3.8: adding a binding moves only the keys that now land in its new
buckets; removing one moves the last buckets into its holes, so only the keys of the
removed and the moved buckets change destination. The hash itself (CRC-32) differs from
RabbitMQ's ``erlang:phash2``: the distribution is as even, the exact placement is not the
same as RabbitMQ's for a given key.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

from .. import errors
from ..queues.group import GROUP_ARGUMENT
from .base import Binding, Exchange

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .base import BindingKey, Destination

HASH_PROPERTIES = ("message_id", "correlation_id", "timestamp")
PARTITIONS = "x-partitions"  # partition queues the exchange declares for one consumer group
MAX_PARTITIONS = 1024
MEMO_SIZE = 65536
_MASK64 = (1 << 64) - 1


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def jump_hash(key: int, buckets: int) -> int:
    """Lamping & Veach's jump consistent hash: a bucket in ``range(buckets)`` for ``key``."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & _MASK64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def weight_of(routing_key: str) -> int:
    """A binding key's weight; raises 406 as the plugin does for a bad one."""
    try:
        weight = int(routing_key)
    except ValueError:
        raise errors.precondition_failed(
            'The binding key must be an integer: <<"%s">>', routing_key) from None
    if weight < 1:
        raise errors.precondition_failed("The binding key must be greater than 0: %d", weight)
    return weight


class ConsistentHashExchange(Exchange):
    type_name = "x-consistent-hash"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hash_header: str | None = _text(self.arguments.get("hash-header"))
        self.hash_property: str | None = _text(self.arguments.get("hash-property"))
        self._buckets: list[Destination] = []  # bucket -> destination
        self._owner: list[BindingKey] = []  # bucket -> binding key that owns it
        # routing key -> destination, for exchanges hashing the routing key: partition keys
        # repeat, and a dict lookup is cheaper than CRC-32 plus the jump loop. Dropped on
        # every binding change, and whole when it reaches MEMO_SIZE keys.
        self._memo: dict[str, Destination] = {}

    @classmethod
    def argument_problem(cls, arguments: dict[str, Any]) -> str | None:
        parts = arguments.get(PARTITIONS)
        if parts is not None and (isinstance(parts, bool) or not isinstance(parts, int)
                                  or not 1 <= parts <= MAX_PARTITIONS):
            return f"{PARTITIONS} must be an integer from 1 to {MAX_PARTITIONS}, got {_text(parts)!r}"
        header = arguments.get("hash-header")
        prop = arguments.get("hash-property")
        if header is not None and prop is not None:
            return "hash-header and hash-property are mutually exclusive"
        if header is not None and not (isinstance(header, (bytes, str)) and _text(header)):
            return "hash-header must be a non-empty string"
        if prop is not None and _text(prop) not in HASH_PROPERTIES:
            return (f"hash-property must be one of {', '.join(HASH_PROPERTIES)}, "
                    f"got {_text(prop)!r}")
        return None

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        weight_of(routing_key)

    def declared(self, vhost: VirtualHost) -> None:
        """With ``x-partitions: N``, declare the partitions ``<name>-0`` … ``<name>-N-1``
        (as RabbitMQ names a super stream's), each bound with weight 1 and one consumer
        group named after the exchange (queues/group.py); durable if the exchange is."""
        count = self.arguments.get(PARTITIONS)
        if not count:
            return
        for i in range(count):
            q = vhost.ensure_queue(f"{self.name}-{i}", self.durable, {GROUP_ARGUMENT: self.name})
            vhost.bind(self.name, q, "1", {})

    def _index_add(self, binding: Binding) -> None:
        self._memo.clear()
        n = weight_of(binding.routing_key)
        self._buckets.extend([binding.destination] * n)
        self._owner.extend([binding.key] * n)

    def _index_remove(self, binding: Binding) -> None:
        self._memo.clear()
        owner = self._owner
        holes = [i for i, k in enumerate(owner) if k == binding.key]
        if not holes:
            return
        keep = len(owner) - len(holes)
        # The last buckets that survive fill the holes below the new end.
        tail = [i for i in range(keep, len(owner)) if owner[i] != binding.key]
        for hole, src in zip(sorted(h for h in holes if h < keep), tail, strict=True):
            owner[hole] = owner[src]
            self._buckets[hole] = self._buckets[src]
        del owner[keep:]
        del self._buckets[keep:]

    def _key_of(self, routing_key: str, headers: dict[str, Any] | None,
                properties: dict[str, Any] | None = None) -> bytes | None:
        if self.hash_header is not None:
            value = (headers or {}).get(self.hash_header)
        elif self.hash_property is not None:
            value = (properties or {}).get(self.hash_property)
        else:
            return routing_key.encode("utf-8", "surrogateescape")
        if value is None:
            return None
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        return str(value).encode("utf-8", "surrogateescape")

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        buckets = self._buckets
        if not buckets:
            return []
        if self.hash_header is None and self.hash_property is None:
            dest = self._memo.get(routing_key)
            if dest is None:
                raw = routing_key.encode("utf-8", "surrogateescape")
                dest = buckets[jump_hash(zlib.crc32(raw), len(buckets))]
                memo = self._memo
                if len(memo) >= MEMO_SIZE:
                    memo.clear()
                memo[routing_key] = dest
            return [dest]
        key = self._key_of(routing_key, headers, properties)
        if key is None:
            return []
        return [buckets[jump_hash(zlib.crc32(key), len(buckets))]]
