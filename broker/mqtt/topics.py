"""MQTT topics and AMQP routing keys.

A PUBLISH to ``a/b/c`` goes to the topic exchange with routing key ``a.b.c``; a SUBSCRIBE
to ``a/+/#`` binds with ``a.*.#``; a delivery's routing key ``a.b.c`` is shown to MQTT
subscribers as ``a/b/c``. Unlike RabbitMQ's plugin, an MQTT topic means exactly itself: the
characters AMQP patterns give a meaning to inside a level ('.', '*') are escaped as
``%2E`` and ``%2A`` (and '%' as ``%25``), so ``a.b/c`` is one AMQP word ``a%2Eb`` then
``c``, and a filter ``P/*`` matches the topic ``P/*`` only. Pure functions, no broker state.
"""
from __future__ import annotations

import re

_TO_AMQP = str.maketrans({"/": ".", "+": "*"})
_ESCAPED = re.compile("%2[5AE]")
_UNESCAPE = {"%25": "%", "%2A": "*", "%2E": "."}


def to_routing_key(topic: str) -> str:
    """A PUBLISH topic name or a SUBSCRIBE filter as an AMQP routing / binding key."""
    if "%" in topic or "." in topic or "*" in topic:
        topic = topic.replace("%", "%25").replace(".", "%2E").replace("*", "%2A")
    return topic.translate(_TO_AMQP)


def to_mqtt_topic(routing_key: str) -> str:
    """An AMQP routing key as the topic name MQTT subscribers see ('*' and '%' in a key
    published over AMQP stay as they are)."""
    topic = routing_key.replace(".", "/")
    if "%" in topic:
        topic = _ESCAPED.sub(lambda m: _UNESCAPE[m.group()], topic)
    return topic


def matches(topic_filter: str, topic: str) -> bool:
    """Whether ``topic`` (a name) matches ``topic_filter`` (section 4.7): '+' one level,
    '#' the rest including the parent; wildcards at the first level do not match topics
    beginning with '$'."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    flevels = topic_filter.split("/")
    tlevels = topic.split("/")
    for i, f in enumerate(flevels):
        if f == "#":
            return True
        if i >= len(tlevels):
            return False
        if f != "+" and f != tlevels[i]:
            return False
    return len(flevels) == len(tlevels)
