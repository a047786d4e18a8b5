"""Hermes' HTTP API as starlette routes (added to ``broker.http_routes``).

Publishing (Hermes frontend): ``POST /topics/{topic}``. Management (Hermes management):
``/topics``, ``/topics/{topic}``, ``/topics/{topic}/schema``,
``/topics/{topic}/subscriptions[/{name}[/state]]``. Errors answer Hermes' JSON body
``{"message": ..., "code": ...}`` with the status of ``HermesError``.

Every route needs HTTP basic credentials of a user with the ``management`` tag (401 as the
management API answers it), and the permissions an AMQP client would need, checked by
``broker.access`` in vhost '/': configure on the exchange to manage a topic, on the queue to
manage a subscription, write on the exchange to publish (403 otherwise).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import errors
from ..management.auth import require
from ..management.http import JsonRejected, parse_json
from .model import HermesError

if TYPE_CHECKING:
    from ..security import AccessControl

MAX_DEFINITION = 1024 * 1024  # bytes of a management request body


def _error(exc: HermesError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _json(request: Request) -> Any:
    body = await request.body()
    if len(body) > MAX_DEFINITION:
        raise HermesError(413, "Request body too large", "MESSAGE_TOO_LARGE")
    try:
        return parse_json(body or b"null")
    except JsonRejected as exc:
        raise HermesError(400, f"Invalid JSON: {exc}") from None


async def _read_body(request: Request, limit: int) -> bytes:
    """The publish body, refused with 413 as soon as it passes ``limit``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise HermesError(413, f"Message size {length} exceeds the maximum {limit} bytes",
                          "MESSAGE_TOO_LARGE")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HermesError(413, f"Message size exceeds the maximum {limit} bytes",
                              "MESSAGE_TOO_LARGE")
        chunks.append(chunk)
    return b"".join(chunks)


def check(access: AccessControl, user, kind: str, name: str, perm: str) -> None:
    """HermesError 403 unless ``user`` (management's ApiUser) has ``perm`` on ``name``."""
    if user.user is None:
        return
    try:
        access.check(user.user, "/", kind, name, perm)
    except errors.AMQPError as exc:
        raise HermesError(403, exc.text, "FORBIDDEN") from None


def routes(hermes) -> list:
    access = hermes.services.access

    def handler(fn):
        async def endpoint(request: Request) -> Response:
            user = await require(request)
            try:
                return await fn(request, user, **request.path_params)
            except HermesError as exc:
                return _error(exc)
        return endpoint

    def may(user, kind: str, name: str, perm: str = "configure") -> None:
        check(access, user, kind, name, perm)

    async def topics(request: Request, user) -> Response:
        if request.method == "GET":
            return JSONResponse(sorted(hermes.topics))
        data = await _json(request)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            may(user, "exchange", data["name"])
        topic = hermes.create_topic(data)
        return JSONResponse(topic.to_json(), status_code=201)

    async def topic(request: Request, user, topic: str) -> Response:
        if request.method == "POST":  # publishing
            t = hermes.get_topic(topic)
            may(user, "exchange", topic, "write")
            body = await _read_body(request, t.maxMessageSize)
            extra = {}
            key = request.headers.get("partition-key")
            if key:
                extra["Partition-Key"] = key
            result = await hermes.publish(topic, body, request.headers.get("content-type"), extra,
                                          user.name,
                                          request.client.host if request.client else None)
            return Response(status_code=result.status,
                            headers={"Hermes-Message-Id": result.message_id})
        if request.method == "GET":
            return JSONResponse(hermes.get_topic(topic).to_json())
        may(user, "exchange", topic)
        if request.method in ("PUT", "PATCH"):
            return JSONResponse(hermes.update_topic(topic, await _json(request)).to_json())
        hermes.delete_topic(topic)
        return Response(status_code=200)

    async def schema(request: Request, user, topic: str) -> Response:
        if request.method == "GET":
            t = hermes.get_topic(topic)
            if t.schema is None:
                raise HermesError(404, f"No schema for topic {topic}", "SCHEMA_NOT_FOUND")
            return Response(t.schema, media_type="application/json",
                            headers={"Schema-Version": str(t.schemaVersion)})
        may(user, "exchange", topic)
        raw = await request.body()
        await _json(request)  # refused as any other body: too large, too deep, not JSON
        hermes.set_schema(topic, raw.decode("utf-8", "replace"))
        return Response(status_code=201)

    async def subscriptions(request: Request, user, topic: str) -> Response:
        if request.method == "GET":
            hermes.get_topic(topic)
            return JSONResponse(sorted(hermes.subscriptions.get(topic, {})))
        data = await _json(request)
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            may(user, "queue", f"{topic}.{data['name']}")
            may(user, "exchange", topic, "read")  # binding the queue: read on the source
        sub = hermes.create_subscription(topic, data)
        return JSONResponse(sub.to_json(), status_code=201)

    async def subscription(request: Request, user, topic: str, name: str) -> Response:
        if request.method == "GET":
            return JSONResponse(hermes.get_subscription(topic, name).to_json())
        may(user, "queue", f"{topic}.{name}")
        if request.method in ("PUT", "PATCH"):
            return JSONResponse(hermes.update_subscription(topic, name, await _json(request)).to_json())
        hermes.delete_subscription(topic, name)
        return Response(status_code=200)

    async def state(request: Request, user, topic: str, name: str) -> Response:
        if request.method == "GET":
            return JSONResponse(hermes.get_subscription(topic, name).state)
        may(user, "queue", f"{topic}.{name}")
        return JSONResponse(hermes.set_state(topic, name, await _json(request)).to_json())

    async def metrics(request: Request, user, topic: str, name: str) -> Response:
        sub = hermes.get_subscription(topic, name)
        q = hermes.vhost.queues.get(f"{topic}.{name}")
        pusher = hermes.subscribers.get(sub.qualified)
        body = dict(pusher.stats) if pusher is not None else {}
        body["lag"] = q.message_count if q is not None else 0
        body["inflight"] = pusher.unacked_count if pusher is not None else 0
        body["rate"] = pusher.limiter.rate if pusher is not None else 0
        return JSONResponse(body)

    return [
        Route("/topics", handler(topics), methods=["GET", "POST"]),
        Route("/topics/{topic}", handler(topic), methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
        Route("/topics/{topic}/schema", handler(schema), methods=["GET", "POST", "PUT"]),
        Route("/topics/{topic}/subscriptions", handler(subscriptions), methods=["GET", "POST"]),
        Route("/topics/{topic}/subscriptions/{name}", handler(subscription),
              methods=["GET", "PUT", "PATCH", "DELETE"]),
        Route("/topics/{topic}/subscriptions/{name}/state", handler(state),
              methods=["GET", "POST", "PUT"]),
        Route("/topics/{topic}/subscriptions/{name}/metrics", handler(metrics), methods=["GET"]),
    ]
