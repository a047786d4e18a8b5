"""x-delivery-count, x-delivery-limit and the x-retry-delays level survive a restart of
the journal store (clean stop = checkpoint, crash = log replay), in memory and paged."""
from __future__ import annotations

import os

import pytest
import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.message import Message
from broker.persistence import journal_format as jf
from broker.persistence.journal import JournalStore
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue


def message(body: bytes, priority: int | None = None) -> Message:
    props: dict = {"delivery_mode": 2}
    if priority is not None:
        props["priority"] = priority
    return Message("", "q", encode_properties(props), props, body)


def run_life(path, body, *, crash: bool = False, budget: int | None = None):
    """One broker lifetime on the journal in ``path``: start (recover), ``body(broker,
    store)``, then a clean stop (checkpoint) or, with ``crash``, a flush and a dead
    process (the next start replays the log). ``budget``: the queues' memory budget.
    Returns what ``body`` returned."""
    settings = JournalSettings() if budget is None else JournalSettings(queue_memory_budget=budget)

    async def main():
        store = JournalStore(str(path), settings=settings)
        broker = Broker(Config(data_dir=str(path)), store)
        await store.open()
        broker.recover()
        result = body(broker, store)
        await store._flush_once()
        if crash:
            os.close(store._lock_fd)
        else:
            await store.close()
        return result
    return trio.run(main)


def queue_of(broker, arguments: dict | None = None, name: str = "q") -> Queue:
    vhost = broker.vhosts["/"]
    q = vhost.queues.get(name)
    if q is None:
        args = arguments or {}
        q = Queue(vhost, name, durable=True, arguments=args, opts=parse_queue_arguments(args))
        vhost.add_queue(q)
    return q


def requeue_times(q: Queue, n: int) -> None:
    """Deliver the head entry and hand it back ``n`` times (a consumer's channel closing)."""
    for _ in range(n):
        q.requeue([(q.get(), None)])


CRASH = pytest.mark.parametrize("crash", [False, True], ids=["clean-stop", "kill-9"])


@CRASH
@pytest.mark.parametrize("budget", [None, 0], ids=["in-memory", "paged"])
def test_delivery_count_survives_restart(tmp_path, crash, budget):
    def first(broker, store):
        q = queue_of(broker, {"x-delivery-limit": 10})
        q.enqueue(message(b"a"))
        q.enqueue(message(b"b"))
        requeue_times(q, 2)

    def second(broker, store):
        q = queue_of(broker)
        e = q.get()
        return e.message.body, e.delivery_count, e.redelivered, \
            e.message.properties["headers"]["x-delivery-count"], q.get().delivery_count

    run_life(tmp_path, first, crash=crash, budget=budget)
    assert run_life(tmp_path, second, budget=budget) == (b"a", 3, True, 2, 1)


@CRASH
def test_delivery_limit_holds_across_restart(tmp_path, crash):
    def first(broker, store):
        q = queue_of(broker, {"x-delivery-limit": 2})
        q.enqueue(message(b"a"))
        requeue_times(q, 2)
        assert q.message_count == 1

    def second(broker, store):
        q = queue_of(broker)
        requeue_times(q, 1)  # the third return: more than 2, dead-lettered (dropped here)
        return q.message_count, q.retry.dead_lettered

    run_life(tmp_path, first, crash=crash)
    assert run_life(tmp_path, second) == (0, 1)


@CRASH
def test_retry_level_survives_restart(tmp_path, crash):
    args = {"x-retry-delays": [0, 0]}  # two levels, then dead-lettered

    def first(broker, store):
        q = queue_of(broker, args)
        q.enqueue(message(b"a"))
        for _ in range(2):
            q.reject(q.get(), None)  # level 1, level 2: back at once (delay 0)
        assert q.message_count == 1

    def second(broker, store):
        q = queue_of(broker)
        e = q.get()
        header = e.message.properties["headers"]["x-delivery-count"]
        q.reject(e, None)  # the third failure is past the last level
        return header, q.message_count, q.retry.dead_lettered

    run_life(tmp_path, first, crash=crash)
    assert run_life(tmp_path, second) == (2, 0, 1)


def test_unacked_delivery_counts_after_a_crash(tmp_path):
    def first(broker, store):
        q = queue_of(broker, {"x-delivery-limit": 5})
        q.enqueue(message(b"a"))
        requeue_times(q, 1)
        q.get()  # the second delivery is never settled: the broker dies

    def second(broker, store):
        e = queue_of(broker).get()
        return e.delivery_count, e.message.properties["headers"]["x-delivery-count"]

    run_life(tmp_path, first, crash=True)
    assert run_life(tmp_path, second) == (3, 2)


def test_counts_are_replayed_on_top_of_a_checkpoint(tmp_path):
    def first(broker, store):
        q = queue_of(broker, {"x-delivery-limit": 9})
        q.enqueue(message(b"a"))
        requeue_times(q, 1)

    def second(broker, store):  # after a checkpoint: two more returns, then a crash
        requeue_times(queue_of(broker), 2)

    def third(broker, store):
        return queue_of(broker).get().delivery_count

    run_life(tmp_path, first)
    run_life(tmp_path, second, crash=True)
    assert run_life(tmp_path, third) == 4


def test_delivered_record_formats():
    one = jf.pack_delivered(7, 42, 1)
    assert one == jf.QSEQ.pack(7, 42)  # the first delivery keeps the format-1 record
    assert jf.unpack_delivered(one) == (7, 42, 1)
    assert jf.unpack_delivered(jf.pack_delivered(7, 42, 300)) == (7, 42, 300)
    assert [jf.count_flags(c, d) for c, d in ((0, False), (0, True), (3, True), (999, False))] \
        == [0, 1, 3, jf.FLAGS_MAX]


def test_a_format_1_journal_is_recovered(tmp_path):
    """Records as the previous version wrote them: a 12-byte delivered record, no count."""
    async def write_old():
        store = JournalStore(str(tmp_path))
        broker = Broker(Config(data_dir=str(tmp_path)), store)
        await store.open()
        broker.recover()
        q = queue_of(broker, {"x-delivery-limit": 3})
        q.observers.remove(store)  # write the message records by hand, as format 1 did
        q.enqueue(message(b"a"))
        entry = q.get()
        store.enqueue(q, entry)
        qid = store._qids[q]
        store.append_record(jf.T_DELIVERED, jf.QSEQ.pack(qid, entry.seq))
        store.append_record(jf.T_DELIVERED, jf.QSEQ.pack(qid, entry.seq))
        await store._flush_once()
        os.close(store._lock_fd)
    trio.run(write_old)

    def second(broker, store):
        e = queue_of(broker).get()
        return e.message.body, e.redelivered, e.delivery_count

    assert run_life(tmp_path, second) == (b"a", True, 2)
