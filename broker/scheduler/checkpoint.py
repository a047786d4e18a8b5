"""The timer index on disk, so that a restart need not read every pending message back.

A stored occurrence never changes: the next occurrence of a repeating schedule is a
new entry (new seq, new journal location). A snapshot of the slot tables therefore
maps ``(seq, location, body length)`` to a schedule state that stays true for as long
as that entry lives. At start-up the journal hands the internal queue its paged index
(``ScheduledQueue.restore(paged=...)``); every entry found in the snapshot with the
same seq, location and body length is rebuilt from it in bulk, without a read. What
was stored after the snapshot (or moved by segment compaction) is in the index log
(``indexlog``), merged in (``merge``) before the join; only what neither describes is
read back one message at a time (``recovery.adopt``). So snapshot and log are caches:
missing, torn, stale or foreign, they cost time, never correctness.

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
    log_gen: int = 0  # the index log's generations it covers (indexlog.py): <= log_gen


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
    for name, code in _COLUMNS:  # the index's columns, by the file format's names
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
        "log_gen": snap.log_gen,
        "tables": [{"vhost": ti.vhost, "n": len(ti),
                    "complex": [[s, *v] for s, v in ti.complex.items()]}
                   for ti in snap.tables.values()],
    }).encode()
    parts = [MAGIC, _LEN.pack(len(header)), header]
    for ti in snap.tables.values():
        # the index's columns, in the file format's order
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


def covered_log_gen(path: str) -> int:
    """The index log generations the snapshot at ``path`` covers (its header only; 0
    when there is none): a new log generation must come after them, or the next
    recovery would take its records for leftovers of that snapshot."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + _LEN.size)
            if len(head) < len(MAGIC) + _LEN.size or head[:len(MAGIC)] != MAGIC:
                return 0
            (hlen,) = _LEN.unpack_from(head, len(MAGIC))
            header = json.loads(f.read(hlen))
        return int(header.get("log_gen", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


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
    return Snapshot(list(header["prefixes"]), tables, int(header.get("log_gen", 0)))


def merge(ti: TableIndex | None, prefixes: list[str], vhost: str, fixed, rows: list) \
        -> TableIndex | None:
    """``ti`` (the snapshot's table of ``vhost``, or None) plus the index log's records of
    that vhost (``indexlog.read``), sorted by seq; a seq logged more than once keeps its
    last record (compaction moved it). Id prefixes met in the log are added to
    ``prefixes``. Vectorized: the cost is a few numpy passes, whatever the count."""
    import numpy as np

    from .indexlog import vhost_key

    vh = vhost_key(vhost)
    recs = fixed[fixed["vh"] == np.uint64(vh)] if len(fixed) else fixed
    mine = [r for r in rows if r[0] == vh]
    if not len(recs) and not mine:
        return ti
    index = {p: i for i, p in enumerate(prefixes)}

    def prefix_no(p: str) -> int:
        i = index.get(p)
        if i is None:
            i = index[p] = len(prefixes)
            prefixes.append(p)
        return i

    cols: dict[str, list] = {name: [] for name, _code in _COLUMNS}
    complex_: dict[int, list] = {}
    if ti is not None:
        for name, code in _COLUMNS:  # the index's columns, by the file format's names
            cols[name].append(np.frombuffer(getattr(ti, name), dtype=_DTYPES[code]))
        complex_.update(ti.complex)
    if len(recs):
        uniq, inverse = np.unique(recs["prefix"], return_inverse=True)
        numbers = np.array([prefix_no(u.decode("ascii")) for u in uniq], dtype=np.uint16)
        for name in ("seq", "loc", "due", "delay", "sidn", "blen", "kind"):
            cols[name].append(recs[name].astype(_DTYPES[dict(_COLUMNS)[name]]))
        cols["sidp"].append(numbers[inverse].astype(np.uint16))
    if mine:
        extra: dict[str, list] = {name: [] for name, _code in _COLUMNS}
        for _vh, seq, loc, blen, due, delay, prefix, sidn, kind, cx in mine:
            for name, value in (("seq", seq), ("loc", loc), ("blen", blen), ("due", due),
                                ("delay", delay), ("sidp", prefix_no(prefix)),
                                ("sidn", sidn), ("kind", kind)):
                extra[name].append(value)
            if cx is not None:
                complex_[seq] = list(cx)
        for name, code in _COLUMNS:
            cols[name].append(np.array(extra[name], dtype=_DTYPES[code]))
    joined = {name: np.concatenate(parts) for name, parts in cols.items()}
    seq = joined["seq"]
    order = np.argsort(seq, kind="stable")
    s = seq[order]
    last = np.ones(len(s), dtype=bool)  # the last record of each seq (stable: log order)
    last[:-1] = s[1:] != s[:-1]
    order = order[last]
    out = {}
    for name, code in _COLUMNS:
        a = array(code)
        a.frombytes(joined[name][order].astype(_DTYPES[code]).tobytes())
        out[name] = a
    return TableIndex(vhost, complex=complex_, **out)


def join(ti: TableIndex, seqs, locs, blens):
    """Match the journal's paged index (sorted by seq) against ``ti``.

    Returns ``(hits, misses)``: ``hits`` the snapshot positions of the matched journal
    entries in journal order (None when the journal's index *is* the snapshot, the
    clean-stop case: every position matches in order), ``misses`` the journal
    positions to read back (numpy arrays: vectorized, a million entries in
    milliseconds)."""
    if ti.seq == seqs and ti.loc == locs and ti.blen == blens:
        return None, []
    import numpy as np

    js = np.asarray(seqs, dtype=np.int64)
    m = len(ti.seq)
    if not m:
        return np.zeros(0, dtype=np.int64), np.arange(len(js))
    sseq = np.frombuffer(ti.seq, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sseq, js), m - 1)
    ok = ((sseq[pos] == js)
          & (np.frombuffer(ti.loc, dtype=np.int64)[pos] == np.asarray(locs, dtype=np.int64))
          & (np.frombuffer(ti.blen, dtype=np.uint32)[pos] == np.asarray(blens, dtype=np.uint32)))
    return pos[ok], np.flatnonzero(~ok)
