"""Stand-ins for binding destinations: exchanges only need ``kind``, ``name`` and, for the
default exchange, whether a queue is broker-internal."""
from __future__ import annotations

from broker.exchanges import Binding


class Dest:
    def __init__(self, name: str, kind: str = "queue", internal: bool = False):
        self.name = name
        self.kind = kind
        self.internal = internal

    def __repr__(self):
        return f"<{self.kind} {self.name}>"


def bind(exchange, dest, routing_key: str = "", arguments: dict | None = None) -> Binding:
    binding = Binding(exchange.name, dest, routing_key, arguments or {})
    exchange.add_binding(binding)
    return binding


def names(dests) -> list:
    return sorted(d.name for d in dests)
