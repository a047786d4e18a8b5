"""Read audit trail files (Avro object containers) and survive damage.

One reader for the writer (where to continue the sequence) and the Spark jobs. It parses
the container itself -- header, then blocks of (count, size, data, sync marker) -- so that a
block that does not check out is skipped instead of ending the file:

- a block whose sync marker is wrong, or whose data does not decompress or decode, is
  *corrupt*: it is skipped, counted, and reading resumes at the next sync marker;
- a file that ends inside a block is *truncated* (a torn tail, e.g. a writer killed while
  writing): what came before is read, the tail is counted.

Each problem is reported as ``Problem(path, offset, kind, detail)``. A file whose header
is unreadable is one problem (``bad header``); a file written with a newer schema version
than this reader knows raises ``UnknownSchemaVersion`` naming the file.
"""
from __future__ import annotations

import io
import json
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import fastavro

from .events import SCHEMA_VERSION

MAGIC = b"Obj\x01"
VERSION_KEY = "triomq.audit.schema_version"


class Problem(NamedTuple):
    path: str
    offset: int
    kind: str  # "corrupt block", "truncated", "bad header"
    detail: str

    def __str__(self) -> str:
        return f"{self.path} @ {self.offset}: {self.kind} ({self.detail})"


class UnknownSchemaVersion(ValueError):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """Avro's zig-zag long at ``pos``: (value, next position); IndexError past the end."""
    shift = 0
    acc = 0
    while True:
        b = data[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (acc >> 1) ^ -(acc & 1), pos


def _block(data: bytes, pos: int) -> tuple[int, int]:
    """The item count of an Avro array's or map's next block (0: the end) and where its items
    start; a negative count comes with the block's size in bytes, skipped."""
    count, pos = _varint(data, pos)
    if count < 0:
        _, pos = _varint(data, pos)
        count = -count
    return count, pos


def _header(data: bytes) -> tuple[dict, bytes, int]:
    if data[:4] != MAGIC:
        raise ValueError("not an Avro object container file")
    pos = 4
    meta: dict[str, bytes] = {}
    while True:
        count, pos = _block(data, pos)
        if count == 0:
            break
        for _ in range(count):
            klen, pos = _varint(data, pos)
            key = data[pos:pos + klen].decode()
            pos += klen
            vlen, pos = _varint(data, pos)
            meta[key] = data[pos:pos + vlen]
            pos += vlen
    sync = data[pos:pos + 16]
    if len(sync) != 16:
        raise IndexError("header cut short")
    return meta, sync, pos + 16


def _kind(t) -> str | None:
    """A field type this module decodes itself: L long/int, S string, B boolean, A array of
    strings; a "?" prefix for a union with null first. None: leave it to fastavro."""
    prefix = ""
    if isinstance(t, list):
        if len(t) != 2 or t[0] != "null":
            return None
        prefix, t = "?", t[1]
    if isinstance(t, dict):
        if t.get("type") == "array" and t.get("items") == "string":
            return prefix + "A"
        return None
    return {"long": prefix + "L", "int": prefix + "L", "string": prefix + "S",
            "boolean": prefix + "B"}.get(t)


def _fast_layout(schema_json: dict):
    """(names, kinds) when every field is of a kind ``_decode_fast`` knows, else None."""
    if schema_json.get("type") != "record":
        return None
    names, kinds = [], []
    for f in schema_json.get("fields", []):
        k = _kind(f.get("type"))
        if k is None:
            return None
        names.append(f["name"])
        kinds.append(k)
    return names, kinds


def _decode_fast(raw: bytes, count: int, names: list, kinds: list) -> list:
    """Avro binary records of a flat schema (``_fast_layout``), four to five times faster
    than fastavro's generic reader for this mostly-null schema."""
    out = []
    pos = 0
    fields = list(zip(names, kinds, strict=True))
    for _ in range(count):
        rec: dict = {}
        for name, k in fields:
            if k[0] == "?":
                branch = raw[pos]
                pos += 1
                if branch == 0:
                    rec[name] = None
                    continue
                if branch != 2:
                    raise ValueError(f"bad union branch {branch} for {name}")
                k = k[1]
            if k == "L" or k == "S":
                shift = acc = 0
                while True:
                    b = raw[pos]
                    pos += 1
                    acc |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                n = (acc >> 1) ^ -(acc & 1)
                if k == "L":
                    rec[name] = n
                else:
                    if n < 0 or pos + n > len(raw):
                        raise ValueError(f"bad string length {n} for {name}")
                    rec[name] = raw[pos:pos + n].decode()
                    pos += n
            elif k == "B":
                rec[name] = raw[pos] == 1
                pos += 1
            else:  # array of strings, in blocks
                items: list = []
                while True:
                    c, pos = _block(raw, pos)
                    if c == 0:
                        break
                    for _ in range(c):
                        n, pos = _varint(raw, pos)
                        if n < 0 or pos + n > len(raw):
                            raise ValueError(f"bad string length {n} in {name}")
                        items.append(raw[pos:pos + n].decode())
                        pos += n
                rec[name] = items
        out.append(rec)
    if pos != len(raw):
        raise ValueError(f"{len(raw) - pos} bytes left over in the block")
    return out


# ---- rows of chosen columns, by a decoder generated for the schema ----
# The Spark jobs read millions of events: a generic loop over fields costs ~30 Python
# operations per field. The generated decoder is straight-line code for one record (one
# local variable per column wanted), skips a run of null union fields with a single
# ``startswith`` (most of this schema's fields are null in any one event), and builds the
# row tuple directly.
_RUN = 6  # null fields tested at once


def _gen_varint(lines: list, ind: str, var: str) -> None:
    """Code reading an Avro long at ``p`` into ``var`` (zig-zag decoded)."""
    lines += [f"{ind}b = raw[p]", f"{ind}p += 1",
              f"{ind}if b > 127:",
              f"{ind}    a = b & 127", f"{ind}    s = 7",
              f"{ind}    while True:",
              f"{ind}        b = raw[p]", f"{ind}        p += 1",
              f"{ind}        a |= (b & 127) << s",
              f"{ind}        if b < 128:", f"{ind}            break",
              f"{ind}        s += 7",
              f"{ind}    b = a",
              f"{ind}{var} = (b >> 1) ^ -(b & 1)"]


def _gen_value(lines: list, ind: str, kind: str, var: str | None, name: str) -> None:
    """Code reading one non-null value of ``kind`` (L, S, B, A) into ``var`` (None: skip)."""
    if kind == "B":
        lines.append(f"{ind}{var} = raw[p] == 1" if var else f"{ind}pass")
        lines.append(f"{ind}p += 1")
        return
    if kind == "L":
        _gen_varint(lines, ind, var or "_")
        return
    if kind == "S":
        _gen_varint(lines, ind, "n")
        lines += [f"{ind}if n < 0 or p + n > end:",
                  f"{ind}    raise ValueError('bad string length %d for %s' % (n, {name!r}))"]
        if var:
            lines.append(f"{ind}{var} = raw[p:p + n].decode()")
        lines.append(f"{ind}p += n")
        return
    # array of strings, in blocks
    lines += [f"{ind}items = []", f"{ind}while True:"]
    _gen_varint(lines, ind + "    ", "c")
    lines += [f"{ind}    if c == 0:", f"{ind}        break",
              f"{ind}    if c < 0:"]
    _gen_varint(lines, ind + "        ", "_")
    lines += [f"{ind}        c = -c",
              f"{ind}    for _i in range(c):"]
    _gen_varint(lines, ind + "        ", "n")
    lines += [f"{ind}        if n < 0 or p + n > end:",
              f"{ind}            raise ValueError('bad string length %d in %s' % (n, {name!r}))",
              f"{ind}        items.append(raw[p:p + n].decode())",
              f"{ind}        p += n"]
    if var:
        lines.append(f"{ind}{var} = items")


def _gen_field(lines: list, ind: str, kind: str, var: str | None, name: str) -> None:
    if kind[0] != "?":
        _gen_value(lines, ind, kind, var, name)
        return
    lines += [f"{ind}b = raw[p]", f"{ind}p += 1", f"{ind}if b == 2:"]
    _gen_value(lines, ind + "    ", kind[1], var, name)
    if var:
        lines += [f"{ind}elif b == 0:", f"{ind}    {var} = None"]
    lines += [f"{ind}elif b != 0:",
              f"{ind}    raise ValueError('bad union branch %d for %s' % (b, {name!r}))"]


def _rows_source(names: list, kinds: list, wanted: tuple) -> str:
    slot = {c: f"v{i}" for i, c in enumerate(wanted) if c in names}
    ts_var = slot.get("ts_us", "ts")
    lines = ["def decode(raw, count, out, lo, hi):",
             "    p = 0", "    end = len(raw)", "    starts = raw.startswith",
             "    append = out.append",
             "    for _r in range(count):"]
    ind = "        "
    i = 0
    while i < len(names):
        if kinds[i][0] == "?":
            j = i
            while j < len(names) and j - i < _RUN and kinds[j][0] == "?":
                j += 1
            if j - i > 1:
                run = list(range(i, j))
                lines.append(f"{ind}if starts({bytes(len(run))!r}, p):")
                lines.append(f"{ind}    p += {len(run)}")
                nulls = [slot[names[k]] for k in run if names[k] in slot]
                if nulls:
                    lines.append(f"{ind}    {' = '.join(nulls)} = None")
                lines.append(f"{ind}else:")
                for k in run:
                    _gen_field(lines, ind + "    ", kinds[k], slot.get(names[k]), names[k])
                i = j
                continue
        var = slot.get(names[i])
        if names[i] == "ts_us" and var is None:
            var = ts_var
        _gen_field(lines, ind, kinds[i], var, names[i])
        i += 1
    row = ", ".join(slot.get(c, "None") for c in wanted)
    lines += [f"{ind}if lo <= {ts_var} < hi:",
              f"{ind}    append(({row},))",
              "    if p != end:",
              "        raise ValueError('%d bytes left over in the block' % (end - p))"]
    return "\n".join(lines) + "\n"


_ROW_DECODERS: dict = {}


def row_decoder(names: list, kinds: list, wanted: tuple):
    """``decode(raw, count, out, lo, hi)``: append to ``out`` a tuple of the ``wanted``
    columns (None for a column the schema lacks) of each record with lo <= ts_us < hi."""
    key = (tuple(names), tuple(kinds), tuple(wanted))
    fn = _ROW_DECODERS.get(key)
    if fn is None:
        if "ts_us" not in names:
            raise ValueError("the audit schema has no ts_us field")
        namespace: dict = {}
        # the source is built from the schema's field kinds; names only appear as repr()s
        exec(compile(_rows_source(names, kinds, wanted), "<audit row decoder>", "exec"),
             namespace)
        fn = _ROW_DECODERS[key] = namespace["decode"]
    return fn


class FileReader:
    """The records of one file, skipping what is damaged (``problems`` lists it)."""

    def __init__(self, path: str, data: bytes | None = None, known_version: int = SCHEMA_VERSION):
        self.path = path
        self.problems: list[Problem] = []
        self.blocks = 0
        if data is None:
            with open(path, "rb") as f:
                data = f.read()
        self.data = data
        self.records_read = 0
        self.meta: dict = {}
        self.ok = False
        self.fast = None  # set by a readable header; rows_iter of a damaged file reads nothing
        # (offset, record count, first bytes of the decoded data) of the block rows_iter
        # handed out last, filtered or not: its first record's seq, ts_us and node
        self.block: tuple[int, int, bytes] | None = None
        try:
            self.meta, self.sync, self.start = _header(data)
            version = int(self.meta.get(VERSION_KEY, b"1").decode() or 1)
            self.codec = self.meta.get("avro.codec", b"null").decode()
            schema_json = json.loads(self.meta["avro.schema"])
            self.schema = fastavro.parse_schema(schema_json)
            self.fast = _fast_layout(schema_json)
        except (ValueError, IndexError, KeyError, UnicodeDecodeError) as exc:
            self.problems.append(Problem(path, 0, "bad header", str(exc) or type(exc).__name__))
            return
        if version > known_version:
            raise UnknownSchemaVersion(
                f"{path}: audit schema version {version} is newer than this reader's "
                f"({known_version}); upgrade the jobs")
        self.version = version
        self.ok = True

    def _inflate(self, raw: bytes) -> bytes:
        if self.codec == "deflate":
            return zlib.decompress(raw, -15)
        if self.codec == "snappy":
            import snappy  # type: ignore[import-not-found]  # only for snappy-coded files
            return snappy.decompress(raw[:-4])
        if self.codec != "null":
            raise ValueError(f"unsupported codec {self.codec}")
        return raw

    def _decode(self, raw: bytes, count: int) -> list:
        raw = self._inflate(raw)
        if self.fast is not None:
            return _decode_fast(raw, count, *self.fast)
        return self._decode_generic(raw, count)

    def _decode_generic(self, raw: bytes, count: int) -> list:
        bio = io.BytesIO(raw)
        schema = self.schema
        read = fastavro.schemaless_reader
        out = [read(bio, schema) for _ in range(count)]
        if bio.tell() != len(raw):
            raise ValueError(f"{len(raw) - bio.tell()} bytes left over in the block")
        return out

    def _spans(self) -> Iterator[tuple[int, int, int, int]]:
        """(block offset, data offset, data size, record count) of each block whose
        framing checks out; framing damage is noted in ``problems``."""
        if not self.ok:
            return
        data = self.data
        end = len(data)
        sync = self.sync
        pos = self.start
        while pos < end:
            block_at = pos
            try:
                count, p = _varint(data, pos)
                size, p = _varint(data, p)
                if count < 0 or size < 0:
                    raise ValueError(f"negative count {count} or size {size}")
                if p + size + 16 > end:
                    raise IndexError
            except IndexError:
                nxt = data.find(sync, block_at + 1)
                if nxt < 0:
                    self.problems.append(Problem(self.path, block_at, "truncated",
                                                 f"{end - block_at} bytes of a torn tail"))
                    return
                self.problems.append(Problem(self.path, block_at, "corrupt block",
                                             "block length runs past the file; resynced"))
                pos = nxt + 16
                continue
            except ValueError as exc:
                pos = self._resync(block_at, str(exc))
                continue
            if data[p + size:p + size + 16] != sync:
                after = p + size + 16
                if after == end or self._framed_at(after):  # only the marker is damaged
                    self.problems.append(Problem(self.path, block_at, "corrupt block",
                                                 "sync marker mismatch"))
                    pos = after
                else:
                    pos = self._resync(block_at, "sync marker mismatch")
                continue
            pos = p + size + 16
            yield block_at, p, size, count

    def _framed_at(self, pos: int) -> bool:
        """Whether a block with a correct sync marker starts at ``pos``."""
        try:
            count, p = _varint(self.data, pos)
            size, p = _varint(self.data, p)
        except (IndexError, ValueError):
            return False
        return count >= 0 and size >= 0 and self.data[p + size:p + size + 16] == self.sync

    def _block(self, block_at: int, p: int, size: int, count: int) -> list | None:
        try:
            records = self._decode(self.data[p:p + size], count)
        except Exception as exc:  # any decoding failure of damaged bytes
            self.problems.append(Problem(self.path, block_at, "corrupt block",
                                         f"{type(exc).__name__}: {exc}"[:200]))
            return None
        self.blocks += 1
        self.records_read += count
        return records

    def blocks_iter(self) -> Iterator[list]:
        """Each good block's records (dicts), in file order."""
        for span in self._spans():
            records = self._block(*span)
            if records is not None:
                yield records

    def rows_iter(self, columns: tuple, lo: int | None = None,
                  hi: int | None = None) -> Iterator[list]:
        """Each good block's events with ``lo <= ts_us < hi`` as tuples of ``columns``
        (None where the file's schema lacks one), in file order."""
        lo_ = -(1 << 63) if lo is None else lo
        hi_ = 1 << 63 if hi is None else hi
        decode = (row_decoder(self.fast[0], self.fast[1], tuple(columns))
                  if self.fast is not None else None)
        data = self.data
        for block_at, p, size, count in self._spans():
            rows: list = []
            try:
                raw = self._inflate(data[p:p + size])
                self.block = (block_at, count, raw[:320])
                if decode is not None:
                    decode(raw, count, rows, lo_, hi_)
                else:
                    rows = [tuple([r.get(c) for c in columns])
                            for r in self._decode_generic(raw, count)
                            if lo_ <= r["ts_us"] < hi_]
            except Exception as exc:  # any decoding failure of damaged bytes
                self.problems.append(Problem(self.path, block_at, "corrupt block",
                                             f"{type(exc).__name__}: {exc}"[:200]))
                continue
            self.blocks += 1
            self.records_read += count
            yield rows

    def last_records(self, blocks: int = 4) -> list:
        """The records of the last ``blocks`` good blocks (only those are decoded)."""
        spans = list(self._spans())
        out: list = []
        for span in spans[-blocks:]:
            records = self._block(*span)
            if records is not None:
                out.extend(records)
        return out

    def _resync(self, block_at: int, why: str) -> int:
        nxt = self.data.find(self.sync, block_at + 1)
        if nxt < 0:
            self.problems.append(Problem(self.path, block_at, "truncated",
                                         f"{why}; no sync marker after it"))
            return len(self.data)
        self.problems.append(Problem(self.path, block_at, "corrupt block", f"{why}; resynced"))
        return nxt + 16

    def __iter__(self) -> Iterator[dict]:
        for block in self.blocks_iter():
            yield from block


def read_records(path: str, problems: list | None = None) -> Iterator[dict]:
    """Every readable record of ``path``; damage is appended to ``problems``."""
    reader = FileReader(path)
    try:
        yield from reader
    finally:
        if problems is not None:
            problems.extend(reader.problems)
