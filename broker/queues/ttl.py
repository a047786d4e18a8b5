"""Message TTL: x-message-ttl on the queue and the per-message expiration property.

As in RabbitMQ, a message expires when it reaches the head of the queue (so a
long-lived message can shelter shorter ones behind it); a TTL of 0 means
"deliver now or never". One timer per queue, armed for the head's deadline.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .args import MAX_EXPIRY_MS

if TYPE_CHECKING:
    from ..timers import TimerHandle
    from .entry import QueueEntry
    from .queue import Queue


class ExpirationError(ValueError):
    pass


def parse_expiration(value: object) -> int | None:
    """The per-message expiration property in ms; RabbitMQ requires a non-negative integer string."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    if not text.isdigit():
        raise ExpirationError(f"invalid expiration '{text}': no_integer")
    ms = int(text)
    if ms > MAX_EXPIRY_MS:
        raise ExpirationError(f"invalid expiration '{text}': {{value_too_large,{ms}}}")
    return ms


def deadline(queue_ttl: int | None, properties: dict[str, Any], now: float) -> float | None:
    per_message = parse_expiration(properties.get("expiration"))
    ttls = [t for t in (queue_ttl, per_message) if t is not None]
    if not ttls:
        return None
    return now + min(ttls) / 1000.0


def is_expired(entry: QueueEntry, now: float) -> bool:
    return entry.expires_at is not None and entry.expires_at < now


class ExpiryTimer:
    """Keeps one timer armed at the ready head's deadline."""

    __slots__ = ("at", "handle", "queue")

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.handle: TimerHandle | None = None
        self.at: float | None = None

    def arm(self) -> None:
        head = self.queue.ready.peek()
        when = head.expires_at if head is not None else None
        if when == self.at:
            return
        self.cancel()
        if when is not None:
            self.at = when
            self.handle = self.queue.vhost.timers.call_at(when + 0.0005, self._fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.handle = None
        self.at = None

    def _fire(self) -> None:
        self.handle = None
        self.at = None
        self.queue.expire_ready(self.queue.vhost.timers.now())
        self.arm()
