"""x-message-deduplication on a queue: the queue level of RabbitMQ's message-deduplication plugin.

A message whose ``x-deduplication-header`` value is already *in the queue* (ready, or
delivered and not yet settled) is dropped on arrival: it was routed, so the publisher is
confirmed and a mandatory one is not returned, as the plugin's ``is_duplicate``. The value
becomes free again when that message leaves -- acked, no-ack delivery, rejected, expired,
dead-lettered, dropped by max-length, purged. A message whose TTL has run out no longer
counts, even while it waits behind the head (the plugin gives its cache entry that TTL).

State is one dict entry per value in the queue; nothing is stored: at start-up it is
rebuilt from the entries the store hands back. So the messages of such a queue are kept
in memory (``unpaged``): a paging store would restore them without reading their headers.

``dedup_key`` is shared with the exchange (``exchanges/dedup.py``).
"""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, cast

from . import ttl
from .fifo import FifoReady
from .priority import PriorityReady

if TYPE_CHECKING:
    from ..message import Message
    from .entry import QueueEntry
    from .queue import Queue
    from .ready import ReadyStore

DEDUP_HEADER = "x-deduplication-header"
ARGUMENT = "x-message-deduplication"
# Longer values are remembered by digest: the plugin takes values of any length, and the
# cache stays bounded in bytes as well as in entries.
DIGEST_OVER = 128


def dedup_key(value: Any) -> bytes | None:
    """The cache key of a header value: text and bytes of the same value are one key,
    other types keep their type (1 and "1" differ); None for a void value."""
    if value is None:
        return None
    if isinstance(value, str):
        key = b"s" + value.encode("utf-8", "surrogateescape")
    elif isinstance(value, (bytes, bytearray)):
        key = b"s" + bytes(value)
    else:
        key = b"r" + repr(value).encode("utf-8", "backslashreplace")
    if len(key) > DIGEST_OVER:
        key = b"h" + hashlib.blake2b(key, digest_size=32).digest()
    return key


def header_key(properties: dict[str, Any]) -> bytes | None:
    headers = properties.get("headers")
    if not headers or DEDUP_HEADER not in headers:
        return None
    return dedup_key(headers[DEDUP_HEADER])


class _HeldFifo(FifoReady):
    """A FIFO a paging store leaves in memory (``Queue.attach_store`` swaps only plain ones)."""
    __slots__ = ()


class _HeldPriority(PriorityReady):
    __slots__ = ()


class QueueDedup:
    """The values present in one queue: key -> [copies present, latest deadline or None]."""

    __slots__ = ("dropped", "present", "queue")

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.present: dict[bytes, list[Any]] = {}  # [int, float | None]
        self.dropped = 0

    def unpaged(self, ready: ReadyStore) -> ReadyStore:
        if type(ready) is FifoReady:
            return _HeldFifo()
        if type(ready) is PriorityReady:
            opts = self.queue.opts
            # a PriorityReady: the queue has an x-max-priority
            return _HeldPriority(cast("int", opts.max_priority), opts.two_level_priority)
        return ready

    def admit(self, message: Message, entry: QueueEntry | None) -> bool:
        """False if ``message`` duplicates one in the queue (the caller drops it). A new
        value, or a stored ``entry`` handed back at start-up, is remembered."""
        key = header_key(message.properties)
        if key is None:
            return True
        seen = self.present.get(key)
        if entry is not None:
            deadline = entry.expires_at
        else:
            q = self.queue
            now = q.vhost.timers.now()
            if seen is not None and (seen[1] is None or seen[1] >= now):
                self.dropped += 1
                return False
            deadline = None
            if q.opts.message_ttl is not None or "expiration" in message.properties:
                deadline = ttl.deadline(q.opts.message_ttl, message.properties, now)
        if seen is None:
            self.present[key] = [1, deadline]
        else:
            seen[0] += 1
            seen[1] = None if deadline is None or seen[1] is None else max(seen[1], deadline)
        return True

    def left(self, entry: QueueEntry) -> None:
        message = entry.message
        if message is None:
            return
        key = header_key(message.properties)
        if key is None:
            return
        seen = self.present.get(key)
        if seen is not None:
            seen[0] -= 1
            if seen[0] <= 0:
                del self.present[key]


def make_queue_dedup(queue: Queue) -> QueueDedup | None:
    return QueueDedup(queue) if queue.opts.extra.get(ARGUMENT) else None
