"""/api/bindings and the bindings of an exchange or a queue: list, create, get, delete.
Does not render a binding (entity_json) nor touch exchanges or queues themselves."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote_plus, unquote_plus

import trio
from starlette.requests import Request

from .. import errors
from .common import (
    amqp_error,
    body,
    check_perm,
    created,
    json_response,
    no_content,
    param,
    table,
    text,
    vhost_scope,
    visible_vhosts,
)
from .entity_json import exchange_name, properties_key, queue_of, vhost_bindings
from .http import ApiError
from .listing import paginate

if TYPE_CHECKING:
    from ..exchanges.base import Exchange
    from ..queues.queue import Queue
    from ..vhost import VirtualHost


async def until_durable(store: Any) -> None:
    """Returns once ``store`` (None: nothing stored) has made durable what it holds now: a
    declare's 201/204 is sent after the new definition is durable, as a queue.declare-ok
    (docs/durability.md). While the store's writes fail, it waits for the retry."""
    if store is None:
        return
    done = trio.Event()
    store.when_durable(done.set)
    await done.wait()


async def list_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    vhosts = [vhost] if vhost is not None else visible_vhosts(broker, user)
    items = [b for v in vhosts for b in vhost_bindings(v)]
    return json_response(paginate(request, items, lambda b: b, lambda b: b["source"]))


async def queue_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request)
    q = queue_of(request, vhost)
    items = [b for b in vhost_bindings(vhost)
             if b["destination_type"] == "queue" and b["destination"] == q.name]
    return json_response(items)


async def exchange_bindings(request: Request):
    user, broker, vhost = await vhost_scope(request)
    name = exchange_name(request)
    if name not in vhost.exchanges:
        raise ApiError(404, "Not Found")
    side = "source" if request.url.path.endswith("/source") else "destination"
    items = [b for b in vhost_bindings(vhost)
             if b[side] == name and (side == "source" or b["destination_type"] == "exchange")]
    return json_response(items)


def _endpoints(request: Request, vhost: VirtualHost):
    """(source exchange, destination kind, destination object) of a /bindings/... path."""
    source = param(request, "source")
    source = "" if source == "amq.default" else source
    kind = "queue" if request.path_params["kind"] == "q" else "exchange"
    dest_name = param(request, "dest")
    if source not in vhost.exchanges:
        raise ApiError(404, "Not Found")
    dest: Queue | Exchange | None
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
    stored = dest.store is not None if kind == "queue" else dest.durable
    if stored and vhost.exchanges[source].durable:
        await until_durable(vhost.store)
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


def _find_binding(vhost: VirtualHost, source: str, kind: str, dest, props_key: str):
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

