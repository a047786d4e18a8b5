"""The nameless default exchange: every queue is implicitly bound by its name."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .direct import DirectExchange

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from .base import Destination


class DefaultExchange(DirectExchange):
    def __init__(self, queues: dict[str, Queue]) -> None:
        super().__init__("", durable=True)
        self._queues = queues

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        q = self._queues.get(routing_key)
        return [q] if q is not None and not q.internal else []
