"""A message's place in one queue."""
from __future__ import annotations


class QueueEntry:
    __slots__ = (
        "delivery_count",
        "expires_at",
        "loc",
        "message",
        "priority",
        "redelivered",
        "seq",
    )

    def __init__(self, message, seq: int, expires_at: float | None = None, priority: int = 0):
        self.message = message
        self.seq = seq  # position in the queue, kept when requeued
        self.redelivered = False
        self.expires_at = expires_at
        self.delivery_count = 0
        self.priority = priority
        self.loc = 0  # where a store keeps the message (journal location), 0 = not stored
