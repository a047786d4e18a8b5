"""The audit writer process: pickled batches of event tuples in, rolled Avro files out.

``python -m broker.audit.writer --dir DIR --node NAME [--roll-bytes N] [--roll-seconds S]
[--codec deflate|null]`` reads frames (4-byte big-endian length, then a pickled list
of event tuples) from stdin until EOF. Each event gets the node's next sequence number and
becomes one record (``events.to_record``). Files are Hive-style partitions
``dt=YYYY-MM-DD/hour=HH/node=NAME/part-<first seq>.avro`` (UTC, from the event time) and
are rolled when the hour changes, past ``--roll-bytes`` or after ``--roll-seconds``. Every
batch ends a block and is handed to the OS, so a broker crash loses only what the broker
had not sent yet; the writer itself, killed, leaves at most a torn last block, which the
reader skips and reports.

The sequence continues across restarts from the highest one found on disk for this node;
the first event of each run is ``node_started`` whose detail says whether the previous run
ended with ``node_stopped`` (if not, its unsent tail is lost).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import glob
import json
import os
import pickle
import struct
import sys
import time

from . import events
from .encoder import BatchEncoder, ContainerFile
from .reader import VERSION_KEY, FileReader


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

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _read_exact(stream, n: int) -> bytes:
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return b""
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m broker.audit.writer")
    p.add_argument("--dir", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--roll-bytes", type=int, default=64 << 20)
    p.add_argument("--roll-seconds", type=float, default=300.0)
    p.add_argument("--codec", default="deflate", choices=("deflate", "null"))
    args = p.parse_args(argv)
    # Unpickling a batch allocates thousands of tuples, which would run the cyclic collector
    # over and over; nothing here makes cycles (everything is freed by reference counts).
    gc.disable()
    seq, last_event = last_state(args.dir, args.node)
    out = RollingWriter(args.dir, args.node, args.roll_bytes, args.roll_seconds, args.codec,
                        seq + 1)
    previous = ("first run" if last_event is None and seq == 0 else
                "previous run ended cleanly" if last_event == "node_stopped" else
                "previous run did not stop cleanly: its unsent tail is lost")
    out.write([(events.TRAIL, time.time(), "node_started", None, previous)])
    stdin = sys.stdin.buffer
    try:
        while True:
            head = _read_exact(stdin, 4)
            if len(head) < 4:
                break
            data = _read_exact(stdin, struct.unpack(">I", head)[0])
            if not data:
                break
            out.write(pickle.loads(data))
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
