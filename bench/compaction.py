"""Journal compaction: bytes it writes against the bytes it frees.

    .venv/bin/python -m bench.compaction [--mib 512] [--size 4096] [--lag 20000]
                                         [--segment-mib 4] [--hold-every 200]

In-process (the real JournalStore and queues, no network): persistent messages go
through one durable queue whose consumer lags ``--lag`` messages behind the publisher
and acks in order, except one message in ``--hold-every`` that it keeps unacked until
the end (scattered live messages pinning old segments). Checkpoints come every two
segments, as ``run()`` would take them. Reported: bytes published, bytes compaction
appended (the log position before and after each ``_compact``), and the segment
bytes deleted by checkpoints.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import trio

from broker.amqp.fields import encode_properties
from broker.broker import Broker
from broker.config import Config, JournalSettings
from broker.message import Message
from broker.persistence.journal import JournalStore
from broker.queues.args import parse_queue_arguments
from broker.queues.queue import Queue


class CountingStore(JournalStore):
    """Counts what compaction appends and what checkpoints delete."""

    compaction_bytes = 0

    def _pos(self) -> int:
        return self._seg * self.segment_size + self._off

    def _compact(self) -> int:
        before = self._pos()
        moved = super()._compact()
        self.compaction_bytes += self._pos() - before
        return moved


def _segment_bytes(jdir: str) -> int:
    return sum(os.path.getsize(os.path.join(jdir, f)) for f in os.listdir(jdir)
               if f.endswith(".log"))


async def run(args, data_dir: str) -> None:
    seg = args.segment_mib << 20
    settings = JournalSettings(segment_size=seg, checkpoint_bytes=2 * seg)
    store = CountingStore(data_dir, segment_size=seg, settings=settings)
    broker = Broker(Config(data_dir=data_dir), store)
    await store.open()
    broker.recover()
    vhost = broker.vhosts["/"]
    q = Queue(vhost, "q", durable=True, arguments={}, opts=parse_queue_arguments({}))
    vhost.add_queue(q)
    props = {"delivery_mode": 2}
    raw = encode_properties(props)
    body = b"x" * args.size
    n = (args.mib << 20) // args.size
    held = []
    deleted = 0
    published = 0
    t0 = time.monotonic()
    for i in range(n):
        q.enqueue(Message("", "q", raw, props, body))
        published += args.size
        if i >= args.lag:
            e = q.get()
            if e.seq % args.hold_every == 0:
                held.append(e)
            else:
                q.ack(e, None)
        if i % 200 == 0:
            await store._flush_once()
            if store._bytes_since_ckpt >= settings.checkpoint_bytes:
                before = _segment_bytes(store.jdir)
                await store.checkpoint()
                after = _segment_bytes(store.jdir)
                deleted += max(0, before - after)
    await store._flush_once()
    dt = time.monotonic() - t0
    written = store.compaction_bytes
    print(f"published {published >> 20} MiB ({n} x {args.size} B, lag {args.lag}, one in "
          f"{args.hold_every} held) in {dt:.1f} s; segments {args.segment_mib} MiB")
    print(f"compaction appended {written / 2**20:.1f} MiB "
          f"({written / published:.3f} of what was published); checkpoints deleted "
          f"{deleted / 2**20:.0f} MiB of segments; compaction written / deleted = "
          f"{written / max(deleted, 1):.3f}")
    for e in held:
        q.ack(e, None)
    await store.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=512)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--lag", type=int, default=20000)
    p.add_argument("--segment-mib", type=int, default=4)
    p.add_argument("--hold-every", type=int, default=200)
    args = p.parse_args(argv)
    d = tempfile.mkdtemp(prefix="triomq-compaction-")
    try:
        trio.run(run, args, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
