"""Journal compaction by dead bytes: a segment is rewritten only if at least
``compact_dead_fraction`` of it is dead, so compaction writes at most
``1 - compact_dead_fraction`` of what it frees; nothing is compacted into a disk that
cannot hold it (a real tmpfs)."""
from __future__ import annotations

import os

import trio

from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.persistence.journal import JournalStore

from .test_full_disk import fill, tmpfs
from .test_store_contract import durable_queue, message

SEGMENT = 64 * 1024
BODY = 1000


class Harness:
    def __init__(self, path, **settings):
        self.store = JournalStore(str(path), segment_size=SEGMENT,
                                  settings=JournalSettings(segment_size=SEGMENT, **settings))
        self.broker = Broker(Config(data_dir=str(path)), self.store)

    async def start(self):
        await self.store.open()
        self.broker.recover()

    def queue(self):
        q = self.broker.vhosts["/"].queues.get("q")
        return q if q is not None else durable_queue(self.broker)

    async def publish(self, q, n, first=0):
        for i in range(first, first + n):
            q.enqueue(message(b"%06d" % i + b"." * (BODY - 6)))
            if i % 20 == 0:
                await self.store._flush_once()
        await self.store._flush_once()

    def segments(self) -> list[int]:
        return sorted(self.store._seg_live)


def ack_three_in_four(q, n) -> None:
    """Take ``n`` messages; ack those whose number is not a multiple of 4, requeue the rest."""
    kept = []
    for _ in range(n):
        e = q.get()
        if int(e.message.body[:6]) % 4:
            q.ack(e, None)
        else:
            kept.append((e, None))
    q.requeue(kept)


def _bodies(q) -> list[int]:
    out = []
    while q.message_count:
        e = q.get()
        out.append(int(e.message.body[:6]))
        q.ack(e, None)
    return out


def test_live_segments_are_not_rewritten(tmp_path):
    """A backlog nobody consumes: its segments are all live, nothing is compacted (the
    old rule rewrote every old segment with at most 2,000 live messages)."""
    async def main():
        h = Harness(tmp_path)
        await h.start()
        q = h.queue()
        await h.publish(q, 400)                 # ~6 segments of 64 KiB, all live
        await h.store.checkpoint()
        await h.publish(q, 200, first=400)      # the log moves on: old ones are candidates
        before = h.segments()
        await h.store.checkpoint()
        assert h.store.compact_written == 0
        assert h.segments() == before
        await h.store.close()

    trio.run(main)


def test_mostly_dead_segments_are_compacted_writing_less_than_they_free(tmp_path):
    """Three messages in four acked: every old segment is 3/4 dead. Compaction moves the
    rest, the next checkpoint deletes the files, and it wrote at most half of what it
    freed; every live message is there after a restart, in order."""
    async def main():
        h = Harness(tmp_path)
        await h.start()
        q = h.queue()
        await h.publish(q, 600)
        ack_three_in_four(q, 600)
        await h.store._flush_once()
        await h.store.checkpoint()
        await h.publish(q, 200, first=600)
        await h.store.checkpoint()              # compacts the 3/4-dead old segments
        assert h.store.compact_written > 0
        await h.publish(q, 100, first=800)
        await h.store.checkpoint()              # deletes the emptied files
        written, freed = h.store.compact_written, h.store.compact_freed
        assert freed >= 2 * SEGMENT
        assert written <= freed * 0.5, (written, freed)
        await h.store.close()
        return written, freed

    written, freed = trio.run(main)
    print(f"\ncompaction wrote {written} bytes, freed {freed} ({written / freed:.2f})")

    async def after():
        h = Harness(tmp_path)
        await h.start()
        got = _bodies(h.queue())
        await h.store.close()
        return got

    got = trio.run(after)
    assert got == [i for i in range(600) if i % 4 == 0] + list(range(600, 900))


def test_compaction_is_not_started_without_room_for_it(tmp_path):
    """On a nearly full disk (a real tmpfs) a compaction that could not finish is not
    started: no ENOSPC of its own, and it runs once there is room."""
    with tmpfs(tmp_path / "disk", 8) as disk:
        async def main():
            h = Harness(os.path.join(disk, "data"))
            await h.start()
            q = h.queue()
            await h.publish(q, 600)
            ack_three_in_four(q, 600)
            await h.store._flush_once()
            await h.store.checkpoint()
            await h.publish(q, 100, first=600)
            ballast = fill(disk, SEGMENT // 2)   # less than one segment of room
            await h.store.checkpoint()
            assert h.store.compact_written == 0
            assert h.store._failed is None
            os.unlink(ballast)
            await h.store.checkpoint()
            assert h.store.compact_written > 0
            await h.store.close()

        trio.run(main)
