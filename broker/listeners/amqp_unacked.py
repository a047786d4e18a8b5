"""An AMQP channel's unacknowledged deliveries: recent ones as objects, older ones as columns;
not what settling them does to queues (amqp_channel.py, queues/queue.py).

A delivery is acked within a sweep of the consumer timeouts (a second) on the hot path: an
``Unacked`` in a dict, as cheap to add and pop as anything. One still out at a sweep moves
to ``Aged``: a few columns (tag, entry, consumer or queue, when its period ended) of eight
octets each, instead of an object of six slots, its int tag and a dict slot (~160 B). Its
queue's store may park the entry itself (``Store.park``: the journal keeps it as a row):
the entry column then holds the store and a slot column the row, and taking the delivery
takes the entry back (``Store.unpark``).
"""
from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from ..consumer_timeout import Period
from ..queues.consumer import Consumer

if TYPE_CHECKING:
    from ..queues.queue import Queue

_NAN = math.nan


class Unacked:
    __slots__ = ("at", "audit_pos", "consumer", "entry", "queue", "tag")

    def __init__(self, tag, entry, queue: Queue, consumer, at: Period | None = None):
        self.tag = tag
        self.entry = entry
        self.queue = queue
        self.consumer = consumer
        self.at = at  # the period between consumer-timeout sweeps it was delivered in
        self.audit_pos = -1  # where the audit trail holds its delivery's record (acked())


class Aged:
    """Deliveries older than a sweep, in tag order. A settled one leaves a hole (its entry
    None) until the holes are the larger part or lead the columns."""

    __slots__ = ("audit", "entries", "head", "live", "owners", "parked", "sent", "tags")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.tags = array("q")
        self.entries: list[Any] = []  # the entry, or the store it is parked in
        self.parked = array("q")  # the store's slot of a parked entry, -1 for none
        # the consumer, or the queue of a basic.get (no consumer): one column for both
        self.owners: list[Any] = []
        self.sent = array("d")  # when the delivery's period ended (NaN: unknown)
        self.audit: dict[int, int] = {}  # tag -> the audit trail's record, where there is one
        self.head = 0  # the first slot that may be live
        self.live = 0

    def add(self, item: Unacked) -> None:
        tag = item.tag
        tags = self.tags
        at = item.at
        sent = at.end if at is not None and at.end is not None else _NAN
        owner = item.consumer if item.consumer is not None else item.queue
        entry: Any = item.entry
        store = item.queue.store
        slot = -1 if store is None else store.park(item.queue, entry)
        if slot >= 0:
            entry = store
        if not tags or tags[-1] < tag:
            tags.append(tag)
            self.entries.append(entry)
            self.parked.append(slot)
            self.owners.append(owner)
            self.sent.append(sent)
        else:  # a transaction's rollback gave back an older one: its place in tag order
            i = bisect_left(tags, tag, self.head)
            tags.insert(i, tag)
            self.entries.insert(i, entry)
            self.parked.insert(i, slot)
            self.owners.insert(i, owner)
            self.sent.insert(i, sent)
        if item.audit_pos >= 0:
            self.audit[tag] = item.audit_pos
        self.live += 1

    def _item(self, i: int, take: bool = False) -> Unacked:
        """The delivery in slot ``i``; its entry None if it is parked, unless ``take``
        (which takes it back from the store)."""
        owner = self.owners[i]
        if isinstance(owner, Consumer):
            consumer, queue = owner, owner.queue
        else:
            consumer, queue = None, owner
        at = None
        sent = self.sent[i]
        if sent == sent:  # not NaN
            at = Period()
            at.end = sent
        tag = self.tags[i]
        entry = self.entries[i]
        slot = self.parked[i]
        if slot >= 0:
            entry = entry.unpark(queue, slot) if take else None
        item = Unacked(tag, entry, queue, consumer, at)
        if self.audit:
            item.audit_pos = self.audit.get(tag, -1)
        return item

    def _take(self, i: int) -> Unacked:
        item = self._item(i, take=True)
        self.entries[i] = None
        self.parked[i] = -1
        self.owners[i] = None
        if self.audit:
            self.audit.pop(item.tag, None)
        self.live -= 1
        return item

    def _tidy(self) -> None:
        entries = self.entries
        head = self.head
        end = len(entries)
        while head < end and entries[head] is None:
            head += 1
        self.head = head
        if not self.live:
            self._reset()
        elif head >= 1024 and head * 2 >= end:
            del self.tags[:head], self.entries[:head], self.owners[:head], self.sent[:head]
            del self.parked[:head]
            self.head = 0
        elif end - head >= 2048 and self.live * 2 < end - head:
            keep = [i for i in range(head, end) if entries[i] is not None]
            self.tags = array("q", [self.tags[i] for i in keep])
            self.entries = [entries[i] for i in keep]
            self.parked = array("q", [self.parked[i] for i in keep])
            self.owners = [self.owners[i] for i in keep]
            self.sent = array("d", [self.sent[i] for i in keep])
            self.head = 0

    def _find(self, tag: int) -> int:
        tags = self.tags
        i = self.head
        if i < len(tags) and tags[i] != tag:
            i = bisect_left(tags, tag, i)
        if i < len(tags) and tags[i] == tag and self.entries[i] is not None:
            return i
        return -1

    def __contains__(self, tag: int) -> bool:
        return self._find(tag) >= 0

    def pop(self, tag: int) -> Unacked | None:
        i = self._find(tag)
        if i < 0:
            return None
        item = self._take(i)
        self._tidy()
        return item

    def pop_upto(self, tag: int) -> list[Unacked]:
        """Every one with a tag up to ``tag``, in tag order (0: all)."""
        taken = []
        tags = self.tags
        entries = self.entries
        end = len(tags) if tag == 0 else bisect_left(tags, tag + 1, self.head)
        for i in range(self.head, end):
            if entries[i] is not None:
                taken.append(self._take(i))
        self._tidy()
        return taken

    def oldest(self) -> Unacked | None:
        """The oldest delivery, left in place (its entry None if parked)."""
        entries = self.entries
        for i in range(self.head, len(entries)):
            if entries[i] is not None:
                return self._item(i)
        return None

    @property
    def first_tag(self) -> int:
        entries = self.entries
        for i in range(self.head, len(entries)):
            if entries[i] is not None:
                return self.tags[i]
        return 0

    @property
    def last_tag(self) -> int:
        entries = self.entries
        for i in range(len(entries) - 1, self.head - 1, -1):
            if entries[i] is not None:
                return self.tags[i]
        return 0


class UnackedDeliveries(dict):
    """tag -> ``Unacked`` for the recent deliveries (plain dict operations on the hot path),
    and ``aged`` for the older ones. ``len`` counts both (the management API's counts)."""

    __slots__ = ("aged",)

    def __init__(self) -> None:
        super().__init__()
        self.aged = Aged()

    def __len__(self) -> int:
        return dict.__len__(self) + self.aged.live

    def age(self, recent: Period) -> int:
        """Move the deliveries older than ``recent`` (the period that just ended) to the
        columns; returns how many moved."""
        moved = []
        for tag, item in dict.items(self):
            if item.at is recent or item.at is None or item.at.end is None:
                break
            moved.append(tag)
        aged = self.aged
        for tag in moved:
            aged.add(dict.pop(self, tag))
        if len(moved) >= 1024:  # a dict keeps its table when emptied by pops: a new one
            kept = list(dict.items(self))
            dict.clear(self)
            dict.update(self, kept)
        return len(moved)

    def take(self, tag: int) -> Unacked | None:
        item = dict.pop(self, tag, None)
        if item is None and self.aged.live:
            item = self.aged.pop(tag)
        return item

    def has(self, tag: int) -> bool:
        return dict.__contains__(self, tag) or (self.aged.live > 0 and tag in self.aged)

    def take_upto(self, tag: int) -> list[Unacked]:
        """Every delivery with a tag up to ``tag`` (0: all), in tag order."""
        aged = self.aged.pop_upto(tag) if self.aged.live else []
        if tag == 0:
            recent = list(dict.values(self))
            dict.clear(self)
        else:
            upto = []
            for first in dict.keys(self):  # in tag order
                if first > tag:
                    break
                upto.append(first)
            recent = [dict.pop(self, first) for first in upto]
        if not aged:
            return recent
        if recent and recent[0].tag < aged[-1].tag:
            return sorted(aged + recent, key=lambda item: item.tag)
        return aged + recent

    def oldest(self) -> Unacked | None:
        """The oldest delivery, left in place (its entry None if its store parked it)."""
        aged = self.aged.oldest() if self.aged.live else None
        if dict.__len__(self):
            first = next(iter(dict.values(self)))
            if aged is None or first.tag < aged.tag:
                return first
        return aged
