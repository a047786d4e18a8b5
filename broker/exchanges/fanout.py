"""fanout: every bound destination, routing key ignored."""
from __future__ import annotations

from .base import Binding, Exchange


class FanoutExchange(Exchange):
    type_name = "fanout"

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    def route(self, routing_key: str, headers: dict | None,
              properties: dict | None = None) -> list:
        return [b.destination for b in self.bindings.values()]
