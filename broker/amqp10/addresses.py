"""AMQP 1.0 addresses as the broker's exchanges and queues (docs/amqp10.md): RabbitMQ 4's
v2 scheme (``/exchanges/X/KEY``, ``/exchanges/X``, ``/queues/Q``, percent-encoded) and the
v1 forms ActiveMQ and RabbitMQ 3 clients use (``/exchange/X/KEY``, ``/topic/T``,
``/queue/Q``, ``/amq/queue/Q``, ``queue://Q``, ``topic://T`` and a plain queue name).
Not messages (``mapping``) nor what a link may do there (the session's checks).
"""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote


class AddressError(Exception):
    """An address the broker does not understand (amqp:invalid-field)."""


@dataclass(frozen=True)
class Target:
    """Where a publish goes: ``exchange`` with ``key`` (None: the message's subject);
    ``queue`` set when the address names a queue (``declare``: create it if missing)."""
    exchange: str
    key: str | None
    queue: str | None = None
    declare: bool = False


@dataclass(frozen=True)
class Source:
    """What a consumer reads: ``queue`` (``declare``: create it if missing), or a queue of
    its own bound to ``exchange`` with ``key``."""
    queue: str | None
    declare: bool = False
    exchange: str | None = None
    key: str = ""


def _v2_name(part: str) -> str:
    name = unquote(part, errors="strict")
    return name


def parse_target(address: str) -> Target:
    if address.startswith("/exchanges/"):
        rest = address[len("/exchanges/"):]
        exchange, slash, key = rest.partition("/")
        if not exchange or (slash and "/" in key):
            raise AddressError(f"bad address '{address}'")
        exchange = _v2_name(exchange)
        if exchange == "amq.default":
            exchange = ""
        return Target(exchange, _v2_name(key) if slash else None)
    if address.startswith("/queues/"):
        name = address[len("/queues/"):]
        if not name or "/" in name:
            raise AddressError(f"bad address '{address}'")
        q = _v2_name(name)
        return Target("", q, q)
    if address.startswith("/exchange/"):
        exchange, slash, key = address[len("/exchange/"):].partition("/")
        if not exchange:
            raise AddressError(f"bad address '{address}'")
        return Target(exchange, key if slash else None)
    if address.startswith("/topic/"):
        return Target("amq.topic", address[len("/topic/"):])
    if address.startswith("topic://"):
        return Target("amq.topic", address[len("topic://"):])
    for prefix, declare in (("/amq/queue/", False), ("/queue/", True), ("queue://", True)):
        if address.startswith(prefix):
            name = address[len(prefix):]
            if not name:
                raise AddressError(f"bad address '{address}'")
            return Target("", name, name, declare)
    if address.startswith("/"):
        raise AddressError(f"bad address '{address}'")
    return Target("", address, address, True)  # ActiveMQ: a plain queue name


def parse_source(address: str) -> Source:
    if address.startswith("/queues/"):
        name = address[len("/queues/"):]
        if not name or "/" in name:
            raise AddressError(f"bad address '{address}'")
        return Source(_v2_name(name))
    if address.startswith("/exchanges/"):
        # RabbitMQ 4 consumes from queues only
        raise AddressError(f"address '{address}': consume from a queue (/queues/:queue)")
    t = parse_target(address)
    if t.queue is not None:
        return Source(t.queue, t.declare)
    return Source(None, False, t.exchange, t.key or "#" if t.exchange == "amq.topic" else t.key or "")


def queue_address(name: str) -> str:
    return "/queues/" + quote(name, safe="")
