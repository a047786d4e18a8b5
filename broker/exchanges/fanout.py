"""fanout: every bound destination, routing key ignored."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Binding, Exchange

if TYPE_CHECKING:
    from .base import Destination


class FanoutExchange(Exchange):
    type_name = "fanout"

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        return [b.destination for b in self.bindings.values()]
