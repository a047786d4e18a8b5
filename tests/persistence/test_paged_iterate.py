"""Iterating a PagedFifo (what a mirror's sync does with a queue's backlog) leaves it as it
was: an entry held in memory in the paged part stays there, so iterating twice, and then
draining, sees every entry (the second iteration raised KeyError: the first had popped it)."""
from __future__ import annotations

from .test_paged import paged_fifo


def test_iterating_twice_keeps_pinned_entries():
    pf, _ = paged_fifo(4, pinned_at=3)
    assert pf.pinned_count == 1
    assert [e.seq for e in pf] == [1, 2, 3, 4]
    assert [e.seq for e in pf] == [1, 2, 3, 4]
    assert pf.pinned_count == 1
    assert [e.seq for e in pf.drain()] == [1, 2, 3, 4]
