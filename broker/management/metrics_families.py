"""The Prometheus metric families /metrics and /metrics/detailed are made of: identity,
logins, global publish/delivery counters by protocol and queue type, churn, recovery,
dead-lettering, the store's group commits, and the process' own figures. Does not walk
queues or channels for the per-queue families (metrics_collectors) nor serve HTTP (metrics)."""
from __future__ import annotations

import os
import platform
import resource
from collections import Counter
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    UntypedMetricFamily,
)

from ..amqp import builds as amqp_builds
from ..churn import QUEUE_STATS, queue_stats
from .common import NODE

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..services import MetricsServices, StatsServices

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
    # TrioMQ's own: which build of the AMQP codec runs, "compiled" or "pure" (TRIOMQ_PURE=1)
    codec = UntypedMetricFamily("triomq_amqp_codec_info", "The AMQP codec's build", labels=["build"])
    codec.add_metric([amqp_builds.current()], 1)
    return [ident, build, codec]


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


def start_time() -> float:
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


def fd_count() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def fd_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def protocol_of(obj) -> str:
    """The ``protocol`` label of a connection or a consumer's channel."""
    return obj.metrics_protocol or PROTOCOL


def global_families(services: MetricsServices, sessions: list, totals: dict, unconfirmed: int,
                    stream_published: int) -> list:
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
    counts["stream"].update(received=stream_published)
    for protocol, (received, dropped, returned) in list(
            services.publishing.by_protocol.items()):
        n = counts.setdefault(protocol, Counter())
        n.update(received=received, unroutable_dropped=dropped, unroutable_returned=returned)
    for n in counts.values():
        # routed: every publish that was neither returned nor dropped
        n["routed"] = max(0, n["received"] - n["unroutable_returned"] - n["unroutable_dropped"])
    publishers: Counter = Counter()
    consumers: Counter = Counter()
    for s in sessions:
        if s.is_publisher:
            publishers[protocol_of(s)] += 1
    for vhost in list(services.vhosts.values()):
        for q in list(vhost.queues.values()):
            if not q.internal:
                for consumer in q.consumers:
                    consumers[protocol_of(consumer.channel.session)] += 1
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


def head_timestamp(q: Queue) -> int | None:
    """The timestamp property of the queue's next message (None: empty, or no timestamp)."""
    entry = q.ready.peek()
    if entry is None:
        return None
    ts = entry.message.properties.get("timestamp")
    return ts if isinstance(ts, int) else None


QUEUE_TYPES = ("rabbit_classic_queue", "rabbit_quorum_queue", "rabbit_stream_queue")


def queue_type_families(services: StatsServices) -> list:
    """The global delivery counters RabbitMQ labels {protocol, queue_type}: summed from the
    queues' own counters (live ones, and deleted ones kept by ``Churn.retire``); the
    deliveries and acks of consumers of other protocols (``Churn.by_protocol``: MQTT, AMQP
    1.0 ...) under their label, the rest under amqp091."""
    sums = {qt: Counter(counts) for qt, counts in services.churn.retired.items()}
    for vhost in list(services.vhosts.values()):
        for q in list(vhost.queues.values()):
            if q.internal:
                continue
            c = sums.setdefault(q.queue_type.module, Counter())
            for name, value in zip(QUEUE_STATS, queue_stats(q), strict=True):
                c[name] += value
    # per (protocol, queue type): Counter of the QUEUE_STATS names
    split: dict[tuple[str, str], Counter] = {}
    for (protocol, qt), (manual, auto, redelivered, acked) in list(
            services.churn.by_protocol.items()):
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


def churn_families(services: StatsServices, prefix: str) -> list:
    """connection_churn_metrics; closed counts are opened minus still open."""
    churn = services.churn
    open_channels = sum(len(s.channels) for s in list(services.sessions))
    out = []
    for name, doc, value in (
            ("connections_opened", "Total number of connections opened",
             churn.connections_opened),
            ("connections_closed", "Total number of connections closed or terminated",
             max(0, churn.connections_opened - len(services.sessions))),
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


def dead_letter_families(services: StatsServices) -> list:
    """rabbitmq_global_messages_dead_lettered_<reason>_total{queue_type, dead_letter_strategy};
    classic at-most-once and disabled always present at 0, as RabbitMQ shows them."""
    counts = services.churn.dead_lettered
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


def store_histogram(store: str, buckets: list, total: float) -> HistogramMetricFamily:
    h = HistogramMetricFamily("triomq_store_sync_seconds",
                              "Duration of each store write+fsync (one group commit)",
                              labels=["store"])
    h.add_metric([store], buckets, total)
    return h


def store_counter(name: str, doc: str, store: str, value: int) -> CounterMetricFamily:
    c = CounterMetricFamily(name, doc, labels=["store"])
    c.add_metric([store], value)
    return c
