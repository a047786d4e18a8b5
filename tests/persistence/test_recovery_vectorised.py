"""Restoring a long recovered index does no Python-level walk over its entries: the queue's
highest seq and byte count are reduced by numpy (a walk cost ~0.3 s per 10M entries at
every restart), and the journal's per-segment live counts of a FIFO's index (searched
runs) equal the general count."""
from __future__ import annotations

import random
from array import array

from broker.persistence import journal
from broker.persistence.journal import NAN, _count_live
from broker.queues.stored import _max_and_sum, _some_expiry


class Unwalkable(array):
    """An index column that fails if something iterates over it in Python."""

    def __iter__(self):
        raise AssertionError("a recovered index column walked item by item")


def test_long_index_is_reduced_without_a_python_walk():
    n = 200_000
    seqs = Unwalkable("q", range(5, 5 + n))
    blens = Unwalkable("I", [7]) * n
    assert _max_and_sum(seqs, blens) == (n + 4, 7 * n)
    exps = Unwalkable("d", [NAN]) * n
    assert _some_expiry(exps) is False
    exps[n - 1] = 1e9
    assert _some_expiry(array("d", exps)) is True
    # short ones: the builtins (no numpy needed)
    assert _max_and_sum(array("q", [3, 9, 4]), array("I", [1, 2, 3])) == (9, 6)


def _general(locs, blens):
    live, nbytes = {}, {}
    segs = [loc >> 32 for loc in locs]
    for seg, b in zip(segs, blens, strict=True):
        live[seg] = live.get(seg, 0) + 1
        nbytes[seg] = nbytes.get(seg, 0) + b + journal.ENQ_MIN
    return live, nbytes


def test_fifo_segment_counts_equal_the_general_count():
    r = random.Random(7)
    for case in range(6):
        n = 120_000 + r.randint(0, 5000)
        if case < 4:  # written in order, some segments skipped
            segs = sorted(r.choice([3, 4, 6, 7, 9]) for _ in range(n))
            offs = sorted(r.randrange(1 << 30) for _ in range(n))
            locs = [(s << 32) | o for s, o in zip(segs, offs, strict=True)]
            locs.sort()
        else:  # not in order (compacted, requeued): the general branch
            locs = [(r.choice([3, 4, 6]) << 32) | r.randrange(1 << 30) for _ in range(n)]
        blens = [r.randrange(0, 300) for _ in range(n)]
        live, nbytes = {2: 1}, {2: 100}  # counts of other queues are added to
        _count_live(live, nbytes, array("q", locs), array("I", blens))
        want_live, want_bytes = _general(locs, blens)
        want_live[2], want_bytes[2] = 1, 100
        assert (live, nbytes) == (want_live, want_bytes), case
