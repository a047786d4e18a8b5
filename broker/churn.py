"""Counters of things opened, closed, created and deleted, which no current state can give
back (rabbitmq_prometheus' connection_churn_metrics and dead-letter counters). One ``Churn``
per broker, shared by its vhosts; plain integer increments on the paths that open or
delete, read at scrape time. Closed counts are derived (opened minus still open)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queues.queue import Queue

# the per-queue delivery counters the global queue_type-labelled counters are summed from
QUEUE_STATS = ("stats_delivered", "stats_deliver_no_ack", "stats_get", "stats_get_no_ack",
               "stats_get_empty", "stats_redeliver", "stats_acked")
# the QUEUE_STATS of a queue, as a tuple in that order
queue_stats = attrgetter(*QUEUE_STATS)


@dataclass
class Churn:
    connections_opened: int = 0
    channels_opened: int = 0
    queues_declared: int = 0
    queues_created: int = 0
    queues_deleted: int = 0
    # (queue type module, dead-letter strategy, reason) -> messages dead-lettered
    dead_lettered: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # queue type module -> the delivery counters of its deleted queues (QUEUE_STATS)
    retired: dict[str, Counter[str]] = field(default_factory=dict)
    # (protocol, queue type module) -> [delivered with manual ack, with auto ack,
    # redelivered, acknowledged] of consumers that are not AMQP 0-9-1 channels (theirs are
    # the rest of the queues' own counters)
    by_protocol: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def delivered(self, protocol: str, queue: Queue, no_ack: bool, redelivered: bool) -> None:
        key = (protocol, queue.queue_type.module)
        c = self.by_protocol.get(key)
        if c is None:
            c = self.by_protocol[key] = [0, 0, 0, 0]
        c[1 if no_ack else 0] += 1
        if redelivered:
            c[2] += 1

    def acked(self, protocol: str, queue: Queue) -> None:
        key = (protocol, queue.queue_type.module)
        c = self.by_protocol.get(key)
        if c is None:
            c = self.by_protocol[key] = [0, 0, 0, 0]
        c[3] += 1

    def retire(self, queue: Queue) -> None:
        """Keep a deleted queue's delivery counters in its type's totals."""
        totals = self.retired.setdefault(queue.queue_type.module, Counter())
        for name, value in zip(QUEUE_STATS, queue_stats(queue), strict=True):
            totals[name] += value

    def dead_letters(self, queue: Queue, strategy: str, reason: str, n: int) -> None:
        """``n`` messages dead-lettered by ``queue`` (strategy as RabbitMQ's label:
        at_most_once, at_least_once, disabled)."""
        self.dead_lettered[(queue.queue_type.module, strategy, reason)] += n
