"""MQTT <-> AMQP mapping: message properties, headers, binding args, queue names; no routing."""
from __future__ import annotations

import math
from typing import Any

from ..amqp.fields import encode_properties
from ..message import Message
from ..mqtt import properties as P
from ..mqtt.topics import to_mqtt_topic, to_routing_key
from ..queues.args import MAX_EXPIRY_MS
from ..queues.entry import QueueEntry

MAX_KEY = 255  # an AMQP shortstr: routing keys and queue names
NO_QUEUES: frozenset = frozenset()
# empty stand-ins shared by sessions until they need their own: each place that would
# write to one replaces it first (thousands of idle connections carry no containers)
NO_LIST: list = []
NO_DECISIONS: dict = {}
NO_DICT: dict = {}
# the binding argument carrying a subscription's granted QoS (a binding without it is one
# stored by an earlier version: QoS 1 in the ...qos1 queue, QoS 0 in the ...qos0 queue)
QOS_ARG = "x-mqtt-qos"
# MQTT 5 subscription options kept in the binding (so a stored session gets them back):
# No Local (0x04) and Retain As Published (0x08) bits, and the Subscription Identifier
OPTIONS_ARG = "x-mqtt-options"
SUBSCRIPTION_ID_ARG = "x-mqtt-subscription-id"
NO_LOCAL, RETAIN_AS_PUBLISHED = 0x04, 0x08
# headers on messages that need them: the v5 publisher's client id (No Local), and the
# RETAIN flag of a PUBLISH (Retain As Published)
PUBLISHER_HEADER = "x-mqtt-publisher"
SHARED_ARG = "x-mqtt-shared"  # the share name of a shared subscription's binding
RETAIN_HEADER = "x-mqtt-retain"
# MQTT 5.0: the inbound QoS 1/2 PUBLISHes a client may have without PUBACK/PUBCOMP, and the
# topic aliases it may define, as the CONNACK states them (both enforced by the connection)
RECEIVE_MAXIMUM = 1024
TOPIC_ALIAS_MAXIMUM = 64
NEVER_EXPIRES = 0xFFFFFFFF  # Session Expiry Interval: the session does not expire
# the longest x-expires / expiration the queues take (RabbitMQ's ten years), in seconds:
# a longer Session Expiry Interval is lowered to it (and the CONNACK says so), a longer
# Message Expiry Interval too
MAX_EXPIRY = MAX_EXPIRY_MS // 1000


def amqp_props(qos: int, dup: bool, retain: bool = False) -> tuple[dict, bytes]:
    headers: dict[str, Any] = {"x-mqtt-publish-qos": qos, "x-mqtt-dup": dup}
    if retain:
        headers[RETAIN_HEADER] = True
    props = {"delivery_mode": 2 if qos else 1, "headers": headers}
    return props, encode_properties(props)


# the property sets an MQTT publish can have, built and encoded once and shared by every
# such message (a Message's properties are never changed once routed: a header is changed
# on a copy, Message.with_changes); retained publishes say so (Retain As Published)
PROPS = {(q, d): amqp_props(q, d) for q in (0, 1, 2) for d in (False, True)}
# the same, indexed [qos][dup] (the publish loop's lookup: no key tuple)
PROPS_BY_QOS = [[PROPS[(q, False)], PROPS[(q, True)]] for q in (0, 1, 2)]
PROPS_RETAINED = {(q, d): amqp_props(q, d, True) for q in (0, 1, 2) for d in (False, True)}


# MQTT 5 PUBLISH properties that travel with the message (as AMQP properties and headers)
MAPPED = frozenset((P.PAYLOAD_FORMAT_INDICATOR, P.MESSAGE_EXPIRY_INTERVAL, P.CONTENT_TYPE,
                     P.RESPONSE_TOPIC, P.CORRELATION_DATA, P.USER_PROPERTY))
# headers carrying what has no AMQP property of its own (and the ones above, internal)
CORRELATION_HEADER = "x-mqtt-correlation-data"  # correlation data that is not a shortstr
FORMAT_HEADER = "x-mqtt-payload-format-indicator"


def is_utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def v5_message_props(qos: int, dup: bool, v5: dict, retain: bool = False,
                      publisher: str | None = None) -> tuple[dict, bytes]:
    """The AMQP properties of a message published with MQTT 5 properties (docs/mqtt.md):
    user properties -> headers (a name given twice: an array of its values), Content
    Type -> content_type, Response Topic -> reply_to (as a routing key), Correlation Data
    -> correlation_id when it is UTF-8 of at most 255 bytes, else the header
    x-mqtt-correlation-data (bytes), Message Expiry Interval -> expiration (ms), Payload
    Format Indicator 1 -> the header x-mqtt-payload-format-indicator."""
    base = (PROPS_RETAINED if retain else PROPS)[(qos, dup)][0]
    headers: dict[str, Any] = {}
    for name, value in v5.get(P.USER_PROPERTY, ()):
        if name.startswith("x-mqtt-") or len(name.encode()) > MAX_KEY:
            # the broker's own headers are not a client's to set; an AMQP table key is a
            # shortstr (a longer name cannot travel as a header)
            continue
        old = headers.get(name)
        if old is None:
            headers[name] = value
        elif isinstance(old, list):
            old.append(value)
        else:
            headers[name] = [old, value]
    headers.update(base["headers"])
    if publisher is not None:
        headers[PUBLISHER_HEADER] = publisher
    props: dict[str, Any] = {"delivery_mode": base["delivery_mode"], "headers": headers}
    expiry = v5.get(P.MESSAGE_EXPIRY_INTERVAL)
    if expiry is not None:
        props["expiration"] = str(min(expiry, MAX_EXPIRY) * 1000)
    content_type = v5.get(P.CONTENT_TYPE)
    if content_type is not None and len(content_type.encode()) <= MAX_KEY:
        props["content_type"] = content_type
    response = v5.get(P.RESPONSE_TOPIC)
    if response is not None:
        key = to_routing_key(response)
        if len(key.encode()) <= MAX_KEY:
            props["reply_to"] = key
    data = v5.get(P.CORRELATION_DATA)
    if data is not None:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and len(data) <= MAX_KEY:
            props["correlation_id"] = text
        else:
            headers[CORRELATION_HEADER] = data
    if v5.get(P.PAYLOAD_FORMAT_INDICATOR):
        headers[FORMAT_HEADER] = 1
    return props, encode_properties(props)


def v5_delivery_props(message: Message, entry: QueueEntry, now: float) -> dict[int, Any]:
    """A v5 PUBLISH's encoded properties from an AMQP message: the mapping back of
    ``v5_message_props`` (any AMQP header that is not the broker's becomes a user
    property), and the Message Expiry Interval left (section 3.3.2.3.3)."""
    mp = message.properties
    out: dict[int, Any] = {}
    headers = mp.get("headers")
    if headers:
        users = []
        for name, value in headers.items():
            if name.startswith("x-mqtt-"):
                continue
            for v in (value if isinstance(value, list) else (value,)):
                if isinstance(v, bytes):
                    v = v.decode("utf-8", "replace")
                elif not isinstance(v, str):
                    if isinstance(v, (dict, list)):
                        continue  # a table or nested array has no string form worth sending
                    v = str(v)
                users.append((name, v))
        if users:
            out[P.USER_PROPERTY] = users
        if headers.get(FORMAT_HEADER) == 1:
            out[P.PAYLOAD_FORMAT_INDICATOR] = 1
        data = headers.get(CORRELATION_HEADER)
        if isinstance(data, bytes):
            out[P.CORRELATION_DATA] = data
    if "content_type" in mp:
        out[P.CONTENT_TYPE] = mp["content_type"]
    if "reply_to" in mp:
        out[P.RESPONSE_TOPIC] = to_mqtt_topic(mp["reply_to"])
    if "correlation_id" in mp and P.CORRELATION_DATA not in out:
        out[P.CORRELATION_DATA] = mp["correlation_id"].encode("utf-8", "replace")
    if "expiration" in mp and entry is not None and entry.expires_at is not None:
        out[P.MESSAGE_EXPIRY_INTERVAL] = max(1, math.ceil(entry.expires_at - now))
    return out


def encode_v5_props(props: dict[int, Any]) -> bytes:
    if not props:
        return b""
    try:
        return P.encode(props)
    except ValueError:  # a value MQTT cannot carry (a string over 65535 bytes)
        return b""


def shared_queue_name(group: str, topic_filter: str) -> str:
    """The queue of the shared subscription ``$share/<group>/<filter>``: one per group and
    filter, its members' sessions its competing consumers."""
    return f"mqtt-shared-{group}-{topic_filter}"


def split_shared(topic_filter: str) -> tuple[str, str] | None:
    """(share name, filter) of ``$share/<name>/<filter>`` (section 4.8.2), None if it is
    not a valid one."""
    parts = topic_filter.split("/", 2)
    if len(parts) < 3 or not parts[1] or not parts[2] or "+" in parts[1] or "#" in parts[1]:
        return None
    return parts[1], parts[2]


def queue_names(client_id: str) -> tuple[str, str]:
    """(the QoS 0 queue of sessions stored by earlier versions, the subscription queue)"""
    base = f"mqtt-subscription-{client_id}"
    return base + "qos0", base + "qos1"
