"""Backend-neutral serialisation of what a store keeps.

Both backends store the same records (the journal in segment files, the SQL
store in rows), so recovery is one code path: ``recovery.restore``.
"""
from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..amqp.fields import decode_table, encode_table

if TYPE_CHECKING:
    from ..exchanges.base import Binding, Exchange
    from ..queues.entry import QueueEntry
    from ..queues.queue import Queue
    from ..vhost import VirtualHost

_MSG_HEAD = struct.Struct(">QHI")  # id, len(exchange+rk block), len(props)


@dataclass
class ExchangeDef:
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict


@dataclass
class QueueDef:
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: dict


@dataclass
class BindingDef:
    vhost: str
    source: str
    destination_kind: str  # "queue" | "exchange"
    destination: str
    routing_key: str
    arguments: dict


@dataclass
class EntryDef:
    """A message's place in a durable queue."""
    vhost: str
    queue: str
    message_id: int
    seq: int
    expires_at: float | None  # wall clock (time.time()), so TTL survives restarts
    priority: int
    delivered: bool = False
    # deliveries so far (x-delivery-count, x-delivery-limit, x-retry-delays level);
    # 0 with delivered=True = a store that keeps only the flag: counts as 1
    delivery_count: int = 0


def exchange_def(vhost: VirtualHost, x: Exchange) -> ExchangeDef:
    return ExchangeDef(vhost.name, x.name, x.type_name, x.durable, x.auto_delete, x.internal,
                       dict(x.arguments))


def queue_def(vhost: VirtualHost, q: Queue) -> QueueDef:
    return QueueDef(vhost.name, q.name, q.durable, q.auto_delete, dict(q.arguments))


def binding_def(vhost: VirtualHost, b: Binding) -> BindingDef:
    return BindingDef(vhost.name, b.source, b.destination.kind, b.destination.name, b.routing_key,
                      dict(b.arguments))


def entry_def(vhost: VirtualHost, queue: Queue, entry: QueueEntry) -> EntryDef:
    expires = None
    if entry.expires_at is not None:
        expires = time.time() + (entry.expires_at - queue.vhost.timers.now())
    return EntryDef(vhost.name, queue.name, entry.message.id, entry.seq, expires, entry.priority,
                    entry.delivery_count > 0, entry.delivery_count)


def unstorable(name: str, arguments: dict | None, limit: int | None) -> str | None:
    """Why a durable definition named ``name`` with ``arguments`` could not be stored in a
    store whose names hold at most ``limit`` bytes (``Store.name_max``), or None.

    The rule every store keeps (docs/sql-store.md, "What a name may hold"): a name, key or
    header may hold any character -- NUL included, as in RabbitMQ -- and a byte that is
    not UTF-8 (a surrogate, as AMQP hands it over); the SQL store's names are at most a
    shortstr (the journal's any length: a name over HTTP may be longer);
    an argument table must encode as AMQP (no lone surrogate that stands for no byte,
    which only JSON can make). AMQP cannot send anything else; the HTTP API and
    definitions can, so a durable declare checks this before it answers ok."""
    try:
        size = len(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return "name holds a lone surrogate (not UTF-8, not a byte)"
    if limit is not None and size > limit:
        return f"name longer than {limit} bytes"
    if arguments:
        try:
            encode_arguments(arguments)
        except (ValueError, TypeError, OverflowError) as exc:
            return f"arguments cannot be stored ({exc})"
    return None


def encode_arguments(arguments: dict) -> bytes:
    return encode_table(arguments or {})


def decode_arguments(raw: bytes) -> dict:
    return decode_table(raw, 0)[0] if raw else {}


def encode_message(message) -> bytes:
    """id, exchange, routing key, raw properties, body in one blob.

    The routing key is the rest of the names block, so it may be longer than a shortstr (a
    key given over HTTP): its length byte says 255 then, and ``decode_message`` ignores it
    (blobs written before that hold exactly that many bytes)."""
    ex = message.exchange.encode("utf-8", "surrogateescape")
    rk = message.routing_key.encode("utf-8", "surrogateescape")
    names = bytes((len(ex),)) + ex + bytes((min(len(rk), 255),)) + rk
    return b"".join((_MSG_HEAD.pack(message.id, len(names), len(message.props_raw)), names,
                     message.props_raw, message.body))


def decode_message(blob: bytes):
    from ..amqp.fields import decode_properties
    from ..message import Message
    msg_id, names_len, props_len = _MSG_HEAD.unpack_from(blob, 0)
    pos = _MSG_HEAD.size
    n = blob[pos]
    exchange = blob[pos + 1:pos + 1 + n].decode("utf-8", "surrogateescape")
    pos += 1 + n
    pos_props = _MSG_HEAD.size + names_len
    routing_key = blob[pos + 1:pos_props].decode("utf-8", "surrogateescape")
    pos = pos_props
    props_raw = bytes(blob[pos:pos + props_len])
    body = bytes(blob[pos + props_len:])
    return Message(exchange, routing_key, props_raw, decode_properties(props_raw), body, msg_id=msg_id)
