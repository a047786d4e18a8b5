"""Rebuild durable state in a broker from stored records (shared by all backends)."""
from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from ..exchanges import EXCHANGE_TYPES, Binding
from ..message import set_message_id_floor
from ..queues.args import ArgumentError, parse_queue_arguments
from ..queues.entry import QueueEntry
from ..queues.queue import Queue
from ..queues.retry import restore_delivery_count
from ..queues.types import (
    QUEUE_VARIANTS,
    make_queue,
    register_queue_variant,  # noqa: F401 - features import it here
)
from .records import BindingDef, EntryDef, ExchangeDef, QueueDef

if TYPE_CHECKING:
    from ..broker import Broker
    from ..vhost import VirtualHost

log = logging.getLogger("broker.recovery")


def encode_meta(value: dict) -> str:
    """A metadata value as stored (compact JSON); raises TypeError/ValueError if not JSON-able."""
    if not isinstance(value, dict):
        raise TypeError(f"metadata value must be a dict, not {type(value).__name__}")
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: as a \u escape, which every store holds
            text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    return text


def restore_meta(broker: Broker, records) -> int:
    """Hand every stored metadata record ``(kind, key, json text)`` to
    ``broker.restore_meta(kind, key, value)``, in the order given; a record its
    owner rejects is logged and skipped, never stops recovery. Returns the count."""
    n = 0
    for kind, key, raw in records:
        try:
            value = json.loads(raw) if isinstance(raw, (str, bytes, bytearray)) else raw
            broker.restore_meta(kind, key, value)
            n += 1
        except Exception:
            log.exception("skipping stored %s record %r", kind, key)
    if n:
        log.info("recovered %d metadata records", n)
    return n


def restore(broker: Broker, exchanges: list[ExchangeDef], queues: list[QueueDef],
            bindings: list[BindingDef], entries: list[EntryDef], messages: dict) -> dict:
    """Recreate definitions and queue contents; ``messages`` maps id -> Message.

    Returns counts for the log. Entries are re-enqueued in seq order, so queue
    order survives; every recovered message that had been delivered comes back
    with redelivered=true and its delivery count (``EntryDef.delivery_count``, at
    least 1), which keeps delivery limits and retry levels across the restart.
    """
    counts = {"exchanges": 0, "queues": 0, "bindings": 0, "messages": 0}
    orphans: list[str] = []  # stored definitions left out: never dropped without a word
    for xd in exchanges:
        vhost = broker.vhosts.get(xd.vhost)
        if vhost is None:
            orphans.append(f"exchange {xd.name!r} (no vhost {xd.vhost!r})")
            continue
        if xd.name in vhost.exchanges:
            continue
        xtype = EXCHANGE_TYPES.get(xd.type)
        if xtype is None:
            log.warning("skipping exchange %r of unknown type %r", xd.name, xd.type)
            continue
        vhost.exchanges[xd.name] = xtype(xd.name, durable=True, auto_delete=xd.auto_delete,
                                         internal=xd.internal, arguments=xd.arguments)
        counts["exchanges"] += 1
    for qd in queues:
        vhost = broker.vhosts.get(qd.vhost)
        if vhost is None:
            orphans.append(f"queue {qd.name!r} (no vhost {qd.vhost!r})")
            continue
        if qd.name in vhost.queues:
            continue
        try:
            opts = parse_queue_arguments(qd.arguments)
        except ArgumentError as exc:
            log.warning("queue %r has invalid stored arguments (%s); using none", qd.name, exc)
            opts = parse_queue_arguments({})
        q = new_queue(broker, vhost, qd.name, durable=True, auto_delete=qd.auto_delete,
                      arguments=qd.arguments, opts=opts)
        vhost.add_queue(q, persist=False)
        counts["queues"] += 1
    for bd in bindings:
        vhost = broker.vhosts.get(bd.vhost)
        source = vhost.exchanges.get(bd.source) if vhost is not None else None
        dest = None if vhost is None else (
            vhost.queues if bd.destination_kind == "queue" else vhost.exchanges).get(bd.destination)
        if source is None or dest is None:
            orphans.append(f"binding {bd.source!r} -> {bd.destination_kind} {bd.destination!r} "
                           f"key {bd.routing_key!r} in vhost {bd.vhost!r} (an end is missing)")
            continue
        binding = Binding(bd.source, dest, bd.routing_key, bd.arguments)
        if source.add_binding(binding):
            if dest.kind == "queue":
                dest.bindings.add((bd.source, binding.key))
            counts["bindings"] += 1
    now_wall = time.time()
    max_id = 0
    by_queue: dict = {}  # Queue -> [QueueEntry] in seq order
    for ed in sorted(entries, key=lambda e: (e.vhost, e.queue, e.seq)):
        vhost = broker.vhosts.get(ed.vhost)
        owner = vhost.queues.get(ed.queue) if vhost is not None else None
        message = messages.get(ed.message_id)
        if vhost is None or owner is None or message is None:
            continue
        max_id = max(max_id, ed.message_id)
        expires_at = None
        if ed.expires_at is not None:
            expires_at = vhost.timers.now() + (ed.expires_at - now_wall)
        entry = QueueEntry(message, ed.seq, expires_at, ed.priority)
        entry.redelivered = ed.delivered
        if ed.delivered or ed.delivery_count:
            restore_delivery_count(owner, entry, max(ed.delivery_count, 1))
        by_queue.setdefault(owner, []).append(entry)
    for owner, restored in by_queue.items():
        counts["messages"] += owner.restore(restored)
    if messages:
        max_id = max(max_id, max(messages))
    set_message_id_floor(max_id)
    log.info("recovered %(exchanges)d exchanges, %(queues)d queues, %(bindings)d bindings, "
             "%(messages)d messages", counts)
    if orphans:
        log.warning("%d stored definitions not recovered: %s%s", len(orphans),
                    "; ".join(orphans[:10]), " ..." if len(orphans) > 10 else "")
    return counts


# ---- queue variants (scheduler seam): registered in queues/types.py --------------------
def new_queue(broker: Broker, vhost: VirtualHost, name: str, **kwargs) -> Queue:
    """The queue to recreate for a stored definition: a registered variant, else a Queue."""
    factory = QUEUE_VARIANTS.get(name)
    if factory is None:
        return make_queue(vhost, name, **kwargs)
    return factory(broker, vhost, name, **kwargs)
