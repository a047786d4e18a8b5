"""``$SYS`` topics: the broker's status under Mosquitto's topic names (mosquitto(8),
"BROKER STATUS"), published every ``mqtt_sys_interval`` seconds (Mosquitto's
``sys_interval``, 10 s by default; 0: none).

Each value is published retained at QoS 0, expiring from queues after 60 s, when it
changed since the last round (as Mosquitto does; a new subscriber of ``$SYS/#`` gets every
value at once from the retained ones), in every
vhost, through the MQTT routing path (the MQTT exchange, routing key translated as for a
client's PUBLISH). The topic exchange keeps MQTT's rule that a filter starting with a
wildcard (``#``, ``+/...``) matches no topic starting with '$' (MQTT-4.7.2-1), so only
``$SYS/...`` subscriptions get them. The retained values live in memory only (the store
would write them every round; they mean nothing after a restart).

The counters are plain integers on ``MQTTService``, incremented where the data passes
(the edge counts bytes, the session PUBLISH packets); the rest is read each round.
Differences from Mosquitto: ``messages/*`` count PUBLISH packets only (Mosquitto counts
every packet type); ``clients/disconnected`` counts non-clean sessions with queues left.
"""
from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import trio

from .. import __version__
from ..amqp.fields import encode_properties
from ..message import Message
from ..mqtt.topics import to_routing_key
from ..publishing import Source

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .mqtt_session import MQTTService

log = logging.getLogger("broker.mqtt")

PREFIX = "$SYS/broker/"
QUEUE_PREFIX = "mqtt-subscription-"
# (topic suffix, counter attribute of MQTTService) for the load averages
LOADS = (("messages/received", "publish_received"), ("messages/sent", "publish_sent"),
         ("publish/received", "publish_received"), ("publish/sent", "publish_sent"),
         ("bytes/received", "bytes_received"), ("bytes/sent", "bytes_sent"),
         ("sockets", "sockets_opened"), ("connections", "connections_accepted"))
PERIODS = ((60.0, "1min"), (300.0, "5min"), (900.0, "15min"))

# transient, and expiring after 60 s as Mosquitto's $SYS messages do: a persistent session
# subscribed to $SYS/# that stays away does not pile up every round's values
EXPIRATION_MS = "60000"
_PROPS = {"delivery_mode": 1, "expiration": EXPIRATION_MS,
          "headers": {"x-mqtt-publish-qos": 0, "x-mqtt-dup": False}}
_RAW = encode_properties(_PROPS)


class SysTopics:
    """Publishes the status of ``service``'s broker; ``run`` is a task of the MQTT
    listener's nursery."""

    def __init__(self, service: MQTTService, interval: float):
        self.service = service
        self.broker = service.broker
        self.interval = interval
        self.started = time.monotonic()
        self.max_clients = 0
        # what each vhost's subscribers were last sent: topic -> payload
        self.sent: dict[str, dict[str, bytes]] = {}
        self._loads: dict[tuple[str, float], float] = {}
        self._last_counts: dict[str, int] = {}
        self._last_time: float | None = None
        self.rounds = 0

    async def run(self) -> None:
        while True:
            try:
                self.publish_round()
            except Exception:  # a status round must never end the MQTT listener
                log.exception("$SYS round failed")
            await trio.sleep(self.interval)

    def values(self, now: float | None = None) -> dict[str, str]:
        """Every topic's current value (as text, Mosquitto's formats)."""
        now = time.monotonic() if now is None else now
        service = self.service
        connected = len(service.clients)
        self.max_clients = max(self.max_clients, connected)
        disconnected, subscriptions = self._sessions_and_subscriptions()
        retained = sum(len(t) for t in service.retained.by_vhost.values())
        v = {
            "version": f"TrioMQ version {__version__}",
            "uptime": f"{int(now - self.started)} seconds",
            "clients/connected": connected,
            "clients/active": connected,  # Mosquitto's deprecated name for the same
            "clients/disconnected": disconnected,
            "clients/inactive": disconnected,
            "clients/total": connected + disconnected,
            "clients/maximum": self.max_clients,
            "clients/expired": 0,
            "messages/received": service.publish_received,
            "messages/sent": service.publish_sent,
            "publish/messages/received": service.publish_received,
            "publish/messages/sent": service.publish_sent,
            "publish/messages/dropped": 0,
            "publish/bytes/received": service.publish_bytes_received,
            "publish/bytes/sent": service.publish_bytes_sent,
            "bytes/received": service.bytes_received,
            "bytes/sent": service.bytes_sent,
            "subscriptions/count": subscriptions,
            "retained messages/count": retained,
        }
        v.update(self._load_values(now))
        return {PREFIX + k: str(val) for k, val in v.items()}

    def _load_values(self, now: float) -> dict[str, str]:
        """Mosquitto's load averages: the per-minute rate since the last round, decayed
        into a 1, 5 and 15 minute exponential moving average."""
        service = self.service
        counts = {attr: getattr(service, attr) for _, attr in LOADS}  # counters LOADS names
        last_time, self._last_time = self._last_time, now
        last_counts, self._last_counts = self._last_counts, counts
        out: dict[str, str] = {}
        if last_time is None or now <= last_time:
            return out
        elapsed = now - last_time
        for name, attr in LOADS:
            rate = (counts[attr] - last_counts[attr]) * 60.0 / elapsed
            for seconds, label in PERIODS:
                exponent = math.exp(-elapsed / seconds)
                key = (name, seconds)
                value = rate + exponent * (self._loads.get(key, 0.0) - rate)
                self._loads[key] = value
                out[f"load/{name}/{label}"] = f"{value:.2f}"
        return out

    def _sessions_and_subscriptions(self) -> tuple[int, int]:
        """(non-clean sessions without a connection, MQTT subscriptions) over the vhosts:
        read from the subscription queues and their bindings (once a round)."""
        service = self.service
        exchange = service.exchange
        away: set[tuple[str, str]] = set()
        subscriptions = 0
        for vhost in self.broker.vhosts.values():
            for name, q in vhost.queues.items():
                if name.startswith(QUEUE_PREFIX) and not q.auto_delete:
                    client_id = name[len(QUEUE_PREFIX):-4]  # less 'qos0' / 'qos1'
                    if (vhost.name, client_id) not in service.clients:
                        away.add((vhost.name, client_id))
            x = vhost.exchanges.get(exchange)
            if x is not None:
                for binding in x.bindings.values():
                    if binding.destination.name.startswith(QUEUE_PREFIX):
                        subscriptions += 1
        return len(away), subscriptions

    def publish_round(self) -> None:
        values = self.values()
        self.rounds += 1
        for vhost in list(self.broker.vhosts.values()):
            sent = self.sent.setdefault(vhost.name, {})
            for topic, text in values.items():
                payload = text.encode()
                if sent.get(topic) != payload:
                    sent[topic] = payload
                    self._publish(vhost, topic, payload)
        for name in [n for n in self.sent if n not in self.broker.vhosts]:
            del self.sent[name]  # a deleted vhost

    def _publish(self, vhost: VirtualHost, topic: str, payload: bytes) -> None:
        """As a client's retained QoS 0 PUBLISH, through the broker's publish path; not
        audited (no user published it; each cluster node reports its own status)."""
        self.service.retained.set_volatile(vhost.name, topic, payload, 0)
        key = to_routing_key(topic)
        message = Message(self.service.exchange, key, _RAW, _PROPS, payload)
        self.broker.publishing.publish(Source(vhost, None, "$SYS"), message,
                                       audited=False)
