"""Avro binary encoding of audit events, a whole batch at a time, column by column.

fastavro's generic writer costs 15-17 µs per record of this 33-field schema of unions
(docs/performance-audit.md): at three events per message that is more than a core at the
broker's confirm+ack rate. Here a batch is split by event kind; each kind has a fixed
field layout (``_LAYOUTS``, in the schema's field order), so a field is either a constant
(the nulls, the event name), a column of integers encoded as zig-zag varints with numpy for
all rows at once, or a column of strings looked up in a cache of encoded bytes. The
fields' bytes are laid side by side in one padded matrix with a mask of the bytes in use;
the mask, read row by row, yields the records in batch order.

The output is plain Avro binary for ``audit_event_v2.avsc``, readable by any Avro reader
(the tests decode every kind with fastavro). A new schema version appends fields, so each
layout only grows at its end.
"""
from __future__ import annotations

import os
import zlib
from operator import itemgetter
from typing import Any

import numpy as np

from . import events
from .events import (
    ACK,
    CAN,
    DEL,
    ENQ,
    FIRE,
    LEFT,
    PUB,
    REJ,
    RETRY,
    SCH,
    STRA,
    STRD,
    STRK,
    STRT,
    TRAIL,
    _int,
    _text,
)

_CACHE_MAX = 50_000
_FIRST = itemgetter(0)
_ANY_PROP = events.TRAIL_PROPS  # property keys the trail keeps something of


def zz(n: int) -> bytes:
    """Avro long: zig-zag, then base-128 varint (for headers and block framing)."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(s: str) -> bytes:
    # a routing key may hold bytes that are not UTF-8 (kept as surrogates): an Avro string
    # must be UTF-8, so those bytes are written as \udcXX escapes
    b = s.encode("utf-8", "backslashreplace")
    return zz(len(b)) + b


# ---- field layouts: one entry per schema field, in order ----
# ("n",) null · ("c", bytes) constant · ("seq",) · ("ts",) · ("node",)
# ("l", j) [null,long] from tuple slot j · ("u", j) idem, seconds -> microseconds
# ("s", j) [null,string] (cached) · ("S", j) plain string (cached, the event name)
# ("b", j) [null,boolean] · ("x", j) [null,string] uncached (unique values)
# ("p", j, k) the k-th of the 6 property fields of the properties at slot j
# ("q", j) [null, array<string>] from a list of names at slot j
N = ("n",)


def _ev(name: str) -> tuple:
    return ("c", _string(name))


def _props(j: int) -> list:
    return [("p", j, k) for k in range(6)]


_HEAD = [("seq",), ("ts",), ("node",)]
# vhost queue exchange routing_key msg | 6 props | body_size persistent user connection channel
# confirm_seq outcome queues | consumer_tag delivery_tag redelivered delivery_count requeue
# reason target due_us count detail | (version 2) stream_offset stream_count
_V2 = [N, N]  # the fields version 2 added, null for every kind but the streams'
_LAYOUTS = {
    PUB: _HEAD + [_ev("published"), ("s", 2), N, ("s", 3), ("s", 4), ("l", 5)] + _props(6)
    + [("l", 7), ("b", 8), ("s", 9), ("s", 10), ("l", 11), ("l", 12), ("s", 14), ("q", 13)]
    + [N] * 10,
    ENQ: _HEAD + [_ev("enqueued"), ("s", 2), ("s", 3), N, N, ("l", 4)] + _props(5) + [N] * 18,
    DEL: _HEAD + [_ev("delivered"), ("s", 2), ("s", 3), N, N, ("l", 4)] + [N] * 9
    + [("s", 9), ("l", 10), N, N, N, ("s", 5), ("l", 6), ("b", 7), ("l", 8)] + [N] * 6,
    ACK: _HEAD + [_ev("acked"), ("s", 2), ("s", 3), N, N, ("l", 4)] + [N] * 9
    + [("s", 7), ("l", 8), N, N, N, ("s", 5), ("l", 6)] + [N] * 8,
    REJ: _HEAD + [("S", 10), ("s", 2), ("s", 3), N, N, ("l", 4)] + [N] * 9
    + [("s", 7), ("l", 8), N, N, N, ("s", 5), ("l", 6), N, N, ("b", 9)] + [N] * 5,
    LEFT: _HEAD + [("S", 5), ("s", 2), ("s", 3), N, N, ("l", 4)] + [N] * 19
    + [("s", 6), ("s", 7), N, N, N],
    SCH: _HEAD + [_ev("scheduled"), ("s", 2), N, ("s", 3), ("s", 4), ("l", 5)] + _props(6)
    + [N] * 15 + [("u", 7), N, N],
    FIRE: _HEAD + [_ev("fired"), ("s", 2), N, ("s", 3), ("s", 4), ("l", 5)] + _props(6)
    + [N] * 7 + [("q", 8)] + [N] * 7 + [("u", 7), N, N],
    CAN: _HEAD + [_ev("cancelled"), ("s", 2)] + [N] * 27 + [("x", 3)],
    RETRY: _HEAD + [_ev("retried"), ("s", 2), ("s", 3), N, N, ("l", 4)] + [N] * 17
    + [("l", 5)] + [N] * 5 + [("x", 6)],
    TRAIL: _HEAD + [("S", 2)] + [N] * 27 + [("l", 3), ("x", 4)],
}
_LAYOUTS = {kind: layout + _V2 for kind, layout in _LAYOUTS.items()}
_LAYOUTS.update({
    STRA: _HEAD + [_ev("appended"), ("s", 2), ("s", 3), N, N, ("l", 4)] + [N] * 24
    + [("l", 5), N],
    STRD: _HEAD + [_ev("delivered"), ("s", 2), ("s", 3), N, N, N] + [N] * 9
    + [("s", 8), ("l", 9), N, N, N, ("s", 4), ("l", 5)] + [N] * 7 + [("x", 10)]
    + [("l", 6), ("l", 7)],
    STRK: _HEAD + [_ev("acked"), ("s", 2), ("s", 3), N, N, N] + [N] * 9
    + [("s", 7), ("l", 8), N, N, N, ("s", 4), ("l", 5)] + [N] * 8 + [("l", 6), N],
    STRT: _HEAD + [_ev("truncated"), ("s", 2), ("s", 3), N, N, N] + [N] * 19 + [("s", 6)]
    + [N] * 4 + [("l", 4), ("l", 5)],
})
_NFIELDS = len(events.load_schema()["fields"])
_COMPACT = (events.PUBC, events.DELC, events.ACKC)
_PUBLISHED, _DELIVERED, _ACKED = (_string(e) for e in ("published", "delivered", "acked"))
_NO_PROPS = b"\x00" * 6 + b"\x02"  # six null properties, then body_size's branch


def _check_layouts() -> None:
    for kind, layout in _LAYOUTS.items():
        if len(layout) != _NFIELDS:
            raise AssertionError(f"audit layout of kind {kind}: {len(layout)} != {_NFIELDS}")


def _prop_fields(props) -> tuple:
    """(message_id, correlation_id, app_id, ref_key, producer, producer_seq) of properties."""
    if not props:
        return (None, None, None, None, None, None)
    headers = props.get("headers")
    if isinstance(headers, dict) and headers:
        ref, prod, pseq = (headers.get(events.REF_KEY), headers.get(events.PRODUCER),
                           _int(headers.get(events.PRODUCER_SEQ)))
    else:
        ref = prod = pseq = None
    return (props.get("message_id"), props.get("correlation_id"), props.get("app_id"), ref,
            prod, pseq)


_LIMITS = np.array([1 << (7 * i) for i in range(1, 10)], np.uint64)
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
_COLS = np.arange(16)


def _varints(values: np.ndarray, present: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(n x w matrix, lengths) of Avro longs, preceded by the union branch if ``present``
    is given (branch 1 when present, 0 = null: no value bytes). A fixed handful of numpy
    calls whatever the values: per call overhead, not per value work, dominates here."""
    x = values.astype(np.int64, copy=False)
    u = ((x << 1) ^ (x >> 63)).view(np.uint64)
    lens = np.searchsorted(_LIMITS, u, side="right") + 1
    w = int(lens.max()) if len(u) else 1
    m = ((u[:, None] >> _SHIFTS[:w]) & np.uint64(0x7F)).astype(np.uint8)
    m |= (_COLS[:w] < (lens - 1)[:, None]).view(np.uint8) << 7
    if present is None:
        return m, lens
    head = (present.view(np.uint8) << 1)[:, None]
    return np.hstack([head, m]), np.where(present, lens, 0) + 1  # branch byte + value bytes


class _Piece:
    __slots__ = ("lens", "m")

    def __init__(self, m: np.ndarray, lens: np.ndarray) -> None:
        self.m = m
        self.lens = lens


def _bytes_piece(items: list) -> _Piece:
    lens = np.fromiter(map(len, items), np.int64, len(items))
    w = max(int(lens.max()), 1)
    m = np.zeros((len(items), w), np.uint8)
    m[np.arange(w) < lens[:, None]] = np.frombuffer(b"".join(items), np.uint8)
    return _Piece(m, lens)


class BatchEncoder:
    """Encodes batches of event tuples of one node, numbering them from ``next_seq``."""

    def __init__(self, node: str, next_seq: int) -> None:
        _check_layouts()
        self.node = _string(node)
        self.seq = next_seq
        self._u: dict = {}  # value -> [null,string] bytes
        self._plain: dict = {}  # value -> string bytes
        self._queues: dict = {}  # tuple of queue names -> array bytes
        self._tables: dict[str, _Table] = {}  # runs of fields of the compact kinds

    # cached encodings of repeated strings (names, tags, connections)
    def _ustr(self, v) -> bytes:
        if v is None:
            return b"\x00"
        c = self._u.get(v)
        if c is None:
            if len(self._u) > _CACHE_MAX:
                self._u.clear()
            c = self._u[v] = b"\x02" + _string(_text(v))
        return c

    def _queue_list(self, names) -> bytes:
        """[null, array<string>] of queue names (cached: a few routes repeat)."""
        key = tuple(names)
        if len(self._queues) > _CACHE_MAX:
            self._queues.clear()
        c = self._queues[key] = b"\x02\x00" if not names else b"".join(
            (b"\x02", zz(len(names)), *(self._pstr(q) for q in names), b"\x00"))
        return c

    def _pstr(self, v) -> bytes:
        c = self._plain.get(v)
        if c is None:
            c = self._plain[v] = _string(_text(v))
        return c

    def _field(self, spec: tuple, rows: list, cols: list, seqs: np.ndarray,
               props: list | None) -> _Piece:
        n = len(rows)
        tag = spec[0]
        if tag == "seq":
            m, lens = _varints(seqs, None)
            return _Piece(m, lens)
        if tag == "ts":
            ts = (np.fromiter(cols[1], np.float64, n) * 1e6).astype(np.int64)
            m, lens = _varints(ts, None)
            return _Piece(m, lens)
        if tag in ("l", "u", "p") and (tag != "p" or spec[2] == 5):
            col = cols[spec[1]] if tag != "p" else [p[5] for p in props or ()]
            if tag == "l" and spec[1] == 12:  # confirm sequence: 0 = no confirms
                col = [v or None for v in col]
            present = np.fromiter((v is not None for v in col), bool, n)
            if tag == "u":
                vals = np.fromiter((0.0 if v is None else v for v in col), np.float64, n)
                ints = (vals * 1e6).astype(np.int64)
            else:
                ints = np.fromiter((0 if v is None else v for v in col), np.int64, n)
            m, lens = _varints(ints, present)
            return _Piece(m, lens)
        if tag == "s":
            get, ustr = self._u.get, self._ustr
            return _bytes_piece([get(v) or ustr(v) for v in cols[spec[1]]])
        if tag == "S":
            pget, pstr = self._plain.get, self._pstr
            return _bytes_piece([pget(v) or pstr(v) for v in cols[spec[1]]])
        if tag == "x" or tag == "p":
            col = cols[spec[1]] if tag == "x" else [p[spec[2]] for p in props or ()]
            return _bytes_piece([b"\x00" if v is None else b"\x02" + _string(_text(v))
                                 for v in col])
        if tag == "b":
            out = np.fromiter((0 if v is None else 2 if v else 1 for v in cols[spec[1]]),
                              np.uint8, n)
            m = np.empty((n, 2), np.uint8)
            m[:, 0] = np.where(out == 0, 0, 2)
            m[:, 1] = np.where(out == 2, 1, 0)
            return _Piece(m, np.where(out == 0, 1, 2))
        if tag == "q":
            qget, qenc = self._queues.get, self._queue_list
            return _bytes_piece([qget(tuple(names)) or qenc(names) for names in cols[spec[1]]])
        raise AssertionError(f"unknown layout field {spec!r}")

    # ---- the broker's compact kinds (events.PUBC, DELC, ACKC): most of every trail ----
    def _table(self, name: str, make) -> _Table:
        t = self._tables.get(name)
        if t is None:
            t = self._tables[name] = _Table(make)
        return t

    def _props_bytes(self, props) -> bytes:
        """The six property fields of one message that has some (uncached: unique ids)."""
        f = _prop_fields(props)
        return b"".join((*(b"\x00" if v is None else b"\x02" + _string(_text(v))
                           for v in f[:5]),
                         b"\x00" if f[5] is None else b"\x02" + zz(f[5])))

    def _props_piece(self, col) -> _Piece:
        """The property fields of PUBC rows, then body_size's union branch: six nulls for
        the usual message without ids or trail headers."""
        if col.count(None) == len(col):  # the usual: the hooks kept no property dict
            return _const_piece(_NO_PROPS, len(col))
        plain = [not p or _ANY_PROP.isdisjoint(p) for p in col]
        if all(plain):
            return _const_piece(_NO_PROPS, len(col))
        return _bytes_piece([_NO_PROPS if ok else self._props_bytes(p) + b"\x02"
                             for ok, p in zip(plain, col, strict=True)])

    def _compact(self, kind: int, rows, seqs: np.ndarray) -> list[_Piece]:
        """The pieces of a group of compact rows: varint columns between runs of fields
        that repeat (names, contexts, constants), each run's bytes cached per key."""
        n = len(rows)
        cols = list(zip(*rows, strict=True))
        ts = (np.array(cols[1], np.float64) * 1e6).astype(np.int64)
        pieces = [_Piece(*_varints(seqs, None)), _Piece(*_varints(ts, None))]
        u, node = self._ustr, self.node
        if kind == events.PUBC:
            # seq ts | node event vhost queue exchange routing_key | msg | 6 props | body_size
            # | persistent user connection channel | confirm_seq | outcome queues, 10 nulls
            head = self._table("pub", lambda k: b"".join(
                (node, _PUBLISHED, u(k[0][0]), b"\x00", u(k[1]), u(k[2]), b"\x02")))
            pieces.append(head.piece(zip(cols[2], cols[3], cols[4], strict=False), n))
            pieces.append(_Piece(*_varints(np.array(cols[5], np.int64), None)))
            pieces.append(self._props_piece(cols[6]))
            pieces.append(_Piece(*_varints(np.array(cols[7], np.int64), None)))
            who = self._table("pubch", lambda k: b"".join(
                (_bool(k[0]), u(k[1][1]), u(k[1][2]), _uint(k[1][3]))))
            pieces.append(who.piece(zip(cols[8], cols[2], strict=False), n))
            cseq = np.array([v or 0 for v in cols[9]], np.int64)
            pieces.append(_Piece(*_varints(cseq, cseq != 0)))
            tail = self._table("pubout", lambda k: b"".join(
                (u(k[0]), self._queue_list(events.queue_names(k[1])), b"\x00" * 12)))
            # queues: mostly one name (a str); a list of several is keyed as a tuple
            qs = [q if q is None or q.__class__ is str else tuple(q) for q in cols[10]]
            pieces.append(tail.piece(zip(cols[11], qs, strict=False), n))
            return pieces
        # DELC / ACKC: seq ts | node event vhost queue, 2 nulls | msg | 9 nulls, connection,
        # channel, 3 nulls, consumer_tag | delivery_tag | DELC: redelivered delivery_count,
        # 8 nulls; ACKC: 10 nulls. A stream's (a third item in the queue's context): the
        # generic path, as STRD / STRK (``events.expand``)
        qpos, chpos, event = (2, 8, _DELIVERED) if kind == events.DELC else (2, 6, _ACKED)
        if max(map(len, cols[qpos])) > 2:
            raise ValueError("a stream's deliveries")
        head = self._table(f"q{kind}", lambda k: b"".join(
            (node, event, u(k[0]), u(k[1]), b"\x00\x00\x02")))
        pieces.append(head.piece(cols[qpos], n))
        pieces.append(_Piece(*_varints(np.array(cols[3], np.int64), None)))
        who = self._table("consumer", lambda k: b"".join(
            (b"\x00" * 9, u(k[0][2]), _uint(k[0][3]), b"\x00" * 3, u(k[1]), b"\x02")))
        pieces.append(who.piece(zip(cols[chpos], cols[4], strict=False), n))
        pieces.append(_Piece(*_varints(np.array(cols[5], np.int64), None)))
        if kind == events.DELC:
            tail = self._table("redelivered", lambda k: b"".join(
                (_bool(k[0]), _uint(k[1]), b"\x00" * 8)))
            pieces.append(tail.piece(zip(cols[6], cols[7], strict=False), n))
        else:
            pieces.append(_const_piece(b"\x00" * 10, n))
        return pieces

    def _generic(self, kind: int, rows, seqs: np.ndarray) -> list[_Piece]:
        layout = _LAYOUTS.get(kind)
        if layout is None:
            raise ValueError(f"unknown audit event kind {kind!r}")
        arity = events.ARITY[kind]
        rows = [r if len(r) == arity else r[:arity] for r in rows]  # flat buffers pad
        cols = list(zip(*rows, strict=True))
        props = None
        if kind in (PUB, SCH, FIRE):
            props = [_prop_fields(p) for p in cols[6]]
        elif kind == ENQ:
            props = [_prop_fields(p) for p in cols[5]]
        pieces = []
        const = b""
        for spec in layout:
            if spec[0] == "n" or spec[0] == "c" or spec[0] == "node":
                const += b"\x00" if spec[0] == "n" else self.node if spec[0] == "node" \
                    else spec[1]
                continue
            if const:
                pieces.append(_const_piece(const, len(rows)))
                const = b""
            pieces.append(self._field(spec, rows, cols, seqs, props))
        if const:
            pieces.append(_const_piece(const, len(rows)))
        return pieces

    def _expanded(self, idx, n: int, rows, gseqs: np.ndarray) -> list:
        """(indexes, pieces) of compact rows the compact path refused, expanded into flat
        kinds and encoded a kind at a time (``idx`` None: the whole batch)."""
        flat = events.expand(list(rows))
        kinds = np.fromiter(map(_FIRST, flat), np.int8, len(flat))
        whole = np.arange(n) if idx is None else idx
        if (kinds == kinds[0]).all():
            return [(idx, self._generic(int(kinds[0]), flat, gseqs))]
        out = []
        for kind in np.unique(kinds).tolist():
            sel = np.flatnonzero(kinds == kind)
            out.append((whole[sel], self._generic(kind, [flat[i] for i in sel.tolist()],
                                                  gseqs[sel])))
        return out

    def encode(self, batch: list) -> bytes:
        """The Avro binary records of ``batch``, in order; sequence numbers assigned."""
        n = len(batch)
        if not n:
            return b""
        for t in self._tables.values():
            if len(t) > _CACHE_MAX:
                t.reset()
        seqs = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        kinds = np.fromiter(map(_FIRST, batch), np.int8, n)
        groups = []
        width = 0
        present = np.bincount(kinds.astype(np.intp, copy=False) if kinds.min() >= 0 else
                              _bad_kind(kinds))
        for kind in np.flatnonzero(present).tolist():
            rows: Any
            if present[kind] == n:
                idx = None
                rows = batch
                gseqs = seqs
            else:
                idx = np.flatnonzero(kinds == kind)
                rows = itemgetter(*idx.tolist())(batch) if len(idx) > 1 else (batch[idx[0]],)
                gseqs = seqs[idx]
            parts: list = []
            if kind in _COMPACT:
                try:
                    parts = [(idx, self._compact(kind, rows, gseqs))]
                except (TypeError, ValueError, OverflowError):
                    # a value of an unusual type or size, a stream's delivery: the generic
                    # path handles it, kind by kind of the expanded rows
                    parts = self._expanded(idx, n, rows, gseqs)
            else:
                parts = [(idx, self._generic(kind, rows, gseqs))]
            for part_idx, pieces in parts:
                m = np.hstack([p.m for p in pieces])
                mask = np.hstack([_COLS16(p.m.shape[1]) < p.lens[:, None] for p in pieces])
                if part_idx is None:
                    return m[mask].tobytes()
                groups.append((part_idx, m, mask))
                width = max(width, m.shape[1])
        big = np.zeros((n, width), np.uint8)
        bigmask = np.zeros((n, width), bool)
        for idx, m, mask in groups:
            big[idx, :m.shape[1]] = m
            bigmask[idx, :m.shape[1]] = mask
        return big[bigmask].tobytes()


def _bad_kind(kinds: np.ndarray):
    raise ValueError(f"unknown audit event kind {int(kinds.min())!r}")


def _COLS16(w: int) -> np.ndarray:
    return _COLS[:w] if w <= len(_COLS) else np.arange(w)


def _bool(v) -> bytes:
    return b"\x00" if v is None else b"\x02\x01" if v else b"\x02\x00"


def _uint(v) -> bytes:
    """[null, int|long] of a small repeated number (channel, delivery count)."""
    return b"\x00" if v is None else b"\x02" + zz(v)


class _Table(dict):
    """Cached encodings of a run of fields that repeats: key -> row of a byte matrix, so a
    group's piece is one dictionary lookup per row and one gather."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make
        self.reset()

    def reset(self) -> None:
        self.clear()
        self.rows: list[bytes] = []
        self.m = np.zeros((16, 16), np.uint8)
        self.lens = np.zeros(16, np.int64)
        self.built = 0

    def __missing__(self, key) -> int:
        i = len(self.rows)
        self.rows.append(self.make(key))
        self[key] = i
        return i

    def piece(self, keys, n: int) -> _Piece:
        ids = np.fromiter(map(self.__getitem__, keys), np.intp, n)
        if self.built < len(self.rows):
            self._build()
        return _Piece(self.m[ids], self.lens[ids])

    def _build(self) -> None:
        new = self.rows[self.built:]
        rows, w = self.m.shape
        need_w = max(w, max(map(len, new)))
        need_r = len(self.rows)
        if need_r > rows or need_w > w:
            m = np.zeros((max(need_r, 2 * rows), max(need_w, w)), np.uint8)
            m[:rows, :w] = self.m
            lens = np.zeros(m.shape[0], np.int64)
            lens[:rows] = self.lens
            self.m, self.lens = m, lens
        for i, b in enumerate(new, self.built):
            self.m[i, :len(b)] = np.frombuffer(b, np.uint8)
            self.lens[i] = len(b)
        self.built = len(self.rows)


def _const_piece(const: bytes, n: int) -> _Piece:
    row = np.frombuffer(const, np.uint8)
    return _Piece(np.broadcast_to(row, (n, len(row))), np.full(n, len(row), np.int64))


class ContainerFile:
    """An Avro object container file written block by block (one block per batch)."""

    def __init__(self, path: str, schema_json: str, codec: str, metadata: dict) -> None:
        self.path = path
        self.codec = codec
        self.sync = os.urandom(16)
        self.f = open(path, "wb")  # noqa: SIM115 - closed by close()
        meta = {"avro.schema": schema_json.encode(), "avro.codec": codec.encode()}
        meta.update({k: v.encode() for k, v in metadata.items()})
        parts = [b"Obj\x01", zz(len(meta))]
        for k, v in meta.items():
            parts += [_string(k), zz(len(v)), v]
        parts += [b"\x00", self.sync]
        self.f.write(b"".join(parts))
        self.f.flush()
        self.size = self.f.tell()

    def write_block(self, count: int, data: bytes) -> None:
        if not count:
            return
        if self.codec == "deflate":
            c = zlib.compressobj(1, zlib.DEFLATED, -15)
            data = c.compress(data) + c.flush()
        block = b"".join((zz(count), zz(len(data)), data, self.sync))
        self.f.write(block)
        self.f.flush()
        self.size += len(block)

    def close(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
