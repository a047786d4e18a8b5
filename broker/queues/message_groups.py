"""JMS message groups (ActiveMQ's ``JMSXGroupID``) on one queue: the messages of a group
go to one consumer at a time, in order.

A queue declared with ``x-message-groups: true`` keeps, for each group id it has seen, the
consumer that owns the group. The first message of a group goes to whichever consumer the
queue would pick (the one holding the fewest groups among those with credit) and makes it
the owner; later messages of the group wait for that consumer while it has no credit
(messages of other groups and ungrouped ones pass them). A message with ``JMSXGroupSeq``
-1 closes its group once delivered; an owner that leaves gives its groups up, and the next
message of each (its unacknowledged ones come back first, requeued) picks a new owner.

The group id is the header ``JMSXGroupID`` (AMQP 0-9-1 and STOMP headers; AMQP 1.0's
``group-id`` property arrives as that header, ``group-sequence`` as ``JMSXGroupSeq``).
The queue dispatches through its selective path while the feature is on
(``selective.dispatch_selective``); queues without the argument never look at a header.
The policy key ``message-groups`` (true/false) turns groups on or off for the queues it
matches (a queue's own argument wins), so a vhost can group every queue as ActiveMQ does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .args import bool_arg, register_queue_argument

if TYPE_CHECKING:
    from ..message import Message
    from .args import QueueOptions
    from .queue import Consumer, Queue

GROUPS_ARGUMENT = "x-message-groups"
GROUP_ID = "JMSXGroupID"
GROUP_SEQ = "JMSXGroupSeq"

register_queue_argument(GROUPS_ARGUMENT, bool_arg)


def group_id(message: Message) -> str | None:
    headers = message.properties.get("headers")
    if not headers:
        return None
    gid = headers.get(GROUP_ID)
    if gid is None:
        return None
    if isinstance(gid, (bytes, bytearray)):
        return bytes(gid).decode("utf-8", "replace")
    return str(gid)


class MessageGroups:
    """Group id -> owning consumer, for one queue."""

    def __init__(self) -> None:
        self.owner: dict[str, Consumer] = {}
        self._held: dict[Consumer, int] = {}  # consumer -> groups it owns

    def choose(self, message: Message, matching: list[Consumer]) -> Consumer | None:
        """The consumer ``message`` goes to now, or None (it waits)."""
        gid = group_id(message)
        if gid is None:
            return next((c for c in matching if c.can_take()), None)
        owner = self.owner.get(gid)
        if owner is not None:
            return owner if owner in matching and owner.can_take() else None
        ready = [c for c in matching if c.can_take()]
        if not ready:
            return None
        held = self._held
        owner = min(ready, key=lambda c: held.get(c, 0))
        self.owner[gid] = owner
        held[owner] = held.get(owner, 0) + 1
        return owner

    def delivered(self, message: Message) -> None:
        """A group ends with the delivery of its message of sequence -1."""
        headers = message.properties.get("headers")
        if not headers or headers.get(GROUP_SEQ) != -1:
            return
        gid = group_id(message)
        owner = self.owner.pop(gid, None) if gid is not None else None
        if owner is not None:
            self._release(owner)

    def consumer_left(self, consumer: Consumer) -> None:
        if self._held.pop(consumer, 0):
            for gid in [g for g, c in self.owner.items() if c is consumer]:
                del self.owner[gid]

    def _release(self, consumer: Consumer) -> None:
        n = self._held.get(consumer, 0) - 1
        if n > 0:
            self._held[consumer] = n
        else:
            self._held.pop(consumer, None)


def message_groups_of(opts: QueueOptions) -> MessageGroups | None:
    return MessageGroups() if opts.extra.get(GROUPS_ARGUMENT) else None


def reconfigure(queue: Queue) -> None:
    """A policy (``message-groups``) turned groups on or off for ``queue``: on, groups
    start from the next message; off, the owners are forgotten and the queue dispatches
    as any other (the selective path only while consumers have selectors)."""
    on = bool(queue.opts.extra.get(GROUPS_ARGUMENT))
    if on and queue.message_groups is None:
        queue.message_groups = MessageGroups()
        queue._selective += 1
    elif not on and queue.message_groups is not None:
        queue.message_groups = None
        queue._selective -= 1
