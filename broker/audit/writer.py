"""The audit converter process: the spool's frames in, rolled Avro files out.

``python -m broker.audit.writer --dir DIR --node NAME [--roll-bytes N] [--roll-seconds S]
[--codec deflate|null]`` runs at the lowest CPU priority (nice 19), so on a busy machine it
yields the CPU to the broker and catches up later. It reads the spool segments
(``spool.py``) in order, following the newest one as the broker appends, and writes each
frame as one Avro block (``encoder.BatchEncoder``) with the sequence numbers the broker gave
it. Files are Hive-style partitions ``dt=YYYY-MM-DD/hour=HH/node=NAME/part-<first seq>.avro``
(UTC, from the batch's first event) rolled when the hour changes, past ``--roll-bytes`` or
after ``--roll-seconds``. A segment is deleted once it is converted, fsynced, and the broker
has moved on to a newer one.

It exits after converting everything once the broker has closed the spool (a clean stop),
or once its parent broker is gone (a crash: what is whole in the spool is converted, and the
next start converts the rest). Frames already in the Avro files (a converter killed between
writing a block and deleting its segment) are skipped by sequence number.
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import gc
import glob
import json
import os
import signal
import sys
import time

from . import events, spool
from .encoder import BatchEncoder, ContainerFile
from .reader import VERSION_KEY, FileReader

BLOCK_EVENTS = 12_000


def _partition(ts_us: int, node: str) -> str:
    t = datetime.datetime.fromtimestamp(ts_us / 1e6, datetime.UTC)
    return f"dt={t:%Y-%m-%d}/hour={t:%H}/node={node}"


def node_files(root: str, node: str) -> list[str]:
    files = glob.glob(os.path.join(root, "dt=*", "hour=*", f"node={node}", "part-*.avro"))
    return sorted(files, key=os.path.basename)


def last_state(root: str, node: str) -> tuple[int, str | None]:
    """(highest sequence on disk for ``node`` or 0, the last event's name)."""
    for path in reversed(node_files(root, node)):
        records = FileReader(path).last_records(1)
        last = records[-1] if records else None
        if last is not None:
            return last["seq"], last["event"]
        try:  # an empty or unreadable file: its name still says where it started
            return int(os.path.basename(path)[5:-5]) - 1, None
        except ValueError:
            continue
    return 0, None


class RollingWriter:
    """The node's current file; one Avro block per batch; rolled by hour, size and age."""

    def __init__(self, root: str, node: str, roll_bytes: int, roll_seconds: float,
                 codec: str, next_seq: int) -> None:
        self.root = root
        self.node = node
        self.roll_bytes = roll_bytes
        self.roll_seconds = roll_seconds
        self.codec = codec
        self.schema_json = json.dumps(events.load_schema())
        self.encoder = BatchEncoder(node, next_seq)
        self.file: ContainerFile | None = None
        self.part: str | None = None
        self.opened_at = 0.0

    def _open(self, part: str, first_seq: int) -> None:
        self.close()
        directory = os.path.join(self.root, part)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"part-{first_seq:020d}.avro")
        self.file = ContainerFile(path, self.schema_json, self.codec,
                                  {VERSION_KEY: str(events.SCHEMA_VERSION)})
        self.part = part
        self.opened_at = time.monotonic()

    def write(self, batch: list) -> None:
        """Encode and write ``batch`` (event tuples, in order) as one block.

        The batch goes to the partition of its first event's hour: a batch covers a few
        milliseconds, so a file may hold a few events of the neighbouring hour (the jobs
        filter on ``ts_us``, never on the partition)."""
        if not batch:
            return
        part = _partition(int(batch[0][1] * 1e6), self.node)
        f = self.file
        if f is None or part != self.part or f.size >= self.roll_bytes \
                or time.monotonic() - self.opened_at >= self.roll_seconds:
            self._open(part, self.encoder.seq)
        assert self.file is not None
        self.file.write_block(len(batch), self.encoder.encode(batch))

    def sync(self) -> None:
        """Everything written so far is on disk."""
        if self.file is not None:
            self.file.f.flush()
            os.fsync(self.file.f.fileno())

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def convert(root: str, out: RollingWriter, last_seq: int, stop, idle_exit) -> int:
    """Convert the spool until ``stop()`` or, with nothing left, ``idle_exit()``; returns
    the last sequence number written."""
    positions: dict[str, int] = {}
    closed_marker = os.path.join(spool.spool_dir(root), "closed")
    while True:
        progressed = False
        # Looked at before the segments are read: the broker writes the marker after its
        # last frame, so a marker seen now means every frame read below is whole, and a
        # frame still being written when the marker was not yet there is read next pass.
        closed = os.path.exists(closed_marker)
        finished = idle_exit()
        segs = spool.segments(root)
        for i, path in enumerate(segs):
            newest = i == len(segs) - 1
            pos = positions.get(path, 0)
            # Frames already spooled (the converter lagging) are joined into one block of
            # up to BLOCK_EVENTS: the encoder's cost per block is spread over more events.
            pending: list = []
            for _, first, count, data, nxt in spool.read_frames(path, pos):
                pos = positions[path] = nxt
                if first + count - 1 <= last_seq:
                    continue  # already in the Avro files
                batch = spool.loads(data)
                if first <= last_seq:
                    batch = batch[last_seq - first + 1:]
                    first = last_seq + 1
                if pending and first != last_seq + 1:  # a hole (a failed spool write)
                    out.write(pending)
                    pending = []
                if not pending:
                    out.encoder.seq = first
                pending += batch
                last_seq = first + len(batch) - 1
                progressed = True
                if len(pending) >= BLOCK_EVENTS:
                    out.write(pending)
                    pending = []
                if stop():
                    break
            if pending:
                out.write(pending)
            if stop():
                return last_seq
            done = not newest or closed
            if done:
                size = os.path.getsize(path)
                if pos < size:
                    print(f"audit converter: {path}: {size - pos} bytes of a torn frame "
                          f"(a crash) skipped", file=sys.stderr, flush=True)
                out.sync()
                os.remove(path)
                positions.pop(path, None)
        if stop():
            return last_seq
        if not progressed:
            if finished:  # a clean stop (all converted, segments gone) or the broker died
                return last_seq
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m broker.audit.writer")
    p.add_argument("--dir", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--roll-bytes", type=int, default=64 << 20)
    p.add_argument("--roll-seconds", type=float, default=300.0)
    p.add_argument("--codec", default="deflate", choices=("deflate", "null"))
    args = p.parse_args(argv)
    # Loading a batch allocates thousands of tuples, which would run the cyclic collector
    # over and over; nothing here makes cycles (everything is freed by reference counts).
    gc.disable()
    try:
        os.nice(19)
    except OSError:
        pass
    parent = os.getppid()
    # One converter per trail: one orphaned by a killed broker may still be finishing when
    # the next broker starts its own, which waits here until the first has exited.
    os.makedirs(spool.spool_dir(args.dir), exist_ok=True)
    lock = open(os.path.join(spool.spool_dir(args.dir), "converter.lock"), "w")  # noqa: SIM115
    fcntl.flock(lock, fcntl.LOCK_EX)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    closed_marker = os.path.join(spool.spool_dir(args.dir), "closed")
    last_seq, _ = last_state(args.dir, args.node)
    out = RollingWriter(args.dir, args.node, args.roll_bytes, args.roll_seconds, args.codec,
                        last_seq + 1)
    try:
        convert(args.dir, out, last_seq, lambda: bool(stopping),
                lambda: os.path.exists(closed_marker) or os.getppid() != parent)
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
