"""The journal's unwritten buffer is bounded: above ``max_unwritten`` bytes appended but not
yet written, publishers are blocked by a resource alarm (``Broker.on_store_backlog``),
lifted once the writer is back under half of it. The end-to-end figure (a burst faster
than the disk) is bench.journal_memory's, in docs/performance-durability.md."""
from __future__ import annotations

import trio

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
