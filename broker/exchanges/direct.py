"""direct: exact routing-key match, a dict lookup."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Binding, Exchange

if TYPE_CHECKING:
    from .base import BindingKey, Destination


class DirectExchange(Exchange):
    type_name = "direct"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._by_key: dict[str, dict[BindingKey, Destination]] = {}

    def _index_add(self, binding: Binding) -> None:
        dests = self._by_key.setdefault(binding.routing_key, {})
        dests[binding.key] = binding.destination

    def _index_remove(self, binding: Binding) -> None:
        dests = self._by_key.get(binding.routing_key)
        if dests is not None:
            dests.pop(binding.key, None)
            if not dests:
                del self._by_key[binding.routing_key]

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        dests = self._by_key.get(routing_key)
        return list(dests.values()) if dests else []
