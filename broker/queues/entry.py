"""A message's place in one queue."""
from __future__ import annotations

from typing import Any


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

    def __init__(self, message: Any, seq: int, expires_at: float | None = None, priority: int = 0):
        # a Message, or a store's placeholder (None) for one not read back yet
        self.message = message
        self.seq = seq  # position in the queue, kept when requeued
        self.redelivered = False
        self.expires_at = expires_at
        self.delivery_count = 0
        self.priority = priority
        self.loc = 0  # where a store keeps the message (journal location), 0 = not stored
