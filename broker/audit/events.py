"""The audit trail's events: the compact tuples the broker appends, and their Avro records.

The hot path appends one tuple per event (kind code first, then ``time.time()``, then
references it already holds: names, ids, the message's property dict); everything else --
turning them into records, the sequence number, text decoding -- happens in the writer
process (``writer.py``), off the broker's event loop.
"""
from __future__ import annotations

import json
import os

SCHEMA_VERSION = 2  # 2: version 1 and stream_offset, stream_count at the end
SCHEMA_PATH = os.path.join(os.path.dirname(__file__), f"audit_event_v{SCHEMA_VERSION}.avsc")

# kind codes (first element of every tuple)
PUB, ENQ, DEL, ACK, REJ, LEFT, SCH, FIRE, CAN, RETRY, TRAIL = range(11)
# The broker's hot hooks append shorter tuples that share the channel's and the queue's
# context tuples (``(vhost, user, peer, channel number)``, ``(vhost, queue)``): fewer
# attribute reads per event, and marshal writes a shared tuple once per batch and then a
# reference. ``expand`` turns them into the flat kinds above, in the converter.
#   (PUBC, t, chctx, exchange, routing_key, msg, props, body_size, persistent, confirm seq,
#    queues, outcome)
#   (DELC, t, qctx, msg, consumer_tag, delivery_tag, redelivered, delivery_count, chctx)
#   (ACKC, t, qctx, msg, consumer_tag, delivery_tag, chctx)
#  ``queues`` of PUBC: None (no queue), one queue's name, or a list of names.
PUBC, DELC, ACKC = 11, 12, 13
# A delivery acked while its DELC record was still in the recorder's buffer: the DELC
# record, its kind changed and the ack's time in slot 9. ``rows`` turns it into the DELC
# and the ACKC it stands for (so the ack's sequence number follows its delivery's).
DACK = 14
# A stream's records (schema version 2) are named by their offsets, the same on every
# replica; a message read back from a stream has its offset as its id, and a stream queue's
# context tuple has a third item (``STREAM``): the DELC and ACKC records of an AMQP 0-9-1
# stream consumer hold the offset in their msg slot, and ``expand`` makes them STRD/STRK.
#   (STRA, t, vhost, stream, msg, offset)  appended: msg is the record at offset
#   (STRD, t, vhost, stream, consumer_tag, delivery_tag, first offset, count, connection,
#    channel, detail)  delivered: records first..first+count-1 (a chunk, or one record)
#   (STRK, t, vhost, stream, consumer_tag, delivery_tag, offset, connection, channel)
#   (STRT, t, vhost, stream, first offset, count, reason)  truncated: retention, deletion
STRA, STRD, STRK, STRT = 15, 16, 17, 18
STREAM = "stream"
# A channel's context has a fifth item on another node's link (``recorder._channel_ctx``):
# a stream's delivery to it is a hop to that node, whose trail records the consumer's
# delivery; the hop's ``delivered`` event has this detail.
FORWARDED = "forwarded"
# The recorder's buffer is flat: every event takes WIDTH slots (the tuple above, padded
# with None), so the hooks leave no tuple behind and a batch is cut into rows in C.
ARITY = {PUB: 15, ENQ: 6, DEL: 11, ACK: 9, REJ: 11, LEFT: 8, SCH: 8, FIRE: 9, CAN: 4,
         RETRY: 7, TRAIL: 5, PUBC: 12, DELC: 9, ACKC: 7, DACK: 10, STRA: 6, STRD: 11, STRK: 9,
         STRT: 7}
WIDTH = 12


def rows(flat: list, trim: bool = False) -> list[tuple]:
    """The events of a flat buffer as tuples (padded to WIDTH unless ``trim``); a DACK
    record becomes its two events."""
    out = list(zip(*[iter(flat)] * WIDTH, strict=False))
    if DACK in flat[::WIDTH]:
        split: list = []
        append = split.append
        for ev in out:
            if ev[0] == DACK:
                _, t, qctx, msg, ctag, tag, redelivered, count, ch, acked_at = ev[:10]
                append((DELC, t, qctx, msg, ctag, tag, redelivered, count, ch, None, None, None))
                append((ACKC, acked_at, qctx, msg, ctag, tag, ch, None, None, None, None, None))
            else:
                append(ev)
        out = split
    if trim:
        out = [ev[:ARITY[ev[0]]] for ev in out]
    return out


def queue_names(queues) -> list:
    """A PUBC ``queues`` slot as a list of names."""
    if queues is None:
        return []
    if isinstance(queues, str):
        return [queues]
    return list(queues)

# the property keys the trail keeps something of; a publish whose properties have none of
# them records None instead of the dict (``hooks.published``)
TRAIL_PROPS = frozenset(("message_id", "correlation_id", "app_id", "headers"))
# header names the trail keeps from a message's headers
REF_KEY = "x-ref-key"
PRODUCER = "x-producer"
PRODUCER_SEQ = "x-seq"


def load_schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return json.load(f)


def _text(value):
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _int(value):
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (bytes, bytearray, str)):
        try:
            return int(value)
        except ValueError:
            return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _props(rec: dict, props) -> None:
    if not props:
        return
    rec["message_id"] = _text(props.get("message_id"))
    rec["correlation_id"] = _text(props.get("correlation_id"))
    rec["app_id"] = _text(props.get("app_id"))
    headers = props.get("headers")
    if isinstance(headers, dict) and headers:
        rec["ref_key"] = _text(headers.get(REF_KEY))
        rec["producer"] = _text(headers.get(PRODUCER))
        rec["producer_seq"] = _int(headers.get(PRODUCER_SEQ))


def expand(batch: list) -> list:
    """``batch`` with the compact kinds (PUBC, DELC, ACKC) turned into flat ones."""
    out: list = []
    append = out.append
    for ev in batch:
        kind = ev[0]
        if kind == DELC:
            _, t, qctx, msg, ctag, tag, redelivered, count, ch = ev[:9]
            if len(qctx) > 2:  # a stream's: msg is the record's offset
                append((STRD, t, qctx[0], qctx[1], ctag, tag, msg, 1, ch[2], ch[3],
                        ch[4] if len(ch) > 4 else None))
            else:
                append((DEL, t, qctx[0], qctx[1], msg, ctag, tag, redelivered, count, ch[2],
                        ch[3]))
        elif kind == ACKC:
            _, t, qctx, msg, ctag, tag, ch = ev[:7]
            if len(qctx) > 2:
                append((STRK, t, qctx[0], qctx[1], ctag, tag, msg, ch[2], ch[3]))
            else:
                append((ACK, t, qctx[0], qctx[1], msg, ctag, tag, ch[2], ch[3]))
        elif kind == PUBC:
            _, t, ch, x, rk, msg, props, size, persistent, cseq, queues, outcome = ev
            append((PUB, t, ch[0], x, rk, msg, props, size, persistent, ch[1], ch[2], ch[3],
                    cseq, queue_names(queues), outcome))
        else:
            append(ev[:ARITY[kind]] if len(ev) > ARITY.get(kind, WIDTH) else ev)
    return out


def to_record(ev: tuple, node: str, seq: int) -> dict:
    """The Avro record (a dict following the schema) of one event tuple."""
    ev = expand([ev])[0]
    kind = ev[0]
    rec: dict = {"seq": seq, "ts_us": int(ev[1] * 1_000_000), "node": node}
    if kind == PUB:
        (_, _, rec["vhost"], rec["exchange"], rec["routing_key"], rec["msg"], props,
         rec["body_size"], rec["persistent"], rec["user"], rec["connection"], rec["channel"],
         cseq, queues, rec["outcome"]) = ev
        rec["event"] = "published"
        rec["confirm_seq"] = cseq or None
        rec["queues"] = list(queues)
        _props(rec, props)
    elif kind == ENQ:
        _, _, rec["vhost"], rec["queue"], rec["msg"], props = ev
        rec["event"] = "enqueued"
        _props(rec, props)
    elif kind == DEL:
        (_, _, rec["vhost"], rec["queue"], rec["msg"], rec["consumer_tag"], rec["delivery_tag"],
         rec["redelivered"], rec["delivery_count"], rec["connection"], rec["channel"]) = ev
        rec["event"] = "delivered"
    elif kind == ACK:
        (_, _, rec["vhost"], rec["queue"], rec["msg"], rec["consumer_tag"], rec["delivery_tag"],
         rec["connection"], rec["channel"]) = ev
        rec["event"] = "acked"
    elif kind == REJ:
        (_, _, rec["vhost"], rec["queue"], rec["msg"], rec["consumer_tag"], rec["delivery_tag"],
         rec["connection"], rec["channel"], rec["requeue"], rec["event"]) = ev
    elif kind == LEFT:
        _, _, rec["vhost"], rec["queue"], rec["msg"], rec["event"], rec["reason"], rec["target"] = ev
    elif kind == SCH:
        _, _, rec["vhost"], rec["exchange"], rec["routing_key"], rec["msg"], props, due = ev
        rec["event"] = "scheduled"
        rec["due_us"] = int(due * 1_000_000)
        _props(rec, props)
    elif kind == FIRE:
        (_, _, rec["vhost"], rec["exchange"], rec["routing_key"], rec["msg"], props, due,
         queues) = ev
        rec["event"] = "fired"
        rec["due_us"] = int(due * 1_000_000)
        rec["queues"] = list(queues)
        _props(rec, props)
    elif kind == CAN:
        _, _, rec["vhost"], rec["detail"] = ev
        rec["event"] = "cancelled"
    elif kind == RETRY:
        _, _, rec["vhost"], rec["queue"], rec["msg"], rec["delivery_count"], rec["detail"] = ev
        rec["event"] = "retried"
    elif kind == TRAIL:
        _, _, rec["event"], rec["count"], rec["detail"] = ev
    elif kind == STRA:
        _, _, rec["vhost"], rec["queue"], rec["msg"], rec["stream_offset"] = ev
        rec["event"] = "appended"
    elif kind == STRD:
        (_, _, rec["vhost"], rec["queue"], rec["consumer_tag"], rec["delivery_tag"],
         rec["stream_offset"], rec["stream_count"], rec["connection"], rec["channel"],
         rec["detail"]) = ev
        rec["event"] = "delivered"
    elif kind == STRK:
        (_, _, rec["vhost"], rec["queue"], rec["consumer_tag"], rec["delivery_tag"],
         rec["stream_offset"], rec["connection"], rec["channel"]) = ev
        rec["event"] = "acked"
    elif kind == STRT:
        (_, _, rec["vhost"], rec["queue"], rec["stream_offset"], rec["stream_count"],
         rec["reason"]) = ev
        rec["event"] = "truncated"
    else:  # pragma: no cover - a broker bug, never a client's input
        raise ValueError(f"unknown audit event kind {kind!r}")
    return rec
