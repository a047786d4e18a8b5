"""PagedFifo's public store-facing API: paged_index, restore_paged, relocate_paged, drain,
and the opt-in of subclasses to restore_paged."""
from __future__ import annotations

from array import array

from broker.amqp.fields import encode_properties
from broker.message import Message
from broker.persistence.paged import PagedFifo
from broker.queues.entry import QueueEntry

NAN = float("nan")


class Clock:
    def now(self) -> float:
        return 0.0


class ReadBack:
    """A store that can read a message back by location (READS_BACK)."""

    def __init__(self):
        self.messages: dict = {}

    def read_message(self, loc: int) -> Message:
        return self.messages[loc]


def msg(body: bytes) -> Message:
    props = {"delivery_mode": 2}
    return Message("", "q", encode_properties(props), props, body)


def paged_fifo(n: int, pinned_at: int | None = None):
    store = ReadBack()
    pf = PagedFifo(store, Clock(), budget=0)
    for i in range(1, n + 1):
        e = QueueEntry(msg(b"m%d" % i), i)
        if i != pinned_at:
            e.loc = (1 << 32) | i
            store.messages[e.loc] = e.message
        pf.append(e)
    return pf, store


def test_paged_index_leaves_out_pinned_entries():
    pf, _ = paged_fifo(4, pinned_at=3)
    assert pf.pinned_count == 1
    seqs, locs, _exps, blens, _flags = pf.paged_index()
    assert list(seqs) == [1, 2, 4] and all(locs) and list(blens) == [2, 2, 2]
    assert [e.seq for e in pf.drain()] == [1, 2, 3, 4]  # the pinned one keeps its place


def test_restore_paged_then_drain_in_order():
    store = ReadBack()
    for i in (1, 2):
        store.messages[(2 << 32) | i] = msg(b"r%d" % i)
    pf = PagedFifo(store, Clock())
    pf.restore_paged(array("q", [1, 2]), array("q", [(2 << 32) | 1, (2 << 32) | 2]),
                     array("d", [NAN, NAN]), array("I", [2, 2]), array("B", [1, 0]))
    out = list(pf.drain())
    assert [(e.seq, e.message.body, e.redelivered) for e in out] == [(1, b"r1", True),
                                                                    (2, b"r2", False)]
    assert len(pf) == 0 and pf.paged_index() is None


def test_relocate_paged_moves_only_entries_in_given_segments():
    pf, store = paged_fifo(3)
    moved = []

    def move(loc, seq, exp, blen, flags):
        new = (9 << 32) | seq
        store.messages[new] = store.messages[loc]
        moved.append(seq)
        return new

    assert pf.relocate_paged({1}, move) == 3 and moved == [1, 2, 3]
    assert {loc >> 32 for loc in pf.paged_index()[1]} == {9}
    assert pf.relocate_paged({1}, move) == 0


def test_subclasses_opt_in_to_restore_paged():
    class Sub(PagedFifo):
        __slots__ = ()

    class OptIn(PagedFifo):
        __slots__ = ()
        accepts_paged_index = True

    assert PagedFifo.accepts_paged_index and not Sub.accepts_paged_index
    assert OptIn.accepts_paged_index


def test_entries_after_reads_a_range_in_place():
    """A replica's sync reads a paged queue a batch at a time: entries after a seq, in
    order, from the head, the paged index and pinned ones, nothing removed."""
    pf, _ = paged_fifo(1200, pinned_at=900)
    head = pf.popleft()  # the first 512 read into the head, one put back
    pf.requeue(head)
    assert pf.paged_count == 1200 - 512
    assert [e.seq for e in pf.entries_after(0, 3)] == [1, 2, 3]
    assert [e.seq for e in pf.entries_after(510, 4)] == [511, 512, 513, 514]  # both parts
    assert [e.seq for e in pf.entries_after(898, 3)] == [899, 900, 901]  # 900 pinned
    assert [e.message.body for e in pf.entries_after(1198, 5)] == [b"m1199", b"m1200"]
    assert pf.entries_after(1200, 5) == []
    assert len(pf) == 1200 and [e.seq for e in pf.drain()] == list(range(1, 1201))


def test_seq_counts_from_the_index():
    pf, _ = paged_fifo(1000, pinned_at=700)
    e = pf.popleft()
    e.delivery_count = 2
    pf.requeue(e)
    seqs, counts = pf.seq_counts()
    assert seqs == list(range(1, 1001)) and counts == {1: 2}
