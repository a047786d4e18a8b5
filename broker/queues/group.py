"""Consumer groups over partition queues: Kafka's partitions and group rebalancing, Hermes'
ordered partition-key consumption, on plain AMQP queues.

The queues of a vhost with the same ``x-consumer-group`` argument are the group's
partitions (usually bound to an ``x-consistent-hash`` exchange, one key to one partition).
Each partition has at most one active consumer at a time, as with single active consumer,
but the group chooses it: a *member* is a channel consuming from the group's partitions, and
the partitions are spread evenly over the members in join order. When a member joins or
leaves, the group rebalances, moving as few partitions as it can (sticky). A partition taken
from a member that still has unacknowledged deliveries from it is handed over only once they
are settled (cooperative, as Kafka's incremental rebalancing): acked, or requeued when the
member's channel closes (a basic.cancel alone does not return them, so a member that cancels
keeps its partitions blocked until it acks or closes). Either way the new owner never gets a
later message of a key while an earlier one is still out, and gets requeued ones first.
"""
from __future__ import annotations

from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from .args import ArgumentError, register_queue_argument, text_arg

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .consumer import ConsumerChannel
    from .queue import Consumer, Queue

GROUP_ARGUMENT = "x-consumer-group"


def _group_name(name: str, value: object) -> str:
    text = text_arg(name, value)
    if not text:
        raise ArgumentError(name, "{empty_name,<<>>}")
    return text


register_queue_argument(GROUP_ARGUMENT, _group_name)


class ConsumerGroup:
    """The partitions (queues) of one group in one vhost and who consumes each.

    Owns only its assignment tables; the queues ask it for their active consumer
    (``active``) and tell it when their consumers change (``rebalance``)."""

    def __init__(self, name: str):
        self.name = name
        self.partitions: list[Queue] = []
        self._owner: dict[Queue, Consumer] = {}    # partition -> consumer delivering from it
        self._next: dict[Queue, Consumer] = {}     # partition -> consumer taking it over
        self._joined: dict[object, int] = {}       # member (channel) -> join order
        self._joins = 0

    def add(self, queue: Queue) -> None:
        if queue not in self.partitions:
            self.partitions.append(queue)
            self.partitions.sort(key=lambda q: q.name)

    def remove(self, queue: Queue) -> None:
        if queue in self.partitions:
            self.partitions.remove(queue)
        self._owner.pop(queue, None)
        self._next.pop(queue, None)
        self.rebalance()

    def active(self, queue: Queue) -> Consumer | None:
        """The consumer ``queue`` may deliver to now, or None (none, at its prefetch, or a
        hand-over waiting for the previous owner's unacked deliveries)."""
        current = self._owner.get(queue)
        nxt = self._next.get(queue)
        if nxt is not None and (current is None or current.unacked == 0):
            self._owner[queue] = current = nxt
            del self._next[queue]
        if current is None or current not in queue.consumers or not current.can_take():
            return None
        return current

    def owner_of(self, queue: Queue) -> Consumer | None:
        """Who owns ``queue`` once any hand-over is done (for views and tests)."""
        return self._next.get(queue) or self._owner.get(queue)

    def rebalance(self) -> None:
        """Recompute who owns each partition after a member joined or left."""
        members = self._members()
        assignment = self._assign(members)
        changed = []
        for queue in self.partitions:
            member = assignment.get(queue)
            wanted = None
            if member is not None:
                wanted = next(c for c in queue.consumers if c.channel is member)
            current = self._owner.get(queue)
            if wanted is current:
                self._next.pop(queue, None)
                continue
            if current is None or current.unacked == 0:
                self._next.pop(queue, None)
                if wanted is None:
                    self._owner.pop(queue, None)
                else:
                    self._owner[queue] = wanted
                    changed.append(queue)
            elif wanted is None:
                self._next.pop(queue, None)  # nobody to hand over to (yet)
            else:
                # handed over once ``current`` settled its deliveries, even after a
                # basic.cancel (which does not return them): acked, or requeued when its
                # channel closes
                self._next[queue] = wanted
        for queue in changed:
            queue.dispatch()

    def _members(self) -> list[ConsumerChannel]:
        present = {c.channel for q in self.partitions for c in q.consumers}
        for gone in [m for m in self._joined if m not in present]:
            del self._joined[gone]
        for member in present:
            if member not in self._joined:
                self._joins += 1
                self._joined[member] = self._joins
        return sorted(present, key=self._joined.__getitem__)

    def _assign(self, members: list[ConsumerChannel]) -> dict[Queue, ConsumerChannel]:
        """Even shares in join order (the first ``P mod M`` members take one more); a
        partition stays with its current owner while that owner is under its share."""
        if not members:
            return {}
        parts = self.partitions
        base, extra = divmod(len(parts), len(members))
        share = {m: base + (1 if i < extra else 0) for i, m in enumerate(members)}
        load = dict.fromkeys(members, 0)
        order = {m: i for i, m in enumerate(members)}
        assignment: dict[Queue, ConsumerChannel] = {}
        for queue in parts:
            owner = self.owner_of(queue)
            member = owner.channel if owner is not None else None
            if member in share and load[member] < share[member] \
                    and any(c.channel is member for c in queue.consumers):
                assignment[queue] = member
                load[member] += 1
        for queue in parts:
            if queue in assignment:
                continue
            candidates = list(dict.fromkeys(c.channel for c in queue.consumers))
            if not candidates:
                continue
            under = [m for m in candidates if load[m] < share[m]]
            pick = min(under or candidates, key=lambda m: (load[m], order[m]))
            assignment[queue] = pick
            load[pick] += 1
        return assignment


_GROUPS: WeakKeyDictionary[VirtualHost, dict[str, ConsumerGroup]] = WeakKeyDictionary()


def group_of(queue: Queue) -> ConsumerGroup | None:
    """The group ``queue`` is a partition of (joining it), or None."""
    name = queue.opts.extra.get(GROUP_ARGUMENT)
    if name is None:
        return None
    groups = _GROUPS.setdefault(queue.vhost, {})
    group = groups.get(name)
    if group is None:
        group = groups[name] = ConsumerGroup(name)
    group.add(queue)
    return group


def find_group(vhost: VirtualHost, name: str) -> ConsumerGroup | None:
    return _GROUPS.get(vhost, {}).get(name)
