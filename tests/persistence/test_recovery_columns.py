"""The journal's vectorised recovery of a queue's index (``QueueState.columns``, and its
in-place path for a FIFO's checkpoint) gives exactly what the per-entry reference
(``QueueState.entries``) gives, over checkpoints with consumed prefixes, unacked
entries listed after the run, removals, deliveries, requeued and new entries."""
from __future__ import annotations

import copy
import random
from array import array

from broker.persistence.journal import NAN, QueueState


def _state(seed: int) -> QueueState:
    r = random.Random(seed)
    n = r.randint(1, 60)
    run = list(range(10, 10 + n))
    tail = r.sample(range(0, 10), r.randint(0, 4)) if r.random() < 0.5 else []  # unacked
    seqs = run + tail
    qs = QueueState(None)
    qs.base = (array("q", seqs), array("q", [s * 100 for s in seqs]),
               array("d", [NAN if r.random() < .7 else 1e9 + s for s in seqs]),
               array("I", [s % 7 for s in seqs]), array("B", [1 if s in tail else 0 for s in seqs]))
    k = r.randint(0, n)
    for s in run[:k] if r.random() < .7 else r.sample(run, min(k, 3)):
        qs.removed.add(s)
    for s in r.sample(tail, len(tail) // 2):
        qs.removed.add(s)
    if r.random() < .5 and tail:
        qs.delivered[r.choice(tail)] = 3
    if r.random() < .5:
        s = r.choice(seqs)
        qs.delivered[s] = max(qs.delivered.get(s, 0), 2)
    for s in range(10 + n, 10 + n + r.randint(0, 5)):
        qs.new[s] = [s * 100 + 1, None, 0, 5, 0]
    if r.random() < .3:  # a requeued (or compacted) entry: its newer row wins
        s = r.choice(seqs)
        if s not in qs.removed:
            qs.new[s] = [s * 100 + 2, None, 0, 5, 1]
    return qs


def _rows(cols) -> list:
    seqs, locs, exps, blens, flags = cols[:5]
    return [(s, loc, None if e != e else e, b, f)
            for s, loc, e, b, f in zip(seqs, locs, exps, blens, flags, strict=True)]


def _reference(qs: QueueState) -> list:
    return [(s, loc, None if e != e else e, b, f) for s, loc, e, _p, b, f in qs.entries()]


def test_columns_match_the_per_entry_reference():
    in_place = 0
    for seed in range(2000):
        want = _reference(_state(seed))
        assert _rows(_state(seed).columns()) == want, seed
        got = _state(seed)._columns_unchanged(False)
        if got is not None:
            in_place += 1
            assert _rows(got) == want, seed
    assert in_place > 1000  # the in-place path is the common one


def test_priority_queue_columns_grouped_by_level_in_seq_order():
    qs = QueueState(None)
    seqs = list(range(1, 21))
    qs.base = (array("q", seqs), array("q", seqs), array("d", [NAN] * 20), array("I", [1] * 20),
               array("B", bytes(20)))
    qs.base_prio = array("B", [s % 3 for s in seqs])
    qs.removed.add(3)
    qs.new[21] = [21, None, 0, 1, 0]
    cols = copy.deepcopy(qs).columns(by_level=True)
    got = list(zip(cols[5], cols[0], strict=True))
    assert got == sorted(got)  # by level, then seq
    assert sorted(cols[0]) == [s for s in range(1, 22) if s != 3]


def test_segment_live_counts_of_a_long_queue_match_a_count_per_entry():
    """``_count_live`` counts a long recovered index with vector operations (a FIFO's
    segments as runs, any other order by bins): the same as one entry at a time."""
    from broker.persistence.journal import ENQ_MIN, _count_live

    r = random.Random(1)
    for in_order in (True, False):
        segs = [r.randint(3, 40) for _ in range(200_001)]
        if in_order:
            segs.sort()
        locs = array("q", [(s << 32) | r.randint(0, 1000) for s in segs])
        blens = array("I", [r.randint(0, 5000) for _ in segs])
        live, live_bytes = {5: 1}, {5: 100}
        _count_live(live, live_bytes, locs, blens)
        want, want_bytes = {5: 1}, {5: 100}
        for loc, blen in zip(locs, blens, strict=True):
            want[loc >> 32] = want.get(loc >> 32, 0) + 1
            want_bytes[loc >> 32] = want_bytes.get(loc >> 32, 0) + ENQ_MIN + blen
        assert (live, live_bytes) == (want, want_bytes)
