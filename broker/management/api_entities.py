"""/api/exchanges and /api/queues: list, get, declare, delete, purge; and the routes of
every entity endpoint (publish and get in api_messages, bindings in api_bindings). Does
not render JSON (entity_json) nor publish."""
from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from .. import errors
from ..exchanges import EXCHANGE_TYPES
from ..queues.types import QUEUE_TYPES
from .api_bindings import (
    create_binding,
    delete_binding,
    exchange_bindings,
    get_binding,
    list_bindings,
    list_pair_bindings,
    queue_bindings,
    until_durable,
)
from .api_messages import get_messages, publish, publish_message
from .common import (
    amqp_error,
    body,
    check_perm,
    created,
    flag,
    json_response,
    no_content,
    param,
    table,
    text,
    vhost_scope,
    visible_vhosts,
)
from .entity_json import (
    consumer_json,
    exchange_json,
    exchange_name,
    exchanges_of,
    queue_json,
    queue_of,
    queues_of,
)
from .http import ApiError
from .listing import paginate

# other modules' names for these, as before the split
__all__ = ["consumer_json", "publish_message", "routes"]


# ---- exchanges ---------------------------------------------------------------------------


async def list_exchanges(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    vhosts = [vhost] if vhost is not None else visible_vhosts(broker, user)
    pairs = [(v, x) for v in vhosts for x in exchanges_of(v)]
    sampler = broker.stats_sampler
    return json_response(paginate(request, pairs, lambda p: exchange_json(p[0], p[1], sampler),
                                  lambda p: p[1].name, lambda p: p[0].name))


async def get_exchange(request: Request):
    user, broker, vhost = await vhost_scope(request)
    x = vhost.exchanges.get(exchange_name(request))
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
        x = vhost.declare_exchange(
            name, xtype, durable=flag(data, "durable", True),
            auto_delete=flag(data, "auto_delete", False), internal=flag(data, "internal", False),
            arguments=table(data, "arguments"))
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    if x.durable:
        await until_durable(vhost.store)
    return no_content() if existed else created()


async def delete_exchange(request: Request):
    user, broker, vhost = await vhost_scope(request)
    name = exchange_name(request)
    if name == "" or name.startswith("amq."):
        raise ApiError(401, "Access refused.", "not_authorised")
    if name not in vhost.exchanges:
        raise ApiError(404, "Not Found")
    check_perm(broker, user, vhost.name, "exchange", name, "configure")
    if_unused = request.query_params.get("if-unused", "false") == "true"
    try:
        vhost.delete_exchange(name, if_unused=if_unused)
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    return no_content()




async def list_queues(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    vhosts = [vhost] if vhost is not None else visible_vhosts(broker, user)
    pairs = [(v, q) for v in vhosts for q in queues_of(v)]
    # in a cluster: counts, node and mirrors as the queue's master has them
    from ..cluster.view import apply, queue_overlays
    views = await queue_overlays(broker, pairs)
    return json_response(paginate(
        request, pairs, lambda p: apply(queue_json(broker, *p), views.get((p[0].name, p[1].name))),
        lambda p: p[1].name, lambda p: p[0].name))






async def get_queue(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = queue_of(request, vhost)
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
        q = vhost.declare_queue(name, durable=flag(data, "durable", True),
                                auto_delete=flag(data, "auto_delete", False),
                                arguments=arguments)
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    await until_durable(q.store)  # (None: transient, nothing stored)
    return no_content() if existed else created()


async def delete_queue(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = queue_of(request, vhost)
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
    q = queue_of(request, vhost)
    check_perm(broker, user, vhost.name, "queue", q.name, "read")
    if q.exclusive_owner is not None:
        raise ApiError(400, f"cannot obtain exclusive access to locked queue '{q.name}' in "
                            f"vhost '{vhost.name}'")
    try:
        q.purge()
    except errors.AMQPError as exc:  # a stream: RabbitMQ's 400 with the explanation
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
