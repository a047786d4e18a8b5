"""Message counters and rates for the API, the console and /metrics.

The hot path only does plain integer increments that already live on the objects
(``Channel.stats_*``, ``Queue.stats_*``, ``Exchange.stats_*``, the session's connection's
``recv_oct`` ...). One task (``Sampler.run``) samples them every
``INTERVAL`` seconds; rates are the difference between the last two samples, and the overview
keeps a short ring of samples for the console's graphs (RabbitMQ's ``msg_rates_age``).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from ..listeners.amqp_session import Session
    from ..listeners.session_base import ProtocolSession
    from ..queues.queue import Queue
    from ..services import StatsServices

INTERVAL = 5.0  # RabbitMQ's collect_statistics_interval
RING = 120  # overview samples kept: 10 minutes at 5 s

# RabbitMQ's channel (and vhost, overview) counters; deliver and get are the ack-mode ones
CHANNEL_FIELDS = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver",
                  "deliver_no_ack", "get", "get_no_ack", "get_empty", "redeliver", "ack")
QUEUE_FIELDS = ("publish", "deliver_get", "ack", "deliver_no_ack", "get", "get_no_ack",
                "get_empty", "redeliver", "messages_ready", "messages_unacknowledged")
EXCHANGE_FIELDS = ("publish_in", "publish_out")
CONNECTION_FIELDS = ("recv_oct", "send_oct")  # RabbitMQ gives the _cnt ones no rate
CONNECTION_COUNTS = ("recv_oct", "recv_cnt", "send_oct", "send_cnt")


def channel_counts(ch) -> tuple:
    """A channel's counters in ``CHANNEL_FIELDS`` order."""
    return (ch.stats_publish, ch.stats_confirm, ch.stats_return_unroutable,
            ch.stats_drop_unroutable, ch.stats_deliver, ch.stats_deliver_no_ack, ch.stats_get,
            ch.stats_get_no_ack, ch.stats_get_empty, ch.stats_redeliver, ch.stats_ack)


def queue_counts(q: Queue) -> tuple:
    """A queue's counters in ``QUEUE_FIELDS`` order, without the two lengths."""
    return (q.stats_published, q.stats_delivered, q.stats_acked, q.stats_deliver_no_ack,
            q.stats_get, q.stats_get_no_ack, q.stats_get_empty, q.stats_redeliver)


def connection_counts(session: Session | ProtocolSession) -> tuple:
    """``CONNECTION_COUNTS`` of a connection (every protocol's connection counts them)."""
    conn = session.conn
    return (conn.recv_oct, conn.recv_cnt, conn.send_oct, conn.send_cnt)


# RabbitMQ's churn_rates (overview) and node counters of the same names
CHURN_FIELDS = ("connection_created", "connection_closed", "channel_created", "channel_closed",
                "queue_declared", "queue_created", "queue_deleted")


def churn_counts(services: StatsServices) -> tuple:
    """``CHURN_FIELDS`` of the broker: closed counts are opened minus still open."""
    churn = services.churn
    sessions = list(services.sessions)
    open_channels = sum(len(s.channels) for s in sessions)
    return (churn.connections_opened, max(0, churn.connections_opened - len(sessions)),
            churn.channels_opened, max(0, churn.channels_opened - open_channels),
            churn.queues_declared, churn.queues_created, churn.queues_deleted)


def with_deliver_get(values: dict) -> dict:
    """Channel counters (or their rates) plus RabbitMQ's deliver_get: every delivery and get,
    with and without ack."""
    return {**values, "deliver_get": values["deliver"] + values["deliver_no_ack"]
            + values["get"] + values["get_no_ack"]}


class MessageTotals:
    """Broker-wide message counters: live channels' counters plus those of closed channels
    (``retire``). Never decreases; what /metrics exports as ``*_total``."""

    def __init__(self, services: StatsServices):
        self.services = services
        self.retired = dict.fromkeys(CHANNEL_FIELDS, 0)
        self.retired_by_vhost: dict[str, dict[str, int]] = {}
        self.retired_octets: dict[str, list[int]] = {}  # vhost -> [recv_oct, send_oct]
        self.retired_stream_published = 0  # closed stream connections' messages_published

    def retire(self, channel) -> None:
        vhost = channel.session.vhost
        targets = [self.retired]
        if vhost is not None:
            targets.append(self.retired_by_vhost.setdefault(
                vhost.name, dict.fromkeys(CHANNEL_FIELDS, 0)))
        counts = channel_counts(channel)
        for r in targets:
            for name, value in zip(CHANNEL_FIELDS, counts, strict=True):
                r[name] += value

    def add(self, vhost_name: str, **counts: int) -> None:
        """Counters of something that is not a channel: the API's publishes count as
        RabbitMQ's do (its internal channel publishes with confirms and mandatory)."""
        r = self.retired_by_vhost.setdefault(vhost_name, dict.fromkeys(CHANNEL_FIELDS, 0))
        for name, value in counts.items():
            r[name] += value
            self.retired[name] += value

    def retire_connection(self, session: Session | ProtocolSession) -> None:
        """A closed connection's octets stay in its vhost's totals, as RabbitMQ's do."""
        self.retired_stream_published += session.messages_published
        if session.vhost is None:
            return
        counts = connection_counts(session)
        r = self.retired_octets.setdefault(session.vhost.name, [0, 0])
        r[0] += counts[0]
        r[1] += counts[2]

    def stream_published(self) -> int:
        """Messages written by stream protocol publishers, closed connections included."""
        return self.retired_stream_published + sum(
            s.messages_published for s in list(self.services.sessions))

    def octets_by_vhost(self) -> dict[str, tuple[int, int]]:
        """``(recv_oct, send_oct)`` per vhost name, closed connections included (vhosts
        that never had a connection are missing)."""
        out = {name: list(r) for name, r in self.retired_octets.items()}
        for session in list(self.services.sessions):
            if session.vhost is None:
                continue
            counts = connection_counts(session)
            r = out.setdefault(session.vhost.name, [0, 0])
            r[0] += counts[0]
            r[1] += counts[2]
        return {name: (r[0], r[1]) for name, r in out.items()}

    def by_vhost(self) -> dict[str, dict[str, int]]:
        """The same counters per vhost name (vhosts without traffic are missing)."""
        out = {name: dict(r) for name, r in self.retired_by_vhost.items()}
        for session in list(self.services.sessions):
            if session.vhost is None:
                continue
            r = out.setdefault(session.vhost.name, dict.fromkeys(CHANNEL_FIELDS, 0))
            for ch in list(session.channels.values()):
                if ch.released:
                    continue
                for name, value in zip(CHANNEL_FIELDS, channel_counts(ch), strict=True):
                    r[name] += value
        return out

    def current(self) -> dict[str, int]:
        out = dict(self.retired)
        for session in list(self.services.sessions):
            for ch in list(session.channels.values()):
                if ch.released:
                    continue
                for name, value in zip(CHANNEL_FIELDS, channel_counts(ch), strict=True):
                    out[name] += value
        return out


def rate_details(counts: dict, rates: dict | None) -> dict:
    """RabbitMQ's ``message_stats``: each counter and ``<name>_details: {"rate": r}``."""
    out: dict = {}
    for name, value in counts.items():
        out[name] = value
        out[name + "_details"] = {"rate": round((rates or {}).get(name, 0.0), 1)}
    return out


@dataclass
class Sample:
    t: float
    values: tuple


def _rates(prev: Sample | None, cur: Sample, names: tuple) -> dict:
    if prev is None or cur.t <= prev.t:
        return dict.fromkeys(names, 0.0)
    dt = cur.t - prev.t
    # lengths may shrink (negative rate); counters only grow
    return {n: (c - p) / dt if n.startswith("messages") else max(0.0, (c - p) / dt)
            for n, c, p in zip(names, cur.values, prev.values, strict=True)}


OVERVIEW_FIELDS = (*CHANNEL_FIELDS, "deliver_get", "messages", "messages_ready",
                   "messages_unacknowledged")


class Sampler:
    """Samples queues, channels and broker totals (``totals``) every ``INTERVAL`` seconds."""

    def __init__(self, services: StatsServices, totals: MessageTotals,
                 interval: float = INTERVAL):
        self.services = services
        self.totals = totals
        self.interval = interval
        self.queues: dict = {}  # queue -> latest counters (QUEUE_FIELDS order)
        self.queues_prev: dict = {}  # the sample before
        self.queue_time: tuple[float, float] = (0.0, 0.0)  # (previous, latest) sample time
        self.queue_changed: dict = {}  # queue -> wall time its counters last changed
        self.channels: dict = {}  # channel -> (previous, latest)
        self.exchanges: dict = {}  # exchange -> (previous, latest)
        self.connections: dict = {}  # session -> (previous, latest)
        self.overview: deque[tuple[float, dict]] = deque(maxlen=RING)  # (time, totals)
        self.vhosts: dict[str, tuple] = {}  # vhost name -> CHANNEL_FIELDS counters
        self.vhosts_prev: dict[str, tuple] = {}
        self.vhost_time: tuple[float, float] = (0.0, 0.0)
        self.vhost_octets: dict[str, tuple] = {}  # vhost name -> (recv_oct, send_oct)
        self.vhost_octets_prev: dict[str, tuple] = {}
        self._overview_prev: Sample | None = None
        self._overview_cur: Sample | None = None
        self._churn_prev: Sample | None = None
        self._churn_cur: Sample | None = None

    def sample(self) -> None:
        now = time.monotonic()
        # one pass, plain tuples: ~10k queues per few ms, every INTERVAL seconds
        self.queue_time = (self.queue_time[1], now)
        latest: dict = {}
        ready = unacked = 0
        for vhost in list(self.services.vhosts.values()):
            for q in list(vhost.queues.values()):
                r, u = q.message_count, q.unacked_count
                latest[q] = (*queue_counts(q), r, u)
                if not q.internal:
                    ready += r
                    unacked += u
        wall = time.time()
        previous, changed = self.queues, self.queue_changed
        # a queue's last change: when a sample first saw its counters as they are now (updated
        # in place for the few that moved; deleted queues pruned when they outnumber a tenth)
        for q, values in latest.items():
            if previous.get(q) != values:
                changed[q] = wall
        if len(changed) > len(latest) + len(latest) // 10 + 16:
            self.queue_changed = {q: changed[q] for q in latest}
        self.queues_prev, self.queues = self.queues, latest
        channels: dict = {}
        for session in list(self.services.sessions):
            for ch in list(session.channels.values()):
                cur = Sample(now, channel_counts(ch))
                old = self.channels.get(ch)
                channels[ch] = (old[1] if old else None, cur)
        self.channels = channels
        connections: dict = {}
        for session in list(self.services.sessions):
            oct_ = connection_counts(session)
            old = self.connections.get(session)
            connections[session] = (old[1] if old else None, Sample(now, (oct_[0], oct_[2])))
        self.connections = connections
        exchanges: dict = {}
        for vhost in list(self.services.vhosts.values()):
            for x in list(vhost.exchanges.values()):
                old = self.exchanges.get(x)
                exchanges[x] = (old[1] if old else None,
                                Sample(now, (x.stats_publish_in, x.stats_publish_out)))
        self.exchanges = exchanges
        totals = self.totals
        self.vhosts_prev = self.vhosts
        self.vhosts = {name: tuple(r[f] for f in CHANNEL_FIELDS)
                       for name, r in totals.by_vhost().items()}
        self.vhost_octets_prev, self.vhost_octets = self.vhost_octets, totals.octets_by_vhost()
        self.vhost_time = (self.vhost_time[1], now)
        t = totals.current()
        values = (*(t[f] for f in CHANNEL_FIELDS), with_deliver_get(t)["deliver_get"],
                  ready + unacked, ready, unacked)
        self._overview_prev, self._overview_cur = self._overview_cur, Sample(now, values)
        churn = Sample(now, churn_counts(self.services))
        self._churn_prev, self._churn_cur = self._churn_cur, churn
        self.overview.append((time.time(), {**dict(zip(OVERVIEW_FIELDS, values, strict=True)),
                                            **dict(zip(CHURN_FIELDS, churn.values,
                                                       strict=True))}))

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(self.interval)

    # ---- readers ----
    def queue_rates(self, q: Queue) -> dict:
        cur, prev = self.queues.get(q), self.queues_prev.get(q)
        if cur is None or prev is None:
            return dict.fromkeys(QUEUE_FIELDS, 0.0)
        t0, t1 = self.queue_time
        return _rates(Sample(t0, prev), Sample(t1, cur), QUEUE_FIELDS)

    def queue_idle_since(self, q: Queue) -> float | None:
        """Wall time since which the queue saw no traffic (no publish, delivery, ack or
        length change), or None if it had some in the last interval or is not sampled yet:
        RabbitMQ's ``idle_since``."""
        cur, prev = self.queues.get(q), self.queues_prev.get(q)
        if cur is None or prev is None or cur != prev:
            return None
        return self.queue_changed.get(q)

    def vhost_rates(self, name: str) -> dict:
        cur, prev = self.vhosts.get(name), self.vhosts_prev.get(name)
        if cur is None or prev is None:
            return dict.fromkeys(CHANNEL_FIELDS, 0.0)
        t0, t1 = self.vhost_time
        return _rates(Sample(t0, prev), Sample(t1, cur), CHANNEL_FIELDS)

    def vhost_octet_rates(self, name: str) -> dict:
        cur, prev = self.vhost_octets.get(name), self.vhost_octets_prev.get(name)
        if cur is None or prev is None:
            return dict.fromkeys(CONNECTION_FIELDS, 0.0)
        t0, t1 = self.vhost_time
        return _rates(Sample(t0, prev), Sample(t1, cur), CONNECTION_FIELDS)

    def channel_rates(self, ch) -> dict:
        return self._pair_rates(self.channels.get(ch), CHANNEL_FIELDS)

    def exchange_rates(self, x) -> dict:
        return self._pair_rates(self.exchanges.get(x), EXCHANGE_FIELDS)

    def connection_rates(self, session: Session | ProtocolSession) -> dict:
        return self._pair_rates(self.connections.get(session), CONNECTION_FIELDS)

    @staticmethod
    def _pair_rates(pair: tuple | None, names: tuple) -> dict:
        if pair is None:
            return dict.fromkeys(names, 0.0)
        return _rates(pair[0], pair[1], names)

    def churn_rates(self) -> dict:
        if self._churn_cur is None:
            return dict.fromkeys(CHURN_FIELDS, 0.0)
        return _rates(self._churn_prev, self._churn_cur, CHURN_FIELDS)

    def overview_rates(self) -> dict:
        if self._overview_cur is None:
            return dict.fromkeys(OVERVIEW_FIELDS, 0.0)
        # queue lengths: RabbitMQ's messages_details is a rate of change too
        return _rates(self._overview_prev, self._overview_cur, OVERVIEW_FIELDS)
