"""Dead-lettering: republish to x-dead-letter-exchange with x-death as RabbitMQ 3.10 writes it.

Reasons: 'rejected' (reject/nack without requeue), 'expired' (TTL), 'maxlen'
(overflow), and 'delivery_limit' (delivery limit). The x-death array holds one
table per (queue, reason), most recent first, with count, reason, queue, time,
exchange, routing-keys and original-expiration when a per-message TTL was
removed; x-first-death-{reason,queue,exchange} are set once.
"""
from __future__ import annotations

import time

from ..amqp.fields import Long, Timestamp

AUTOMATIC_REASONS = ("expired", "maxlen", "delivery_limit")


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _raw(name: str) -> bytes:
    """A name or routing key as the bytes it arrived as (not UTF-8 ones included)."""
    return name.encode("utf-8", "surrogateescape")


def _is_name(value, name: str) -> bool:
    """Whether an x-death field (bytes, or text a client wrote) is the name ``name``."""
    if isinstance(value, str):
        value = value.encode("utf-8", "surrogateescape")
    return isinstance(value, (bytes, bytearray)) and bytes(value) == _raw(name)


def routing_keys_of(message) -> list:
    keys = [message.routing_key]
    headers = message.headers
    for name in ("CC", "BCC"):
        extra = headers.get(name)
        if isinstance(extra, list):
            keys.extend(_text(k) for k in extra)
    return keys


def dead_lettered_message(message, queue_name: str, reason: str, dlx: str,
                          dlx_routing_key: str | None):
    props = dict(message.properties)
    headers = dict(props.get("headers") or {})
    headers.pop("BCC", None)
    x_death = list(headers.get("x-death") or [])
    entry = None
    for i, item in enumerate(x_death):
        if isinstance(item, dict) and _is_name(item.get("queue"), queue_name) \
                and _text(item.get("reason", b"")) == reason:
            entry = x_death.pop(i)
            break
    if entry is None:
        entry = {
            "count": Long(1),
            "reason": reason.encode(),
            "queue": _raw(queue_name),
            "time": Timestamp(int(time.time())),
            "exchange": _raw(message.exchange),
            "routing-keys": [_raw(k) for k in routing_keys_of(message)],
        }
        expiration = props.get("expiration")
        if expiration is not None:
            entry["original-expiration"] = _text(expiration).encode()
    else:
        entry = dict(entry)
        entry["count"] = Long(int(entry.get("count", 0)) + 1)
        entry["time"] = Timestamp(int(time.time()))
    x_death.insert(0, entry)
    headers["x-death"] = x_death
    if "x-first-death-reason" not in headers:
        headers["x-first-death-reason"] = reason.encode()
        headers["x-first-death-queue"] = _raw(queue_name)
        headers["x-first-death-exchange"] = _raw(message.exchange)
    props["headers"] = headers
    props.pop("expiration", None)
    return message.with_changes(exchange=dlx,
                                routing_key=dlx_routing_key if dlx_routing_key is not None
                                else message.routing_key,
                                properties=props)


def is_cycle(message, target_queue: str) -> bool:
    """Drop rather than loop: the target already dead-lettered this message and
    no client rejection happened along the way (RabbitMQ's rule)."""
    seen = False
    for item in message.headers.get("x-death") or []:
        if not isinstance(item, dict):
            continue
        if _text(item.get("reason", b"")) == "rejected":
            return False
        if _is_name(item.get("queue"), target_queue):
            seen = True
    return seen


def dead_letter(queue, entries, reason: str) -> None:
    """Republish ``entries`` from ``queue`` to its DLX (if it has one and it exists)."""
    dlx = queue.opts.dead_letter_exchange
    if dlx is None or not entries:
        return
    vhost = queue.vhost
    for entry in entries:
        message = dead_lettered_message(entry.message, queue.name, reason, dlx,
                                        queue.opts.dead_letter_routing_key)
        queues = vhost.route(dlx, message.routing_key, message)
        for target in queues:
            if is_cycle(message, target.name) and reason in AUTOMATIC_REASONS:
                continue
            target.enqueue(message)
