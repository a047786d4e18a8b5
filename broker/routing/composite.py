"""ActiveMQ's composite destinations on exchanges and bindings.

A destination name holding commas, ``queue.a,queue.b,topic://orders``, fans out to each
member: a bare name or ``queue://name`` is a queue (created durable on first use, as
ActiveMQ creates destinations), ``topic://name`` an exchange (which must exist, or be one a
resolver creates, e.g. a virtual topic). The composite itself becomes a durable fanout
exchange named exactly as written, bound to every member, the first time it is published
to -- as the exchange of basic.publish or as a routing key to the default exchange (when
no queue has that name). It is an ordinary exchange from then on: listed, persisted,
deletable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import errors

if TYPE_CHECKING:
    from ..exchanges.base import Destination, Exchange
    from ..queues.queue import Queue
    from ..vhost import VirtualHost

QUEUE_SCHEME = "queue://"
TOPIC_SCHEME = "topic://"


def members(name: str) -> list[tuple[str, str]] | None:
    """``[(kind, name)]`` for a composite name; None if ``name`` is not one (or malformed)."""
    if "," not in name:
        return None
    out = []
    for part in name.split(","):
        part = part.strip()
        kind = "queue"
        if part.startswith(TOPIC_SCHEME):
            kind, part = "exchange", part[len(TOPIC_SCHEME):]
        elif part.startswith(QUEUE_SCHEME):
            part = part[len(QUEUE_SCHEME):]
        if not part:
            return None
        out.append((kind, part))
    return out


class CompositeDestinations:
    def exchange(self, vhost: VirtualHost, name: str) -> Exchange | None:
        parts = members(name)
        if parts is None:
            return None
        x = vhost.exchanges.get(name)
        if x is not None:
            return x
        for kind, member in parts:
            if kind == "queue" and member.startswith("amq.") and vhost.find_queue(member) is None:
                raise errors.access_refused(f"queue name '{member}' contains reserved prefix 'amq.*'")
        destinations: list[Destination] = []
        for kind, member in parts:
            dest: Destination | None
            if kind == "exchange":
                dest = vhost.exchanges.get(member) or vhost.resolve_exchange(member)
                if dest is None:
                    raise errors.not_found(vhost.exchange_resource(member))
            else:
                dest = vhost.find_queue(member)
                if dest is None:
                    dest = vhost.resolve_queue(member) or vhost.ensure_queue(member, durable=True,
                                                                               arguments={})
            destinations.append(dest)
        x = vhost.declare_exchange(name, "fanout", durable=True)
        for dest in destinations:
            vhost.bind(name, dest, "", {})
        return x

    def queue(self, vhost: VirtualHost, name: str) -> Queue | None:
        return None  # a composite is something to publish to, never to consume from

    def route_key(self, vhost: VirtualHost, routing_key: str) -> str | None:
        if "," not in routing_key:
            return None
        try:
            x = self.exchange(vhost, routing_key)
        except errors.AMQPError:
            return None  # unroutable, as any key that names no queue
        return x.name if x is not None else None

    def queue_declared(self, vhost: VirtualHost, queue: Queue) -> None:
        return None
