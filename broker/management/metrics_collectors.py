"""The two collectors a scrape runs: ``BrokerCollector`` (/metrics, aggregated or per
object) and ``DetailedCollector`` (/metrics/detailed, the families asked for). They read live
queues, sessions and channels on the event loop; they do not format text nor serve HTTP
(metrics), and the families not tied to a queue or channel are built in metrics_families."""
from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, UntypedMetricFamily

from ..broker import process_rss
from .api_connections import connection_name
from .metrics_families import (
    auth_families,
    churn_families,
    dead_letter_families,
    fd_count,
    fd_limit,
    global_families,
    head_timestamp,
    identity,
    queue_type_families,
    recovery_families,
    start_time,
    store_counter,
    store_histogram,
)
from .stats import connection_counts

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..scheduler import Scheduler
    from ..services import MetricsServices
    from .stats import MessageTotals


class BrokerCollector:
    """/metrics: the broker's services, the message totals, the scheduler's backlog and the
    memory limit (``memory_limit()``: read at each scrape, as the alarm check reads it)."""

    def __init__(self, services: MetricsServices, totals: MessageTotals, scheduler: Scheduler,
                 memory_limit: Callable[[], int], per_object: bool):
        self.services = services
        self.totals = totals
        self.scheduler = scheduler
        self.memory_limit = memory_limit
        self.per_object = per_object

    def collect(self):
        services = self.services
        yield from identity()
        totals = self.totals.current()
        sessions = [s for s in list(services.sessions) if s.vhost is not None]
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
        ubytes = GaugeMetricFamily("rabbitmq_queue_messages_unacked_bytes",
                                   "Size in bytes of all unacknowledged messages",
                                   labels=labels)
        mbytes = GaugeMetricFamily("rabbitmq_queue_messages_bytes",
                                   "Size in bytes of ready and unacknowledged messages",
                                   labels=labels)
        qpub = CounterMetricFamily("rabbitmq_queue_messages_published",
                                   "Messages published into a queue", labels=labels)
        head = GaugeMetricFamily("rabbitmq_queue_head_message_timestamp",
                                 "Timestamp of the first message in the queue, if any",
                                 labels=labels)
        queues = 0
        sums = [0, 0, 0, 0, 0, 0]  # ready, unacked, consumers, ready bytes, published,
        # unacked bytes
        for vhost in list(services.vhosts.values()):
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
                    sums[5] += q.unacked_bytes
                    continue
                key = [vhost.name, q.name]
                ready.add_metric(key, r)
                unacked.add_metric(key, u)
                messages.add_metric(key, r + u)
                qcons.add_metric(key, c)
                qbytes.add_metric(key, q.ready_bytes)
                ubytes.add_metric(key, q.unacked_bytes)
                mbytes.add_metric(key, q.ready_bytes + q.unacked_bytes)
                qpub.add_metric(key, q.stats_published)
                ts = head_timestamp(q)
                if ts is not None:
                    head.add_metric(key, ts)
        if not self.per_object:
            for family, value in ((ready, sums[0]), (unacked, sums[1]),
                                  (messages, sums[0] + sums[1]), (qcons, sums[2]),
                                  (qbytes, sums[3]), (qpub, sums[4]), (ubytes, sums[5]),
                                  (mbytes, sums[3] + sums[5])):
                family.add_metric([], value)
        # as rabbitmq_prometheus: head timestamps per object only (aggregated: the family
        # with no samples)
        yield from (ready, unacked, messages, qcons, qbytes, ubytes, mbytes, qpub, head)
        yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open",
                                value=len(sessions))
        yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open", value=channels)
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected",
                                value=consumers)
        yield GaugeMetricFamily("rabbitmq_queues", "Queues available", value=queues)
        yield from churn_families(services, "rabbitmq_")
        chans = [ch for s in sessions for ch in list(s.channels.values())]
        yield GaugeMetricFamily("rabbitmq_channel_consumers", "Consumers on a channel",
                                value=sum(len(ch.consumers) for ch in chans))
        unconfirmed = sum(len(ch._unconfirmed) for ch in chans)
        yield GaugeMetricFamily("rabbitmq_channel_messages_unconfirmed",
                                "Published but not yet confirmed", value=unconfirmed)
        yield GaugeMetricFamily("rabbitmq_channel_messages_unacked",
                                "Delivered but not yet acknowledged",
                                value=sum(len(ch.unacked) for ch in chans))
        yield GaugeMetricFamily("rabbitmq_channel_prefetch",
                                "Total limit of unacknowledged messages for all consumers on "
                                "a channel",
                                value=sum(ch.global_prefetch for ch in chans))
        yield GaugeMetricFamily("rabbitmq_consumer_prefetch",
                                "Limit of unacknowledged messages for each consumer",
                                value=sum(c.prefetch for ch in chans
                                          for c in list(ch.consumers.values())))
        yield GaugeMetricFamily("rabbitmq_connection_channels", "Channels on a connection",
                                value=channels)
        yield from auth_families(services.access, "rabbitmq_")
        yield from global_families(services, sessions, totals, unconfirmed,
                                   self.totals.stream_published())
        yield from queue_type_families(services)
        yield from dead_letter_families(services)
        yield from recovery_families(services.recovery)
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
        alarms = services.alarms
        # untyped, as rabbitmq_prometheus serves its alarm families
        for name, doc, value in (
                ("rabbitmq_alarms_memory_used_watermark",
                 "is 1 if VM memory watermark alarm is in effect",
                 int(any(a.startswith("memory") for a in alarms))),
                ("rabbitmq_alarms_free_disk_space_watermark",
                 "is 1 if free disk space watermark alarm is in effect", int("disk" in alarms))):
            alarm = UntypedMetricFamily(name, doc)
            alarm.add_metric([], value)
            yield alarm
        max_fds = fd_limit()
        open_fds = fd_count()
        fd_alarm = UntypedMetricFamily("rabbitmq_alarms_file_descriptor_limit",
                                       "is 1 if file descriptor limit alarm is in effect")
        fd_alarm.add_metric([], int(open_fds >= max_fds))
        yield fd_alarm
        yield GaugeMetricFamily("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.",
                                value=start_time())
        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes",
                                "Memory used in bytes", value=process_rss())
        yield GaugeMetricFamily("rabbitmq_resident_memory_limit_bytes",
                                "Memory high watermark in bytes", value=self.memory_limit())
        yield GaugeMetricFamily("rabbitmq_process_open_fds", "Open file descriptors",
                                value=open_fds)
        yield GaugeMetricFamily("rabbitmq_process_max_fds", "Open file descriptors limit",
                                value=max_fds)
        yield GaugeMetricFamily("rabbitmq_process_open_tcp_sockets", "Open TCP sockets",
                                value=len(services.sessions))
        # no separate socket limit: sockets are file descriptors; RabbitMQ keeps ~10% of
        # them for files, so does this figure
        yield GaugeMetricFamily("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit",
                                value=int(max_fds * 0.9))
        config = services.config
        try:
            free = shutil.disk_usage(config.data_dir).free
        except OSError:
            free = 0
        yield GaugeMetricFamily("rabbitmq_disk_space_available_bytes",
                                "Disk space available in bytes", value=free)
        yield GaugeMetricFamily("rabbitmq_disk_space_available_limit_bytes",
                                "Free disk space low watermark in bytes",
                                value=config.disk_free_limit)
        # ---- this broker's own ----
        store = services.store
        stats = store.flush_stats
        if stats is not None:
            buckets = []
            cumulative = 0
            for bound, count in zip((*stats.BUCKETS, float("inf")), stats.counts, strict=True):
                cumulative += count
                buckets.append((repr(bound) if bound != float("inf") else "+Inf", cumulative))
            yield store_histogram(store.name, buckets, stats.seconds)
            yield store_counter("triomq_store_group_commits", "Group commits (one write+sync each)",
                           store.name, stats.commits)
            yield store_counter("triomq_store_group_committed_messages",
                           "Publishes confirmed by group commits (divide by group_commits for "
                           "the mean group-commit size)", store.name, stats.committed)
            yield store_counter("triomq_store_errors", "Failed store writes", store.name,
                           stats.errors)
        yield GaugeMetricFamily("triomq_scheduler_pending",
                                "Scheduled messages waiting for their time",
                                value=self.scheduler.pending)
        yield GaugeMetricFamily("triomq_alarms", "Resource alarms in effect", value=len(alarms))


class DetailedCollector:
    """/metrics/detailed: the families asked for, per object, ``rabbitmq_detailed_*``;
    ``vhosts`` (if any) limits the queue families to those vhosts."""

    def __init__(self, services: MetricsServices, families: set[str], vhosts: set[str]):
        self.services = services
        self.families = families
        self.vhosts = vhosts

    def collect(self):
        services = self.services
        yield from identity()
        fam = self.families
        if "connection_churn_metrics" in fam:
            yield from churn_families(services, "rabbitmq_detailed_")
        if "auth_attempt_metrics" in fam:
            yield from auth_families(services.access, "rabbitmq_detailed_")
        queue_families = fam & {"queue_coarse_metrics", "queue_consumer_count", "queue_metrics"}
        if queue_families:
            labels = ["vhost", "queue"]
            ready = GaugeMetricFamily("rabbitmq_detailed_queue_messages_ready",
                                      "Messages ready to be delivered to consumers",
                                      labels=labels)
            unacked = GaugeMetricFamily("rabbitmq_detailed_queue_messages_unacked",
                                        "Messages delivered to consumers but not yet "
                                        "acknowledged", labels=labels)
            messages = GaugeMetricFamily("rabbitmq_detailed_queue_messages",
                                         "Sum of ready and unacknowledged messages",
                                         labels=labels)
            consumers = GaugeMetricFamily("rabbitmq_detailed_queue_consumers",
                                          "Consumers on a queue", labels=labels)
            ready_bytes = GaugeMetricFamily("rabbitmq_detailed_queue_messages_ready_bytes",
                                            "Size in bytes of ready messages", labels=labels)
            unacked_bytes = GaugeMetricFamily(
                "rabbitmq_detailed_queue_messages_unacked_bytes",
                "Size in bytes of all unacknowledged messages", labels=labels)
            all_bytes = GaugeMetricFamily("rabbitmq_detailed_queue_messages_bytes",
                                          "Size in bytes of ready and unacknowledged messages",
                                          labels=labels)
            head = GaugeMetricFamily("rabbitmq_detailed_queue_head_message_timestamp",
                                     "Timestamp of the first message in the queue, if any",
                                     labels=labels)
            for vhost in list(services.vhosts.values()):
                if self.vhosts and vhost.name not in self.vhosts:
                    continue
                for q in list(vhost.queues.values()):
                    if q.internal:
                        continue
                    key = [vhost.name, q.name]
                    ready.add_metric(key, q.message_count)
                    unacked.add_metric(key, q.unacked_count)
                    messages.add_metric(key, q.message_count + q.unacked_count)
                    consumers.add_metric(key, len(q.consumers))
                    ready_bytes.add_metric(key, q.ready_bytes)
                    unacked_bytes.add_metric(key, q.unacked_bytes)
                    all_bytes.add_metric(key, q.ready_bytes + q.unacked_bytes)
                    ts = head_timestamp(q)
                    if ts is not None:
                        head.add_metric(key, ts)
            if "queue_coarse_metrics" in fam:
                yield from (ready, unacked, messages)
            if "queue_consumer_count" in fam:
                yield consumers
            if "queue_metrics" in fam:
                yield from (ready_bytes, unacked_bytes, all_bytes, head)
        if "channel_metrics" in fam:
            labels = ["channel"]
            cons = GaugeMetricFamily("rabbitmq_detailed_channel_consumers",
                                     "Consumers on a channel", labels=labels)
            unconfirmed = GaugeMetricFamily("rabbitmq_detailed_channel_messages_unconfirmed",
                                            "Published but not yet confirmed", labels=labels)
            for s in list(services.sessions):
                if s.vhost is None or (self.vhosts and s.vhost.name not in self.vhosts):
                    continue
                for number, ch in list(s.channels.items()):
                    name = f"{connection_name(s)} ({number})"  # RabbitMQ's channel name
                    cons.add_metric([name], len(ch.consumers))
                    unconfirmed.add_metric([name], len(ch._unconfirmed))
            yield from (cons, unconfirmed)
