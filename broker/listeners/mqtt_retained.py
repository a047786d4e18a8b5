"""Retained MQTT messages: the last retained PUBLISH of each topic, per vhost, durable.

Kept in memory (a dict per vhost) and written through the store's metadata seam
(``Store.save_meta`` / ``delete_meta``, kind ``mqtt_retained``), so every store backend
keeps them across restarts and they come back through ``broker.restore_meta`` before the
listeners open. A write is ordered with the store's other writes: the PUBACK of a retained
QoS 1 publish waits for ``store.when_durable`` like a persistent message does.

A subscription gets the retained messages whose topics match its filter (wildcards
included, as the MQTT spec says); the lookup scans the vhost's retained topics.
"""
from __future__ import annotations

import base64
import hashlib
import logging

from ..mqtt.topics import matches

log = logging.getLogger("broker.mqtt")

KIND = "mqtt_retained"


def _key(vhost: str, topic: str) -> str:
    # the store's key is any string but some databases refuse NUL and long keys: a digest
    return hashlib.sha256(f"{vhost}\x00{topic}".encode()).hexdigest()


class RetainedStore:
    """Retained messages by vhost and topic. ``set`` replaces (an empty payload clears,
    section 3.3.1.3); ``matching`` lists what a new subscription receives."""

    def __init__(self, broker):
        self.store = broker.store
        self.by_vhost: dict[str, dict[str, tuple[bytes, int]]] = {}
        restorers = getattr(broker, "meta_restorers", None)
        if restorers is not None:
            restorers[KIND] = self._restore

    def _restore(self, key: str, value: dict) -> None:
        try:
            payload = base64.b64decode(value["payload"])
            self.by_vhost.setdefault(value["vhost"], {})[value["topic"]] = (payload,
                                                                            int(value["qos"]))
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring an unreadable retained message record %s", key)

    def set(self, vhost: str, topic: str, payload: bytes, qos: int) -> None:
        topics = self.by_vhost.setdefault(vhost, {})
        if not payload:
            if topics.pop(topic, None) is not None:
                self.store.delete_meta(KIND, _key(vhost, topic))
            return
        topics[topic] = (payload, qos)
        self.store.save_meta(KIND, _key(vhost, topic), {
            "vhost": vhost, "topic": topic, "qos": qos,
            "payload": base64.b64encode(payload).decode("ascii")})

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
        self.by_vhost.pop(vhost, None)
