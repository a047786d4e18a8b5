"""x-delayed-message: RabbitMQ's delayed-message plugin contract.

The exchange routes like its ``x-delayed-type`` (direct, fanout, topic,
headers); a message published with a positive ``x-delay`` header (ms) is taken
over by the scheduler (broker/scheduler) and routed through this exchange when
due. Bindings and routing are delegated to an inner exchange of the delayed type,
through its public ``ExchangeType`` methods: the inner exchange owns the binding
table and the routing index, and this exchange shows that same table as its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Binding, Exchange

if TYPE_CHECKING:
    from .base import BindingKey, Destination

DELAYABLE_TYPES = ("direct", "fanout", "topic", "headers")


def _text(value: object) -> object:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


class DelayedMessageExchange(Exchange):
    type_name = "x-delayed-message"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from . import EXCHANGE_TYPES
        inner_type = _text(self.arguments.get("x-delayed-type"))
        if inner_type not in DELAYABLE_TYPES:
            inner_type = "direct"  # only reachable for bad stored definitions
        self.delayed_type = inner_type
        self.inner: Exchange = EXCHANGE_TYPES[inner_type](self.name, durable=self.durable)
        self.bindings = self.inner.bindings  # one table: the inner exchange's

    @classmethod
    def argument_problem(cls, args: dict[str, Any]) -> str | None:
        value = _text(args.get("x-delayed-type"))
        if value not in DELAYABLE_TYPES:
            return "Invalid argument, 'x-delayed-type' must be an existing exchange type"
        return None

    def add_binding(self, binding: Binding) -> bool:
        return self.inner.add_binding(binding)

    def remove_binding(self, key: BindingKey) -> Binding | None:
        return self.inner.remove_binding(key)

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        return self.inner.route(routing_key, headers, properties)
