"""On-disk format of the journal: segment files of CRC-checked records.

A segment is ``journal/NNNNNNNN.log``, preallocated to SEGMENT_SIZE bytes, and
filled front to back with records::

    u32 payload length | u32 CRC32(type byte + payload) | u8 type | payload

Zero bytes after the last record mark the end of the data (preallocation).
A location ("loc") is ``segment number << 32 | offset of the record header``.

The checkpoint (``journal/checkpoint``) is written to a temp file, fsynced and
renamed: definitions + the live entries of every durable queue + the log
position it covers. Recovery loads it and replays records after that position.
"""
from __future__ import annotations

import json
import math
import os
import struct
import zlib
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .records import BindingDef, ExchangeDef, QueueDef, decode_arguments, encode_arguments

if TYPE_CHECKING:
    from mmap import mmap
    from typing import TypeAlias

    from typing_extensions import Buffer

    # what a segment or a record's payload is read from
    Buf: TypeAlias = bytes | bytearray | memoryview | mmap

SEGMENT_SIZE = 32 * 1024 * 1024
HDR = struct.Struct(">IIB")
HDR_SIZE = HDR.size  # 9

# record types
T_EXCHANGE = 1
T_EXCHANGE_DEL = 2
T_QUEUE = 3
T_QUEUE_DEL = 4
T_BINDING = 5
T_BINDING_DEL = 6
T_ENQ = 8        # enqueue with the message blob inline
T_ENQ_REF = 9    # enqueue of a message stored by an earlier T_ENQ in the same segment
T_DELIVERED = 10
T_REMOVE = 11
T_META = 12      # a feature's metadata record (Store.save_meta); also in the checkpoint
T_META_DEL = 13
T_CKPT_HEAD = 20   # checkpoint file only
T_CKPT_QUEUE = 21
T_CKPT_END = 22
T_CKPT_PRIO = 23   # checkpoint file only (format 2): priorities of a checkpoint-queue's entries

#: Format 2 (this version) adds, readable by it together with format-1 journals:
#: the delivery count in a delivered record (16 bytes instead of 12; a 12-byte one
#: means count 1), the delivery count in the checkpoint's flags byte (saturated at
#: FLAGS_MAX; format 1 wrote 1 for every delivered entry) and T_CKPT_PRIO.
FORMAT_VERSION = 2
FLAGS_MAX = 255

TYPE_NAMES = {T_EXCHANGE: "exchange", T_EXCHANGE_DEL: "exchange-delete", T_QUEUE: "queue",
              T_QUEUE_DEL: "queue-delete", T_BINDING: "binding", T_BINDING_DEL: "binding-delete",
              T_ENQ: "enqueue", T_ENQ_REF: "enqueue-ref", T_DELIVERED: "delivered",
              T_REMOVE: "remove", T_META: "meta", T_META_DEL: "meta-delete",
              T_CKPT_HEAD: "checkpoint-head",
              T_CKPT_QUEUE: "checkpoint-queue", T_CKPT_END: "checkpoint-end",
              T_CKPT_PRIO: "checkpoint-priorities"}

ENQ = struct.Struct(">IQdBIQ")  # qid, seq, expires_at (wall, NaN = none), priority, body len, ref loc
QSEQ = struct.Struct(">IQ")     # qid, seq
DELIVERED_N = struct.Struct(">IQI")  # qid, seq, delivery count (format 2, count > 1)
U32 = struct.Struct(">I")
MAX_PAYLOAD = SEGMENT_SIZE - HDR_SIZE

NO_EXPIRY = float("nan")


def seg_name(seg: int) -> str:
    return f"{seg:08d}.log"


def seg_of(loc: int) -> int:
    return loc >> 32


def off_of(loc: int) -> int:
    return loc & 0xFFFFFFFF


def make_loc(seg: int, off: int) -> int:
    return (seg << 32) | off


def pack_record(rtype: int, payload: bytes) -> bytes:
    t = bytes((rtype,))
    crc = zlib.crc32(payload, zlib.crc32(t))
    return HDR.pack(len(payload), crc, rtype) + payload


def pack_record_parts(rtype: int, parts: list[Buffer]) -> list[Buffer]:
    """``pack_record`` of the concatenated ``parts`` (bytes-like: a checkpoint's arrays),
    as the header followed by the parts themselves: written one after the other, no
    joined copy of a ten-million-entry index is made."""
    crc = zlib.crc32(bytes((rtype,)))
    n = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
        n += memoryview(part).nbytes
    return [HDR.pack(n, crc, rtype), *parts]


# ---- definitions: json for the scalars + the AMQP table of arguments ----
def _pack_def(d: ExchangeDef | QueueDef | BindingDef, kind: str,
              extra: dict[str, Any] | None = None) -> bytes:
    fields = asdict(d)
    args = fields.pop("arguments")
    if extra:
        fields.update(extra)
    fields["kind"] = kind
    js = json.dumps(fields).encode()
    return U32.pack(len(js)) + js + encode_arguments(args)


def _unpack_def(payload: Buf) -> tuple[dict[str, Any], dict[str, Any]]:
    (n,) = U32.unpack_from(payload, 0)
    fields = json.loads(bytes(payload[4:4 + n]))
    args = decode_arguments(bytes(payload[4 + n:]))
    return fields, args


def pack_exchange(xd: ExchangeDef) -> bytes:
    return _pack_def(xd, "x")


def pack_queue(qd: QueueDef, qid: int) -> bytes:
    return _pack_def(qd, "q", {"qid": qid})


def pack_binding(bd: BindingDef) -> bytes:
    return _pack_def(bd, "b")


def unpack_exchange(payload: Buf) -> ExchangeDef:
    f, args = _unpack_def(payload)
    return ExchangeDef(f["vhost"], f["name"], f["type"], f["durable"], f["auto_delete"],
                       f["internal"], args)


def unpack_queue(payload: Buf) -> tuple[QueueDef, int]:
    f, args = _unpack_def(payload)
    return QueueDef(f["vhost"], f["name"], f["durable"], f["auto_delete"], args), f["qid"]


def unpack_binding(payload: Buf) -> BindingDef:
    f, args = _unpack_def(payload)
    return BindingDef(f["vhost"], f["source"], f["destination_kind"], f["destination"],
                      f["routing_key"], args)


def pack_name(vhost: str, name: str) -> bytes:
    return json.dumps([vhost, name]).encode()


def unpack_name(payload: Buf) -> tuple[str, str]:
    v, n = json.loads(bytes(payload))
    return v, n


def pack_meta(kind: str, key: str, raw: str | None = None) -> bytes:
    """A metadata record: JSON ``[kind, key]``, then (not for a delete) a newline and the
    value's JSON text (``recovery.encode_meta``)."""
    head = json.dumps([kind, key]).encode()
    return head if raw is None else head + b"\n" + raw.encode()


def unpack_meta(payload: Buf) -> tuple[str, str, str | None]:
    """(kind, key, value JSON text or None for a delete record)."""
    data = bytes(payload)
    head, sep, raw = data.partition(b"\n")
    kind, key = json.loads(head)
    return kind, key, raw.decode() if sep else None


def binding_key(bd: BindingDef) -> tuple[str, str, str, str, str, bytes]:
    return (bd.vhost, bd.source, bd.destination_kind, bd.destination, bd.routing_key,
            encode_arguments(bd.arguments))


def pack_enq(qid: int, seq: int, expires: float | None, priority: int, body_len: int,
             ref: int) -> bytes:
    return ENQ.pack(qid, seq, NO_EXPIRY if expires is None else expires, priority, body_len, ref)


def unpack_enq(payload: Buf, pos: int = 0
               ) -> tuple[int, int, float | None, int, int, int]:
    qid, seq, exp, prio, blen, ref = ENQ.unpack_from(payload, pos)
    return qid, seq, (None if math.isnan(exp) else exp), prio, blen, ref


def pack_delivered(qid: int, seq: int, count: int) -> bytes:
    """A delivered record: the first delivery keeps the format-1 payload."""
    return QSEQ.pack(qid, seq) if count <= 1 else DELIVERED_N.pack(qid, seq, count)


def unpack_delivered(payload: Buf) -> tuple[int, int, int]:
    """(qid, seq, delivery count) of a delivered record of either format."""
    if len(payload) >= DELIVERED_N.size:
        return DELIVERED_N.unpack_from(payload, 0)
    qid, seq = QSEQ.unpack_from(payload, 0)
    return qid, seq, 1


def count_flags(count: int, delivered: bool = False) -> int:
    """The checkpoint / paged-index flags byte of an entry: its delivery count
    (saturated), at least 1 if it was delivered (0 = never delivered)."""
    if count > FLAGS_MAX:
        return FLAGS_MAX
    return count or (1 if delivered else 0)


# ---- scanning ----
class ScanResult:
    """Records of one segment plus how its data ends."""

    def __init__(self, path: str):
        self.path = path
        self.end = 0           # offset after the last good record
        self.torn_at: int | None = None    # offset of a torn tail record (partial write)
        self.torn_bytes = 0
        self.corrupt_at: int | None = None  # offset of a bad record followed by more data
        self.corrupt_reason = ""
        self.skipped: list[tuple[int, int, str]] = []  # salvage: (offset, length, reason)


def _all_zero(buf: Buf, start: int, end: int) -> bool:
    step = 1 << 20
    zero = bytes(step)
    pos = start
    while pos < end:
        n = min(step, end - pos)
        if buf[pos:pos + n] != zero[:n]:
            return False
        pos += n
    return True


def _next_nonzero_end(buf: Buf, start: int, end: int) -> int:
    """Offset just past the last non-zero byte in buf[start:end] (start if none)."""
    chunk = bytes(buf[start:end]).rstrip(b"\0")
    return start + len(chunk)


# CRC-32 of each record type's byte: a record's CRC covers its type, then its payload
_TYPE_CRC = {t: zlib.crc32(bytes((t,))) for t in TYPE_NAMES}


def scan(buf: Buf, path: str, start: int = 0,
         records: list[tuple[int, int, memoryview]] | None = None,
         salvage: bool = False) -> ScanResult:
    """Walk records of one segment held in ``buf`` (bytes or mmap).

    Appends (offset, type, payload memoryview) to ``records`` (if given) and
    returns a ScanResult. With salvage=True, a bad record is skipped by searching
    for the next valid header instead of stopping.
    """
    res = ScanResult(path)
    end = start
    size = len(buf)
    mv = memoryview(buf)
    pos = start
    hdr_unpack = HDR.unpack_from
    crc32 = zlib.crc32
    type_crc = _TYPE_CRC
    skipped = res.skipped
    while pos + HDR_SIZE <= size:
        length, crc, rtype = hdr_unpack(buf, pos)
        if length == 0 and crc == 0 and rtype == 0:
            # end of data, unless something non-zero follows (a zeroed header in the middle)
            tail_end = _next_nonzero_end(buf, pos, size)
            if tail_end == pos:
                break
            if salvage:
                nxt = _skip_unreadable(buf, pos, size, skipped, "zeroed header", tail_end)
                if nxt is None:
                    break
                pos = nxt
                continue
            res.corrupt_at = pos
            res.corrupt_reason = "zeroed record header followed by data"
            break
        rec_end = pos + HDR_SIZE + length
        tcrc = type_crc.get(rtype)
        ok = tcrc is not None and rec_end <= size
        if ok:
            payload = mv[pos + HDR_SIZE:rec_end]
            ok = crc32(payload, tcrc or 0) == crc  # tcrc is set when ok
        if ok:
            if records is not None:
                records.append((pos, rtype, payload))
            pos = end = rec_end
            continue
        # bad record: torn tail (nothing after it) or corruption in the middle
        after = rec_end if (rtype in TYPE_NAMES and rec_end <= size) else None
        if after is None or _all_zero(buf, after, size):
            if salvage:
                nxt = _resync(buf, pos + 1, size)
                if nxt is not None:
                    skipped.append((pos, nxt - pos, "bad record"))
                    pos = nxt
                    continue
            res.torn_at = pos
            res.torn_bytes = _next_nonzero_end(buf, pos, size) - pos
            break
        if salvage:
            nxt = _skip_unreadable(buf, pos, size, skipped, "CRC mismatch", size)
            if nxt is None:
                break
            pos = nxt
            continue
        res.corrupt_at = pos
        res.corrupt_reason = "CRC mismatch" if rtype in TYPE_NAMES else f"unknown record type {rtype}"
        break
    res.end = end
    mv.release() if records is None else None
    return res


def _skip_unreadable(buf: Buf, pos: int, size: int, skipped: list[tuple[int, int, str]], why: str,
                     end_if_lost: int) -> int | None:
    """Salvage: note the unreadable bytes from ``pos`` to the next valid record (or to
    ``end_if_lost`` when none follows) and return where reading resumes (None: stop)."""
    nxt = _resync(buf, pos + 1, size)
    skipped.append((pos, (nxt if nxt is not None else end_if_lost) - pos, why))
    return nxt


def _resync(buf: Buf, start: int, size: int) -> int | None:
    """Find the next offset holding a valid record (for repair)."""
    pos = start
    limit = size - HDR_SIZE
    while pos <= limit:
        length, crc, rtype = HDR.unpack_from(buf, pos)
        if rtype in TYPE_NAMES and 0 < length <= size - pos - HDR_SIZE:
            payload = bytes(buf[pos + HDR_SIZE:pos + HDR_SIZE + length])
            if zlib.crc32(payload, zlib.crc32(bytes((rtype,)))) == crc:
                return pos
        pos += 1
    return None


def list_segments(jdir: str) -> list[int]:
    try:
        names = os.listdir(jdir)
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        if n.endswith(".log") and n[:-4].isdigit():
            out.append(int(n[:-4]))
    return sorted(out)
