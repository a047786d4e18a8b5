"""ActiveMQ's virtual topics on exchanges and bindings.

Publishing to ``VirtualTopic.<name>`` (as the exchange, or as a routing key to the default
exchange) goes to a durable fanout exchange of that name. Each consumer group ``A`` reads
its own durable queue ``Consumer.A.VirtualTopic.<name>``, created and bound to the exchange
the first time it is used (declared, consumed from, fetched from): every group gets every
message, and the consumers of one group share theirs (the queue's round robin). Nothing is
hidden: the exchange, the queues and their bindings are ordinary ones, listed and persisted
as such; an AMQP client may bind more queues to the exchange.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..exchanges.base import Exchange
    from ..queues.queue import Queue
    from ..vhost import VirtualHost

TOPIC_PREFIX = "VirtualTopic."
CONSUMER_PREFIX = "Consumer."


def topic_of_queue(name: str) -> str | None:
    """``VirtualTopic.X`` for a consumer queue name ``Consumer.<group>.VirtualTopic.X``."""
    if not name.startswith(CONSUMER_PREFIX):
        return None
    group, sep, rest = name[len(CONSUMER_PREFIX):].partition(".")
    if not group or not sep or not rest.startswith(TOPIC_PREFIX) or len(rest) == len(TOPIC_PREFIX):
        return None
    return rest


def is_topic(name: str) -> bool:
    return name.startswith(TOPIC_PREFIX) and len(name) > len(TOPIC_PREFIX)


class VirtualTopics:
    exchange_type = "fanout"

    def exchange(self, vhost: VirtualHost, name: str) -> Exchange | None:
        if not is_topic(name):
            return None
        x = vhost.exchanges.get(name)
        if x is None:
            x = vhost.declare_exchange(name, self.exchange_type, durable=True)
        return x

    def queue(self, vhost: VirtualHost, name: str) -> Queue | None:
        topic = topic_of_queue(name)
        if topic is None:
            return None
        q = vhost.ensure_queue(name, durable=True, arguments={})
        self._bind(vhost, topic, q)
        return q

    def route_key(self, vhost: VirtualHost, routing_key: str) -> str | None:
        return routing_key if self.exchange(vhost, routing_key) is not None else None

    def queue_declared(self, vhost: VirtualHost, queue: Queue) -> None:
        topic = topic_of_queue(queue.name)
        if topic is not None:
            self._bind(vhost, topic, queue)

    def _bind(self, vhost: VirtualHost, topic: str, queue: Queue) -> None:
        if self.exchange(vhost, topic) is not None:
            vhost.bind(topic, queue, "", {})
