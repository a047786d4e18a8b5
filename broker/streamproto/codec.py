"""RabbitMQ Stream protocol frames, sans-IO: bytes in, command objects out, and back. Not the
I/O, nor what a command means to the broker (listeners/stream_session.py).

``decode(key, version, payload)`` turns a client's frame (``FrameReader.feed``'s triples)
into one of the command classes (``commands``); a body that ends early or carries bytes
after its last field, an unknown key or version raises ``FrameError`` with
``UNKNOWN_FRAME``. The ``encode_*`` functions build what the server sends; ``encode`` builds
any command object (clients' frames too: tests, the bench). The protocol's names are all
reachable from here: framing from ``frames``, the commands from ``commands``, chunks and
sub-entry batches from ``subentry``.
"""
from __future__ import annotations

import struct
from dataclasses import fields
from typing import Any

from .commands import *  # noqa: F403
from .commands import (
    CLIENT_COMMANDS,
    SUPPORTED_VERSIONS,
    Command,
    Publish,
    PublishedMessage,
    SubEntry,
)
from .frames import *  # noqa: F403
from .frames import (
    _HEAD,
    _I16,
    _I32,
    _I64,
    _SUBENTRY,
    _U8,
    _U16,
    _U32,
    _U64,
    CLOSE,
    CONSUMER_UPDATE,
    CREDIT,
    DELIVER,
    EXCHANGE_COMMAND_VERSIONS,
    HEARTBEAT,
    METADATA,
    METADATA_UPDATE,
    OFFSET_FIRST,
    OFFSET_LAST,
    OFFSET_NEXT,
    OFFSET_OFFSET,
    OFFSET_TIMESTAMP,
    OK,
    OPEN,
    PARTITIONS,
    PEER_PROPERTIES,
    PUBLISH,
    PUBLISH_CONFIRM,
    PUBLISH_ERROR,
    QUERY_OFFSET,
    QUERY_PUBLISHER_SEQUENCE,
    RESPONSE,
    ROUTE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    STREAM_STATS,
    TUNE,
    Cursor,
    _unknown,
)
from .subentry import *  # noqa: F403

_MIN_SIZE = {"u8": 1, "u16": 2, "u32": 4, "u64": 8, "i64": 8, "str": 2, "bytes": 4}


def _read(cur: Cursor, tp) -> Any:
    if isinstance(tp, tuple):  # ("array", element)
        return [_read(cur, tp[1]) for _ in range(cur.count(_MIN_SIZE[tp[1]]))]
    if tp == "props" or tp == "opt_props":
        if tp == "opt_props" and cur.remaining == 0:  # clients before 3.11 send none
            return {}
        props = {}
        for _ in range(cur.count(4)):
            k = cur.str()
            props[k] = cur.str()
        return props
    if tp in ("offset_spec", "update_offset_spec"):
        kind = cur.u16()
        if kind in (OFFSET_FIRST, OFFSET_LAST, OFFSET_NEXT):
            # rstream answers a ConsumerUpdate with a value after every type; RabbitMQ
            # ignores what follows first/last/next there
            if tp == "update_offset_spec" and cur.remaining == 8:
                cur.u64()
            return (kind, 0)
        if kind == OFFSET_OFFSET:
            return (kind, cur.u64())
        if kind == OFFSET_TIMESTAMP:
            return (kind, cur.i64())
        raise _unknown(f"unknown offset specification {kind}")
    if tp == "versions":
        return [(cur.u16(), cur.u16(), cur.u16()) for _ in range(cur.count(6))]
    return getattr(cur, tp)()  # the command table names the reader of each field type


def decode(key: int, version: int, payload) -> Command:
    """The command in one client frame (``FrameReader.feed``'s triples)."""
    cls = CLIENT_COMMANDS.get(key)
    if cls is None:
        raise _unknown(f"unknown key {key:#06x}")
    low, high = SUPPORTED_VERSIONS[key & 0x7FFF]
    if not low <= version <= high:
        raise _unknown(f"unsupported version {version} of key {key:#06x}")
    cur = Cursor(payload)
    if cls is Publish:
        return _decode_publish(cur, version)
    values = [_read(cur, tp) for tp in cls.FIELDS]
    if cur.remaining:
        raise _unknown(f"{cur.remaining} bytes after the last field")
    return cls(*values, version=version)


def _decode_publish(cur: Cursor, version: int) -> Publish:
    publisher_id = cur.u8()
    messages = []
    # every entry is at least 12 bytes (publishing id and a size)
    for _ in range(cur.count(12)):
        publishing_id = cur.u64()
        filter_value = cur.str() if version == 2 else None
        if cur.remaining and cur.buf[cur.pos] & 0x80:
            kind, count, size, length = _SUBENTRY.unpack_from(cur.buf, cur.pos) \
                if cur.remaining >= _SUBENTRY.size else (0, 0, 0, -1)
            if length < 0:
                raise _unknown("frame too short")
            cur.pos += _SUBENTRY.size
            data: Any = SubEntry((kind & 0x70) >> 4, count, size, cur.raw(length))
        else:
            n = cur.i32()
            data = cur.raw(n)
        messages.append(PublishedMessage(publishing_id, data, filter_value))
    if cur.remaining:
        raise _unknown(f"{cur.remaining} bytes after the last field")
    return Publish(publisher_id, messages, version=version)


# ---- writing ----
def _w_str(out: list, s: str | None) -> None:
    if s is None:
        out.append(_I16.pack(-1))
        return
    b = s.encode()
    out.append(_I16.pack(len(b)))
    out.append(b)


def _write(out: list, tp, value) -> None:
    if isinstance(tp, tuple):
        out.append(_I32.pack(len(value)))
        for v in value:
            _write(out, tp[1], v)
    elif tp == "props" or tp == "opt_props":
        out.append(_I32.pack(len(value)))
        for k, v in value.items():
            _w_str(out, k)
            _w_str(out, v)
    elif tp in ("offset_spec", "update_offset_spec"):
        kind, v = value
        out.append(_U16.pack(kind))
        if kind == OFFSET_OFFSET:
            out.append(_U64.pack(v))
        elif kind == OFFSET_TIMESTAMP:
            out.append(_I64.pack(v))
    elif tp == "versions":
        out.append(_I32.pack(len(value)))
        for k, lo, hi in value:
            out.append(struct.pack(">HHH", k, lo, hi))
    elif tp == "stats":
        out.append(_I32.pack(len(value)))
        for k, v in value.items():
            _w_str(out, k)
            out.append(_I64.pack(v))
    elif tp == "str":
        _w_str(out, value)
    elif tp == "bytes":
        if value is None:
            out.append(_I32.pack(-1))
        else:
            out.append(_I32.pack(len(value)))
            out.append(bytes(value))
    else:
        out.append({"u8": _U8, "u16": _U16, "u32": _U32, "u64": _U64, "i64": _I64,
                    "i32": _I32}[tp].pack(value))


def frame(key: int, version: int, spec, values) -> bytes:
    """One frame: size, key, version, then ``values`` written as ``spec`` says."""
    out: list = []
    for tp, v in zip(spec, values, strict=True):
        _write(out, tp, v)
    body = b"".join(out)
    return _HEAD.pack(len(body) + 4, key, version) + body


def encode(cmd: Command) -> bytes:
    """Any command object as a frame (what a client sends: tests and the bench)."""
    if isinstance(cmd, Publish):
        out: list = [_U8.pack(cmd.publisher_id), _I32.pack(len(cmd.messages))]
        for m in cmd.messages:
            out.append(_U64.pack(m.publishing_id))
            if cmd.version == 2:
                _w_str(out, m.filter_value)
            if isinstance(m.data, SubEntry):
                s = m.data
                out.append(_SUBENTRY.pack(0x80 | s.compression << 4, s.count,
                                          s.uncompressed_size, len(s.data)))
                out.append(bytes(s.data))
            else:
                out.append(_I32.pack(len(m.data)))
                out.append(bytes(m.data))
        body = b"".join(out)
        return _HEAD.pack(len(body) + 4, PUBLISH, cmd.version) + body
    # each dataclass field by its name, in the command table's order
    values = [getattr(cmd, f.name) for f in fields(cmd) if f.name != "version"]
    return frame(cmd.KEY, cmd.version, cmd.FIELDS, values)


# what the server sends: responses (key | 0x8000, correlation id, code, then these fields)
RESPONSE_FIELDS: dict[int, tuple] = {
    PEER_PROPERTIES: ("props",),
    SASL_HANDSHAKE: (("array", "str"),),
    OPEN: ("props",),
    QUERY_PUBLISHER_SEQUENCE: ("u64",),
    QUERY_OFFSET: ("u64",),
    ROUTE: (("array", "str"),),
    PARTITIONS: (("array", "str"),),
    EXCHANGE_COMMAND_VERSIONS: ("versions",),
    STREAM_STATS: ("stats",),
}


def encode_response(key: int, correlation_id: int, code: int, *extra) -> bytes:
    """A response; the extra fields (``RESPONSE_FIELDS``) only when ``code`` is OK, as
    RabbitMQ leaves them out of an error except for the sequence and offset queries."""
    spec = RESPONSE_FIELDS.get(key, ())
    if code != OK and key not in (QUERY_PUBLISHER_SEQUENCE, QUERY_OFFSET):
        spec, extra = (), ()
    elif len(extra) != len(spec):
        spec = spec[:len(extra)]
    return frame(key | RESPONSE, 1, ("u32", "u16", *spec), (correlation_id, code, *extra))


def encode_sasl_response(correlation_id: int, code: int, challenge: bytes | None = None) -> bytes:
    spec: tuple = ("u32", "u16") + (("bytes",) if challenge is not None else ())
    values: tuple = (correlation_id, code) + ((challenge,) if challenge is not None else ())
    return frame(SASL_AUTHENTICATE | RESPONSE, 1, spec, values)


def encode_credit_error(code: int, subscription_id: int) -> bytes:
    """Credit's only answer, sent on a problem (no correlation id)."""
    return frame(CREDIT | RESPONSE, 1, ("u16", "u8"), (code, subscription_id))


def encode_metadata(correlation_id: int, brokers: list[tuple[int, str, int]],
                    streams: list[tuple[str, int, int, list[int]]]) -> bytes:
    out: list = [_U32.pack(correlation_id), _I32.pack(len(brokers))]
    for ref, host, port in brokers:
        out.append(_U16.pack(ref))
        _w_str(out, host)
        out.append(_U32.pack(port))
    out.append(_I32.pack(len(streams)))
    for name, code, leader, replicas in streams:
        _w_str(out, name)
        out.append(struct.pack(">HH", code, leader))
        out.append(_I32.pack(len(replicas)))
        out.extend(_U16.pack(r) for r in replicas)
    body = b"".join(out)
    return _HEAD.pack(len(body) + 4, METADATA | RESPONSE, 1) + body


def encode_tune(frame_max: int, heartbeat: int) -> bytes:
    return frame(TUNE, 1, ("u32", "u32"), (frame_max, heartbeat))


def encode_heartbeat() -> bytes:
    return _HEAD.pack(4, HEARTBEAT, 1)


def encode_close(correlation_id: int, code: int, reason: str) -> bytes:
    return frame(CLOSE, 1, ("u32", "u16", "str"), (correlation_id, code, reason))


def encode_publish_confirm(publisher_id: int, ids: list[int]) -> bytes:
    n = len(ids)
    return (_HEAD.pack(4 + 1 + 4 + 8 * n, PUBLISH_CONFIRM, 1) + _U8.pack(publisher_id)
            + _I32.pack(n) + struct.pack(f">{n}Q", *ids))


def encode_publish_error(publisher_id: int, errors: list[tuple[int, int]]) -> bytes:
    out = [_U8.pack(publisher_id), _I32.pack(len(errors))]
    out.extend(struct.pack(">QH", pid, code) for pid, code in errors)
    body = b"".join(out)
    return _HEAD.pack(len(body) + 4, PUBLISH_ERROR, 1) + body


def encode_metadata_update(code: int, stream: str) -> bytes:
    return frame(METADATA_UPDATE, 1, ("u16", "str"), (code, stream))


def encode_consumer_update(correlation_id: int, subscription_id: int, active: bool) -> bytes:
    return frame(CONSUMER_UPDATE, 1, ("u32", "u8", "u8"),
                 (correlation_id, subscription_id, 1 if active else 0))


def encode_deliver_header(subscription_id: int, chunk_size: int, version: int = 1,
                          committed_offset: int = 0) -> bytes:
    """The bytes before a chunk in a Deliver frame (the chunk itself follows as is)."""
    if version == 2:
        return (_HEAD.pack(4 + 1 + 8 + chunk_size, DELIVER, 2) + _U8.pack(subscription_id)
                + _U64.pack(committed_offset))
    return _HEAD.pack(4 + 1 + chunk_size, DELIVER, 1) + _U8.pack(subscription_id)
