"""Destinations created on first use, mapped onto ordinary exchanges, queues and bindings.

A ``DestinationResolver`` is consulted only where a name misses (an exchange or queue that
does not exist, a default-exchange routing key that matches no queue), so ordinary names
never pay for it. Each one creates what a name stands for through the vhost's public
methods: the result is durable and visible as plain exchanges and bindings.

- ``virtual_topics``: ActiveMQ's virtual topics (``VirtualTopic.Orders`` and the consumer
  queues ``Consumer.<group>.VirtualTopic.Orders``).
- ``composite``: ActiveMQ's composite destinations (``queue.a,queue.b``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .composite import CompositeDestinations
from .virtual_topics import VirtualTopics

if TYPE_CHECKING:
    from ..exchanges.base import Exchange
    from ..queues.queue import Queue
    from ..vhost import VirtualHost


class DestinationResolver(Protocol):
    """Names that stand for destinations created on first use.

    Every method runs synchronously on the loop's thread, on a miss only. Each returns None
    when the name is not one of its own; it creates entities through the vhost's public
    methods (``declare_exchange``, ``ensure_queue``, ``bind``), which persist them, and it
    raises ``errors.AMQPError`` only for a name of its own that is invalid.
    """

    def exchange(self, vhost: VirtualHost, name: str) -> Exchange | None:
        """The exchange ``name`` stands for, created now; None if not this resolver's."""

    def queue(self, vhost: VirtualHost, name: str) -> Queue | None:
        """The queue ``name`` stands for, created (and bound) now; None if not this resolver's."""

    def route_key(self, vhost: VirtualHost, routing_key: str) -> str | None:
        """For a default-exchange publish whose key matches no queue: the name of the
        exchange (created now) the message is routed through instead, or None."""

    def queue_declared(self, vhost: VirtualHost, queue: Queue) -> None:
        """A client declared the new queue ``queue``: bind it if its name asks for it."""


RESOLVERS: list[DestinationResolver] = [VirtualTopics(), CompositeDestinations()]

__all__ = ["RESOLVERS", "CompositeDestinations", "DestinationResolver", "VirtualTopics"]
