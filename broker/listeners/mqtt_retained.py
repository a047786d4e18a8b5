"""Retained MQTT messages: the last retained PUBLISH of each topic, per vhost, durable.

Kept in memory (a dict per vhost) and written through the store's metadata seam
(``Store.save_meta`` / ``delete_meta``, kind ``mqtt_retained``), so every store backend
keeps them across restarts and they come back through ``broker.restore_meta`` before the
listeners open. A write is ordered with the store's other writes: the PUBACK of a retained
QoS 1 publish waits for ``store.when_durable`` like a persistent message does.

A subscription gets the retained messages whose topics match its filter (wildcards
included, as the MQTT spec says); the lookup scans the vhost's retained topics.

An MQTT 5 retained PUBLISH keeps its properties (``extra``: those a subscriber receives,
and the wall-clock time its Message Expiry Interval ends, after which it is not sent:
section 3.3.2.3.3), in the same record.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any

from ..mqtt import properties as P
from ..mqtt.topics import matches

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.mqtt")

KIND = "mqtt_retained"
_clock = time.time  # wall clock: an expiry time is stored and outlives a restart


def _key(vhost: str, topic: str) -> str:
    # the store's key is any string but some databases refuse NUL and long keys: a digest
    return hashlib.sha256(f"{vhost}\x00{topic}".encode()).hexdigest()


class RetainedStore:
    """Retained messages by vhost and topic. ``set`` replaces (an empty payload clears,
    section 3.3.1.3); ``matching`` lists what a new subscription receives."""

    def __init__(self, broker: Broker):
        self.store = broker.store
        self.by_vhost: dict[str, dict[str, tuple[bytes, int]]] = {}
        # (vhost, topic) -> (v5 properties kept, wall-clock expiry or None): MQTT 5 only
        self.extra: dict[tuple[str, str], tuple[dict[int, Any], float | None]] = {}
        broker.meta_restorers[KIND] = self._restore

    def _restore(self, key: str, value: dict) -> None:
        try:
            payload = base64.b64decode(value["payload"])
            self.by_vhost.setdefault(value["vhost"], {})[value["topic"]] = (payload,
                                                                            int(value["qos"]))
            if "props" in value or value.get("expires") is not None:
                raw = base64.b64decode(value.get("props", ""))
                props = P.decode(raw, 0, len(raw), P.PUBLISH)[0] if raw else {}
                self.extra[(value["vhost"], value["topic"])] = (props, value.get("expires"))
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring an unreadable retained message record %s", key)

    def set(self, vhost: str, topic: str, payload: bytes, qos: int,
            v5: dict[int, Any] | None = None) -> None:
        """``v5``: the PUBLISH's MQTT 5 properties (those a subscriber gets are kept)."""
        topics = self.by_vhost.setdefault(vhost, {})
        self.extra.pop((vhost, topic), None)
        if not payload:
            if topics.pop(topic, None) is not None:
                self.store.delete_meta(KIND, _key(vhost, topic))
            return
        topics[topic] = (payload, qos)
        record: dict[str, Any] = {"vhost": vhost, "topic": topic, "qos": qos,
                                  "payload": base64.b64encode(payload).decode("ascii")}
        if v5:
            kept = {k: v for k, v in v5.items() if k in _KEPT}
            interval = v5.get(P.MESSAGE_EXPIRY_INTERVAL)
            expires = _clock() + interval if interval is not None else None
            if kept or expires is not None:
                self.extra[(vhost, topic)] = (kept, expires)
                record["props"] = base64.b64encode(P.encode(kept)).decode("ascii")
                record["expires"] = expires
        self.store.save_meta(KIND, _key(vhost, topic), record)

    def properties(self, vhost: str, topic: str) -> tuple[dict[int, Any], int | None] | None:
        """The v5 properties of a retained message and the seconds left of its Message
        Expiry Interval (None: none); None when it has none, or has expired (then it is
        dropped)."""
        extra = self.extra.get((vhost, topic))
        if extra is None:
            return None
        props, expires = extra
        if expires is None:
            return props, None
        left = expires - _clock()
        if left <= 0:
            self.set(vhost, topic, b"", 0)
            return None
        return props, max(1, int(left + 0.999))



    def set_volatile(self, vhost: str, topic: str, payload: bytes, qos: int) -> None:
        """Retained in memory only (the broker's own ``$SYS`` status: rewritten every few
        seconds, meaningless after a restart)."""
        self.by_vhost.setdefault(vhost, {})[topic] = (payload, qos)

    def get(self, vhost: str, topic: str) -> tuple[bytes, int] | None:
        return self.by_vhost.get(vhost, {}).get(topic)

    def matching(self, vhost: str, topic_filter: str) -> list[tuple[str, bytes, int]]:
        """(topic, payload, qos) of every retained message ``topic_filter`` matches."""
        topics = self.by_vhost.get(vhost)
        if not topics:
            return []
        if "+" not in topic_filter and "#" not in topic_filter:
            found = topics.get(topic_filter)
            return [] if found is None else [(topic_filter, *found)]
        return [(t, p, q) for t, (p, q) in topics.items() if matches(topic_filter, t)]

    def forget_vhost(self, vhost: str) -> None:
        for topic in list(self.by_vhost.get(vhost, {})):
            self.store.delete_meta(KIND, _key(vhost, topic))
            self.extra.pop((vhost, topic), None)
        self.by_vhost.pop(vhost, None)


# the properties of a retained PUBLISH its subscribers get (the expiry is kept as a time)
_KEPT = frozenset((P.PAYLOAD_FORMAT_INDICATOR, P.CONTENT_TYPE, P.RESPONSE_TOPIC,
                   P.CORRELATION_DATA, P.USER_PROPERTY))
