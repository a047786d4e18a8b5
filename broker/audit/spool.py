"""The trail's spool: the broker's batches on disk until the converter turns them into Avro.

The broker's drain task appends one *frame* per batch to the current segment
``DIR/.spool/seg-<first seq>.bin``: a header ``(first seq, event count, length)`` and the
serialised list of event tuples (``dumps``). The broker numbers the events (it knows each batch's size),
so the sequence is fixed the moment a batch is on disk. The converter process
(``writer.py``, at the lowest CPU priority) reads the segments in order, writes each frame
as one Avro block, and deletes a segment once every frame of it is in an fsynced Avro file
and the broker has moved on to a newer one. Frames the Avro files already hold (a converter
restarted after a crash) are recognised by their sequence numbers and skipped, so nothing
is converted twice and nothing is lost.

``closed`` (an empty file) marks a clean stop: the broker writes it after its last frame;
the next start removes it.
"""
from __future__ import annotations

import glob
import marshal
import os
import pickle
import struct
from typing import Any

from . import events

FRAME = struct.Struct(">QII")  # first seq, events, bytes of serialised data
SEGMENT_BYTES = 16 << 20


def dumps(batch: list) -> bytes:
    """A batch as frame data: marshal (several times faster than pickle for names and
    numbers), or pickle when a property value is of a type marshal refuses. ``batch`` is
    either the recorder's flat buffer (``events.WIDTH`` slots per event: ``F``/``Q``) or a
    list of event tuples (``M``/``P``)."""
    rows = bool(batch) and isinstance(batch[0], tuple)
    try:
        return (b"M" if rows else b"F") + marshal.dumps(batch)
    except ValueError:
        return (b"P" if rows else b"Q") + pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> list:
    """The events of frame data as tuples (those of a flat buffer padded to WIDTH)."""
    kind = data[:1]
    batch = marshal.loads(data[1:]) if kind in b"MF" else pickle.loads(data[1:])
    return events.rows(batch) if kind in b"FQ" else batch


def spool_dir(root: str) -> str:
    return os.path.join(root, ".spool")


def segments(root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(spool_dir(root), "seg-*.bin")))


def read_frames(path: str, offset: int = 0):
    """Yield ``(offset, first_seq, count, data, next offset)`` of each whole frame from
    ``offset``; a torn last frame (a write in progress, or a crash) ends the iteration."""
    with open(path, "rb") as f:
        f.seek(offset)
        while True:
            head = f.read(FRAME.size)
            if len(head) < FRAME.size:
                return
            first, count, length = FRAME.unpack(head)
            data = f.read(length)
            if len(data) < length:
                return
            yield offset, first, count, data, offset + FRAME.size + length
            offset += FRAME.size + length


def last_spooled_seq(root: str) -> int:
    """The last sequence number in the spool (0 if it is empty)."""
    for path in reversed(segments(root)):
        last = 0
        for _, first, count, _, _ in read_frames(path):
            last = first + count - 1
        if last:
            return last
    return 0


class Spool:
    """The broker's side: append frames (from a worker thread: plain file writes)."""

    def __init__(self, root: str, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.dir = spool_dir(root)
        os.makedirs(self.dir, exist_ok=True)
        self.segment_bytes = segment_bytes
        self.file: Any = None
        self.size = 0

    def bytes_waiting(self) -> int:
        """Bytes of spool not yet converted (whole segments still present)."""
        total = 0
        for path in glob.glob(os.path.join(self.dir, "seg-*.bin")):
            try:
                total += os.path.getsize(path)
            except OSError:
                pass
        return total

    def _roll(self, first_seq: int) -> None:
        if self.file is None or self.size >= self.segment_bytes:
            if self.file is not None:
                self.file.close()
            name = os.path.join(self.dir, f"seg-{first_seq:020d}.bin")
            self.file = open(name, "ab")  # noqa: SIM115 - kept open until the roll
            self.size = self.file.tell()

    def append(self, first_seq: int, count: int, data: bytes) -> None:
        self._roll(first_seq)
        self.file.write(FRAME.pack(first_seq, count, len(data)) + data)
        self.file.flush()
        self.size += FRAME.size + len(data)

    def append_frames(self, frames: list[tuple[int, int, bytes]]) -> None:
        """Append each ``(first seq, count, data)``, in order, with one write: a segment
        rolls before a call, so it may pass ``segment_bytes`` by one call's frames."""
        if not frames:
            return
        self._roll(frames[0][0])
        out = []
        for first, count, data in frames:
            out.append(FRAME.pack(first, count, len(data)))
            out.append(data)
        chunk = b"".join(out)
        self.file.write(chunk)
        self.file.flush()
        self.size += len(chunk)

    def close(self, clean: bool) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            self.file = None
        if clean:
            with open(os.path.join(self.dir, "closed"), "w"):
                pass
