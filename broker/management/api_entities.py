"""/api/exchanges, /api/queues and /api/bindings: list, declare, delete, publish, get, purge."""
from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
from urllib.parse import quote_plus, unquote_plus

from starlette.requests import Request
from starlette.routing import Route

from .. import errors
from ..amqp import spec
from ..amqp.fields import encode_properties
from ..exchanges import EXCHANGE_TYPES
from ..message import Message
from ..publishing import ROUTED, STORING, TAKEN, Source
from ..queues.ttl import ExpirationError, parse_expiration
from ..queues.types import QUEUE_TYPES
from .common import (
    NODE,
    amqp_error,
    body,
    check_perm,
    created,
    flag,
    json_response,
    jsonable,
    no_content,
    param,
    table,
    text,
    vhost_scope,
    visible_vhosts,
)
from .http import ApiError
from .listing import paginate
from .stats import EXCHANGE_FIELDS, QUEUE_FIELDS, queue_counts, rate_details

# ---- rendering ---------------------------------------------------------------------------


def exchange_json(vhost, x, sampler=None) -> dict:
    out = {"arguments": jsonable(x.arguments), "auto_delete": x.auto_delete,
           "durable": x.durable, "internal": x.internal, "name": x.name,
           "type": x.type_name or "direct", "user_who_performed_action": "rmq-internal",
           "vhost": vhost.name}
    if x.stats_publish_in and sampler is not None:  # as RabbitMQ: once it saw traffic
        out["message_stats"] = rate_details(
            dict(zip(EXCHANGE_FIELDS, (x.stats_publish_in, x.stats_publish_out), strict=True)),
            sampler.exchange_rates(x))
    policy = getattr(x, "policy", None)
    if policy is not None:
        out["policy"] = policy
    return out


def queue_json(broker, vhost, q) -> dict:
    ready = q.message_count
    unacked = q.unacked_count
    sampler = broker.stats_sampler
    rates = sampler.queue_rates(q)
    consumers = q.consumers
    exclusive_tag = None
    if consumers and getattr(consumers[0], "exclusive", False):
        exclusive_tag = consumers[0].tag
    ready_bytes = q.ready_bytes
    return {
        "arguments": jsonable(q.arguments),
        "auto_delete": q.auto_delete,
        "backing_queue_status": {"mode": "default", "len": ready},
        "consumer_capacity": 1.0 if consumers else 0.0,
        "consumer_utilisation": 1.0 if consumers else None,
        "consumers": len(consumers),
        "durable": q.durable,
        "effective_policy_definition": jsonable(q.effective_policy_definition),
        "exclusive": q.exclusive_owner is not None,
        "exclusive_consumer_tag": exclusive_tag,
        "head_message_timestamp": None,
        "memory": 0,
        "message_bytes": ready_bytes + q.unacked_bytes,
        "message_bytes_persistent": ready_bytes if q.store is not None else 0,
        "message_bytes_ram": ready_bytes,
        "message_bytes_ready": ready_bytes,
        "message_bytes_unacknowledged": q.unacked_bytes,
        "message_stats": _queue_message_stats(q, rates),
        "messages": ready + unacked,
        "messages_details": {"rate": round(rates["messages_ready"]
                                           + rates["messages_unacknowledged"], 1)},
        "messages_persistent": ready if q.store is not None else 0,
        "messages_ram": ready + unacked,
        "messages_ready": ready,
        "messages_ready_details": {"rate": round(rates["messages_ready"], 1)},
        "messages_ready_ram": ready,
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": round(rates["messages_unacknowledged"], 1)},
        "messages_unacknowledged_ram": unacked,
        "name": q.name,
        "node": NODE,
        "operator_policy": q.operator_policy,
        "policy": q.policy,
        "recoverable_slaves": None,
        "single_active_consumer_tag": None,
        "state": "running",
        "type": q.queue_type.name,
        "vhost": vhost.name,
        **q.type_info(),  # a stream's segments and offsets
        # a replicated type's members, as RabbitMQ lists them (this node alone)
        **({} if q.queue_type.mirrored else {"leader": NODE, "members": [NODE],
                                             "online": [NODE]}),
        **_idle_since(sampler, q),
    }


def _idle_since(sampler, q) -> dict:
    """RabbitMQ's ``idle_since`` (present only while idle), in its local-time format."""
    since = sampler.queue_idle_since(q)
    if since is None:
        return {}
    stamp = datetime.datetime.fromtimestamp(since).astimezone()
    return {"idle_since": stamp.isoformat(timespec="milliseconds")}


def _queue_message_stats(q, rates: dict) -> dict:
    """RabbitMQ's queue counters: deliver is what remains of deliver_get (every delivery and
    get) once the no-ack deliveries and the gets are taken out."""
    counts = dict(zip(QUEUE_FIELDS, queue_counts(q), strict=False))
    rates = dict(rates)
    for values in (counts, rates):
        values["deliver"] = max(0, values["deliver_get"] - values["deliver_no_ack"]
                                - values["get"] - values["get_no_ack"])
    return rate_details(
        {k: counts[k] for k in ("publish", "deliver", "deliver_no_ack", "get", "get_no_ack",
                                "get_empty", "redeliver", "deliver_get", "ack")}, rates)


def consumer_json(consumer, vhost_name: str) -> dict:
    from .api_connections import channel_ref
    return {"arguments": jsonable(consumer.arguments or {}),
            "ack_required": not consumer.no_ack, "active": True, "activity_status": "up",
            "channel_details": channel_ref(consumer.channel),
            "consumer_tag": consumer.tag, "exclusive": consumer.exclusive,
            "prefetch_count": consumer.prefetch or consumer.channel.prefetch,
            "queue": {"name": consumer.queue.name, "vhost": vhost_name}}


def properties_key(routing_key: str, arguments: dict) -> str:
    """RabbitMQ's binding id: the routing key form-encoded (``~`` when empty) plus, with
    arguments, ``~`` and a short hash of them."""
    key = quote_plus(routing_key, safe="").replace("~", "%7E")
    if not arguments:
        return key or "~"
    digest = hashlib.md5(json.dumps(jsonable(arguments), sort_keys=True).encode()).digest()
    return key + "~" + base64.urlsafe_b64encode(digest[:6]).decode()


def binding_json(vhost_name: str, source: str, dest_kind: str, dest: str, routing_key: str,
                 arguments: dict) -> dict:
    return {"source": source, "vhost": vhost_name, "destination": dest,
            "destination_type": dest_kind, "routing_key": routing_key,
            "arguments": jsonable(arguments),
            "properties_key": properties_key(routing_key, arguments)}


def vhost_bindings(vhost) -> list[dict]:
    out = []
    for q in vhost.queues.values():  # the default exchange's implicit bindings
        if not q.internal:
            out.append(binding_json(vhost.name, "", "queue", q.name, q.name, {}))
    for x in vhost.exchanges.values():
        if x.name == "":
            continue
        for b in x.bindings.values():
            if getattr(b.destination, "internal", False):
                continue
            out.append(binding_json(vhost.name, x.name, b.destination.kind, b.destination.name,
                                    b.routing_key, b.arguments))
    return out


def _exchanges_of(vhost) -> list:
    return [x for x in vhost.exchanges.values() if not getattr(x, "hidden", False)]


def _queues_of(vhost) -> list:
    return [q for q in vhost.queues.values() if not q.internal]


# ---- exchanges ---------------------------------------------------------------------------


async def list_exchanges(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    vhosts = [vhost] if vhost is not None else visible_vhosts(broker, user)
    pairs = [(v, x) for v in vhosts for x in _exchanges_of(v)]
    sampler = broker.stats_sampler
    return json_response(paginate(request, pairs, lambda p: exchange_json(p[0], p[1], sampler),
                                  lambda p: p[1].name, lambda p: p[0].name))


def _exchange_name(request: Request) -> str:
    name = param(request, "name")
    return "" if name == "amq.default" else name


async def get_exchange(request: Request):
    user, broker, vhost = await vhost_scope(request)
    x = vhost.exchanges.get(_exchange_name(request))
    if x is None:
        raise ApiError(404, "Not Found")
    out = exchange_json(vhost, x, broker.stats_sampler)
    out["incoming"] = []
    out["outgoing"] = []
    return json_response(out)


async def put_exchange(request: Request):
    user, broker, vhost = await vhost_scope(request, creating=True)
    name = param(request, "name")
    data = await body(request, {"type", "durable", "auto_delete", "internal", "arguments",
                                "vhost", "name", "user_who_performed_action"})
    xtype = text(data, "type", "direct") if "type" in data else None
    if xtype is None:
        raise ApiError(400, "type missing", "bad_request")
    if xtype not in EXCHANGE_TYPES:
        raise ApiError(400, f"unknown exchange type '{xtype}'")
    if name in ("amq.default", "") or (name.startswith("amq.") and name not in vhost.exchanges):
        raise ApiError(401, "Access refused.", "not_authorised")
    check_perm(broker, user, vhost.name, "exchange", name, "configure")
    existed = name in vhost.exchanges
    try:
        vhost.declare_exchange(spec.Exchange.Declare(
            exchange=name, type=xtype, passive=False, durable=flag(data, "durable", True),
            auto_delete=flag(data, "auto_delete", False), internal=flag(data, "internal", False),
            arguments=table(data, "arguments")))
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    return no_content() if existed else created()


async def delete_exchange(request: Request):
    user, broker, vhost = await vhost_scope(request)
    name = _exchange_name(request)
    if name == "" or name.startswith("amq."):
        raise ApiError(401, "Access refused.", "not_authorised")
    if name not in vhost.exchanges:
        raise ApiError(404, "Not Found")
    check_perm(broker, user, vhost.name, "exchange", name, "configure")
    if_unused = request.query_params.get("if-unused", "false") == "true"
    try:
        vhost.delete_exchange(spec.Exchange.Delete(exchange=name, if_unused=if_unused))
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    return no_content()


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


def publish_message(broker, vhost, exchange: str, routing_key: str, properties: dict,
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
        outcome = broker.publishing.publish(Source(broker, vhost, user, peer), message)
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
    name = _exchange_name(request)
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


async def list_queues(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    vhosts = [vhost] if vhost is not None else visible_vhosts(broker, user)
    pairs = [(v, q) for v in vhosts for q in _queues_of(v)]
    # in a cluster: counts, node and mirrors as the queue's master has them
    from ..cluster.view import apply, queue_overlays
    views = await queue_overlays(broker, pairs)
    return json_response(paginate(
        request, pairs, lambda p: apply(queue_json(broker, *p), views.get((p[0].name, p[1].name))),
        lambda p: p[1].name, lambda p: p[0].name))


def _queue(request: Request, vhost):
    q = vhost.find_queue(param(request, "name"))
    if q is None:
        raise ApiError(404, "Not Found")
    return q


async def get_queue(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = _queue(request, vhost)
    from ..cluster.view import apply, queue_overlays
    views = await queue_overlays(broker, [(vhost, q)])
    out = apply(queue_json(broker, vhost, q), views.get((vhost.name, q.name)))
    out["consumer_details"] = [consumer_json(c, vhost.name) for c in q.consumers]
    out["deliveries"] = []
    out["incoming"] = []
    return json_response(out)


async def put_queue(request: Request):
    user, broker, vhost = await vhost_scope(request, creating=True)
    name = param(request, "name")
    size = len(name.encode())
    if size > 255:  # what AMQP can name; RabbitMQ's words
        raise ApiError(400, f"queue should be less than 255 bytes, actually was {size}\n")
    data = await body(request, {"durable", "auto_delete", "arguments", "node", "vhost", "name",
                                "exclusive", "type", "queue_type"})
    if flag(data, "exclusive", False):
        raise ApiError(400, "field 'exclusive': a queue declared over HTTP has no connection "
                            "to be exclusive to")
    arguments = dict(table(data, "arguments"))
    qtype = data.get("type") or data.get("queue_type")
    if qtype is not None:
        if qtype not in QUEUE_TYPES:
            raise ApiError(400, f"field 'type': unknown queue type '{qtype}'")
        arguments.setdefault("x-queue-type", qtype)
    if name.startswith("amq."):
        raise ApiError(400, f"queue name '{name}' contains reserved prefix 'amq.*'")
    if not name:
        raise ApiError(400, "field 'name': a queue declared over HTTP needs a name")
    check_perm(broker, user, vhost.name, "queue", name, "configure")
    existed = vhost.find_queue(name) is not None
    try:
        vhost.declare_queue(spec.Queue.Declare(
            queue=name, passive=False, durable=flag(data, "durable", True), exclusive=False,
            auto_delete=flag(data, "auto_delete", False), arguments=arguments), None)
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    return no_content() if existed else created()


async def delete_queue(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = _queue(request, vhost)
    check_perm(broker, user, vhost.name, "queue", q.name, "configure")
    qp = request.query_params
    if qp.get("if-unused", "false") == "true" and q.consumers:
        raise ApiError(400, f"queue '{q.name}' in vhost '{vhost.name}' in use")
    if qp.get("if-empty", "false") == "true" and (q.message_count or q.unacked_count):
        raise ApiError(400, f"queue '{q.name}' in vhost '{vhost.name}' not empty")
    vhost.delete_queue(q)
    return no_content()


async def purge_queue(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = _queue(request, vhost)
    check_perm(broker, user, vhost.name, "queue", q.name, "read")
    if q.exclusive_owner is not None:
        raise ApiError(400, f"cannot obtain exclusive access to locked queue '{q.name}' in "
                            f"vhost '{vhost.name}'")
    try:
        q.purge()
    except errors.AMQPError as exc:  # a stream: RabbitMQ's 400 with the explanation
        raise amqp_error(exc) from None
    return no_content()


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


async def list_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    vhosts = [vhost] if vhost is not None else visible_vhosts(broker, user)
    items = [b for v in vhosts for b in vhost_bindings(v)]
    return json_response(paginate(request, items, lambda b: b, lambda b: b["source"]))


async def queue_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = _queue(request, vhost)
    items = [b for b in vhost_bindings(vhost)
             if b["destination_type"] == "queue" and b["destination"] == q.name]
    return json_response(items)


async def exchange_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request)
    name = _exchange_name(request)
    if name not in vhost.exchanges:
        raise ApiError(404, "Not Found")
    side = "source" if request.url.path.endswith("/source") else "destination"
    items = [b for b in vhost_bindings(vhost)
             if b[side] == name and (side == "source" or b["destination_type"] == "exchange")]
    return json_response(items)


def _endpoints(request: Request, vhost):
    """(source exchange, destination kind, destination object) of a /bindings/... path."""
    source = param(request, "source")
    source = "" if source == "amq.default" else source
    kind = "queue" if request.path_params["kind"] == "q" else "exchange"
    dest_name = param(request, "dest")
    if source not in vhost.exchanges:
        raise ApiError(404, "Not Found")
    if kind == "queue":
        dest = vhost.find_queue(dest_name)
    else:
        dest = vhost.exchanges.get(dest_name)
    if dest is None:
        raise ApiError(404, "Not Found")
    return source, kind, dest


async def list_pair_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request)
    source, kind, dest = _endpoints(request, vhost)
    items = [b for b in vhost_bindings(vhost) if b["source"] == source
             and b["destination_type"] == kind and b["destination"] == dest.name]
    return json_response(items)


async def create_binding(request: Request):
    user, broker, vhost = await vhost_scope(request, creating=True)
    data = await body(request, {"routing_key", "arguments", "vhost", "source", "destination",
                                "destination_type"})
    source, kind, dest = _endpoints(request, vhost)
    # as RabbitMQ: a null routing key is the empty one
    routing_key = "" if data.get("routing_key") is None else text(data, "routing_key")
    arguments = table(data, "arguments")
    check_perm(broker, user, vhost.name, kind, dest.name, "write")
    check_perm(broker, user, vhost.name, "exchange", source, "read")
    try:
        vhost.bind(source, dest, routing_key, arguments)
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    location = properties_key(routing_key, arguments)
    resp = created()
    resp.headers["location"] = location
    return resp


def _props_keys(props_key: str) -> set[str]:
    """The binding ids a path's ``{props}`` may stand for: as given (the id encoded twice in
    the URL, as RabbitMQ's own clients send it) and, as RabbitMQ also accepts, read from an
    id encoded once (the key part then arrives decoded: ``a/b`` for ``a%2Fb``)."""
    key, sep, digest = props_key.partition("~")
    if sep and "~" in digest:
        return {props_key}
    once = quote_plus(unquote_plus(key), safe="").replace("~", "%7E")
    if not sep:
        return {props_key, once or "~"}
    return {props_key, once + "~" + digest if digest else once or "~"}


def _find_binding(vhost, source: str, kind: str, dest, props_key: str):
    keys = _props_keys(props_key)
    for b in vhost_bindings(vhost):
        if (b["source"] == source and b["destination_type"] == kind
                and b["destination"] == dest.name and b["properties_key"] in keys):
            return b
    return None


async def get_binding(request: Request):
    user, broker, vhost = await vhost_scope(request)
    source, kind, dest = _endpoints(request, vhost)
    b = _find_binding(vhost, source, kind, dest, param(request, "props"))
    if b is None:
        raise ApiError(404, "Not Found")
    return json_response(b)


async def delete_binding(request: Request):
    user, broker, vhost = await vhost_scope(request)
    source, kind, dest = _endpoints(request, vhost)
    b = _find_binding(vhost, source, kind, dest, param(request, "props"))
    if b is None:
        raise ApiError(404, "Not Found")
    if source == "":
        raise ApiError(401, "Access refused.", "not_authorised")
    check_perm(broker, user, vhost.name, kind, dest.name, "write")
    check_perm(broker, user, vhost.name, "exchange", source, "read")
    x = vhost.exchanges[source]
    for binding in list(x.bindings.values()):
        if (binding.destination is dest and binding.routing_key == b["routing_key"]
                and properties_key(binding.routing_key, binding.arguments) == b["properties_key"]):
            try:
                vhost.unbind(source, dest, binding.routing_key, binding.arguments)
            except errors.AMQPError as exc:
                raise amqp_error(exc) from None
    return no_content()


def routes() -> list:
    V, N = "{vhost}", "{name}"
    B = "/api/bindings/{vhost}/e/{source}/{kind:str}/{dest}"
    return [
        Route("/api/exchanges", list_exchanges),
        Route(f"/api/exchanges/{V}", list_exchanges),
        Route(f"/api/exchanges/{V}/{N}", get_exchange, methods=["GET"]),
        Route(f"/api/exchanges/{V}/{N}", put_exchange, methods=["PUT"]),
        Route(f"/api/exchanges/{V}/{N}", delete_exchange, methods=["DELETE"]),
        Route(f"/api/exchanges/{V}/{N}/publish", publish, methods=["POST"]),
        Route(f"/api/exchanges/{V}/{N}/bindings/source", exchange_bindings),
        Route(f"/api/exchanges/{V}/{N}/bindings/destination", exchange_bindings),
        Route("/api/queues", list_queues),
        Route(f"/api/queues/{V}", list_queues),
        Route(f"/api/queues/{V}/{N}", get_queue, methods=["GET"]),
        Route(f"/api/queues/{V}/{N}", put_queue, methods=["PUT"]),
        Route(f"/api/queues/{V}/{N}", delete_queue, methods=["DELETE"]),
        Route(f"/api/queues/{V}/{N}/contents", purge_queue, methods=["DELETE"]),
        Route(f"/api/queues/{V}/{N}/get", get_messages, methods=["POST"]),
        Route(f"/api/queues/{V}/{N}/bindings", queue_bindings),
        Route("/api/bindings", list_bindings),
        Route(f"/api/bindings/{V}", list_bindings),
        Route(B, list_pair_bindings, methods=["GET"]),
        Route(B, create_binding, methods=["POST"]),
        Route(B + "/{props}", get_binding, methods=["GET"]),
        Route(B + "/{props}", delete_binding, methods=["DELETE"]),
    ]
