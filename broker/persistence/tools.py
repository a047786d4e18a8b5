"""Store tools for the command line: ``inspect`` and ``repair``.

``python -m broker inspect --data-dir DIR`` describes the journal in DIR;
``python -m broker inspect --store URL`` asks the backend class of URL
(``Store.inspect(target, out)``, a classmethod taking the data dir or URL and a
text stream; a store without a report says so).
``python -m broker repair --data-dir DIR`` salvages every readable journal record.
"""
from __future__ import annotations

import os
import sys
import time
import zlib

from . import journal_format as jf
from .base import StoreUnavailable, journal_dir, store_class, store_scheme


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="describe the stored data (segments, records, "
                                             "live messages per queue)")
    p.add_argument("--data-dir", default="./data", help="data directory (default ./data)")
    p.add_argument("--store", default=None, help="store URL (default: the journal in --data-dir)")
    p.set_defaults(handler=_inspect_cmd)
    r = subparsers.add_parser("repair", help="salvage every readable journal record into a "
                                            "fresh journal (the broker must be stopped)")
    r.add_argument("--data-dir", default="./data", help="data directory (default ./data)")
    r.set_defaults(handler=_repair_cmd)


def _store_class(url):
    try:
        return store_class(url)
    except StoreUnavailable:
        raise StoreUnavailable(f"no inspect support for store URL {url!r}") from None


def _inspect_cmd(args) -> int:
    try:
        cls = _store_class(args.store)
        target = (journal_dir(args.store, args.data_dir) if store_scheme(args.store) == "journal"
                  else args.store)
        return int(cls.inspect(target, sys.stdout) or 0)
    except StoreUnavailable as exc:
        print(f"triomq: error: {exc}", file=sys.stderr)
        return 1


def _repair_cmd(args) -> int:
    try:
        return repair_journal(args.data_dir, sys.stdout)
    except StoreUnavailable as exc:
        print(f"triomq: error: {exc}", file=sys.stderr)
        return 1


def inspect_journal(data_dir: str, out) -> int:
    from .journal import load_state
    jdir = os.path.join(data_dir, "journal")
    if not os.path.isdir(jdir):
        print(f"no journal in {data_dir}", file=out)
        return 1
    status = 0
    try:
        state = load_state(jdir, scan_old=True)
    except StoreUnavailable as exc:
        print(f"ERROR: {exc}", file=out)
        state = load_state(jdir, salvage=True)
        status = 1
    print(f"journal {jdir}", file=out)
    ck = os.path.join(jdir, "checkpoint")
    if os.path.exists(ck):
        print(f"checkpoint: segment {state.ckpt_pos[0]} offset {state.ckpt_pos[1]} "
              f"({os.path.getsize(ck)} bytes)", file=out)
    else:
        print("checkpoint: none", file=out)
    print(f"records replayed after the checkpoint: {state.records}", file=out)
    print("segments:", file=out)
    for seg, res, counts in state.segments:
        size = os.path.getsize(res.path)
        parts = ", ".join(f"{jf.TYPE_NAMES.get(t, t)}={n}" for t, n in sorted(counts.items()))
        note = ""
        if res.torn_at is not None:
            note += f" TORN TAIL at {res.torn_at} ({res.torn_bytes} bytes)"
        if res.corrupt_at is not None:
            note += f" CORRUPT at {res.corrupt_at} ({res.corrupt_reason})"
        if seg < state.ckpt_pos[0]:
            note += " (before checkpoint: counts cover the whole segment)"
        print(f"  {jf.seg_name(seg)}  file {size} bytes, data {res.end} bytes, "
              f"{sum(counts.values())} records [{parts}]{note}", file=out)
    for path, off, n, why in state.skipped:
        print(f"  unreadable: {path} offset {off}: {n} bytes ({why})", file=out)
    print(f"exchanges: {len(state.exchanges)}, queues: {len(state.queues)}, "
          f"bindings: {len(state.bindings)}", file=out)
    print("live messages per queue:", file=out)
    total = 0
    for _qid, qs in sorted(state.queues.items(), key=lambda kv: (kv[1].qdef.vhost, kv[1].qdef.name)):
        n = qs.count()
        total += n
        print(f"  vhost {qs.qdef.vhost!r} queue {qs.qdef.name!r}: {n}", file=out)
    print(f"total live messages: {total}", file=out)
    return status


def _record_at(buf, off: int):
    """(rtype, payload) of a valid record at ``off`` or None."""
    if off + jf.HDR_SIZE > len(buf):
        return None
    length, crc, rtype = jf.HDR.unpack_from(buf, off)
    end = off + jf.HDR_SIZE + length
    if rtype not in jf.TYPE_NAMES or end > len(buf):
        return None
    payload = bytes(buf[off + jf.HDR_SIZE:end])
    if zlib.crc32(payload, zlib.crc32(bytes((rtype,)))) != crc:
        return None
    return rtype, payload


def repair_journal(data_dir: str, out) -> int:
    """Rewrite the journal from every readable record; the old one is kept aside."""
    import fcntl
    import mmap

    from .journal import JournalStore, load_state
    jdir = os.path.join(data_dir, "journal")
    if not os.path.isdir(jdir):
        raise StoreUnavailable(f"no journal in {data_dir}")
    lock = os.open(os.path.join(jdir, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise StoreUnavailable(f"journal {jdir} is in use by a running broker; stop it first") from None
    state = load_state(jdir, salvage=True)
    maps: dict[int, mmap.mmap | bytes] = {}

    def buf_of(seg):
        if seg not in maps:
            path = os.path.join(jdir, jf.seg_name(seg))
            try:
                with open(path, "rb") as f:
                    maps[seg] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                maps[seg] = b""
        return maps[seg]

    tmp_dir = os.path.join(data_dir, "journal.repair-tmp")
    if os.path.exists(tmp_dir):
        import shutil
        shutil.rmtree(tmp_dir)
    new = JournalStore(data_dir, jdir=tmp_dir)
    os.makedirs(tmp_dir)
    for (kind, key), raw in state.meta.items():
        new.append_record(jf.T_META, jf.pack_meta(kind, key, raw))
    for xd in state.exchanges.values():
        new.append_record(jf.T_EXCHANGE, jf.pack_exchange(xd))
    dropped_msgs = 0
    kept = 0
    for qid, qs in state.queues.items():
        new.append_record(jf.T_QUEUE, jf.pack_queue(qs.qdef, qid))
        for seq, loc, exp, prio, blen, fl in qs.entries():
            rec = _record_at(buf_of(loc >> 32), loc & 0xFFFFFFFF)
            if rec is None or rec[0] != jf.T_ENQ:
                dropped_msgs += 1
                print(f"  dropped message seq {seq} of queue {qs.qdef.name!r}: its record at "
                      f"{jf.seg_name(loc >> 32)} offset {loc & 0xFFFFFFFF} is unreadable", file=out)
                continue
            blob = rec[1][jf.ENQ.size:]
            new.append_record(jf.T_ENQ, jf.pack_enq(qid, seq, None if exp != exp else exp, prio, blen, 0)
                        + blob)
            if fl:
                new.append_record(jf.T_DELIVERED, jf.QSEQ.pack(qid, seq))
            kept += 1
    for bd in state.bindings.values():
        new.append_record(jf.T_BINDING, jf.pack_binding(bd))
    new.write_buffered_and_close()
    for m in maps.values():
        if not isinstance(m, bytes):
            m.close()
    # the next qid must stay above every qid in use
    aside = os.path.join(data_dir, f"journal.broken-{time.strftime('%Y%m%d-%H%M%S')}")
    os.close(lock)
    os.rename(jdir, aside)
    os.rename(tmp_dir, jdir)
    for path, off, n, why in state.skipped:
        print(f"dropped {n} bytes at {path} offset {off} ({why})", file=out)
    print(f"repair: kept {kept} messages, {len(state.exchanges)} exchanges, {len(state.queues)} "
          f"queues, {len(state.bindings)} bindings; dropped {len(state.skipped)} unreadable "
          f"region(s) and {dropped_msgs} message(s); old journal kept in {aside}", file=out)
    return 0
