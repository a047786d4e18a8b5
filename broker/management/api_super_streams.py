"""``/api/stream/super-streams/{vhost}/{name}``: super streams over HTTP (what ``ctl
add_super_stream`` / ``delete_super_stream`` call; RabbitMQ does this with
``rabbitmq-streams``, which talks to the node directly). PUT takes ``partitions`` (a
count) or ``binding_keys`` (a list, or a comma-separated string as on the command line)
and optional queue ``arguments`` for every partition; GET answers the partitions in
order with their binding keys; DELETE removes the exchange and its streams.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Route

from .. import errors
from ..streams import super as super_streams
from .common import (
    amqp_error,
    body,
    check_perm,
    created,
    json_response,
    no_content,
    param,
    table,
    vhost_scope,
)
from .http import ApiError

if TYPE_CHECKING:
    from ..vhost import VirtualHost


def _keys(data: dict) -> tuple[int | None, list[str] | None]:
    count, keys = data.get("partitions"), data.get("binding_keys")
    if (count is None) == (keys is None):
        raise ApiError(400, "give one of 'partitions' or 'binding_keys'")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                              or count < 1):
        raise ApiError(400, "field 'partitions': expected a positive integer")
    if count is not None and count > super_streams.MAX_PARTITIONS:
        raise ApiError(400, f"field 'partitions': at most {super_streams.MAX_PARTITIONS}")
    if isinstance(keys, str):
        keys = [k.strip() for k in keys.split(",")]
    if keys is not None and not (isinstance(keys, list)
                                 and all(isinstance(k, str) for k in keys)):
        raise ApiError(400, "field 'binding_keys': expected a list of strings")
    if keys is not None and len(keys) > super_streams.MAX_PARTITIONS:
        raise ApiError(400, f"field 'binding_keys': at most {super_streams.MAX_PARTITIONS} "
                            f"keys")
    return count, keys


async def put_super_stream(request: Request):
    user, broker, vhost = await vhost_scope(request, creating=True)
    name = param(request, "name")
    data = await body(request, {"partitions", "binding_keys", "arguments"})
    count, keys = _keys(data)
    try:
        parts, keys = super_streams.layout(name, count, keys)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    if not name or name.startswith("amq."):
        raise ApiError(400, f"super stream name '{name}' is empty or has the reserved "
                            f"prefix 'amq.*'")
    size = max(len(p.encode()) for p in [name, *parts])
    if size > 255:  # a partition is a queue: what AMQP can name
        raise ApiError(400, f"super stream '{name[:40]}': a partition's name should be less "
                            f"than 255 bytes, actually was {size}")
    check_perm(broker, user, vhost.name, "exchange", name, "configure")
    for part in parts:
        check_perm(broker, user, vhost.name, "queue", part, "configure")
    taken = [n for n in [name] if n in vhost.exchanges] + [p for p in parts
                                                           if vhost.find_queue(p)]
    if taken:
        raise ApiError(400, f"super stream '{name}' in vhost '{vhost.name}': "
                            f"'{taken[0]}' already exists")
    try:
        super_streams.declare(vhost, name, parts, keys, dict(table(data, "arguments")))
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    return created()


def _super(request: Request, vhost: VirtualHost) -> list[tuple[str, str, int]]:
    name = param(request, "name")
    parts = super_streams.partitions_of(vhost, name) \
        if super_streams.is_super_stream(vhost, name) else None
    if parts is None:
        raise ApiError(404, "Not Found")
    return parts


async def get_super_stream(request: Request):
    user, broker, vhost = await vhost_scope(request)
    parts = _super(request, vhost)
    return json_response({"name": param(request, "name"), "vhost": vhost.name,
                          "partitions": [p for p, _k, _o in parts],
                          "binding_keys": [k for _p, k, _o in parts]})


async def delete_super_stream(request: Request):
    user, broker, vhost = await vhost_scope(request)
    name = param(request, "name")
    parts = _super(request, vhost)
    check_perm(broker, user, vhost.name, "exchange", name, "configure")
    for part, _k, _o in parts:
        check_perm(broker, user, vhost.name, "queue", part, "configure")
    try:
        super_streams.delete(vhost, name)
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    return no_content()


def routes() -> list:
    path = "/api/stream/super-streams/{vhost}/{name}"
    return [Route(path, get_super_stream, methods=["GET"]),
            Route(path, put_super_stream, methods=["PUT"]),
            Route(path, delete_super_stream, methods=["DELETE"])]
