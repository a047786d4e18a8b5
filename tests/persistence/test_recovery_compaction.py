"""A kill -9 in the middle of a compaction (broker/persistence/journal/compaction.py): the
moved copies of live messages are in the log, the checkpoint that would cover them and the
deletion of the old segments are not. Nothing is lost or comes back twice, order is kept,
and the log a restart replays stays bounded by the checkpoint interval: a compaction pass
moves a bounded number of messages, however many old segments qualify.

The kill is taken as a copy of the data directory at that moment, once what was appended
has been written (a SIGKILL leaves the page cache, so the files are what a restart
reads); real journal, real queues, in-process."""
from __future__ import annotations

import shutil

import trio

from broker.recovery_progress import RecoveryProgress

from .test_compaction import Harness, _bodies, ack_three_in_four

CKPT_RECORDS = 400  # the checkpoint interval in records, as --journal-checkpoint-records


def _killed_copy(src, dst) -> None:
    shutil.copytree(src, dst)


def test_kill_9_mid_compaction_loses_nothing_and_replays_a_bounded_log(tmp_path):
    data, killed = tmp_path / "data", tmp_path / "killed"
    n = 3000  # ~46 segments of 64 KiB; 750 live messages left in them

    async def main():
        h = Harness(data, checkpoint_records=CKPT_RECORDS)
        await h.start()
        q = h.queue()
        await h.publish(q, n)
        ack_three_in_four(q, n)          # every old segment 3/4 dead
        await h.store._flush_once()
        await h.store.checkpoint()
        await h.publish(q, 50, first=n)  # the log moves on, nothing left the old ones since
        moved = h.store._compact()       # the checkpoint's first step ...
        await h.store._flush_once()      # ... its records on disk, the checkpoint not written
        _killed_copy(data, killed)
        await h.store.close()
        return moved

    moved = trio.run(main)
    assert moved > 0

    async def after():
        h = Harness(killed, checkpoint_records=CKPT_RECORDS)
        h.store.progress = progress = RecoveryProgress()
        await h.start()
        replayed = next(p for p in progress.phases if p.name == "journal log").done
        got = _bodies(h.queue())
        await h.store.close()
        return replayed, got

    replayed, got = trio.run(after)
    assert got == [i for i in range(n) if i % 4 == 0] + list(range(n, n + 50))
    # the records since the last checkpoint (the publishes after it and the compaction's),
    # not every live message of every old segment
    assert replayed <= 2 * CKPT_RECORDS, (replayed, moved)


def test_a_bounded_compaction_catches_up_over_passes(tmp_path):
    """The bound spreads the work over checkpoints, it does not drop it: pass after pass
    every mostly dead old segment is compacted and deleted, each pass appending at most
    half an interval of records (or one segment's), and nothing is lost."""
    n = 3000

    async def main():
        h = Harness(tmp_path, checkpoint_records=CKPT_RECORDS)
        await h.start()
        q = h.queue()
        await h.publish(q, n)
        ack_three_in_four(q, n)
        await h.store._flush_once()
        await h.store.checkpoint()
        old = set(h.segments())
        passes = []
        for i in range(40):
            await h.publish(q, 10, first=n + 10 * i)
            before = h.store._records_since_ckpt
            moved = h.store._compact()
            passes.append((moved, h.store._records_since_ckpt - before))
            await h.store.checkpoint()
            if not old & set(h.segments()):
                break
        left = old & set(h.segments())
        got = _bodies(h.queue())
        await h.store.close()
        return passes, left, got, i

    passes, left, got, i = trio.run(main)
    assert not left, (left, passes)
    assert len([p for p in passes if p[0]]) > 1  # spread over several passes
    assert max(records for _moved, records in passes) <= CKPT_RECORDS // 2, passes
    assert got == [k for k in range(n) if k % 4 == 0] + list(range(n, n + 10 * (i + 1)))
