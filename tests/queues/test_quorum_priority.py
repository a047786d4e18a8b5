"""Quorum queue priorities (RabbitMQ 4's rabbit_fifo_q): two levels -- 0-4 or none
normal, 5 and above high -- served two high for one normal (a high message older than
the oldest normal one keeps the third turn), in memory and on the journal across a
clean stop and a kill -9, paged or not."""
from __future__ import annotations

import pytest

from broker.broker import Broker
from broker.queues.priority import PriorityReady

from ..persistence.test_delivery_count import CRASH, message, queue_of, run_life

Q = {"x-queue-type": "quorum"}
PRIOS = [0, 7, 3, 9, None, 5, 4, 6, 1, 8, 2, 5, 10, 0, 255, None]


def model(prios, counter: int = 0) -> list[bytes]:
    """rabbit_fifo_q's out/1, written out independently: the delivery order of bodies."""
    hi = [i for i, p in enumerate(prios) if (p or 0) > 4]
    no = [i for i, p in enumerate(prios) if (p or 0) <= 4]
    out = []
    while hi or no:
        if hi and (counter != 2 or not no or hi[0] < no[0]):
            out.append(hi.pop(0))
        else:
            out.append(no.pop(0))
        counter = 0 if counter == 2 else counter + 1
    return [b"m%02d" % i for i in out]


def publish(q, prios) -> None:
    for i, p in enumerate(prios):
        q.enqueue(message(b"m%02d" % i, priority=p))


def drain(q) -> list[bytes]:
    out = []
    while (e := q.get()) is not None:
        out.append(e.message.body)
        q.ack(e, None)
    return out


def test_model_is_two_to_one():
    # high published first: every high message is older than the normal ones, so each
    # third turn still goes to high ("safe" to favour it)
    assert model([9] * 6 + [0] * 3) == [b"m%02d" % i for i in range(9)]
    # normal published first: every third turn goes to the older normal message
    assert model([0, 0, 0, 9, 9, 9, 9]) == [b"m03", b"m04", b"m00", b"m05", b"m06", b"m01",
                                            b"m02"]


def test_quorum_queue_two_levels_in_memory():
    q = queue_of(Broker(), Q)
    assert isinstance(q.ready, PriorityReady)
    publish(q, PRIOS)
    assert drain(q) == model(PRIOS)


def test_classic_queue_without_max_priority_stays_fifo():
    q = queue_of(Broker(), {})
    publish(q, PRIOS)
    assert drain(q) == [b"m%02d" % i for i in range(len(PRIOS))]


def test_peek_agrees_with_popleft():
    q = queue_of(Broker(), Q)
    publish(q, PRIOS)
    while (head := q.ready.peek()) is not None:
        assert q.ready.popleft() is head


@CRASH
@pytest.mark.parametrize("budget", [None, 0], ids=["in-memory", "paged"])
def test_quorum_priorities_survive_restart(tmp_path, crash, budget):
    def first(broker, store):
        publish(queue_of(broker, Q), PRIOS)

    def second(broker, store):
        return drain(queue_of(broker))

    run_life(tmp_path, first, crash=crash, budget=budget)
    assert run_life(tmp_path, second, budget=budget) == model(PRIOS)


def test_partly_drained_levels_survive_restart(tmp_path):
    """Taken before the stop: the rest comes back by level in publish order (the
    counter starts again, as a fresh rabbit_fifo_q)."""
    def first(broker, store):
        q = queue_of(broker, Q)
        publish(q, PRIOS)
        got = [q.get() for _ in range(4)]
        for e in got:
            q.ack(e, None)
        return [e.message.body for e in got]

    def second(broker, store):
        return drain(queue_of(broker))

    taken = run_life(tmp_path, first, budget=0)
    assert taken == model(PRIOS)[:4]
    survivors = [(i, p) for i, p in enumerate(PRIOS) if b"m%02d" % i not in taken]
    expect = [b"m%02d" % survivors[int(b[1:])][0]
              for b in model([p for _i, p in survivors])]
    assert run_life(tmp_path, second, budget=0) == expect


def test_a_checkpoint_without_levels_is_read_back_with_the_two_level_rule(tmp_path):
    """A checkpoint without the levels column (format 1): recovery reads the messages back
    for their priorities and maps them as a quorum queue does (priority 3 is normal; the
    classic cap would have made it high)."""
    import os

    from broker.persistence import journal_format as jf

    run_life(tmp_path, lambda broker, store: publish(queue_of(broker, Q), PRIOS), budget=0)
    path = os.path.join(tmp_path, "journal", "checkpoint")
    with open(path, "rb") as f:
        data = f.read()
    recs: list = []
    jf.scan(data, path, records=recs)
    assert jf.T_CKPT_PRIO in [rtype for _off, rtype, _p in recs]
    with open(path, "wb") as f:
        f.write(b"".join(jf.pack_record(rtype, bytes(p)) for _off, rtype, p in recs
                         if rtype != jf.T_CKPT_PRIO))
    assert run_life(tmp_path, lambda broker, store: drain(queue_of(broker)),
                    budget=0) == model(PRIOS)
