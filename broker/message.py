"""A published message, shared by every queue it is routed to."""
from __future__ import annotations

import itertools

from .amqp.fields import encode_properties

_ids = itertools.count(1)


class Message:
    """Immutable once routed; queues hold ``QueueEntry`` objects that point here.

    ``props_raw`` is kept as received so delivery re-sends it without re-encoding.
    """

    __slots__ = (
        "__weakref__",
        "body",
        "exchange",
        "id",
        "persistent",
        "properties",
        "props_raw",
        "routing_key",
    )

    def __init__(self, exchange: str, routing_key: str, props_raw: bytes, properties: dict,
                 body: bytes, msg_id: int | None = None):
        self.id = next(_ids) if msg_id is None else msg_id
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_raw = props_raw
        self.properties = properties
        self.body = body
        self.persistent = properties.get("delivery_mode") == 2

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def headers(self) -> dict:
        h = self.properties.get("headers")
        return h if isinstance(h, dict) else {}

    def with_changes(self, *, exchange: str | None = None, routing_key: str | None = None,
                     properties: dict | None = None) -> Message:
        """A new message (new id) differing in routing data and/or properties."""
        props = self.properties if properties is None else properties
        raw = self.props_raw if properties is None else encode_properties(props)
        return Message(self.exchange if exchange is None else exchange,
                       self.routing_key if routing_key is None else routing_key,
                       raw, props, self.body)


def set_message_id_floor(value: int) -> None:
    """After recovery, make new ids larger than every stored one."""
    global _ids
    current = next(_ids)
    _ids = itertools.count(max(current, value + 1))
