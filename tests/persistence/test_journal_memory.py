"""The journal's unwritten buffer is bounded: above ``max_unwritten`` bytes appended but not
yet written, publishers are blocked by a resource alarm (``Broker.on_store_backlog``),
lifted once the writer is back under half of it. The end-to-end figure (a burst faster
than the disk) is bench.journal_memory's, in docs/performance-durability.md."""
from __future__ import annotations

import trio
import trio.testing

from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.persistence.journal import JournalStore

from .test_store_contract import durable_queue, message

ALARM = "memory (journal backlog)"


def test_unwritten_buffer_over_its_bound_blocks_publishers(tmp_path):
    async def main():
        store = JournalStore(str(tmp_path), settings=JournalSettings(max_unwritten=64 * 1024))
        broker = Broker(Config(data_dir=str(tmp_path)), store)
        await store.open()
        broker.recover()
        q = durable_queue(broker)
        for _ in range(60):                      # 60 KB: under the bound
            q.enqueue(message(b"x" * 1000))
        assert ALARM not in broker.alarms
        for _ in range(10):                      # over it: publishers blocked
            q.enqueue(message(b"x" * 1000))
        assert ALARM in broker.alarms and broker.blocked
        await store._flush_once()                # written: unblocked
        assert ALARM not in broker.alarms and not broker.blocked
        await store.close()

    trio.run(main)


def test_unacked_deliveries_keep_only_their_location(tmp_path):
    """Deliveries left unacked for a while keep their message by journal location only
    (StoredMessage): no body, no properties in memory. An ack reads nothing back; a
    requeue reads it back whole; compaction moves them; a restart brings them back."""
    from broker.persistence.journal import _SLOTS, StoredMessage

    def in_memory(m) -> bool:
        try:
            _SLOTS["body"].__get__(m)
        except AttributeError:
            return False
        return True

    async def main():
        settings = JournalSettings(segment_size=64 * 1024, compact_dead_fraction=0.0)
        store = JournalStore(str(tmp_path), segment_size=64 * 1024, settings=settings)
        broker = Broker(Config(data_dir=str(tmp_path)), store)
        await store.open()
        broker.recover()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            q = durable_queue(broker)
            for i in range(200):
                q.enqueue(message(b"%04d" % i + b"." * 996))
            await store._flush_once()
            held = [q.get() for _ in range(200)]
            assert not any(isinstance(e.message, StoredMessage) for e in held)
            await trio.sleep(2.5)                # two pager passes
            assert all(isinstance(e.message, StoredMessage) and not in_memory(e.message)
                       for e in held)
            for e in held[100:150]:
                q.ack(e, None)
            assert not any(in_memory(e.message) for e in held)  # acks read nothing
            await store.checkpoint()
            for _ in range(150):                 # the log moves on: the old segments compact
                q.enqueue(message(b"late" + b"." * 996))
            await store._flush_once()
            await store.checkpoint()
            assert store.compact_written > 0
            assert not any(in_memory(e.message) for e in held[:100])
            q.requeue([(e, None) for e in held[:10]])
            assert [q.get().message.body[:4] for _ in range(10)] == [b"%04d" % i for i in range(10)]
            assert held[0].message.properties["delivery_mode"] == 2
            nursery.cancel_scope.cancel()
        await store.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    async def after():
        store = JournalStore(str(tmp_path), segment_size=64 * 1024)
        broker = Broker(Config(data_dir=str(tmp_path)), store)
        await store.open()
        broker.recover()
        q = broker.vhosts["/"].queues["q"]
        got = []
        while q.message_count:
            e = q.get()
            got.append((e.message.body[:4], e.redelivered))
            q.ack(e, None)
        await store.close()
        return got

    got = trio.run(after)
    expected = [(b"%04d" % i, True) for i in range(200) if not 100 <= i < 150]
    assert sorted(g for g in got if g[0] != b"late") == expected
    assert sum(1 for g in got if g[0] == b"late") == 150
