"""Prometheus /metrics: one custom collector that reads the broker's state at scrape time
(no metric objects on the message path). RabbitMQ's names (rabbitmq_prometheus plugin) where
the meaning is the same; ``triomq_*`` for this broker's own.

As rabbitmq_prometheus: ``/metrics`` is aggregated (queue metrics summed, no vhost or queue
names) unless ``Config.metrics_per_object``; ``/metrics/per-object`` always labels each queue.
No login is asked unless ``Config.metrics_auth`` (then a user tagged monitoring or
administrator, 401 otherwise)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..broker import process_rss
from .auth import require
from .stats import connection_counts, with_deliver_get


class BrokerCollector:
    def __init__(self, broker, per_object: bool):
        self.broker = broker
        self.per_object = per_object

    def collect(self):
        broker = self.broker
        totals = broker.message_totals.current()
        sessions = [s for s in list(broker.sessions) if s.vhost is not None]
        channels = sum(len(s.channels) for s in sessions)
        consumers = 0
        labels = ["vhost", "queue"] if self.per_object else None
        ready = GaugeMetricFamily("rabbitmq_queue_messages_ready",
                                  "Messages ready to be delivered to consumers", labels=labels)
        unacked = GaugeMetricFamily("rabbitmq_queue_messages_unacked",
                                    "Messages delivered to consumers but not yet acknowledged",
                                    labels=labels)
        messages = GaugeMetricFamily("rabbitmq_queue_messages",
                                     "Sum of ready and unacknowledged messages", labels=labels)
        qcons = GaugeMetricFamily("rabbitmq_queue_consumers", "Consumers on a queue",
                                  labels=labels)
        qbytes = GaugeMetricFamily("rabbitmq_queue_messages_ready_bytes",
                                   "Size in bytes of ready messages", labels=labels)
        qpub = CounterMetricFamily("rabbitmq_queue_messages_published",
                                   "Messages published into a queue", labels=labels)
        queues = 0
        sums = [0, 0, 0, 0, 0]  # ready, unacked, consumers, ready bytes, published
        for vhost in list(broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                if q.internal:
                    continue
                queues += 1
                r, u, c = q.message_count, q.unacked_count, len(q.consumers)
                consumers += c
                if not self.per_object:
                    sums[0] += r
                    sums[1] += u
                    sums[2] += c
                    sums[3] += q.ready_bytes
                    sums[4] += q.stats_published
                    continue
                key = [vhost.name, q.name]
                ready.add_metric(key, r)
                unacked.add_metric(key, u)
                messages.add_metric(key, r + u)
                qcons.add_metric(key, c)
                qbytes.add_metric(key, q.ready_bytes)
                qpub.add_metric(key, q.stats_published)
        if not self.per_object:
            for family, value in ((ready, sums[0]), (unacked, sums[1]),
                                  (messages, sums[0] + sums[1]), (qcons, sums[2]),
                                  (qbytes, sums[3]), (qpub, sums[4])):
                family.add_metric([], value)
        yield from (ready, unacked, messages, qcons, qbytes, qpub)
        yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open",
                                value=len(sessions))
        yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open", value=channels)
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected",
                                value=consumers)
        yield GaugeMetricFamily("rabbitmq_queues", "Queues available", value=queues)
        yield CounterMetricFamily("rabbitmq_global_messages_received",
                                  "Total number of messages received from publishers",
                                  value=totals["publish"])
        yield CounterMetricFamily("rabbitmq_global_messages_delivered",
                                  "Total number of messages delivered to consumers",
                                  value=with_deliver_get(totals)["deliver_get"])
        yield CounterMetricFamily("rabbitmq_global_messages_delivered_get",
                                  "Total number of messages fetched with basic.get",
                                  value=totals["get"] + totals["get_no_ack"])
        yield CounterMetricFamily("rabbitmq_global_messages_acknowledged",
                                  "Total number of messages acknowledged by consumers",
                                  value=totals["ack"])
        # rabbitmq_prometheus's channel counters (its "get" and "delivered" are the no-ack
        # ones, "get_ack" and "delivered_ack" the ack-mode ones); closed channels included
        for name, doc, value in (
                ("rabbitmq_channel_messages_published", "Total number of messages published "
                 "into an exchange on a channel", totals["publish"]),
                ("rabbitmq_channel_messages_confirmed", "Total number of messages published "
                 "into an exchange and confirmed on the channel", totals["confirm"]),
                ("rabbitmq_channel_messages_unroutable_returned", "Total number of messages "
                 "published as mandatory into an exchange and returned to the publisher as "
                 "unroutable", totals["return_unroutable"]),
                ("rabbitmq_channel_messages_unroutable_dropped", "Total number of messages "
                 "published as non-mandatory into an exchange and dropped as unroutable",
                 totals["drop_unroutable"]),
                ("rabbitmq_channel_get_ack", "Total number of messages fetched with basic.get in "
                 "manual acknowledgement mode", totals["get"]),
                ("rabbitmq_channel_get", "Total number of messages fetched with basic.get in "
                 "automatic acknowledgement mode", totals["get_no_ack"]),
                ("rabbitmq_channel_messages_delivered_ack", "Total number of messages delivered "
                 "to consumers in manual acknowledgement mode", totals["deliver"]),
                ("rabbitmq_channel_messages_delivered", "Total number of messages delivered to "
                 "consumers in automatic acknowledgement mode", totals["deliver_no_ack"]),
                ("rabbitmq_channel_messages_redelivered", "Total number of messages redelivered "
                 "to consumers", totals["redeliver"]),
                ("rabbitmq_channel_messages_acked", "Total number of messages acknowledged by "
                 "consumers", totals["ack"]),
                ("rabbitmq_channel_get_empty", "Total number of times basic.get operations "
                 "fetched no message", totals["get_empty"])):
            yield CounterMetricFamily(name, doc, value=value)
        # open connections' socket counters, summed as rabbitmq_prometheus does
        octets = [0, 0, 0, 0]
        for s in sessions:
            for i, v in enumerate(connection_counts(s)):
                octets[i] += v
        for name, doc, value in (
                ("rabbitmq_connection_incoming_bytes", "Total number of bytes received on a "
                 "connection", octets[0]),
                ("rabbitmq_connection_incoming_packets", "Total number of packets received on a "
                 "connection", octets[1]),
                ("rabbitmq_connection_outgoing_bytes", "Total number of bytes sent on a "
                 "connection", octets[2]),
                ("rabbitmq_connection_outgoing_packets", "Total number of packets sent on a "
                 "connection", octets[3])):
            yield CounterMetricFamily(name, doc, value=value)
        alarms = broker.alarms
        yield GaugeMetricFamily("rabbitmq_alarms_memory_used_watermark",
                                "is 1 if VM memory watermark alarm is in effect",
                                value=int(any(a.startswith("memory") for a in alarms)))
        yield GaugeMetricFamily("rabbitmq_alarms_free_disk_space_watermark",
                                "is 1 if free disk space watermark alarm is in effect",
                                value=int("disk" in alarms))
        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes",
                                "Memory used in bytes", value=process_rss())
        yield GaugeMetricFamily("rabbitmq_resident_memory_limit_bytes",
                                "Memory high watermark in bytes", value=broker.memory_limit)
        # ---- this broker's own ----
        store = broker.store
        stats = getattr(store, "flush_stats", None)
        if stats is not None:
            buckets = []
            cumulative = 0
            for bound, count in zip((*stats.BUCKETS, float("inf")), stats.counts, strict=True):
                cumulative += count
                buckets.append((repr(bound) if bound != float("inf") else "+Inf", cumulative))
            yield _histogram(store.name, buckets, stats.seconds)
            yield _counter("triomq_store_group_commits", "Group commits (one write+sync each)",
                           store.name, stats.commits)
            yield _counter("triomq_store_group_committed_messages",
                           "Publishes confirmed by group commits (divide by group_commits for "
                           "the mean group-commit size)", store.name, stats.committed)
            yield _counter("triomq_store_errors", "Failed store writes", store.name,
                           stats.errors)
        scheduler = getattr(broker, "scheduler", None)
        if scheduler is not None:
            try:
                pending = scheduler.pending
                pending = pending() if callable(pending) else pending
            except Exception:
                pending = None
            if isinstance(pending, int):
                yield GaugeMetricFamily("triomq_scheduler_pending",
                                        "Scheduled messages waiting for their time",
                                        value=pending)
        yield GaugeMetricFamily("triomq_alarms", "Resource alarms in effect", value=len(alarms))


def _histogram(store: str, buckets: list, total: float) -> HistogramMetricFamily:
    h = HistogramMetricFamily("triomq_store_sync_seconds",
                              "Duration of each store write+fsync (one group commit)",
                              labels=["store"])
    h.add_metric([store], buckets, total)
    return h


def _counter(name: str, doc: str, store: str, value: int) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["store"])
    c.add_metric([store], value)
    return c


def make_registry(broker, per_object: bool) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, per_object))
    return registry


def routes(broker) -> list:
    registries = {per_object: make_registry(broker, per_object) for per_object in (False, True)}

    async def scrape(request: Request, per_object: bool) -> Response:
        if broker.config.metrics_auth:
            await require(request, "monitoring")
        return Response(generate_latest(registries[per_object]), media_type=CONTENT_TYPE_LATEST)

    async def metrics(request: Request) -> Response:
        return await scrape(request, broker.config.metrics_per_object)

    async def per_object(request: Request) -> Response:
        return await scrape(request, True)

    return [Route("/metrics", metrics), Route("/metrics/per-object", per_object)]
