"""/api/exchanges/{vhost}/{name}/publish and /api/queues/{vhost}/{name}/get: a message in
through the publish path, messages out as the API shows them. Does not declare, list or
delete anything (api_entities, api_bindings)."""
from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING

from starlette.requests import Request

from .. import errors
from ..amqp.fields import encode_properties
from ..message import Message
from ..publishing import ROUTED, STORING, TAKEN, Source
from ..queues.ttl import ExpirationError, parse_expiration
from .common import (
    amqp_error,
    body,
    check_perm,
    flag,
    json_response,
    jsonable,
    param,
    table,
    text,
    vhost_scope,
)
from .entity_json import exchange_name
from .http import ApiError

if TYPE_CHECKING:
    from ..broker import Broker
    from ..vhost import VirtualHost


def _payload_bytes(data: dict) -> bytes:
    payload = text(data, "payload", "")
    encoding = text(data, "payload_encoding", "string")
    if encoding == "string":
        return payload.encode("utf-8")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "field 'payload': not valid base64") from None
    raise ApiError(400, f"field 'payload_encoding': expected string or base64, got "
                        f"{json.dumps(encoding)}")


def publish_message(broker: Broker, vhost: VirtualHost, exchange: str, routing_key: str, properties: dict,
                    payload: bytes, user: str | None = None, peer: str | None = None) -> bool:
    """Publish one message through the broker's publish path, as an AMQP publish without
    confirms would (publish hooks: a delay, a half message; audited as published by
    ``user`` from ``peer``); True if it reached a queue (or a hook took it over)."""
    try:
        raw = encode_properties(properties)
    except Exception as exc:  # a property of the wrong type
        raise ApiError(400, f"field 'properties': {exc}") from None
    message = Message(exchange, routing_key, raw, properties, payload)
    audit = broker.audit
    if audit is not None:
        audit.clock_start()
    try:
        outcome = broker.publishing.publish(Source(vhost, user, peer), message)
    except errors.AMQPError as exc:  # a publish hook refused it (an invalid x-delay, ...)
        raise amqp_error(exc) from None
    finally:
        if audit is not None:
            audit.clock_stop()
    return outcome is ROUTED or outcome is STORING or outcome is TAKEN


_PROPERTY_TYPES = {"content_type": str, "content_encoding": str, "headers": dict,
                   "delivery_mode": int, "priority": int, "correlation_id": str, "reply_to": str,
                   "expiration": str, "message_id": str, "timestamp": int, "type": str,
                   "user_id": str, "app_id": str, "cluster_id": str}


def _properties(data: dict) -> dict:
    props = table(data, "properties")
    out = {}
    for key, value in props.items():
        kind = _PROPERTY_TYPES.get(key)
        if kind is None:
            raise ApiError(400, f"field 'properties.{key}': unknown message property")
        if kind is int and isinstance(value, str) and value.isdigit():
            value = int(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ApiError(400, f"field 'properties.{key}': expected {kind.__name__}")
        # what the basic properties can carry: checked here, not when a consumer is sent it
        if isinstance(value, str) and len(value.encode()) > 255:
            raise ApiError(400, f"field 'properties.{key}': longer than 255 bytes")
        limit = 255 if key in ("delivery_mode", "priority") else None
        if isinstance(value, int) and limit is not None and not 0 <= value <= limit:
            raise ApiError(400, f"field 'properties.{key}': expected 0 to 255")
        if isinstance(value, int) and key == "timestamp" and value < 0:
            raise ApiError(400, f"field 'properties.{key}': expected a non-negative integer")
        if key == "expiration":
            try:
                parse_expiration(value)
            except ExpirationError as exc:
                raise ApiError(400, f"field 'properties.{key}': {exc}") from None
        out[key] = value
    return out


async def publish(request: Request):
    user, broker, vhost = await vhost_scope(request, creating=True)
    name = exchange_name(request)
    data = await body(request, {"routing_key", "payload", "payload_encoding", "properties",
                                "vhost", "name", "exchange", "props", "mandatory"},
                      required=("routing_key", "payload", "payload_encoding", "properties"))
    x = vhost.exchanges.get(name)
    if x is None:
        raise ApiError(404, "Not Found")
    check_perm(broker, user, vhost.name, "exchange", name, "write")
    props = _properties(data)
    if "user_id" in props and props["user_id"] != user.name:
        raise ApiError(400, f"user_id property set to '{props['user_id']}' but authenticated "
                            f"user was '{user.name}'")
    if broker.stops_publishers:
        # a resource alarm stops every publisher's reads at the edge; an HTTP publish has
        # no reads to stop, so it is refused, as Hermes refuses one (RabbitMQ's direct
        # connection lets it through; the aliveness test, which RabbitMQ keeps working
        # under an alarm, still does)
        raise ApiError(503, "resource alarm(s) in effect, publishers are blocked: "
                            + ", ".join(sorted(broker.alarms)), headers={"Retry-After": "1"})
    routed = publish_message(broker, vhost, name, text(data, "routing_key"), props,
                             _payload_bytes(data), user.name,
                             request.client.host if request.client else None)
    broker.message_totals.add(vhost.name, publish=1, confirm=1, return_unroutable=int(not routed))
    return json_response({"routed": routed})


# ---- queues ------------------------------------------------------------------------------



_ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true",
             "reject_requeue_false")


def _int_field(data: dict, key: str, default: int | None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"field '{key}': expected an integer, got {json.dumps(value)}")
    return value


async def get_messages(request: Request):
    user, broker, vhost = await vhost_scope(request)
    data = await body(request, {"count", "ackmode", "encoding", "truncate", "requeue",
                                "vhost", "name", "queue", "payload_file"})
    q = vhost.find_queue(param(request, "name"))
    if q is None:
        raise ApiError(404, f"NOT_FOUND - no queue '{param(request, 'name')}' in vhost "
                            f"'{vhost.name}'", "not_found")
    check_perm(broker, user, vhost.name, "queue", q.name, "read")
    count = _int_field(data, "count", 1) or 0
    if count < 1:
        raise ApiError(400, "field 'count': must be at least 1")
    ackmode = data.get("ackmode")
    if ackmode is None and "requeue" in data:  # RabbitMQ < 3.7 clients
        ackmode = "ack_requeue_true" if flag(data, "requeue", True) else "ack_requeue_false"
    ackmode = ackmode or "ack_requeue_true"
    if ackmode not in _ACKMODES:
        raise ApiError(400, f"field 'ackmode': expected one of {', '.join(_ACKMODES)}")
    encoding = data.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise ApiError(400, "field 'encoding': expected auto or base64")
    truncate = _int_field(data, "truncate", None)
    if q.exclusive_owner is not None:
        raise ApiError(400, f"cannot obtain exclusive access to locked queue '{q.name}' in "
                            f"vhost '{vhost.name}'")
    entries = []
    out = []
    for _ in range(count):
        try:
            entry = q.get()
        except errors.AMQPError as exc:  # a stream: RabbitMQ 3.10 answers "540 <why>"
            raise ApiError(400, f"{exc.code} {exc.explanation}", "bad_request") from None
        if entry is None:
            break
        entries.append(entry)
        m = entry.message
        payload = m.body if truncate is None else m.body[:truncate]
        if encoding == "auto":
            try:
                shown, enc = payload.decode("utf-8"), "string"
            except UnicodeDecodeError:
                shown, enc = base64.b64encode(payload).decode(), "base64"
        else:
            shown, enc = base64.b64encode(payload).decode(), "base64"
        out.append({"payload_bytes": len(m.body), "redelivered": entry.redelivered,
                    "exchange": m.exchange, "routing_key": m.routing_key,
                    "message_count": q.message_count,
                    "properties": jsonable(m.properties), "payload": shown,
                    "payload_encoding": enc})
    if entries:
        q.stats_get += len(entries)  # RabbitMQ's own gets go through a channel, with ack
        q.unacked_count += len(entries)  # as a basic.get with ack; settled below
        q.unacked_bytes += sum(len(e.message.body) for e in entries)
        if ackmode == "ack_requeue_true" or ackmode == "reject_requeue_true":
            q.requeue(sorted(((e, None) for e in entries), key=lambda p: -p[0].seq))
        elif ackmode == "ack_requeue_false":
            for e in entries:
                q.ack(e, None)
        else:
            for e in entries:
                q.reject(e, None)
    return json_response(out)


# ---- bindings ----------------------------------------------------------------------------

