"""What every exchange type shares: identity, bindings bookkeeping, routing API."""
from __future__ import annotations


class Binding:
    __slots__ = ("source", "destination", "routing_key", "arguments", "key")

    def __init__(self, source: str, destination, routing_key: str, arguments: dict):
        self.source = source
        self.destination = destination  # a Queue or an Exchange object
        self.routing_key = routing_key
        self.arguments = arguments or {}
        self.key = (destination.kind, destination.name, routing_key, _freeze(self.arguments))


def _freeze(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


class Exchange:
    kind = "exchange"
    type_name = ""

    def __init__(self, name: str, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict | None = None):
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict[tuple, Binding] = {}
        alt = self.arguments.get("alternate-exchange")
        self.alternate_exchange = alt.decode() if isinstance(alt, bytes) else alt

    # Subclasses index bindings for routing.
    def _index_add(self, binding: Binding) -> None:
        raise NotImplementedError

    def _index_remove(self, binding: Binding) -> None:
        raise NotImplementedError

    def route(self, routing_key: str, headers: dict | None) -> list:
        """Destinations (queues or exchanges) matching; may contain duplicates."""
        raise NotImplementedError

    def add_binding(self, binding: Binding) -> bool:
        if binding.key in self.bindings:
            return False
        self.bindings[binding.key] = binding
        self._index_add(binding)
        return True

    def remove_binding(self, key: tuple) -> Binding | None:
        binding = self.bindings.pop(key, None)
        if binding is not None:
            self._index_remove(binding)
        return binding

    @property
    def has_bindings(self) -> bool:
        return bool(self.bindings)
