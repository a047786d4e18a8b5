"""How a pending message is packed: transient blobs and the stored state headers.

* A transient pending message is one ``bytes`` blob (exchange, routing key, raw
  properties, body): what routing needs at due time, not GC-tracked.
* A persistent one is stored with its schedule state in ``x-triomq-*`` headers,
  so a restart can rebuild its slot from the stored message alone.
* The copy delivered at due time: the state headers stripped, and for
  ``x-delayed-message`` the ``x-delay`` header negated (patched in the raw
  property bytes when possible, so a blob is never re-encoded).
"""
from __future__ import annotations

import struct

from ..amqp.fields import decode_properties, encode_properties
from ..message import Message
from .spec import X_DELAY, Schedule

H_SID = "x-triomq-sid"
H_KIND = "x-triomq-kind"
H_DUE = "x-triomq-due"
H_LEFT = "x-triomq-left"
H_RUN = "x-triomq-run"
H_DELAY = "x-triomq-delay"
H_PERIOD = "x-triomq-period"
H_REPEAT = "x-triomq-repeat"
H_CRON = "x-triomq-cron"
STATE_HEADERS = (H_SID, H_KIND, H_DUE, H_LEFT, H_RUN, H_DELAY, H_PERIOD, H_REPEAT, H_CRON)

_BLOB = struct.Struct(">BBI")  # exchange length, routing key length, raw properties length
_SIGNED = {ord("b"): struct.Struct(">b"), ord("s"): struct.Struct(">h"),
           ord("I"): struct.Struct(">i"), ord("l"): struct.Struct(">q")}
_X_DELAY_KEY = bytes((len(X_DELAY),)) + X_DELAY.encode()


def pack_blob(message) -> bytes:
    """A transient pending message in one bytes object: what routing needs at due time."""
    ex = message.exchange.encode("utf-8", "surrogateescape")
    rk = message.routing_key.encode("utf-8", "surrogateescape")
    raw = message.props_raw
    return b"".join((_BLOB.pack(len(ex), len(rk), len(raw)), ex, rk, raw, message.body))


def unpack_blob(blob: bytes):
    """(exchange, routing key, raw properties, body)."""
    exl, rkl, pl = _BLOB.unpack_from(blob, 0)
    p = _BLOB.size
    ex = blob[p:p + exl].decode("utf-8", "surrogateescape")
    p += exl
    rk = blob[p:p + rkl].decode("utf-8", "surrogateescape")
    p += rkl
    return ex, rk, blob[p:p + pl], blob[p + pl:]


def blob_message(blob: bytes) -> Message:
    ex, rk, raw, body = unpack_blob(blob)
    return Message(ex, rk, raw, decode_properties(raw), body)


def negate_x_delay(raw: bytes, delay: int):
    """props_raw with the x-delay header value replaced by -delay, patched in place
    (same width), or None when the encoding is not a plain signed integer."""
    at = raw.find(_X_DELAY_KEY)
    if at < 0:
        return None
    tag_at = at + len(_X_DELAY_KEY)
    if tag_at >= len(raw):
        return None
    packer = _SIGNED.get(raw[tag_at])
    if packer is None:
        return None
    try:
        value = packer.pack(-delay)
    except struct.error:
        return None
    return raw[:tag_at + 1] + value + raw[tag_at + 1 + packer.size:]


def blob_delivery(blob: bytes, delayed: bool, delay: int) -> Message:
    """The copy to route now of a transient message: as it came (no state headers),
    with x-delay = -delay for the delayed-message exchange."""
    ex, rk, raw, body = unpack_blob(blob)
    if delayed:
        patched = negate_x_delay(raw, delay)
        if patched is not None:
            return Message(ex, rk, patched, decode_properties(patched), body)
        props = decode_properties(raw)
        headers = dict(props.get("headers") or {})
        headers[X_DELAY] = -delay
        props["headers"] = headers
        return Message(ex, rk, encode_properties(props), props, body)
    return Message(ex, rk, raw, decode_properties(raw), body)


def stored_delivery(stored, delayed: bool, delay: int):
    """The copy to route now of a stored message: state headers stripped, and as the
    plugin does, a delayed message says it was delayed by -x-delay."""
    props = dict(stored.properties)
    headers = dict(props.get("headers") or {})
    for h in STATE_HEADERS:
        headers.pop(h, None)
    if delayed:
        headers[X_DELAY] = -delay
    props["headers"] = headers
    return stored.with_changes(properties=props)


def with_state(message, sid: str, sched: Schedule, due: float, left: int, run: float):
    """The message to store: its schedule state in x-triomq-* headers."""
    props = dict(message.properties)
    headers = dict(props.get("headers") or {})
    headers[H_SID] = sid.encode()
    headers[H_KIND] = sched.kind.encode()
    headers[H_DELAY] = sched.delay
    headers[H_PERIOD] = sched.period
    headers[H_REPEAT] = sched.repeat
    if sched.cron:
        headers[H_CRON] = sched.cron.encode()
    headers[H_DUE] = round(due * 1000)
    headers[H_LEFT] = left
    headers[H_RUN] = round(run * 1000)
    props["headers"] = headers
    return message.with_changes(properties=props)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def read_state(headers) -> tuple[str, Schedule, float, int, float]:
    """(sid, schedule, due, left, run) from a stored message's headers.
    Raises KeyError, ValueError or TypeError when they are missing or invalid."""
    sid = _text(headers[H_SID])
    kind = _text(headers[H_KIND])
    due = int(headers[H_DUE]) / 1000.0
    left = int(headers[H_LEFT])
    run = int(headers[H_RUN]) / 1000.0
    if kind not in ("delay", "amq"):
        raise ValueError(f"unknown kind {kind!r}")
    cron = _text(headers[H_CRON]) if H_CRON in headers else None
    schedule = Schedule(kind, delay=int(headers[H_DELAY]), period=int(headers[H_PERIOD]),
                        repeat=int(headers[H_REPEAT]), cron=cron)
    return sid, schedule, due, left, run
