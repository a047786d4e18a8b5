"""The timer index's log: what changed since the last snapshot, appended as it happens.

The snapshot (``checkpoint``) is written at most once a minute; without more, a kill -9
leaves everything scheduled since then to be read back from the journal one message at
a time (~29 us each, properties decoded). So every journal-paged occurrence the
scheduler stores -- scheduled, next occurrence of a repeating schedule, read back at
recovery, moved by segment compaction -- is also appended here as a compact record of
what the timer needs (vhost, seq, location, body length, due, kind, delay, id), never
the message's properties. Removals are not logged: the journal's own index says which
entries are still alive, and recovery only keeps records that match one exactly.

Records are buffered and written (``os.write``, no fsync) by a callback the journal
runs right after the group commit that made their entries durable, before the
publishers' confirms: a process killed after a confirm has its records in the page
cache. A machine crash may lose the unsynced tail, which costs read-backs, never a
message (the snapshot and the log are caches). The log is cut into generations:
``rotate`` starts a new file when a snapshot is taken; once the snapshot is on disk
the files it covers are deleted, so the log never holds more than about a snapshot
interval of records and the work after a crash is a snapshot load plus a bounded
read of fixed-size records (numpy, no per-record Python).

File ``scheduler-index.log.<gen>``: batches of ``BATCH`` header (magic, record count,
JSON length, CRC-32 of what follows) + ``count`` fixed 64-byte records (``REC``) + a
JSON list of the rows that do not fit one (repeat/cron state, odd id prefixes).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import zlib

log = logging.getLogger("broker.scheduler")

PREFIX = "scheduler-index.log."
BATCH = struct.Struct("<4sIII")
BATCH_MAGIC = b"SXL1"
# vhost hash, seq, loc, due, delay, sid number, sid prefix, body length, kind
REC = struct.Struct("<Qqqdqq8sIB3x")
FLUSH_AT = 1 << 20  # bytes buffered before a write even without a group commit


def vhost_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def numpy_dtype():
    import numpy as np

    return np.dtype([("vh", "<u8"), ("seq", "<i8"), ("loc", "<i8"), ("due", "<f8"),
                     ("delay", "<i8"), ("sidn", "<i8"), ("prefix", "S8"), ("blen", "<u4"),
                     ("kind", "u1"), ("pad", "V3")])


def generations(directory: str) -> list[tuple[int, str]]:
    """(generation, path) of the log files in ``directory``, oldest first."""
    out = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
            out.append((int(name[len(PREFIX):]), os.path.join(directory, name)))
    out.sort()
    return out


def drop_upto(directory: str, gen: int) -> None:
    """The snapshot covering generations <= ``gen`` is on disk: delete them."""
    for g, path in generations(directory):
        if g <= gen:
            try:
                os.unlink(path)
            except OSError:
                pass


class IndexLog:
    """The scheduler's appender (one per store directory)."""

    def __init__(self, directory: str, first_gen: int = 1):
        self.directory = directory
        self.gen = max([first_gen, *(g + 1 for g, _p in generations(directory))])
        self._fd: int | None = None
        self._fixed = bytearray()
        self._n = 0
        self._rows: list = []
        self.records = 0  # appended by this run (tests, stats)
        self.failed: str | None = None

    @property
    def pending(self) -> bool:
        return bool(self._n or self._rows)

    def add(self, vh: int, seq: int, loc: int, blen: int, due: float, delay: int,
            prefix: str, sidn: int, kind: int, complex_=None) -> None:
        """Buffer one occurrence; ``complex_`` = [kind name, delay, period, repeat, cron,
        left, run] for a repeating / cron schedule."""
        self.records += 1
        if complex_ is None and prefix.isascii() and len(prefix) <= 8 and "\0" not in prefix:
            self._fixed += REC.pack(vh, seq, loc, due, delay, sidn, prefix.encode(), blen,
                                    kind)
            self._n += 1
        else:
            self._rows.append([vh, seq, loc, blen, due, delay, prefix, sidn, kind, complex_])
        if len(self._fixed) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered (page cache: survives the process, not the machine)."""
        if not self._n and not self._rows:
            return
        js = json.dumps(self._rows).encode() if self._rows else b""
        body = bytes(self._fixed) + js
        data = BATCH.pack(BATCH_MAGIC, self._n, len(js), zlib.crc32(body)) + body
        self._fixed = bytearray()
        self._n = 0
        self._rows = []
        try:
            if self._fd is None:
                self._fd = os.open(os.path.join(self.directory, f"{PREFIX}{self.gen}"),
                                   os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
            self.failed = None
        except OSError as exc:
            # costs read-backs after a crash, never a message: the journal has the entries
            if self.failed is None:
                log.warning("scheduler: cannot append to the timer index log in %s: %s",
                            self.directory, exc.strerror)
            self.failed = exc.strerror or str(exc)
            self._close()

    def rotate(self) -> int:
        """Close the current generation (a snapshot is being taken of everything it
        holds); returns its number. Later records go to the next one."""
        self.flush()
        self._close()
        gen = self.gen
        self.gen += 1
        return gen

    def drop_upto(self, gen: int) -> None:
        drop_upto(self.directory, gen)

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def close(self) -> None:
        self.flush()
        self._close()


def read(directory: str, after_gen: int = 0):
    """Every usable record of generations > ``after_gen``: (fixed records as one numpy
    structured array, other rows, records read). A damaged batch ends its file (a torn
    tail after a machine crash): what follows is ignored, which costs read-backs only."""
    import numpy as np

    dtype = numpy_dtype()
    parts: list[bytes] = []
    rows: list = []
    for gen, path in generations(directory):
        if gen <= after_gen:
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            log.warning("scheduler: cannot read %s (%s): reading messages back", path,
                        exc.strerror)
            continue
        pos = 0
        view = memoryview(data)
        while pos + BATCH.size <= len(data):
            magic, n, jlen, crc = BATCH.unpack_from(data, pos)
            end = pos + BATCH.size + n * REC.size + jlen
            if magic != BATCH_MAGIC or end > len(data) or \
                    zlib.crc32(view[pos + BATCH.size:end]) != crc:
                log.warning("scheduler: timer index log %s damaged at offset %d: the rest "
                            "of it is ignored", path, pos)
                break
            fixed_end = pos + BATCH.size + n * REC.size
            parts.append(data[pos + BATCH.size:fixed_end])
            if jlen:
                try:
                    rows.extend(json.loads(bytes(view[fixed_end:end])))
                except ValueError:
                    break
            pos = end
    fixed = np.frombuffer(b"".join(parts), dtype=dtype)
    return fixed, rows, len(fixed) + len(rows)
