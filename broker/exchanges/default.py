"""The nameless default exchange: every queue is implicitly bound by its name."""
from __future__ import annotations

from .direct import DirectExchange


class DefaultExchange(DirectExchange):
    def __init__(self, queues: dict):
        super().__init__("", durable=True)
        self._queues = queues

    def route(self, routing_key: str, headers: dict | None,
              properties: dict | None = None) -> list:
        q = self._queues.get(routing_key)
        return [q] if q is not None and not q.internal else []
