"""MQTT topics and AMQP routing keys, as RabbitMQ's MQTT plugin maps them.

A PUBLISH to ``a/b/c`` goes to the topic exchange with routing key ``a.b.c``; a SUBSCRIBE
to ``a/+/#`` binds with ``a.*.#``; a delivery's routing key ``a.b.c`` is shown to MQTT
subscribers as ``a/b/c``. A '.' inside an MQTT topic level therefore becomes a level
separator on the AMQP side (as in RabbitMQ). Pure functions, no broker state.
"""
from __future__ import annotations

_TO_AMQP = str.maketrans({"/": ".", "+": "*"})
_TO_MQTT = str.maketrans({".": "/", "*": "+"})


def to_routing_key(topic: str) -> str:
    """A PUBLISH topic name or a SUBSCRIBE filter as an AMQP routing / binding key."""
    return topic.translate(_TO_AMQP)


def to_mqtt_topic(routing_key: str) -> str:
    """An AMQP routing key as the topic name MQTT subscribers see."""
    return routing_key.translate(_TO_MQTT)


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
