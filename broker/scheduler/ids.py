"""Scheduled-message ids: ``<8 hex>-<n>``, kept across restarts in ``x-triomq-sid``.

An id is stored in its slot as (prefix index, number) -- two array items -- and
found through ``SidMap``, an array-backed open-addressing hash from that pair to
the slot's address ``vhost index << 32 | slot``. ``SidIndex`` owns the prefix
table, the id counter and the map; it reads the pair back from the slot tables.
"""
from __future__ import annotations

import itertools
import os
from array import array

from .slots import SLOT_BITS, SLOT_MASK, SlotTable


class SidMap:
    """id -> (vhost index << 32 | slot): open addressing with linear probing over one
    array of values (8 bytes per bucket, load <= 0.7). The id itself is not stored:
    it is (prefix index, number) in the slot table, and the hash is computed from
    that pair, so a probe compares two array items and deletion (backward shift)
    can recompute any entry's home bucket. Value 0 = empty bucket (values are +1)."""
    __slots__ = ("ident", "mask", "n", "vals")

    def __init__(self, ident, capacity: int = 1 << 12):
        self.ident = ident  # value -> (prefix index, number)
        self._empty(capacity)

    def _empty(self, capacity: int) -> None:
        self.vals = array("q", bytes(8 * capacity))
        self.mask = capacity - 1
        self.n = 0

    @staticmethod
    def hkey(p: int, n: int) -> int:
        h = (n * 0x9E3779B97F4A7C15 + p * 0xC2B2AE3D27D4EB4F) & 0xFFFFFFFFFFFFFFFF
        return h ^ (h >> 32)

    def __len__(self) -> int:
        return self.n

    def insert(self, p: int, n: int, value: int) -> None:
        if (self.n + 1) * 10 > (self.mask + 1) * 7:
            self._grow()
        vals = self.vals
        mask = self.mask
        i = self.hkey(p, n) & mask
        while vals[i]:
            i = (i + 1) & mask
        vals[i] = value + 1
        self.n += 1

    def insert_many(self, ps, ns, first_value: int) -> None:
        """Insert ids ``(ps[i], ns[i])`` with values ``first_value + i`` (recovery: one
        resize up front; into an empty table with numpy, else the probe loop inline)."""
        count = len(ns)
        cap = self.mask + 1
        while (self.n + count) * 10 > cap * 7:
            cap *= 2
        if cap != self.mask + 1:
            self._grow(cap)
        vals, mask = self.vals, self.mask
        indexes: range | list[int] = range(count)
        if not self.n and count > 4096:
            indexes = self._place_empty(ps, ns, first_value)
        for i in indexes:
            p, n = ps[i], ns[i]
            h = (n * 0x9E3779B97F4A7C15 + p * 0xC2B2AE3D27D4EB4F) & 0xFFFFFFFFFFFFFFFF
            j = (h ^ (h >> 32)) & mask
            while vals[j]:
                j = (j + 1) & mask
            vals[j] = first_value + i + 1
            self.n += 1

    def _place_empty(self, ps, ns, first_value: int) -> list[int]:
        """Bulk insert into an empty table with numpy: in home order, each id takes the
        first bucket at or after its home not taken by the ids before it -- what
        inserting them one by one in that order gives, so probing and backward-shift
        deletion work as usual. Returns the indexes of those that would run past the
        last bucket (a few at most), for the loop to wrap."""
        import numpy as np

        p = np.asarray(ps, dtype=np.uint16).astype(np.uint64)
        n = np.asarray(ns, dtype=np.int64).view(np.uint64)
        with np.errstate(over="ignore"):
            h = n * np.uint64(0x9E3779B97F4A7C15) + p * np.uint64(0xC2B2AE3D27D4EB4F)
        home = ((h ^ (h >> np.uint64(32))) & np.uint64(self.mask)).astype(np.int64)
        order = np.argsort(home, kind="stable")
        k = np.arange(len(order), dtype=np.int64)
        pos = np.maximum.accumulate(home[order] - k) + k  # increasing with k
        placed = int(np.searchsorted(pos, self.mask, side="right"))
        vals = np.frombuffer(self.vals, dtype=np.int64)
        vals[pos[:placed]] = order[:placed] + (first_value + 1)
        self.n += placed
        return order[placed:].tolist()

    def find(self, p: int, n: int) -> int:
        vals, mask, ident = self.vals, self.mask, self.ident
        i = self.hkey(p, n) & mask
        while True:
            v = vals[i]
            if not v:
                return -1
            if ident(v - 1) == (p, n):
                return v - 1
            i = (i + 1) & mask

    def delete(self, p: int, n: int, value: int) -> bool:
        vals, mask, ident = self.vals, self.mask, self.ident
        want = value + 1
        i = self.hkey(p, n) & mask
        while True:
            v = vals[i]
            if not v:
                return False
            if v == want:
                break
            i = (i + 1) & mask
        j = i
        hkey = self.hkey
        while True:  # backward-shift deletion: no tombstones
            j = (j + 1) & mask
            v = vals[j]
            if not v:
                break
            home = hkey(*ident(v - 1)) & mask
            if (i <= j and i < home <= j) or (i > j and (home > i or home <= j)):
                continue
            vals[i] = v
            i = j
        vals[i] = 0
        self.n -= 1
        return True

    def _grow(self, cap: int = 0) -> None:
        old = self.vals
        cap = cap or (self.mask + 1) * 2
        self.vals = vals = array("q", bytes(8 * cap))
        self.mask = mask = cap - 1
        ident, hkey = self.ident, self.hkey
        for v in old:
            if v:
                i = hkey(*ident(v - 1)) & mask
                while vals[i]:
                    i = (i + 1) & mask
                vals[i] = v

    def clear(self) -> None:
        self._empty(1 << 12)


def split_sid(sid: str) -> tuple[str, int]:
    """(prefix, number) of ``<prefix>-<n>``; (sid, -1) when the id has no number part."""
    prefix, sep, num = sid.rpartition("-")
    if sep and num.isdigit() and num.isascii() and str(int(num)) == num and int(num) < 1 << 62:
        return prefix, int(num)
    return sid, -1


class SidIndex:
    """Every pending id of the broker: new ids, id -> (table, slot), slot -> id."""

    def __init__(self, tables: list[SlotTable]):
        self._tables = tables  # the scheduler's list, indexed by vhost index
        self._map = SidMap(self._ident)
        self._prefixes: list[str] = []
        self._prefix_index: dict[str, int] = {}
        self._own = os.urandom(4).hex()
        self._counter = itertools.count(1)
        self._own_p = self.prefix_of(self._own)

    @property
    def prefixes(self) -> list[str]:
        return self._prefixes

    def prefix_of(self, prefix: str) -> int:
        p = self._prefix_index.get(prefix)
        if p is None:
            p = len(self._prefixes)
            if p > 0xFFFF:
                raise ValueError("too many scheduler id prefixes")
            self._prefixes.append(prefix)
            self._prefix_index[prefix] = p
        return p

    def _ident(self, value: int) -> tuple[int, int]:
        return self._tables[value >> SLOT_BITS].sid_pair(value & SLOT_MASK)

    def sid_of(self, t: SlotTable, slot: int) -> str:
        p, n = t.sid_pair(slot)
        prefix = self._prefixes[p]
        return prefix if n < 0 else f"{prefix}-{n}"

    def lookup(self, sid) -> tuple[SlotTable, int] | None:
        """The live slot holding ``sid``, or None."""
        if not isinstance(sid, str):
            return None
        prefix, n = split_sid(sid)
        p = self._prefix_index.get(prefix)
        if p is None:
            return None
        v = self._map.find(p, n)
        if v < 0:
            return None
        t = self._tables[v >> SLOT_BITS]
        slot = v & SLOT_MASK
        if not t.kind[slot]:
            return None
        return t, slot

    def assign_new(self, t: SlotTable, slot: int) -> str:
        """Give a new slot a fresh id of this broker run."""
        n = next(self._counter)
        t.set_sid(slot, self._own_p, n)
        self._map.insert(self._own_p, n, (t.vi << SLOT_BITS) | slot)
        return f"{self._own}-{n}"

    def assign(self, t: SlotTable, slot: int, sid: str) -> None:
        """Give a slot a known id (recovery)."""
        prefix, n = split_sid(sid)
        p = self.prefix_of(prefix)
        t.set_sid(slot, p, n)
        self._map.insert(p, n, (t.vi << SLOT_BITS) | slot)

    def own_prefixes(self, prefixes: list[str]) -> list[int]:
        """This index's prefix numbers for a snapshot's prefix table (added as needed)."""
        return [self.prefix_of(prefix) for prefix in prefixes]

    def assign_loaded(self, t: SlotTable, first: int, count: int) -> None:
        """Index the ids of slots ``first .. first+count-1`` of ``t`` (filled by
        ``SlotTable.load`` with prefix numbers of this index)."""
        self._map.insert_many(t.sidp[first:first + count], t.sidn[first:first + count],
                              (t.vi << SLOT_BITS) | first)

    def forget(self, t: SlotTable, slot: int) -> None:
        p, n = t.sid_pair(slot)
        self._map.delete(p, n, (t.vi << SLOT_BITS) | slot)

    def clear(self) -> None:
        self._map.clear()
