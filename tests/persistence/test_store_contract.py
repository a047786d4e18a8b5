"""The Store contract (broker/persistence/base.py): URL registry, declared capabilities,
stores as observers of the queue operation stream, recovery through Queue.restore, and
what a write failure does (broker.on_store_failure, pending confirms nacked)."""
from __future__ import annotations

import errno
import math
import os

import pytest
import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config
from broker.message import Message
from broker.persistence import (
    DURABLE,
    PAGES_MESSAGES,
    READS_BACK,
    MemoryStore,
    StoreUnavailable,
    open_store,
    store_class,
)
from broker.persistence.base import BLOCKS_ON_FAILURE, store_scheme
from broker.persistence.journal import JournalStore
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue


def message(body: bytes, persistent: bool = True) -> Message:
    props = {"delivery_mode": 2 if persistent else 1}
    return Message("", "q", encode_properties(props), props, body)


def durable_queue(broker, name="q", arguments=None) -> Queue:
    vhost = broker.vhosts["/"]
    args = arguments or {}
    q = Queue(vhost, name, durable=True, arguments=args, opts=parse_queue_arguments(args))
    vhost.add_queue(q)
    return q


# ---------------------------------------------------------------- registry
@pytest.mark.parametrize("url,scheme", [
    (None, "journal"), ("", "journal"), ("journal", "journal"), ("journal:/tmp/x", "journal"),
    ("/var/lib/triomq", "journal"), ("memory", "memory"), ("memory:", "memory"),
    ("sqlite:///a.db", "sqlite"), ("postgresql+psycopg://u@h/db", "postgresql"),
    ("mysql+pymysql://root@h/db", "mysql"), ("mariadb://h/db", "mariadb"),
])
def test_store_scheme(url, scheme):
    assert store_scheme(url) == scheme


def test_registry_opens_backends(tmp_path):
    j = open_store(f"journal:{tmp_path}/elsewhere", str(tmp_path))
    assert isinstance(j, JournalStore) and j.data_dir == f"{tmp_path}/elsewhere"
    assert isinstance(open_store(None, str(tmp_path)), JournalStore)
    assert isinstance(open_store("memory", str(tmp_path)), MemoryStore)
    assert store_class("sqlite:///x.db").__name__ == "SQLStore"
    with pytest.raises(StoreUnavailable, match="unsupported store URL 'bogus://x'"):
        open_store("bogus://x", str(tmp_path))


def test_capabilities_are_declared():
    from broker.persistence.sql import SQLStore
    assert MemoryStore.capabilities == frozenset()
    assert {DURABLE, PAGES_MESSAGES, READS_BACK, BLOCKS_ON_FAILURE} <= JournalStore.capabilities
    assert SQLStore.capabilities == frozenset({DURABLE, PAGES_MESSAGES})  # FIFO backlogs page


def test_memory_store_is_not_attached_to_queues():
    broker = Broker(Config(), MemoryStore())
    q = durable_queue(broker)
    assert q.store is None and q.observers == []


# ---------------------------------------------------------------- the journal as observer
class JournalBroker:
    def __init__(self, path):
        self.store = JournalStore(str(path))
        self.broker = Broker(Config(data_dir=str(path)), self.store)

    async def start(self):
        await self.store.open()
        self.broker.recover()

    async def stop(self):
        await self.store.close()


def life(path, body, crash: bool = False) -> None:
    """One broker lifetime on the journal in ``path``: start (recover), ``body(jb)``, then a
    clean stop (checkpoint) or, with ``crash``, a flush and a dead process (log replay)."""
    async def main():
        jb = JournalBroker(path)
        await jb.start()
        body(jb)
        if crash:
            await jb.store._flush_once()
            os.close(jb.store._lock_fd)
        else:
            await jb.stop()
    trio.run(main)


def test_journal_tracks_unacked_from_the_op_stream_and_checkpoints_them(tmp_path):
    def first(jb):
        q = durable_queue(jb.broker)
        assert q.store is jb.store and jb.store in q.observers
        for body in (b"a", b"b", b"c"):
            q.enqueue(message(body))
        q.enqueue(message(b"transient", persistent=False))
        held = q.get()                          # delivered, not acked: the store follows it
        assert held.message.body == b"a" and list(jb.store._out) == [held]
        acked = q.get()
        q.ack(acked, None)
        assert list(jb.store._out) == [held]    # the stop writes a checkpoint with it

    def second(jb):
        q = jb.broker.vhosts["/"].queues["q"]
        bodies = [(e.message.body, e.redelivered) for e in q.ready]
        assert bodies == [(b"a", True), (b"c", False)]
        assert q.next_seq == 4

    life(tmp_path, first)
    life(tmp_path, second)


def test_journal_restores_a_paged_index(tmp_path):
    def first(jb):
        q = durable_queue(jb.broker)
        for i in range(5):
            q.enqueue(message(b"m%d" % i))

    def second(jb):
        q = jb.broker.vhosts["/"].queues["q"]
        assert q.restores_paged
        seqs, locs, exps, _blens, _flags = q.paged_index()
        assert list(seqs) == [1, 2, 3, 4, 5] and all(locs) and all(math.isnan(x) for x in exps)
        assert q.message_count == 5 and q.ready_bytes == 10 and q.next_seq == 6
        assert [q.get().message.body for _ in range(5)] == [b"m%d" % i for i in range(5)]

    life(tmp_path, first, crash=True)           # no checkpoint: recovery replays the log
    life(tmp_path, second)


def test_journal_write_failure_reports_to_broker_and_nacks(tmp_path):
    """A failed write: its publishes are in doubt (they wait for the retry, never nacked);
    a publish while writes fail is taken back from its queue unwritten and nacked; a
    callback without on_failure has its entries written by the retry."""
    async def main():
        jb = JournalBroker(tmp_path)
        await jb.start()
        jb.store._dirty = trio.Event()
        q = durable_queue(jb.broker)
        q.enqueue(message(b"x"))
        reports = []
        jb.broker.on_store_failure = lambda store, reason: reports.append((store, reason))
        recovered = []
        jb.broker.on_store_recovered = lambda store: recovered.append(store)
        results = []
        jb.store.when_durable(lambda: results.append("ack"), lambda: results.append("nack"))
        waiting = []
        jb.store.when_durable(lambda: waiting.append("done"))     # no on_failure: waits
        real = jb.store._write_chunks

        def full(chunks):
            raise OSError(errno.ENOSPC, "No space left on device")

        jb.store._write_chunks = full
        with trio.move_on_after(0.01):           # _flush_once sleeps 1 s after a failure
            await jb.store._flush_once()
        assert reports == [(jb.store, "no space left on device")]
        assert results == [] and waiting == []   # in doubt: neither confirmed nor nacked
        q.enqueue(message(b"nacked"))
        jb.store.when_durable(lambda: results.append("ack2"), lambda: results.append("nack2"))
        assert results == ["nack2"]              # while failing: nacked at once...
        assert [e.message.body for e in q.ready] == [b"x"]  # ...and never in the queue
        q.enqueue(message(b"kept"))              # no on_failure (no confirms): written later
        jb.store.when_durable(lambda: waiting.append("kept"))
        jb.store._write_chunks = real
        await jb.store._flush_once()
        assert recovered == [jb.store] and waiting == ["done", "kept"]
        assert results == ["nack2", "ack"]       # the write in doubt made it after all
        await jb.stop()

    trio.run(main)

    def after(jb):
        q = jb.broker.vhosts["/"].queues["q"]
        assert [q.get().message.body for _ in range(q.message_count)] == [b"x", b"kept"]

    life(tmp_path, after)


def test_broker_on_store_failure_blocks_for_a_blocking_store(tmp_path):
    store = JournalStore(str(tmp_path))
    broker = Broker(Config(data_dir=str(tmp_path)), store)
    broker.on_store_failure(store, "no space left on device")
    assert "journal" in broker.alarms
    broker.on_store_recovered(store)
    assert not broker.alarms


def test_broker_on_store_failure_does_not_block_for_sql():
    from broker.persistence.sql import SQLStore
    store = SQLStore("sqlite:////tmp/never-opened.db")
    broker = Broker(Config(), store)
    broker.on_store_failure(store, "database lost")
    assert not broker.alarms
