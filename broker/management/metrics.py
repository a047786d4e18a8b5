"""Prometheus /metrics: one custom collector that reads the broker's state at scrape time
(no metric objects on the message path). RabbitMQ's names (rabbitmq_prometheus plugin) where
the meaning is the same; ``triomq_*`` for this broker's own.

As rabbitmq_prometheus: ``/metrics`` is aggregated (queue metrics summed, no vhost or queue
names) unless ``Config.metrics_per_object``; ``/metrics/per-object`` always labels each queue;
``/metrics/detailed?family=...&vhost=...`` serves only the families asked for, per object,
named ``rabbitmq_detailed_*``. Every endpoint carries ``rabbitmq_identity_info`` and
``rabbitmq_build_info``, which RabbitMQ's Grafana dashboards join every query on.
No login is asked unless ``Config.metrics_auth`` (then a user tagged monitoring or
administrator, 401 otherwise)."""
from __future__ import annotations

import os
import platform
import resource
import shutil
from collections import Counter

import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    UntypedMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..broker import process_rss
from ..churn import QUEUE_STATS
from .api_connections import connection_name
from .auth import require
from .common import NODE
from .stats import connection_counts

RABBITMQ_VERSION = "3.10.8"  # the version this broker answers as (server properties, /api)
PROTOCOL = "amqp091"  # AMQP 0-9-1 channels' (and the API's, STOMP's) protocol label
# labels RabbitMQ 3.10 serves at 0 before any traffic; the others (mqtt310, mqtt311,
# mqtt50, amqp10: RabbitMQ 3.12 and 4.0's native MQTT and AMQP 1.0) once they publish
BASE_PROTOCOLS = ("amqp091", "stream")
# rabbitmq_prometheus' dead-letter counters by reason (x-death reasons)
DEAD_LETTER_REASONS = {"expired": "expired", "maxlen": "maxlen", "rejected": "rejected",
                       "delivery_limit": "delivery_limit"}
# the /metrics/detailed families served (rabbitmq_prometheus' names)
DETAILED_FAMILIES = ("queue_coarse_metrics", "queue_consumer_count", "queue_metrics",
                     "connection_churn_metrics", "channel_metrics", "auth_attempt_metrics")


def identity() -> list:
    """rabbitmq_identity_info and rabbitmq_build_info, RabbitMQ's label sets."""
    ident = UntypedMetricFamily("rabbitmq_identity_info", "RabbitMQ node & cluster identity info",
                                labels=["rabbitmq_node", "rabbitmq_cluster",
                                        "rabbitmq_cluster_permanent_id"])
    ident.add_metric([NODE, NODE, "triomq-cluster-id-" + NODE], 1)
    build = UntypedMetricFamily("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info",
                                labels=["rabbitmq_version", "prometheus_plugin_version",
                                        "prometheus_client_version", "erlang_version"])
    # no Erlang here: its label says so rather than inventing a version
    build.add_metric([RABBITMQ_VERSION, RABBITMQ_VERSION, _client_version(),
                      "none (Python " + platform.python_version() + ")"], 1)
    return [ident, build]


def _client_version() -> str:
    from importlib.metadata import version
    try:
        return version("prometheus-client")
    except Exception:
        return ""


def auth_families(access, prefix: str) -> list:
    """rabbitmq_auth_attempts_{,succeeded_,failed_}total{protocol}: logins of every
    protocol (amqp091, amqp10, mqtt, stomp, stream, http), counted by ``Access``."""
    counts = dict(access.auth_attempts)
    out = []
    for i, (name, doc) in enumerate((
            ("auth_attempts", "Total number of authentication attempts"),
            ("auth_attempts_succeeded", "Total number of successful authentication attempts"),
            ("auth_attempts_failed", "Total number of failed authentication attempts"))):
        c = CounterMetricFamily(prefix + name, doc, labels=["protocol"])
        for protocol, values in sorted(counts.items()):
            c.add_metric([protocol], values[i])
        out.append(c)
    return out


def _start_time() -> float:
    """The process' start (seconds since the epoch), from /proc as prometheus_client's
    process collector reads it."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def _open_fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def _max_fds() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


class BrokerCollector:
    def __init__(self, broker, per_object: bool):
        self.broker = broker
        self.per_object = per_object

    def collect(self):
        broker = self.broker
        yield from identity()
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
        yield from churn_families(broker, "rabbitmq_")
        chans = [ch for s in sessions for ch in list(s.channels.values())]
        yield GaugeMetricFamily("rabbitmq_channel_consumers", "Consumers on a channel",
                                value=sum(len(getattr(ch, "consumers", ())) for ch in chans))
        unconfirmed = sum(len(getattr(ch, "_unconfirmed", ())) for ch in chans)
        yield GaugeMetricFamily("rabbitmq_channel_messages_unconfirmed",
                                "Published but not yet confirmed", value=unconfirmed)
        yield GaugeMetricFamily("rabbitmq_channel_messages_unacked",
                                "Delivered but not yet acknowledged",
                                value=sum(len(getattr(ch, "unacked", ())) for ch in chans))
        yield GaugeMetricFamily("rabbitmq_channel_prefetch",
                                "Total limit of unacknowledged messages for all consumers on "
                                "a channel",
                                value=sum(getattr(ch, "global_prefetch", 0) for ch in chans))
        yield GaugeMetricFamily("rabbitmq_consumer_prefetch",
                                "Limit of unacknowledged messages for each consumer",
                                value=sum(getattr(c, "prefetch", 0) for ch in chans
                                          for c in list(getattr(ch, "consumers", {}).values())))
        yield GaugeMetricFamily("rabbitmq_connection_channels", "Channels on a connection",
                                value=channels)
        yield from auth_families(broker.access, "rabbitmq_")
        yield from global_families(broker, sessions, totals, unconfirmed)
        yield from queue_type_families(broker)
        yield from dead_letter_families(broker)
        yield from recovery_families(broker.recovery)
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
        max_fds = _max_fds()
        open_fds = _open_fds()
        fd_alarm = UntypedMetricFamily("rabbitmq_alarms_file_descriptor_limit",
                                       "is 1 if file descriptor limit alarm is in effect")
        fd_alarm.add_metric([], int(open_fds >= max_fds))
        yield fd_alarm
        yield GaugeMetricFamily("process_start_time_seconds",
                                "Start time of the process since unix epoch in seconds.",
                                value=_start_time())
        yield GaugeMetricFamily("rabbitmq_process_resident_memory_bytes",
                                "Memory used in bytes", value=process_rss())
        yield GaugeMetricFamily("rabbitmq_resident_memory_limit_bytes",
                                "Memory high watermark in bytes", value=broker.memory_limit)
        yield GaugeMetricFamily("rabbitmq_process_open_fds", "Open file descriptors",
                                value=open_fds)
        yield GaugeMetricFamily("rabbitmq_process_max_fds", "Open file descriptors limit",
                                value=max_fds)
        yield GaugeMetricFamily("rabbitmq_process_open_tcp_sockets", "Open TCP sockets",
                                value=len(broker.sessions))
        # no separate socket limit: sockets are file descriptors; RabbitMQ keeps ~10% of
        # them for files, so does this figure
        yield GaugeMetricFamily("rabbitmq_process_max_tcp_sockets", "Open TCP sockets limit",
                                value=int(max_fds * 0.9))
        config = broker.config
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
        store = broker.store
        stats = store.flush_stats
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
        yield GaugeMetricFamily("triomq_scheduler_pending",
                                "Scheduled messages waiting for their time",
                                value=broker.scheduler.pending)
        yield GaugeMetricFamily("triomq_alarms", "Resource alarms in effect", value=len(alarms))


def protocol_of(obj) -> str:
    """The ``protocol`` label of a connection or a consumer's channel."""
    return getattr(obj, "metrics_protocol", None) or PROTOCOL


def global_families(broker, sessions: list, totals: dict, unconfirmed: int) -> list:
    """rabbitmq_global_publishers/consumers and rabbitmq_global_messages_*{protocol}:
    AMQP 0-9-1 from its channels' counters (and the API's publishes), stream publishes
    from the stream connections, every other protocol from the publish path's count
    (``Publishing.by_protocol``). Only AMQP 0-9-1 has confirms and mandatory returns
    counted; the others' are 0."""
    counts: dict[str, dict[str, int]] = {p: Counter() for p in BASE_PROTOCOLS}
    amqp = counts[PROTOCOL]
    amqp.update(received=totals["publish"], confirmed=totals["confirm"],
                unroutable_returned=totals["return_unroutable"],
                unroutable_dropped=totals["drop_unroutable"],
                received_confirm=totals["confirm"] + unconfirmed)
    stream = broker.message_totals.stream_published()
    counts["stream"].update(received=stream)
    for protocol, (received, dropped, returned) in list(
            broker.publishing.by_protocol.items()):
        n = counts.setdefault(protocol, Counter())
        n.update(received=received, unroutable_dropped=dropped, unroutable_returned=returned)
    for n in counts.values():
        # routed: every publish that was neither returned nor dropped
        n["routed"] = max(0, n["received"] - n["unroutable_returned"] - n["unroutable_dropped"])
    publishers: Counter = Counter()
    consumers: Counter = Counter()
    for s in sessions:
        if getattr(s, "is_publisher", False):
            publishers[protocol_of(s)] += 1
    for vhost in list(broker.vhosts.values()):
        for q in list(vhost.queues.values()):
            if not q.internal:
                for consumer in q.consumers:
                    consumers[protocol_of(getattr(consumer.channel, "session", None)
                                          or consumer.channel)] += 1
    out: list = []
    for name, doc, values in (
            ("rabbitmq_global_publishers", "Current number of publishers", publishers),
            ("rabbitmq_global_consumers", "Current number of consumers", consumers)):
        g = GaugeMetricFamily(name, doc, labels=["protocol"])
        for protocol in sorted({*counts, *values}):
            g.add_metric([protocol], values[protocol])
        out.append(g)
    for name, doc in (
            ("received", "Total number of messages received from publishers"),
            ("confirmed", "Total number of messages confirmed to publishers"),
            ("unroutable_returned", "Total number of messages published as mandatory into "
             "an exchange and returned to the publisher as unroutable"),
            ("unroutable_dropped", "Total number of messages published as non-mandatory "
             "into an exchange and dropped as unroutable"),
            ("routed", "Total number of messages routed to queues or streams"),
            # received in confirm mode: confirmed, plus those still waiting for theirs
            ("received_confirm", "Total number of messages received from publishers "
             "expecting confirmations")):
        c = CounterMetricFamily("rabbitmq_global_messages_" + name, doc, labels=["protocol"])
        for protocol in sorted(counts):
            c.add_metric([protocol], counts[protocol][name])
        out.append(c)
    return out


def head_timestamp(q) -> int | None:
    """The timestamp property of the queue's next message (None: empty, or no timestamp)."""
    entry = q.ready.peek()
    if entry is None:
        return None
    ts = entry.message.properties.get("timestamp")
    return ts if isinstance(ts, int) else None


QUEUE_TYPES = ("rabbit_classic_queue", "rabbit_quorum_queue", "rabbit_stream_queue")


def queue_type_families(broker) -> list:
    """The global delivery counters RabbitMQ labels {protocol, queue_type}: summed from the
    queues' own counters (live ones, and deleted ones kept by ``Churn.retire``); the
    deliveries and acks of consumers of other protocols (``Churn.by_protocol``: MQTT, AMQP
    1.0 ...) under their label, the rest under amqp091."""
    sums = {qt: Counter(counts) for qt, counts in broker.churn.retired.items()}
    for vhost in list(broker.vhosts.values()):
        for q in list(vhost.queues.values()):
            if q.internal:
                continue
            c = sums.setdefault(q.queue_type.module, Counter())
            for name in QUEUE_STATS:
                c[name] += getattr(q, name)
    # per (protocol, queue type): Counter of the QUEUE_STATS names
    split: dict[tuple[str, str], Counter] = {}
    for (protocol, qt), (manual, auto, redelivered, acked) in list(
            broker.churn.by_protocol.items()):
        other = Counter(stats_delivered=manual + auto, stats_deliver_no_ack=auto,
                        stats_redeliver=redelivered, stats_acked=acked)
        split[(protocol, qt)] = other
        rest = sums.setdefault(qt, Counter())
        for name, n in other.items():
            rest[name] -= n
    for qt in {*QUEUE_TYPES, *sums}:
        split[(PROTOCOL, qt)] = sums.get(qt, Counter())
    out = []
    for name, doc, value in (
            ("delivered", "Total number of messages delivered to consumers",
             lambda c: c["stats_delivered"]),
            ("delivered_consume_manual_ack", "Total number of messages delivered to consumers "
             "using manual acknowledgement mode",
             lambda c: c["stats_delivered"] - c["stats_deliver_no_ack"] - c["stats_get"]
             - c["stats_get_no_ack"]),
            ("delivered_consume_auto_ack", "Total number of messages delivered to consumers "
             "using automatic acknowledgement mode", lambda c: c["stats_deliver_no_ack"]),
            ("delivered_get_manual_ack", "Total number of messages delivered to consumers "
             "using basic.get with manual acknowledgment mode", lambda c: c["stats_get"]),
            ("delivered_get_auto_ack", "Total number of messages delivered to consumers using "
             "basic.get with automatic acknowledgment mode", lambda c: c["stats_get_no_ack"]),
            ("get_empty", "Total number of times basic.get operations fetched no message",
             lambda c: c["stats_get_empty"]),
            ("redelivered", "Total number of messages redelivered to consumers",
             lambda c: c["stats_redeliver"]),
            ("acknowledged", "Total number of messages acknowledged by consumers",
             lambda c: c["stats_acked"])):
        family = CounterMetricFamily("rabbitmq_global_messages_" + name, doc,
                                     labels=["protocol", "queue_type"])
        for protocol, qt in sorted(split):
            family.add_metric([protocol, qt], max(0, value(split[(protocol, qt)])))
        out.append(family)
    return out


def churn_families(broker, prefix: str) -> list:
    """connection_churn_metrics; closed counts are opened minus still open."""
    churn = broker.churn
    open_channels = sum(len(s.channels) for s in list(broker.sessions))
    out = []
    for name, doc, value in (
            ("connections_opened", "Total number of connections opened",
             churn.connections_opened),
            ("connections_closed", "Total number of connections closed or terminated",
             max(0, churn.connections_opened - len(broker.sessions))),
            ("channels_opened", "Total number of channels opened", churn.channels_opened),
            ("channels_closed", "Total number of channels closed",
             max(0, churn.channels_opened - open_channels)),
            ("queues_declared", "Total number of queues declared", churn.queues_declared),
            ("queues_created", "Total number of queues created", churn.queues_created),
            ("queues_deleted", "Total number of queues deleted", churn.queues_deleted)):
        out.append(CounterMetricFamily(prefix + name, doc, value=value))
    return out


def recovery_families(recovery) -> list:
    """The broker's recovery (``Broker.recovery``): 1 while it runs, and each phase of
    the last start (units done, known total, seconds)."""
    active = GaugeMetricFamily("triomq_recovery_active",
                               "1 while the broker reads back its stores after a start")
    active.add_metric([], 1 if recovery.active or not recovery.ready else 0)
    done = GaugeMetricFamily("triomq_recovery_phase_done", "Units a recovery phase has read",
                             labels=["phase", "unit"])
    total = GaugeMetricFamily("triomq_recovery_phase_total",
                              "Units a recovery phase has to read (0: not known)",
                              labels=["phase", "unit"])
    seconds = GaugeMetricFamily("triomq_recovery_phase_seconds",
                                "Seconds a recovery phase has taken so far",
                                labels=["phase", "unit"])
    for phase in list(recovery.phases):
        labels = [phase.name, phase.unit]
        done.add_metric(labels, phase.done)
        total.add_metric(labels, phase.total or 0)
        seconds.add_metric(labels, round(phase.elapsed(), 3))
    return [active, done, total, seconds]


def dead_letter_families(broker) -> list:
    """rabbitmq_global_messages_dead_lettered_<reason>_total{queue_type, dead_letter_strategy};
    classic at-most-once and disabled always present at 0, as RabbitMQ shows them."""
    counts = broker.churn.dead_lettered
    out = []
    for reason, name in DEAD_LETTER_REASONS.items():
        c = CounterMetricFamily("rabbitmq_global_messages_dead_lettered_" + name,
                                f"Total number of messages dead-lettered due to {name}",
                                labels=["queue_type", "dead_letter_strategy"])
        seen = {(qt, st): n for (qt, st, r), n in counts.items() if r == reason}
        for key in (("rabbit_classic_queue", "at_most_once"),
                    ("rabbit_classic_queue", "disabled")):
            seen.setdefault(key, 0)
        for (qt, st), n in sorted(seen.items()):
            c.add_metric([qt, st], n)
        out.append(c)
    return out


class DetailedCollector:
    """/metrics/detailed: the families asked for, per object, ``rabbitmq_detailed_*``;
    ``vhosts`` (if any) limits the queue families to those vhosts."""

    def __init__(self, broker, families: set[str], vhosts: set[str]):
        self.broker = broker
        self.families = families
        self.vhosts = vhosts

    def collect(self):
        broker = self.broker
        yield from identity()
        fam = self.families
        if "connection_churn_metrics" in fam:
            yield from churn_families(broker, "rabbitmq_detailed_")
        if "auth_attempt_metrics" in fam:
            yield from auth_families(broker.access, "rabbitmq_detailed_")
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
            for vhost in list(broker.vhosts.values()):
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
            for s in list(broker.sessions):
                if s.vhost is None or (self.vhosts and s.vhost.name not in self.vhosts):
                    continue
                for number, ch in list(s.channels.items()):
                    name = f"{connection_name(s)} ({number})"  # RabbitMQ's channel name
                    cons.add_metric([name], len(getattr(ch, "consumers", ())))
                    unconfirmed.add_metric([name], len(getattr(ch, "_unconfirmed", ())))
            yield from (cons, unconfirmed)


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


class _Snapshot:
    """Families already collected, for rendering away from the event loop."""

    def __init__(self, families: list):
        self.families = families

    def collect(self):
        return self.families


def _render(families: list) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(families))
    return generate_latest(registry)


async def render(collector) -> Response:
    """Read the broker's state on the event loop (the collector touches live objects), then
    format the text in a worker thread: with 10,000 queues per object, formatting is ~70 %
    of a scrape's time (bench/oauth2_metrics.py)."""
    families = list(collector.collect())
    body = await trio.to_thread.run_sync(_render, families)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def routes(broker) -> list:
    collectors = {per_object: BrokerCollector(broker, per_object) for per_object in (False, True)}

    async def scrape(request: Request, per_object: bool) -> Response:
        if broker.config.metrics_auth:
            await require(request, "monitoring")
        return await render(collectors[per_object])

    async def metrics(request: Request) -> Response:
        return await scrape(request, broker.config.metrics_per_object)

    async def per_object(request: Request) -> Response:
        return await scrape(request, True)

    async def detailed(request: Request) -> Response:
        if broker.config.metrics_auth:
            await require(request, "monitoring")
        families = {f for f in request.query_params.getlist("family") if f in DETAILED_FAMILIES}
        vhosts = set(request.query_params.getlist("vhost"))
        return await render(DetailedCollector(broker, families, vhosts))

    return [Route("/metrics", metrics), Route("/metrics/per-object", per_object),
            Route("/metrics/detailed", detailed)]
