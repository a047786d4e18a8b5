"""Message counters and rates for the API, the console and /metrics.

The hot path only does plain integer increments that already live on the objects
(``Channel.stats_*``, ``Queue.stats_*``). One task (``Sampler.run``) samples them every
``INTERVAL`` seconds; rates are the difference between the last two samples, and the overview
keeps a short ring of samples for the console's graphs (RabbitMQ's ``msg_rates_age``).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import trio

INTERVAL = 5.0  # RabbitMQ's collect_statistics_interval
RING = 120  # overview samples kept: 10 minutes at 5 s

CHANNEL_FIELDS = ("publish", "deliver", "get", "ack")
QUEUE_FIELDS = ("publish", "deliver_get", "ack", "messages_ready", "messages_unacknowledged")


class MessageTotals:
    """Broker-wide message counters: live channels' counters plus those of closed channels
    (``retire``). Never decreases; what /metrics exports as ``*_total``."""

    def __init__(self, broker):
        self.broker = broker
        self.retired = dict.fromkeys(CHANNEL_FIELDS, 0)
        self.retired_by_vhost: dict[str, dict[str, int]] = {}

    def retire(self, channel) -> None:
        vhost = channel.session.vhost
        targets = [self.retired]
        if vhost is not None:
            targets.append(self.retired_by_vhost.setdefault(
                vhost.name, dict.fromkeys(CHANNEL_FIELDS, 0)))
        for r in targets:
            r["publish"] += channel.stats_publish
            r["deliver"] += channel.stats_deliver
            r["get"] += channel.stats_get
            r["ack"] += channel.stats_ack

    def by_vhost(self) -> dict[str, dict[str, int]]:
        """The same counters per vhost name (vhosts without traffic are missing)."""
        out = {name: dict(r) for name, r in self.retired_by_vhost.items()}
        for session in list(self.broker.sessions):
            if session.vhost is None:
                continue
            r = out.setdefault(session.vhost.name, dict.fromkeys(CHANNEL_FIELDS, 0))
            for ch in list(session.channels.values()):
                if ch.released:
                    continue
                r["publish"] += ch.stats_publish
                r["deliver"] += ch.stats_deliver
                r["get"] += ch.stats_get
                r["ack"] += ch.stats_ack
        return out

    def current(self) -> dict[str, int]:
        out = dict(self.retired)
        for session in list(self.broker.sessions):
            for ch in list(session.channels.values()):
                if ch.released:
                    continue
                out["publish"] += ch.stats_publish
                out["deliver"] += ch.stats_deliver
                out["get"] += ch.stats_get
                out["ack"] += ch.stats_ack
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


OVERVIEW_FIELDS = ("publish", "deliver", "get", "deliver_get", "ack",
                   "messages", "messages_ready", "messages_unacknowledged")


class Sampler:
    """Samples queues, channels and broker totals every ``INTERVAL`` seconds."""

    def __init__(self, broker, interval: float = INTERVAL):
        self.broker = broker
        self.interval = interval
        self.queues: dict = {}  # queue -> latest counters (QUEUE_FIELDS order)
        self.queues_prev: dict = {}  # the sample before
        self.queue_time: tuple[float, float] = (0.0, 0.0)  # (previous, latest) sample time
        self.channels: dict = {}  # channel -> (previous, latest)
        self.overview: deque[tuple[float, dict]] = deque(maxlen=RING)  # (time, totals)
        self.vhosts: dict[str, tuple] = {}  # vhost name -> CHANNEL_FIELDS counters
        self.vhosts_prev: dict[str, tuple] = {}
        self.vhost_time: tuple[float, float] = (0.0, 0.0)
        self._overview_prev: Sample | None = None
        self._overview_cur: Sample | None = None

    def sample(self) -> None:
        now = time.monotonic()
        # one pass, plain tuples: ~10k queues per few ms, every INTERVAL seconds
        self.queue_time = (self.queue_time[1], now)
        latest: dict = {}
        ready = unacked = 0
        for vhost in list(self.broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                r, u = q.message_count, q.unacked_count
                latest[q] = (q.stats_published, q.stats_delivered, q.stats_acked, r, u)
                if not q.internal:
                    ready += r
                    unacked += u
        self.queues_prev, self.queues = self.queues, latest
        channels: dict = {}
        for session in list(self.broker.sessions):
            for ch in list(session.channels.values()):
                cur = Sample(now, (ch.stats_publish, ch.stats_deliver, ch.stats_get, ch.stats_ack))
                old = self.channels.get(ch)
                channels[ch] = (old[1] if old else None, cur)
        self.channels = channels
        totals = self.broker.message_totals
        self.vhosts_prev = self.vhosts
        self.vhosts = {name: tuple(r[f] for f in CHANNEL_FIELDS)
                       for name, r in totals.by_vhost().items()}
        self.vhost_time = (self.vhost_time[1], now)
        t = totals.current()
        values = (t["publish"], t["deliver"], t["get"], t["deliver"] + t["get"], t["ack"],
                  ready + unacked, ready, unacked)
        self._overview_prev, self._overview_cur = self._overview_cur, Sample(now, values)
        self.overview.append((time.time(), dict(zip(OVERVIEW_FIELDS, values, strict=True))))

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(self.interval)

    # ---- readers ----
    def queue_rates(self, q) -> dict:
        cur, prev = self.queues.get(q), self.queues_prev.get(q)
        if cur is None or prev is None:
            return dict.fromkeys(QUEUE_FIELDS, 0.0)
        t0, t1 = self.queue_time
        return _rates(Sample(t0, prev), Sample(t1, cur), QUEUE_FIELDS)

    def vhost_rates(self, name: str) -> dict:
        cur, prev = self.vhosts.get(name), self.vhosts_prev.get(name)
        if cur is None or prev is None:
            return dict.fromkeys(CHANNEL_FIELDS, 0.0)
        t0, t1 = self.vhost_time
        return _rates(Sample(t0, prev), Sample(t1, cur), CHANNEL_FIELDS)

    def channel_rates(self, ch) -> dict:
        pair = self.channels.get(ch)
        if pair is None:
            return dict.fromkeys(CHANNEL_FIELDS, 0.0)
        return _rates(pair[0], pair[1], CHANNEL_FIELDS)

    def overview_rates(self) -> dict:
        if self._overview_cur is None:
            return dict.fromkeys(OVERVIEW_FIELDS, 0.0)
        # queue lengths: RabbitMQ's messages_details is a rate of change too
        return _rates(self._overview_prev, self._overview_cur, OVERVIEW_FIELDS)
