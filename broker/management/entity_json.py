"""The management API's JSON for exchanges, queues, consumers and bindings, and the
lookups the entity endpoints share. Does not serve a route (api_entities, api_messages,
api_bindings do)."""
from __future__ import annotations

import base64
import datetime
import hashlib
import json
from typing import TYPE_CHECKING
from urllib.parse import quote_plus

from starlette.requests import Request

from .common import (
    NODE,
    jsonable,
    param,
)
from .http import ApiError
from .stats import EXCHANGE_FIELDS, QUEUE_FIELDS, queue_counts, rate_details

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import Queue
    from ..vhost import VirtualHost

# ---- rendering ---------------------------------------------------------------------------


def exchange_json(vhost: VirtualHost, x, sampler=None) -> dict:
    out = {"arguments": jsonable(x.arguments), "auto_delete": x.auto_delete,
           "durable": x.durable, "internal": x.internal, "name": x.name,
           "type": x.type_name or "direct", "user_who_performed_action": "rmq-internal",
           "vhost": vhost.name}
    if x.stats_publish_in and sampler is not None:  # as RabbitMQ: once it saw traffic
        out["message_stats"] = rate_details(
            dict(zip(EXCHANGE_FIELDS, (x.stats_publish_in, x.stats_publish_out), strict=True)),
            sampler.exchange_rates(x))
    policy = x.policy
    if policy is not None:
        out["policy"] = policy
    return out


def queue_json(broker: Broker, vhost: VirtualHost, q: Queue) -> dict:
    ready = q.message_count
    unacked = q.unacked_count
    sampler = broker.stats_sampler
    rates = sampler.queue_rates(q)
    consumers = q.consumers
    exclusive_tag = None
    if consumers and consumers[0].exclusive:
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


def _idle_since(sampler, q: Queue) -> dict:
    """RabbitMQ's ``idle_since`` (present only while idle), in its local-time format."""
    since = sampler.queue_idle_since(q)
    if since is None:
        return {}
    stamp = datetime.datetime.fromtimestamp(since).astimezone()
    return {"idle_since": stamp.isoformat(timespec="milliseconds")}


def _queue_message_stats(q: Queue, rates: dict) -> dict:
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


def vhost_bindings(vhost: VirtualHost) -> list[dict]:
    out = []
    for q in vhost.queues.values():  # the default exchange's implicit bindings
        if not q.internal:
            out.append(binding_json(vhost.name, "", "queue", q.name, q.name, {}))
    for x in vhost.exchanges.values():
        if x.name == "":
            continue
        for b in x.bindings.values():
            if b.destination.internal:
                continue
            out.append(binding_json(vhost.name, x.name, b.destination.kind, b.destination.name,
                                    b.routing_key, b.arguments))
    return out


def exchanges_of(vhost: VirtualHost) -> list:
    return [x for x in vhost.exchanges.values() if not x.hidden]


def queues_of(vhost: VirtualHost) -> list:
    return [q for q in vhost.queues.values() if not q.internal]



def queue_of(request: Request, vhost: VirtualHost):
    q = vhost.find_queue(param(request, "name"))
    if q is None:
        raise ApiError(404, "Not Found")
    return q


def exchange_name(request: Request) -> str:
    """The {name} of an exchange path (``amq.default``: the default exchange)."""
    name = param(request, "name")
    return "" if name == "amq.default" else name
