"""x-message-deduplication: the exchange of RabbitMQ's message-deduplication plugin.

A message carrying the header ``x-deduplication-header`` is routed only if no message with
the same value went through this exchange within the cache TTL; otherwise it is dropped
(not routed: the publisher is still confirmed). Messages without the header always pass.
Like the plugin's exchange it routes as a fanout.

Arguments, as the plugin: ``x-cache-size`` (required, a positive integer: at most that many
values are remembered, the oldest forgotten first), ``x-cache-ttl`` (optional, milliseconds;
a message's own ``x-cache-ttl`` header overrides it), ``x-cache-persistence`` (``memory``,
the default, or ``disk``).

With ``disk`` the cache also lives in an internal queue of the exchange's vhost
(``CacheQueue``, one tiny persistent marker message per value, the value as its body), so
it is written by whatever store the broker runs on and comes back after a restart or a
kill -9. The queue's own features do the bookkeeping: per-message TTL expires markers,
x-max-length (drop-head) evicts the oldest; the exchange forgets a value when its marker
leaves. A duplicate is "routed" to that queue, which drops it: its confirm then waits for
the store like the original's, so a duplicate is never confirmed ahead of the message it
repeats (a kill -9 in between would otherwise lose both).
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING, Any

from ..amqp.fields import encode_properties
from ..message import Message
from ..queues.args import parse_queue_arguments
from ..queues.dedup import DEDUP_HEADER, DIGEST_OVER, dedup_key
from ..queues.entry import QueueEntry
from ..queues.fifo import FifoReady
from ..queues.queue import Queue
from .base import Binding, Exchange

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .base import Destination

log = logging.getLogger("broker.exchanges.dedup")

TTL_HEADER = "x-cache-ttl"
CACHE_QUEUE_PREFIX = "amq.triomq.dedup."
_FOREVER = float("inf")
EVICT_BATCH_FROM = 4096  # memory caches this large forget their oldest values in batches

# cache queue name -> exchange name, for recovery (queue variants are looked up by name)
_CACHE_QUEUES: dict[str, str] = {}


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


def _memory_key(value: Any) -> Any:
    """The memory cache's key of a header value: the bytes of a text or bytes value (the
    same value either way), a digest of a long one, other types by type and repr."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    elif isinstance(value, bytearray):
        value = bytes(value)
    elif not isinstance(value, bytes):
        return ("r", type(value).__name__, repr(value))
    if len(value) >= DIGEST_OVER:
        return ("h", hashlib.blake2b(value, digest_size=32).digest())
    return value


def cache_queue_name(exchange_name: str) -> str:
    name = CACHE_QUEUE_PREFIX + exchange_name
    if len(name.encode("utf-8", "surrogateescape")) > 255:  # a shortstr
        name = CACHE_QUEUE_PREFIX + hashlib.sha256(exchange_name.encode(
            "utf-8", "surrogateescape")).hexdigest()
    return name


class _HeldFifo(FifoReady):
    """Markers stay in memory (a paging store swaps only plain FIFOs): they are tiny and
    bounded by x-cache-size, and the exchange keeps each one as its value's entry."""
    __slots__ = ()

    def last(self) -> QueueEntry:
        return self._q[-1]


class CacheQueue(Queue):
    """The internal queue holding one deduplication exchange's cache as marker messages."""

    internal = True  # invisible to clients: 404, never routed to by name

    def __init__(self, vhost: VirtualHost, name: str, durable: bool, size: int) -> None:
        opts = parse_queue_arguments({})
        opts.max_length = size
        self.exchange: MessageDeduplicationExchange | None = None
        super().__init__(vhost, name, durable=durable, arguments={}, opts=opts)

    def _new_ready(self) -> _HeldFifo:
        return _HeldFifo()

    def serve(self, exchange: MessageDeduplicationExchange | None) -> None:
        self.exchange = exchange

    def write(self, key: bytes, ttl_ms: int | None) -> QueueEntry:
        """Store a marker for ``key``; returns its entry (the newest, at the tail)."""
        props: dict[str, Any] = {"delivery_mode": 2}
        if ttl_ms is not None:
            props["expiration"] = str(ttl_ms)
        super().enqueue(Message("", self.name, encode_properties(props), props, key))
        ready = self.ready
        assert isinstance(ready, _HeldFifo)
        return ready.last()

    def enqueue(self, message: Message, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        """A routed message is a duplicate parked here only so that its confirm waits for
        the store: dropped. A stored marker handed back at start-up is adopted."""
        if entry is None:
            self.refused_id = message.id
            return True
        exchange = self.exchange
        if exchange is None:  # its exchange was deleted: forget the stored marker
            self.settled(entry)
            return True
        super().enqueue(message, entry=entry)
        exchange.adopt(entry, self.vhost.timers.now())
        return True

    def discard(self, entries: list[QueueEntry], reason: str) -> None:
        super().discard(entries, reason)
        exchange = self.exchange
        if exchange is not None:
            for entry in entries:
                exchange.forget(entry)


def _recovered_cache_queue(broker: object, vhost: VirtualHost, name: str,
                           **_queue_kwargs: Any) -> CacheQueue:
    """Queue-variant factory: a stored cache queue comes back serving its exchange
    (exchanges are recovered before queues), or empty and unserved if it is gone."""
    x = vhost.exchanges.get(_CACHE_QUEUES.get(name, ""))
    if isinstance(x, MessageDeduplicationExchange) and x.persistent_cache:
        q = CacheQueue(vhost, name, durable=True, size=x.cache_size)
        x.use_cache_queue(q)
        return q
    return CacheQueue(vhost, name, durable=True, size=1)


class MessageDeduplicationExchange(Exchange):
    type_name = "x-message-deduplication"
    clock: Callable[[], float] = staticmethod(time.monotonic)  # tests substitute a fake clock

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cache_size = _whole(self.arguments.get("x-cache-size")) or 1
        ttl = self.arguments.get("x-cache-ttl")
        self.cache_ttl = _whole(ttl) if ttl is not None else None  # ms, None: no expiry
        # disk cache: value key -> (expiry on self.clock, its marker entry, if written)
        self._seen: OrderedDict[bytes, tuple[float, QueueEntry | None]] = OrderedDict()
        # memory cache: value key (_memory_key) -> expiry on self.clock
        self._mem: dict[Any, float] = {}
        size = self.cache_size
        self._evict_at = size + (size >> 4 if size >= EVICT_BATCH_FROM else 0)
        self.dropped = 0
        self.persistent_cache = _text(self.arguments.get("x-cache-persistence")) == "disk"
        self._cache_queue: CacheQueue | None = None
        if self.persistent_cache:
            from ..queues.types import register_queue_variant

            _CACHE_QUEUES[cache_queue_name(self.name)] = self.name
            register_queue_variant(cache_queue_name(self.name), _recovered_cache_queue)

    @classmethod
    def argument_problem(cls, arguments: dict[str, Any]) -> str | None:
        # the plugin's texts
        if _whole(arguments.get("x-cache-size")) is None:
            return "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"
        ttl = arguments.get("x-cache-ttl")
        if ttl is not None and _whole(ttl) is None:
            return "Invalid argument, 'x-cache-ttl' must be an integer greater than 0"
        persistence = arguments.get("x-cache-persistence")
        if persistence is not None and (not isinstance(persistence, (str, bytes))
                                        or _text(persistence) not in ("memory", "disk")):
            return "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'"
        return None

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    @property
    def cache_queue(self) -> CacheQueue | None:
        return self._cache_queue

    @property
    def cached(self) -> int:
        return len(self._seen) if self.persistent_cache else len(self._mem)

    def is_duplicate(self, headers: dict[str, Any] | None) -> bool:
        """Whether a message with these headers repeats one seen within the TTL; a new
        value is remembered (so this is called once per message, by ``route``)."""
        if not headers:
            return False
        value = headers.get(DEDUP_HEADER)
        if value is None:
            return False
        if not self.persistent_cache:
            return self._memory_duplicate(value, headers)
        # dedup_key's result for the usual short longstr, inline
        key = (b"s" + value if type(value) is bytes and len(value) < DIGEST_OVER
               else dedup_key(value))
        if key is None:
            return False
        now = self.clock()
        seen = self._seen
        known = seen.get(key)
        if known is not None:
            if known[0] > now:
                return True
            del seen[key]
        own = headers.get(TTL_HEADER)
        ttl = (_whole(own) if own is not None else None) or self.cache_ttl
        self._remember(key, now + ttl / 1000 if ttl else _FOREVER, ttl)
        return False

    def _memory_duplicate(self, value: Any, headers: dict[str, Any]) -> bool:
        """``is_duplicate`` for a memory cache: value -> expiry in a plain dict (insertion
        ordered: the oldest first). The common short bytes value is its own key (nothing
        allocated); the clock is read only for values that can expire. The oldest values
        are forgotten in batches of a sixteenth of the cache (caches of 4,096 and more),
        so a large cache may hold up to 1/16 more than x-cache-size for a while."""
        key = value if type(value) is bytes and len(value) < DIGEST_OVER else _memory_key(value)
        seen = self._mem
        known = seen.get(key)
        if known is not None:
            if known is _FOREVER or known > self.clock():
                return True
            del seen[key]
        own = headers.get(TTL_HEADER)
        ttl = (_whole(own) if own is not None else None) or self.cache_ttl
        seen[key] = self.clock() + ttl / 1000 if ttl else _FOREVER
        if len(seen) > self._evict_at:
            for old in list(islice(seen, len(seen) - self.cache_size)):
                del seen[old]
        return False

    def _remember(self, key: bytes, expiry: float, ttl: int | None) -> None:
        if self.persistent_cache and self._cache_queue is None:
            self._find_vhost()
        q = self._cache_queue
        if q is None:
            self._seen[key] = (expiry, None)
            if len(self._seen) > self.cache_size:
                self._seen.popitem(last=False)
            return
        # the queue's x-max-length evicts the oldest marker, and forget() follows it
        self._seen[key] = (expiry, q.write(key, ttl))

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        if headers and not self.persistent_cache:
            # the memory cache's common case inline: a short bytes value, seen forever
            value = headers.get(DEDUP_HEADER)
            if (type(value) is bytes and len(value) < DIGEST_OVER and self.cache_ttl is None
                    and TTL_HEADER not in headers):
                seen = self._mem
                known = seen.get(value)
                if known is _FOREVER:
                    self.dropped += 1
                    return []
                if known is None:
                    seen[value] = _FOREVER
                    if len(seen) > self._evict_at:
                        for old in list(islice(seen, len(seen) - self.cache_size)):
                            del seen[old]
                    return [b.destination for b in self.bindings.values()]
                # remembered with a message's own x-cache-ttl: the general path below
        if self.is_duplicate(headers):
            self.dropped += 1
            q = self._cache_queue
            return [q] if q is not None and q.store is not None else []
        return [b.destination for b in self.bindings.values()]

    # ---- the cache on disk ----
    def _find_vhost(self) -> None:
        """The exchange learns its vhost from a queue it reaches (directly or through
        exchange-to-exchange bindings): the cache queue is created then."""
        stack = list(self.bindings.values())
        visited: set[int] = set()
        while stack:
            dest = stack.pop().destination
            if dest.kind == "queue":
                vhost = dest.vhost
                if vhost is not None and vhost.exchanges.get(self.name) is self:
                    self._attach(vhost)
                    return
            elif id(dest) not in visited:
                visited.add(id(dest))
                stack.extend(dest.bindings.values())

    def _attach(self, vhost: VirtualHost) -> None:
        name = cache_queue_name(self.name)
        left = vhost.queues.get(name)
        if left is not None:  # the cache of a deleted exchange of the same name
            vhost.delete_queue(left, reason="deduplication exchange redeclared")
        q = CacheQueue(vhost, name, durable=self.durable, size=self.cache_size)
        vhost.add_queue(q)
        self.use_cache_queue(q)
        now = self.clock()
        for key, (expiry, _marker) in list(self._seen.items()):
            ttl = None if expiry == _FOREVER else max(1, int((expiry - now) * 1000))
            self._seen[key] = (expiry, q.write(key, ttl))

    def use_cache_queue(self, q: CacheQueue) -> None:
        q.serve(self)
        self._cache_queue = q

    def adopt(self, entry: QueueEntry, timers_now: float) -> None:
        """Recovery: a stored marker (in store order, so a later one wins)."""
        key = entry.message.body
        expiry = _FOREVER
        if entry.expires_at is not None:
            expiry = self.clock() + (entry.expires_at - timers_now)
        self._seen.pop(key, None)
        self._seen[key] = (expiry, entry)

    def forget(self, entry: QueueEntry) -> None:
        """A marker left its queue (expired, evicted): forget its value unless a newer
        marker stands for it."""
        key = entry.message.body
        known = self._seen.get(key)
        if known is not None and known[1] is entry:
            del self._seen[key]
