"""x-max-length / x-max-length-bytes with the x-overflow behaviours.

Limits count ready messages only (as RabbitMQ does); drop-head discards (or
dead-letters with reason 'maxlen') from the front, reject-publish refuses the
new message (nacked under confirms), reject-publish-dlx also dead-letters it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .args import QueueOptions
    from .entry import QueueEntry
    from .queue import Queue


def is_limited(opts: QueueOptions) -> bool:
    return opts.max_length is not None or opts.max_length_bytes is not None


def would_overflow(queue: Queue, size: int) -> bool:
    opts = queue.opts
    if opts.max_length is not None and queue.message_count + 1 > opts.max_length:
        return True
    return opts.max_length_bytes is not None and queue.ready_bytes + size > opts.max_length_bytes


def over_limit(queue: Queue) -> bool:
    opts = queue.opts
    if opts.max_length is not None and queue.message_count > opts.max_length:
        return True
    return opts.max_length_bytes is not None and queue.ready_bytes > opts.max_length_bytes


def drop_head(queue: Queue) -> list[QueueEntry]:
    """Remove ready messages from the front until within limits; returns them. Only what is
    in memory can go: a backlog still being read from the SQL store counts towards the
    limits, and is dropped from once read, on the next publish."""
    dropped = []
    while len(queue.ready) and over_limit(queue):
        entry = queue.ready.popleft()
        queue.ready_bytes -= entry.message.size
        dropped.append(entry)
    return dropped
