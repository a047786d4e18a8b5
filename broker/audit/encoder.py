"""Avro binary encoding of audit events, a whole batch at a time, column by column.

fastavro's generic writer costs 15-17 µs per record of this 33-field schema of unions
(docs/performance-audit.md): at three events per message that is more than a core at the
broker's confirm+ack rate. Here a batch is split by event kind; each kind has a fixed
field layout (``_LAYOUTS``, in the schema's field order), so a field is either a constant
(the nulls, the event name), a column of integers encoded as zig-zag varints with numpy for
all rows at once, or a column of strings looked up in a cache of encoded bytes. The
fields' bytes are laid side by side in one padded matrix with a mask of the bytes in use;
the mask, read row by row, yields the records in batch order.

The output is plain Avro binary for ``audit_event_v1.avsc``, readable by any Avro reader
(the tests decode every kind with fastavro). A new schema version appends fields, so each
layout only grows at its end.
"""
from __future__ import annotations

import os
import zlib

import numpy as np

from . import events
from .events import ACK, CAN, DEL, ENQ, FIRE, LEFT, PUB, REJ, RETRY, SCH, TRAIL, _int, _text

_CACHE_MAX = 50_000


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
# reason target due_us count detail
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
_NFIELDS = len(events.load_schema()["fields"])


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


def _varints(values: np.ndarray, present: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(n x w matrix, lengths) of Avro longs, preceded by the union branch if ``present``
    is given (branch 1 when present, 0 = null: no value bytes)."""
    x = values.astype(np.int64)
    u = ((x << 1) ^ (x >> 63)).astype(np.uint64)
    n = len(u)
    lens = np.ones(n, np.int64)
    for i in range(1, 10):
        lens += (u >> np.uint64(7 * i)) > 0
    w = int(lens.max()) if n else 1
    m = np.empty((n, w), np.uint8)
    v = u.copy()
    for i in range(w):
        m[:, i] = (v & np.uint64(0x7F)).astype(np.uint8)
        v >>= np.uint64(7)
    m |= ((np.arange(w) < (lens - 1)[:, None]) * 0x80).astype(np.uint8)
    if present is None:
        return m, lens
    head = np.where(present, 2, 0).astype(np.uint8)[:, None]
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

    def encode(self, batch: list) -> bytes:
        """The Avro binary records of ``batch``, in order; sequence numbers assigned."""
        n = len(batch)
        if not n:
            return b""
        batch = events.expand(batch)
        seqs = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        kinds = np.fromiter((ev[0] for ev in batch), np.int8, n)
        groups = []
        width = 0
        for kind in np.unique(kinds).tolist():
            layout = _LAYOUTS.get(kind)
            if layout is None:
                raise ValueError(f"unknown audit event kind {kind!r}")
            idx = np.nonzero(kinds == kind)[0]
            rows = [batch[i] for i in idx.tolist()]
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
                pieces.append(self._field(spec, rows, cols, seqs[idx], props))
            if const:
                pieces.append(_const_piece(const, len(rows)))
            m = np.hstack([p.m for p in pieces])
            mask = np.hstack([np.arange(p.m.shape[1]) < p.lens[:, None] for p in pieces])
            groups.append((idx, m, mask))
            width = max(width, m.shape[1])
        if len(groups) == 1:
            _, m, mask = groups[0]
            return m[mask].tobytes()
        big = np.zeros((n, width), np.uint8)
        bigmask = np.zeros((n, width), bool)
        for idx, m, mask in groups:
            big[idx, :m.shape[1]] = m
            bigmask[idx, :m.shape[1]] = mask
        return big[bigmask].tobytes()


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
