"""The timer index on disk, so that a restart need not read every pending message back.

A stored occurrence never changes: the next occurrence of a repeating schedule is a
new entry (new seq, new journal location). A snapshot of the slot tables therefore
maps ``(seq, location, body length)`` to a schedule state that stays true for as long
as that entry lives. At start-up the journal hands the internal queue its paged index
(``ScheduledQueue.restore(paged=...)``); every entry found in the snapshot with the
same seq, location and body length is rebuilt from it in bulk, without a read. The
rest -- written after the snapshot, or moved by segment compaction -- is read back one
message at a time as before (``recovery.adopt``). So the snapshot is a cache: missing,
torn, stale or foreign, it costs time, never correctness.

The file lives in the store's own directory (``Store.sidecar_path``: it goes wherever
the journal goes). It is written atomically (temporary file, fsync, rename) by the
scheduler's checkpoint task: after ``CHANGES`` schedule/fire/remove operations (so
that the tail a kill -9 leaves to be read back stays short) and at a clean stop.

Layout: ``MAGIC``, a little-endian u32 header length, the JSON header (version, id
prefixes, per vhost: the number of entries and the complex schedules by seq), then per
vhost the raw arrays seq, loc, due, delay, sidn (8 bytes each), sidp (2), blen (4),
kind (1); a CRC-32 of everything before it closes the file.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from array import array
from dataclasses import dataclass, field
from sys import byteorder

from .slots import SlotTable

log = logging.getLogger("broker.scheduler")

FILE_NAME = "scheduler-index.bin"
MAGIC = b"TMQSCHX1"
VERSION = 1
# Operations between two snapshots, and at least this share of the pending count (a kill -9
# leaves at most that many entries to read back one by one), and at least MIN_INTERVAL
# seconds apart: copying a million slots holds the event loop for ~30 ms, which must stay
# rare enough not to show in the firing lateness.
CHANGES = 200_000
CHANGES_SHARE = 0.25
MIN_INTERVAL = 60.0
# (attribute, array type code) in file order
_COLUMNS = (("seq", "q"), ("loc", "q"), ("due", "d"), ("delay", "q"), ("sidn", "q"),
            ("sidp", "H"), ("blen", "I"), ("kind", "B"))
_LEN = struct.Struct("<I")
_DTYPES = {"q": "=i8", "d": "=f8", "H": "=u2", "I": "=u4", "B": "=u1"}  # array code -> numpy


@dataclass
class TableIndex:
    """The journal-paged slots of one vhost's table, in seq order."""
    vhost: str
    seq: array
    loc: array
    due: array
    delay: array
    sidn: array
    sidp: array  # indexes into ``Snapshot.prefixes``
    blen: array
    kind: array
    complex: dict[int, list] = field(default_factory=dict)  # seq -> Schedule fields, left, run

    def __len__(self) -> int:
        return len(self.seq)


@dataclass
class Snapshot:
    prefixes: list[str]
    tables: dict[str, TableIndex]


def take(tables: list[SlotTable], prefixes: list[str]) -> Snapshot:
    """Copies of every table's columns, free slots included (location 0): plain memory
    copies, a few milliseconds for a million slots on the event loop. Free slots are
    dropped and the rest sorted by seq in the writer thread (``write``)."""
    out: dict[str, TableIndex] = {}
    for t in tables:
        if not t.n_stored:
            continue
        cols = {name: column[:] for name, column in (
            ("seq", t.seq_column()), ("loc", t.loc_column()), ("due", t.due),
            ("delay", t.delay), ("sidn", t.sidn), ("sidp", t.sidp),
            ("blen", t.blen_column()), ("kind", t.kind))}
        complex_ = {}
        if t.cx:
            for slot, (sched, left, run) in t.cx.items():
                seq, loc = t.stored_at(slot)
                if loc:
                    complex_[seq] = [sched.kind, sched.delay, sched.period, sched.repeat,
                                     sched.cron, left, run]
        out[t.vhost_name] = TableIndex(t.vhost_name, complex=complex_, **cols)
    return Snapshot(list(prefixes), out)


def _stored_in_seq_order(ti: TableIndex) -> None:
    """Keep the journal-paged slots (location not 0), sorted by seq: free slots are reused,
    so slot order is not seq order. numpy's mask, sort and gather run without the GIL,
    so the event loop keeps firing while a million entries are sorted."""
    import numpy as np

    seqs = np.frombuffer(ti.seq, dtype=np.int64)
    keep = np.flatnonzero(np.frombuffer(ti.loc, dtype=np.int64))
    order = keep[np.argsort(seqs[keep], kind="stable")]
    for name, code in _COLUMNS:
        column = np.frombuffer(getattr(ti, name), dtype=_DTYPES[code])
        sorted_column = array(code)
        sorted_column.frombytes(column[order].tobytes())
        setattr(ti, name, sorted_column)


def write(path: str, snap: Snapshot) -> None:
    """Write ``snap`` to ``path`` atomically (run in a worker thread: the stored slots are
    picked and sorted by seq here, off the event loop)."""
    for ti in snap.tables.values():
        _stored_in_seq_order(ti)
    header = json.dumps({
        "version": VERSION, "byteorder": byteorder, "prefixes": snap.prefixes,
        "tables": [{"vhost": ti.vhost, "n": len(ti),
                    "complex": [[s, *v] for s, v in ti.complex.items()]}
                   for ti in snap.tables.values()],
    }).encode()
    parts = [MAGIC, _LEN.pack(len(header)), header]
    for ti in snap.tables.values():
        parts.extend(getattr(ti, name).tobytes() for name, _code in _COLUMNS)
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    parts.append(_LEN.pack(crc))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.writelines(parts)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read(path: str) -> Snapshot | None:
    """The snapshot at ``path``; None (and a log line) when missing or unusable."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("scheduler: cannot read the timer index %s (%s): reading messages back",
                    path, exc.strerror)
        return None
    try:
        return _parse(memoryview(data))
    except (ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
        log.warning("scheduler: ignoring the timer index %s (%s): reading messages back",
                    path, exc)
        return None


def _parse(data: memoryview) -> Snapshot:
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a timer index")
    if len(data) < len(MAGIC) + 2 * _LEN.size:
        raise ValueError("truncated")
    (crc,) = _LEN.unpack_from(data, len(data) - _LEN.size)
    if zlib.crc32(data[:len(data) - _LEN.size]) != crc:
        raise ValueError("checksum mismatch (torn write)")
    pos = len(MAGIC)
    (hlen,) = _LEN.unpack_from(data, pos)
    pos += _LEN.size
    header = json.loads(bytes(data[pos:pos + hlen]))
    pos += hlen
    if header.get("version") != VERSION:
        raise ValueError(f"unknown version {header.get('version')!r}")
    swap = header.get("byteorder") != byteorder
    tables: dict[str, TableIndex] = {}
    for th in header["tables"]:
        n = int(th["n"])
        cols = {}
        for name, code in _COLUMNS:
            a = array(code)
            size = a.itemsize * n
            a.frombytes(data[pos:pos + size])
            if len(a) != n:
                raise ValueError("truncated column")
            if swap:
                a.byteswap()
            cols[name] = a
            pos += size
        complex_ = {int(row[0]): list(row[1:]) for row in th["complex"]}
        tables[th["vhost"]] = TableIndex(th["vhost"], complex=complex_, **cols)
    if pos != len(data) - _LEN.size:
        raise ValueError("trailing bytes")
    return Snapshot(list(header["prefixes"]), tables)


def join(ti: TableIndex, seqs, locs, blens) -> tuple[list[int] | None, list[int]]:
    """Match the journal's paged index (sorted by seq) against ``ti``.

    Returns ``(hits, misses)``: ``hits[i]`` is the snapshot position of the i-th
    matched journal entry (None when the journal's index *is* the snapshot, the
    clean-stop case: every position matches in order), ``misses`` the journal
    positions to read back."""
    if ti.seq == seqs and ti.loc == locs and ti.blen == blens:
        return None, []
    hits: list[int] = []
    misses: list[int] = []
    sseq, sloc, sblen = ti.seq, ti.loc, ti.blen
    m = len(sseq)
    j = 0
    for i, s in enumerate(seqs):
        while j < m and sseq[j] < s:
            j += 1
        if j < m and sseq[j] == s and sloc[j] == locs[i] and sblen[j] == blens[i]:
            hits.append(j)
        else:
            misses.append(i)
    return hits, misses

