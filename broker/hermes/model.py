"""Hermes' topic and subscription definitions: parsed from its management API's JSON,
validated apart from behaviour, rendered back in the same shape.

``parse_topic(data, current=None)`` / ``parse_subscription(topic, data, current=None)``
return a new definition (an update when ``current`` is given: absent fields keep their
value) or raise ``HermesError`` (HTTP 400 naming the field). Definitions are plain
dataclasses: ``to_json()`` is both the API's answer and the stored metadata record.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from ..schemas import SchemaError, backward_problem, compiled

# a topic is an exchange, a subscription the queue "{topic}.{name}" consumed with the tag
# "hermes.{topic}.{name}": AMQP short strings, at most 255 bytes (names are ASCII)
MAX_NAME = 255 - len("hermes.")
TOPIC_NAME = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$")
SUBSCRIPTION_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
MAX_INFLIGHT_TTL = 7200  # seconds, Hermes' hard limit
RETENTION_SECONDS = {"DAYS": 86400, "HOURS": 3600, "MINUTES": 60, "SECONDS": 1}
MAX_RETENTION_MS = 2**32 - 1  # a queue's message TTL at most (RabbitMQ's timer limit)


class HermesError(Exception):
    """An HTTP error with Hermes' JSON body ``{"message": ..., "code": ...}``."""

    def __init__(self, status: int, message: str, code: str = "VALIDATION_ERROR",
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"message": self.message, "code": self.code}


def invalid(field_name: str, problem: str) -> HermesError:
    return HermesError(400, f"{field_name}: {problem}")


def _get(data: dict, key: str, kind: type | tuple, default: Any, prefix: str = "") -> Any:
    value = data.get(key, default)
    if value is None:
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (kind is int and (isinstance(value, bool) or not isinstance(value, int))) or \
            not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise invalid(prefix + key, f"must be {name}, got {value!r}"[:200])
    return value


def _choice(data: dict, key: str, choices: tuple, default: str) -> str:
    value = _get(data, key, str, default)
    upper = value.upper()
    if upper not in choices:
        raise invalid(key, f"must be one of {', '.join(choices)}, got {value!r}"[:200])
    return upper


def _positive(data: dict, key: str, default, prefix: str, kind: type = int, minimum=1,
              maximum=None):
    value = _get(data, key, kind, default, prefix)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise invalid(prefix + key, f"must be {bound}, got {value!r}")
    return value


def _owner(data: dict, default: dict) -> dict:
    owner = _get(data, "owner", dict, default)
    return {"source": str(owner.get("source", "Plaintext")), "id": str(owner.get("id", ""))}


# ---- topics ---------------------------------------------------------------------------------
@dataclass
class TopicDef:
    name: str
    description: str = ""
    contentType: str = "JSON"  # Hermes' field names, as on the wire
    ack: str = "ALL"
    retentionTime: dict = field(default_factory=lambda: {"duration": 1, "retentionUnit": "DAYS"})
    maxMessageSize: int = 1024 * 1024
    owner: dict = field(default_factory=lambda: {"source": "Plaintext", "id": ""})
    schema: str | None = None  # AVRO: the schema (JSON text), latest version
    schemaVersion: int = 0

    @property
    def group(self) -> str:
        return self.name.rsplit(".", 1)[0]

    def to_json(self) -> dict:
        out = asdict(self)
        out["groupName"] = self.group
        return out


def parse_topic(data: Any, current: TopicDef | None = None, max_size: int | None = None) -> TopicDef:
    if not isinstance(data, dict):
        raise HermesError(400, "topic definition must be a JSON object")
    base = current or TopicDef(name="")
    if current is None:
        name = _get(data, "name", str, "")
        if not TOPIC_NAME.match(name):
            raise invalid("name", f"must be 'group.topic' (letters, digits, '_' and '-' "
                                  f"around dots), got {name!r}"[:200])
        if len(name) > MAX_NAME:
            raise invalid("name", f"longer than {MAX_NAME} characters")
    else:
        name = current.name
        if data.get("name") not in (None, name):
            raise invalid("name", "cannot be changed")
    content_type = _choice(data, "contentType", ("JSON", "AVRO"), base.contentType)
    if current is not None and content_type != current.contentType:
        raise invalid("contentType", "cannot be changed")
    retention = _get(data, "retentionTime", dict, base.retentionTime)
    duration = _positive(retention, "duration", base.retentionTime.get("duration", 1), "retentionTime.")
    unit = _choice(retention, "retentionUnit", ("DAYS", "HOURS", "MINUTES", "SECONDS"),
                   base.retentionTime.get("retentionUnit", "DAYS"))
    if duration * RETENTION_SECONDS[unit] * 1000 > MAX_RETENTION_MS:
        raise invalid("retentionTime", f"at most {MAX_RETENTION_MS // 86_400_000} days "
                                       "(it is the message TTL of the subscription queues)")
    topic = replace(
        base, name=name,
        description=_get(data, "description", str, base.description),
        contentType=content_type,
        ack=_choice(data, "ack", ("ALL", "LEADER"), base.ack),
        retentionTime={"duration": duration, "retentionUnit": unit},
        maxMessageSize=_positive(data, "maxMessageSize", base.maxMessageSize, "",
                                 maximum=max_size),
        owner=_owner(data, base.owner),
    )
    if "schema" in data and data["schema"] is not None:
        set_schema(topic, data["schema"], current.schema if current else None)
    if topic.contentType == "AVRO" and topic.schema is None:
        raise invalid("schema", "an AVRO topic needs an Avro schema")
    return topic


def set_schema(topic: TopicDef, schema: Any, old: str | None) -> None:
    """Give ``topic`` a new schema version; 400 if invalid or not backward compatible."""
    try:
        new = compiled(schema if isinstance(schema, str) else _json_text(schema))
    except SchemaError as exc:
        raise invalid("schema", str(exc)) from None
    except RecursionError:  # schema text nested past what the JSON decoder recurses
        raise invalid("schema", "nested too deeply") from None
    if old is not None:
        try:
            problem = backward_problem(compiled(old), new)
        except (TypeError, ValueError) as exc:  # a name or type of the wrong JSON type
            problem = f"invalid Avro schema: {exc}"[:200]
        if problem:
            raise invalid("schema", problem)
    if new.text != old:
        topic.schema = new.text
        topic.schemaVersion += 1


def _json_text(value: Any) -> str:
    import json
    return json.dumps(value)


# ---- subscriptions ---------------------------------------------------------------------------
@dataclass
class SubscriptionPolicy:
    rate: float = 400.0  # max requests per second
    messageTtl: int = 3600  # s a message may stay in flight (retries)
    messageBackoff: int = 100  # ms between retries
    backoffMultiplier: float = 1.0
    backoffMaxIntervalInSec: int = 600
    retryClientErrors: bool = False
    requestTimeout: int = 1000  # ms
    inflightSize: int = 100  # requests (SERIAL) at once
    ordered: bool = False  # one request at a time, in queue order (a failure holds the rest)


@dataclass
class BatchPolicy:
    batchSize: int = 100  # messages per request
    batchTime: int = 100  # ms to fill a batch
    batchVolume: int = 64 * 1024  # body bytes per request


@dataclass
class SubscriptionDef:
    topicName: str
    name: str
    endpoint: str
    description: str = ""
    owner: dict = field(default_factory=lambda: {"source": "Plaintext", "id": ""})
    contentType: str = "JSON"  # JSON: AVRO messages are pushed as JSON
    deliveryType: str = "SERIAL"
    state: str = "ACTIVE"
    subscriptionPolicy: SubscriptionPolicy = field(default_factory=SubscriptionPolicy)
    batchSubscriptionPolicy: BatchPolicy = field(default_factory=BatchPolicy)
    headers: list = field(default_factory=list)  # [{"name": ..., "value": ...}]
    # where a message goes after its TTL or a refused 4xx: None = the '{topic}.{name}.dead' queue
    deadLetterExchange: str | None = None

    @property
    def qualified(self) -> str:
        return f"{self.topicName}${self.name}"

    def to_json(self) -> dict:
        return asdict(self)


def _policy(data: dict, current: SubscriptionPolicy) -> SubscriptionPolicy:
    p = "subscriptionPolicy."
    return SubscriptionPolicy(
        rate=_positive(data, "rate", current.rate, p, float, minimum=0.01),
        messageTtl=_positive(data, "messageTtl", current.messageTtl, p, minimum=0,
                             maximum=MAX_INFLIGHT_TTL),
        messageBackoff=_positive(data, "messageBackoff", current.messageBackoff, p, minimum=0),
        backoffMultiplier=_positive(data, "backoffMultiplier", current.backoffMultiplier, p, float,
                                    minimum=1.0),
        backoffMaxIntervalInSec=_positive(data, "backoffMaxIntervalInSec",
                                          current.backoffMaxIntervalInSec, p),
        retryClientErrors=_get(data, "retryClientErrors", bool, current.retryClientErrors, p),
        requestTimeout=_positive(data, "requestTimeout", current.requestTimeout, p),
        inflightSize=_positive(data, "inflightSize", current.inflightSize, p, maximum=1000),
        ordered=_get(data, "ordered", bool, current.ordered, p),
    )


def _batch(data: dict, current: BatchPolicy) -> BatchPolicy:
    p = "batchSubscriptionPolicy."
    return BatchPolicy(
        batchSize=_positive(data, "batchSize", current.batchSize, p, maximum=10000),
        batchTime=_positive(data, "batchTime", current.batchTime, p, minimum=0),
        batchVolume=_positive(data, "batchVolume", current.batchVolume, p),
    )


def _endpoint(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid("endpoint", f"must be an http:// or https:// URL, got {value!r}"[:200])
    return value


def parse_subscription(topic: str, data: Any, current: SubscriptionDef | None = None,
                       name: str | None = None) -> SubscriptionDef:
    if not isinstance(data, dict):
        raise HermesError(400, "subscription definition must be a JSON object")
    if data.get("topicName") not in (None, topic):
        raise invalid("topicName", f"must be the topic of the path, '{topic}'")
    if current is None:
        sub_name = _get(data, "name", str, name or "")
        if not SUBSCRIPTION_NAME.match(sub_name):
            raise invalid("name", f"must be letters, digits, '_' or '-', got {sub_name!r}"[:200])
        if len(f"{topic}.{sub_name}") > MAX_NAME:
            raise invalid("name", f"with its topic's name longer than {MAX_NAME} characters")
        if "endpoint" not in data:
            raise invalid("endpoint", "is required")
        base = SubscriptionDef(topicName=topic, name=sub_name, endpoint="http://x")
    else:
        base = current
        if data.get("name") not in (None, current.name):
            raise invalid("name", "cannot be changed")
    headers = _get(data, "headers", list, base.headers)
    for h in headers:
        if not (isinstance(h, dict) and isinstance(h.get("name"), str)
                and isinstance(h.get("value"), str)):
            raise invalid("headers", "must be a list of {\"name\": ..., \"value\": ...}")
    dlx = _get(data, "deadLetterExchange", str, base.deadLetterExchange)
    return replace(
        base,
        endpoint=_endpoint(_get(data, "endpoint", str, base.endpoint)),
        description=_get(data, "description", str, base.description),
        owner=_owner(data, base.owner),
        contentType=_choice(data, "contentType", ("JSON", "AVRO"), base.contentType),
        deliveryType=_choice(data, "deliveryType", ("SERIAL", "BATCH"), base.deliveryType),
        state=_choice(data, "state", ("ACTIVE", "SUSPENDED"), base.state),
        subscriptionPolicy=_policy(_get(data, "subscriptionPolicy", dict, {}), base.subscriptionPolicy),
        batchSubscriptionPolicy=_batch(_get(data, "batchSubscriptionPolicy", dict, {}),
                                       base.batchSubscriptionPolicy),
        headers=[{"name": h["name"], "value": h["value"]} for h in headers],
        deadLetterExchange=dlx,
    )


def subscription_from_record(value: dict) -> SubscriptionDef:
    data = dict(value)
    policy = SubscriptionPolicy(**data.pop("subscriptionPolicy", {}))
    batch = BatchPolicy(**data.pop("batchSubscriptionPolicy", {}))
    return SubscriptionDef(subscriptionPolicy=policy, batchSubscriptionPolicy=batch, **data)


def topic_from_record(value: dict) -> TopicDef:
    data = {k: v for k, v in value.items() if k != "groupName"}
    return TopicDef(**data)
