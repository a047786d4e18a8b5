"""The timer engine's near heap and far columns against a plain sorted reference."""
from __future__ import annotations

import random

import pytest

from broker.scheduler import engine as eng
from broker.scheduler.slots import K_DELAY, SlotTable


class _Timers:
    def now(self) -> float:
        return 0.0

    def call_at(self, when, fn):  # the test drives run_due itself
        return None


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(eng, "REFILL", 16)
    monkeypatch.setattr(eng, "SPILL", 64)
    monkeypatch.setattr(eng, "COMPACT_MIN", 8)


@pytest.mark.parametrize("seed", range(6))
def test_fires_in_due_order_through_refills_spills_and_removals(small, seed):
    rnd = random.Random(seed)
    tables = [SlotTable(0, "/"), SlotTable(1, "v2")]
    fired: list[tuple[float, int, int]] = []
    clock = [1000.0]

    def fire(t, slot, due, now):
        fired.append((due, t.vi, slot))
        t.release(slot)

    e = eng.TimerEngine(_Timers(), lambda: clock[0], tables, fire, fire_batch=7)
    live: dict[tuple[int, int], float] = {}

    def schedule(due: float) -> None:
        t = tables[rnd.randrange(2)]
        slot = t.alloc()
        t.kind[slot] = K_DELAY
        t.due[slot] = due
        e.push(t, slot, due)
        live[(t.vi, slot)] = due

    # a bulk load (recovery) into the far columns, then live traffic
    t0 = tables[0]
    dues = [clock[0] + rnd.uniform(0, 500) for _ in range(300)]
    for d in dues:
        slot = t0.alloc()
        t0.kind[slot] = K_DELAY
        t0.due[slot] = d
        live[(0, slot)] = d
    e.push_many(t0, 0, t0.due)
    for _step in range(120):
        for _ in range(rnd.randrange(0, 12)):
            schedule(clock[0] + rnd.choice([rnd.uniform(0, 5), rnd.uniform(0, 900)]))
        if live and rnd.random() < 0.3:  # remove or reschedule: the old key goes dead
            vi, slot = rnd.choice(sorted(live))
            t = tables[vi]
            if rnd.random() < 0.5:
                t.release(slot)
                del live[(vi, slot)]
            else:
                nd = clock[0] + rnd.uniform(0, 50)
                t.due[slot] = nd
                e.push(t, slot, nd)
                live[(vi, slot)] = nd
            e.maybe_compact(len(live))
        clock[0] += rnd.uniform(0, 10)
        before = len(fired)
        while e.run_due():
            pass
        for due, vi, slot in fired[before:]:
            assert due <= clock[0]  # never early
            assert live.pop((vi, slot)) == due
        # nothing due is left behind
        assert all(d > clock[0] for d in live.values())
        head = e.head_due()
        assert head == (min(live.values()) if live else None)
    assert [d for d, _v, _s in fired] == sorted(d for d, _v, _s in fired)


def test_a_million_pending_keep_the_heap_small():
    t = SlotTable(0, "/")
    e = eng.TimerEngine(_Timers(), lambda: 0.0, [t], lambda *a: None)
    n = 300_000
    for i in range(n):
        slot = t.alloc()
        t.kind[slot] = K_DELAY
        t.due[slot] = 10_000.0 + i % 7919
        e.push(t, slot, t.due[slot])
    assert e.head_due() == 10_000.0
    assert len(e.heap) <= eng.SPILL + 1
    assert len(e.heap) + len(e.far_due) == n
