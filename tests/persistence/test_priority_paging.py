"""Durable priority queues on the journal are paged (``paged.PagedPriority``, one
``PagedFifo`` per level) and keep strict priority order across restarts."""
from __future__ import annotations

import os

import pytest

from broker.persistence import journal_format as jf
from broker.persistence.paged import PagedPriority
from broker.queues.entry import QueueEntry

from .test_delivery_count import CRASH, message, queue_of, run_life
from .test_paged import Clock, ReadBack

PRIO = {"x-max-priority": 4}


def publish_mix(q, n: int) -> list[bytes]:
    """n messages at priorities 0..5 (5 is capped to 4); returns the bodies in delivery order."""
    sent = []
    for i in range(n):
        p = (i * 3) % 6
        body = b"%d-%03d" % (p, i)
        q.enqueue(message(body, priority=p))
        sent.append((-min(p, 4), i, body))
    return [body for _p, _i, body in sorted(sent)]


def drain(q) -> list[bytes]:
    out = []
    while (e := q.get()) is not None:
        out.append(e.message.body)
        q.ack(e, None)
    return out


def test_priority_queue_on_the_journal_is_paged(tmp_path):
    def body(broker, store):
        q = queue_of(broker, PRIO)
        assert isinstance(q.ready, PagedPriority) and q.restores_paged
        want = publish_mix(q, 60)
        seqs, locs, _exps, _blens, _flags = q.paged_index()
        assert len(seqs) == 60 and all(locs) and q.stored_entries() == []
        return want, drain(q)

    want, got = run_life(tmp_path, body, budget=0)
    assert got == want


@CRASH
@pytest.mark.parametrize("budget", [0, 200_000], ids=["all-paged", "mostly-in-memory"])
def test_paged_priority_backlog_keeps_strict_order_across_restart(tmp_path, crash, budget):
    def first(broker, store):
        q = queue_of(broker, PRIO)
        want = publish_mix(q, 90)
        taken = [q.get() for _ in range(3)]  # delivered, never acked: back, redelivered
        q.ack(q.get(), None)                  # gone for good
        return want, [e.message.body for e in taken]

    def second(broker, store):
        q = queue_of(broker)
        assert isinstance(q.ready, PagedPriority)
        assert q.stored_entries() == [] and len(q.paged_index()[0]) == 89  # nothing read back
        return drain(q)

    want, taken = run_life(tmp_path, first, crash=crash, budget=budget)
    got = run_life(tmp_path, second, budget=budget)
    acked = want[3]
    assert got == [b for b in want if b != acked]
    assert got[:3] == taken


def test_a_checkpoint_without_priorities_is_read_back(tmp_path):
    """A format-1 checkpoint (no T_CKPT_PRIO): recovery reads the messages for their
    priorities, as the previous version did, pages them out again, and keeps order."""
    want = run_life(tmp_path, lambda broker, store: publish_mix(queue_of(broker, PRIO), 40),
                    budget=0)
    path = os.path.join(tmp_path, "journal", "checkpoint")
    with open(path, "rb") as f:
        data = f.read()
    recs: list = []
    jf.scan(data, path, records=recs)
    kinds = [rtype for _off, rtype, _p in recs]
    assert jf.T_CKPT_PRIO in kinds
    with open(path, "wb") as f:
        f.write(b"".join(jf.pack_record(rtype, bytes(p)) for _off, rtype, p in recs
                         if rtype != jf.T_CKPT_PRIO))

    def second(broker, store):
        q = queue_of(broker)
        return len(q.paged_index()[0]), drain(q)

    assert run_life(tmp_path, second, budget=0) == (40, want)


def test_requeue_and_counts_in_a_paged_priority_queue(tmp_path):
    def first(broker, store):
        q = queue_of(broker, {**PRIO, "x-delivery-limit": 5})
        want = publish_mix(q, 30)
        e = q.get()
        q.requeue([(e, None)])
        e = q.get()
        q.requeue([(e, None)])
        return want

    def second(broker, store):
        q = queue_of(broker)
        head = q.get()
        count = head.delivery_count, head.message.properties["headers"]["x-delivery-count"]
        q.ack(head, None)
        return [head.message.body, *drain(q)], count

    want = run_life(tmp_path, first, crash=True, budget=0)
    assert run_life(tmp_path, second, budget=0) == (want, (3, 2))


def test_paged_priority_index_round_trip_and_relocation():
    store = ReadBack()
    pp = PagedPriority(store, Clock(), 2, budget=0)
    for i, p in enumerate([0, 2, 1, 2, 0, 1], start=1):
        m = message(b"m%d" % i, priority=p)
        store.messages[i << 32] = m
        e = QueueEntry(m, i, None, p)
        e.loc = i << 32
        pp.append(e)
    cols = pp.paged_levels()
    assert list(cols[0]) == [2, 4, 3, 6, 1, 5] and list(cols[5]) == [2, 2, 1, 1, 0, 0]
    moved = pp.relocate_paged({3, 4}, lambda loc, *rest: loc + 1)
    assert moved == 2
    again = PagedPriority(store, Clock(), 2, budget=0)
    with pytest.raises(TypeError):
        again.restore_paged(*cols[:5])
    store.messages[(3 << 32) + 1] = store.messages[3 << 32]
    store.messages[(4 << 32) + 1] = store.messages[4 << 32]
    again.restore_paged(*pp.paged_levels())
    assert len(again) == 6 and again.head_entries() == []
    assert [again.popleft().message.body for _ in range(6)] == \
        [b"m2", b"m4", b"m3", b"m6", b"m1", b"m5"]
