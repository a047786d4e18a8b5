"""Dispatch for a queue whose consumers have x-filter selectors or which has message
groups: looks past the head; not the plain dispatch (queue.py) nor selector parsing."""
from __future__ import annotations

from typing import TYPE_CHECKING, cast

from .entry import QueueEntry
from .ops import Op

if TYPE_CHECKING:
    from .queue import Queue

SELECT_WINDOW = 256  # messages a selective dispatch looks at past the head per pass


# Consumers with an x-filter (JMS selectors): a message goes to a consumer whose selector
# it matches; one that no consumer matches stays for later ones, and those behind it
# still flow -- up to SELECT_WINDOW of them per pass, so a backlog of unmatched messages
# costs a bounded scan. A consumer's own exclusive queue drops what its selector refuses
# (a subscription: nobody else will ever read it).
def dispatch_selective(queue: Queue) -> None:
    ready = queue.ready
    kept: list[QueueEntry] = []
    refused: list[QueueEntry] = []
    expired: list[QueueEntry] = []
    now = queue.vhost.timers.now()
    subscription = queue.exclusive_owner is not None and len(queue.consumers) == 1
    groups = queue.message_groups
    commit = queue.commit_seq
    while ready and len(kept) < SELECT_WINDOW:
        if commit is not None and cast("QueueEntry", ready.peek()).seq > commit:
            break
        entry = ready.popleft()
        queue.ready_bytes -= len(entry.message.body)
        if entry.expires_at is not None and entry.expires_at < now:
            expired.append(entry)
            continue
        matching = [c for c in queue.consumers
                    if c.selector is None or c.selector(entry.message)]
        if not matching:
            (refused if subscription else kept).append(entry)
            continue
        if groups is None:
            consumer = next((c for c in matching if c.can_take()), None)
        else:
            consumer = groups.choose(entry.message, matching)
        if consumer is None:
            kept.append(entry)
            if not any(c.can_take() for c in queue.consumers):
                break
            continue
        queue.deliver_to(consumer, entry)
        if groups is not None:
            groups.delivered(entry.message)
    for entry in reversed(kept):  # back in front, in their order
        ready.requeue(entry)
        queue.ready_bytes += len(entry.message.body)
    for entry in refused:
        queue._left(entry, Op.SETTLE)
    if expired:
        queue.discard(expired, "expired")
    if queue._expiry.at is not None or ready:
        queue._expiry.arm()
    if queue.flow_waiters:
        queue.flow_check()
