"""Candidates for an incremental journal checkpoint, measured in-process on a built backlog.

    .venv/bin/python -m bench.recovery_index [--messages 1000000] [--drain 0.5] [--repeat 3]

Builds the journal ``bench.recovery`` builds (``--messages`` 16-byte persistent messages in
one durable queue, a whole checkpoint as a clean stop leaves it), then measures:

1. the whole checkpoint as it is: bytes, and ``load_checkpoint`` (mapped, CRC, column
   copies) per entry;
2. per-segment indexes (the candidate): each segment's entries as runs of
   ``qid, first seq, n, kind`` + u32 offsets + u32 body lengths (seqs, expiries and
   priorities only when not implied: a contiguous FIFO run has none), written once when a
   segment is sealed; bytes per entry, and the time to read them back into the columns
   recovery uses (one preallocated array per column, each run's slice filled in place);
3. what a checkpoint writes after ``--drain`` of the queue was consumed: the whole format
   rewrites every live entry, the candidate appends the removals as seq ranges;
4. how the candidate's index would be fed: appending a packed row per enqueue on the event
   loop (the hook) against re-reading the log since the last checkpoint in a worker thread
   (scan + decode per record; that holds the GIL as long).

Nothing is started; the figures are the store's own work, per entry or record.
"""
from __future__ import annotations

import argparse
import math
import mmap
import os
import shutil
import struct
import tempfile
import time
import zlib

from broker.persistence import journal_format as jf
from broker.persistence.journal.load import load_checkpoint
from broker.persistence.journal.state import JournalState

from .recovery import build_journal

HEAD = struct.Struct("<IIII")      # segment, CRC of the run, run bytes, entries
RUN = struct.Struct("<IQIB")       # qid, first seq, n, kind (1 seqs, 2 expiries, 4 priorities)
ROW = struct.Struct("<IQII")       # the hook's row: qid, seq, offset, body length
RANGE = struct.Struct("<IQQ")      # a removal: qid, seqs [a, b)


def best(fn, repeat: int) -> float:
    out = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t0)
    return out


def write_indexes(state: JournalState, out: str) -> int:
    """The candidate's per-segment files from a loaded checkpoint; bytes written."""
    import numpy as np

    written = 0
    files: dict = {}
    for qid, qs in state.queues.items():
        if qs.base is None:
            continue
        seqs, locs, exps, blens, _flags = (np.frombuffer(a, dt) for a, dt in zip(
            qs.base, (np.int64, np.int64, np.float64, np.uint32, np.uint8), strict=True))
        prios = None if qs.base_prio is None else np.frombuffer(qs.base_prio, np.uint8)
        segs = locs >> 32
        cuts = (np.flatnonzero(np.diff(segs)) + 1).tolist()
        for s, e in zip([0, *cuts], [*cuts, len(segs)], strict=True):
            seg, sq = int(segs[s]), seqs[s:e]
            kind, parts = 0, []
            if int(sq[-1]) - int(sq[0]) != e - s - 1 or not bool(np.all(np.diff(sq) == 1)):
                kind |= 1
                parts.append(sq.astype("<i8").tobytes())
            parts.append((locs[s:e] & 0xFFFFFFFF).astype("<u4").tobytes())
            parts.append(blens[s:e].astype("<u4").tobytes())
            if not bool(np.all(np.isnan(exps[s:e]))):
                kind |= 2
                parts.append(exps[s:e].astype("<f8").tobytes())
            if prios is not None and bool(np.any(prios[s:e])):
                kind |= 4
                parts.append(prios[s:e].tobytes())
            body = RUN.pack(qid, int(sq[0]), e - s, kind) + b"".join(parts)
            f = files.get(seg)
            if f is None:
                f = files[seg] = open(os.path.join(out, f"{seg:08d}.idx"), "wb")  # noqa: SIM115
            f.write(HEAD.pack(seg, zlib.crc32(body), len(body), e - s) + body)
            written += HEAD.size + len(body)
    for f in files.values():
        f.close()
    return written


def read_indexes(out: str) -> dict:
    """Every run read back: per queue, (seqs, locs, exps, blens, flags) filled in place."""
    import numpy as np

    runs: list = []
    total: dict[int, int] = {}
    maps: list = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name), "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        maps.append(buf)
        pos = 0
        while pos < len(buf):
            seg, crc, size, _n = HEAD.unpack_from(buf, pos)
            pos += HEAD.size
            with memoryview(buf)[pos:pos + size] as body:
                if zlib.crc32(body) != crc:
                    raise ValueError(f"{name}: damaged run at {pos}")
            qid, first, n, kind = RUN.unpack_from(buf, pos)
            runs.append((buf, pos + RUN.size, seg, qid, first, n, kind))
            total[qid] = total.get(qid, 0) + n
            pos += size
    cols = {qid: (np.empty(n, np.int64), np.empty(n, np.int64), np.full(n, np.nan),
                  np.empty(n, np.uint32), np.zeros(n, np.uint8)) for qid, n in total.items()}
    at = dict.fromkeys(total, 0)
    for buf, p, seg, qid, first, n, kind in runs:
        seqs, locs, exps, blens, _flags = cols[qid]
        a, b = at[qid], at[qid] + n
        if kind & 1:
            seqs[a:b] = np.frombuffer(buf, "<i8", n, p)
            p += 8 * n
        else:
            seqs[a:b] = np.arange(first, first + n, dtype=np.int64)
        locs[a:b] = np.frombuffer(buf, "<u4", n, p)
        locs[a:b] |= np.int64(seg << 32)
        p += 4 * n
        blens[a:b] = np.frombuffer(buf, "<u4", n, p)
        p += 4 * n
        if kind & 2:
            exps[a:b] = np.frombuffer(buf, "<f8", n, p)
        at[qid] = b
    del runs
    for buf in maps:
        buf.close()
    return cols


def hook_rows(n: int) -> float:
    """Seconds to append ``n`` packed rows, as an enqueue hook would."""
    rows = bytearray()
    pack = ROW.pack
    t0 = time.perf_counter()
    for i in range(n):
        rows += pack(1, i, i & 0xFFFFFF, 16)
    return time.perf_counter() - t0


def rescan_segment(jdir: str) -> tuple[int, float]:
    """Records of the first segment and seconds to scan and decode its enqueues."""
    path = os.path.join(jdir, jf.seg_name(jf.list_segments(jdir)[0]))
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    unpack = jf.ENQ.unpack_from
    t0 = time.perf_counter()
    recs: list = []
    jf.scan(buf, path, records=recs)
    rows = bytearray()
    for off, rtype, payload in recs:
        if rtype == jf.T_ENQ:
            qid, seq, _exp, _prio, blen, _ref = unpack(payload, 0)
            rows += ROW.pack(qid, seq, off, blen)
    dt = time.perf_counter() - t0
    n = len(recs)
    del recs, payload
    return n, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--drain", type=float, default=0.5, help="fraction consumed (3.)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"Command: `python -m bench.recovery_index --messages {args.messages} "
          f"--drain {args.drain} --repeat {args.repeat}`, load average "
          f"{os.getloadavg()[0]:.1f}")
    tmp = tempfile.mkdtemp(prefix="recovery-index-")
    try:
        build_journal(tmp, args.messages, 16)
        jdir = os.path.join(tmp, "journal")
        n = args.messages
        state = JournalState()
        load_checkpoint(jdir, state)  # warm: the file is in the page cache for both
        whole = os.path.getsize(os.path.join(jdir, "checkpoint"))
        t_whole = best(lambda: load_checkpoint(jdir, JournalState()), args.repeat)
        out = os.path.join(tmp, "index")
        os.makedirs(out)
        written = write_indexes(state, out)
        read_indexes(out)
        t_index = best(lambda: read_indexes(out), args.repeat)
        cols = read_indexes(out)
        for qid, qs in state.queues.items():
            if qs.base is not None:
                got = cols[qid]
                assert all(bytes(a) == g.tobytes() for a, g in zip(qs.base[:2], got[:2],
                                                                   strict=True)), "differs"
        drained = int(n * args.drain)
        rewrite = (n - drained) * (whole - 200) // max(n, 1)
        delta = RANGE.size if drained else 0
        hook = hook_rows(200_000) / 200_000
        recs, t_scan = rescan_segment(jdir)
        per = 1e6 / max(n, 1)
        print(f"| {n:,} entries | bytes | read (best of {args.repeat}) | per entry |")
        print("|---|---|---|---|")
        print(f"| whole checkpoint (now) | {whole / 1e6:.1f} MB ({whole / n:.1f} B/entry) | "
              f"{t_whole:.3f} s | {t_whole * per:.3f} µs |")
        print(f"| per-segment indexes | {written / 1e6:.1f} MB ({written / n:.1f} B/entry), "
              f"{len(os.listdir(out))} files | {t_index:.3f} s | {t_index * per:.3f} µs |")
        print(f"\nafter consuming {drained:,}: the whole format rewrites {rewrite / 1e6:.1f} MB; "
              f"the indexes append {delta} bytes (one seq range)")
        print(f"feeding the index: a packed row per enqueue on the loop {hook * 1e6:.2f} µs; "
              f"re-reading the log {t_scan / recs * 1e6:.2f} µs per record "
              f"({recs:,} records of one segment in {t_scan:.2f} s, holding the GIL)")
        print(f"extrapolated to 10M: whole {t_whole * per * 10:.2f} s, "
              f"indexes {t_index * per * 10:.2f} s; load average {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
