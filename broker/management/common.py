"""Helpers shared by the API modules: path parameters, JSON bodies with field validation,
JSON-able AMQP values, and AMQP errors turned into RabbitMQ's HTTP answers."""
from __future__ import annotations

import base64
import datetime
import decimal
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import errors
from .auth import CHALLENGE, ApiUser, require
from .http import ApiError, JsonRejected, parse_json

if TYPE_CHECKING:
    from ..broker import Broker

NODE = "triomq@localhost"


def broker_of(request: Request):
    return request.app.state.broker


def param(request: Request, name: str) -> str:
    """A path parameter, percent-decoded (paths are matched still encoded, so that a vhost
    ``%2F`` stays one segment as in RabbitMQ). Not UTF-8: 400 (decoded with U+FFFD in place
    of the bytes, another name than the one asked for would be made)."""
    try:
        return unquote(request.path_params[name], errors="strict")
    except UnicodeDecodeError:
        raise ApiError(400, f"path segment '{name}' is not valid UTF-8") from None


def vhost_or_404(broker: Broker, name: str, creating: bool = False):
    """The vhost; 404 as RabbitMQ words it (``vhost_not_found`` when creating in it)."""
    vhost = broker.vhosts.get(name)
    if vhost is None:
        if creating:
            raise ApiError(404, "vhost_not_found", "not_found")
        raise ApiError(404, "Not Found")
    return vhost


async def vhost_scope(request: Request, creating: bool = False,
                      optional: bool = False) -> tuple[ApiUser, Any, Any]:
    """The preamble of a handler for a path with ``{vhost}``: the caller (401 unless
    authenticated), the vhost (404, worded for ``creating``) and the caller's access to it
    (401), in that order as RabbitMQ answers. Returns ``(user, broker, vhost)``; with
    ``optional``, a path without ``{vhost}`` gives vhost None (the handler lists them all)."""
    user = await require(request)
    broker = broker_of(request)
    if optional and "vhost" not in request.path_params:
        return user, broker, None
    vhost = vhost_or_404(broker, param(request, "vhost"), creating)
    check_vhost_access(broker, user, vhost.name)
    return user, broker, vhost


def json_of(raw: bytes) -> Any:
    """A request body's JSON; 400 naming the problem (malformed, too deep, a number out
    of range)."""
    try:
        return parse_json(raw)
    except JsonRejected as exc:
        raise ApiError(400, str(exc)) from None


async def body(request: Request, allowed: Iterable[str], required: Iterable[str] = ()) -> dict:
    """The JSON object in the request body; 400 naming the field for malformed JSON, a
    non-object, an unknown key or a missing required one."""
    raw = await request.body()
    if not raw.strip():
        data: Any = {}
    else:
        data = json_of(raw)
    if not isinstance(data, dict):
        raise ApiError(400, "not_json: expected a JSON object")
    allowed = set(allowed)
    for key in data:
        if key not in allowed:
            raise ApiError(400, f"unknown field '{key}' (expected one of: "
                                f"{', '.join(sorted(allowed))})")
    for key in required:
        if key not in data:
            raise ApiError(400, f"{key} missing", "bad_request")
    return data


def flag(data: dict, key: str, default: bool) -> bool:
    """A boolean field; rabbitmqadmin sends "true"/"false" strings."""
    value = data.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ApiError(400, f"field '{key}': expected a boolean, got {json.dumps(value)}")


def text(data: dict, key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ApiError(400, f"field '{key}': expected a string, got {json.dumps(value)}")
    return value


def table(data: dict, key: str) -> dict:
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise ApiError(400, f"field '{key}': expected a JSON object, got {json.dumps(value)}")
    return value


def _scalar_jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    return value


def jsonable(value: Any) -> Any:
    """AMQP field values as RabbitMQ renders them in JSON. Nested tables and arrays are
    walked with an explicit stack: a header table may be nested as deep as a frame
    holds (18,000 levels), far past the recursion limit."""
    if not isinstance(value, (dict, list, tuple)):
        return _scalar_jsonable(value)
    root: Any = {} if isinstance(value, dict) else []
    stack = [(value, root)]
    while stack:
        src, dst = stack.pop()
        for k, v in (src.items() if isinstance(src, dict) else enumerate(src)):
            if isinstance(v, (dict, list, tuple)):
                out: Any = {} if isinstance(v, dict) else []
                stack.append((v, out))
            else:
                out = _scalar_jsonable(v)
            if isinstance(dst, dict):
                dst[str(k)] = out
            else:
                dst.append(out)
    return root


def dumps_deep(data: Any) -> bytes:
    """JSON text of ``data`` without recursion (json.dumps stops near 1,000 levels):
    for the rare answer holding deeply nested header tables."""
    out: list[str] = []
    stack: list[Any] = [data]
    dumps = json.dumps
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            out.append(item.text)
        elif isinstance(item, dict):
            out.append("{")
            parts: list[Any] = []
            for n, (k, v) in enumerate(item.items()):
                parts.append(_Raw(("," if n else "") + dumps(str(k), ensure_ascii=False) + ":"))
                parts.append(v)
            parts.append(_Raw("}"))
            stack.extend(reversed(parts))
        elif isinstance(item, (list, tuple)):
            out.append("[")
            parts = []
            for n, v in enumerate(item):
                if n:
                    parts.append(_Raw(","))
                parts.append(v)
            parts.append(_Raw("]"))
            stack.extend(reversed(parts))
        else:
            out.append(dumps(item, ensure_ascii=False, allow_nan=False))
    return "".join(out).encode("utf-8")


class _Raw:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


def amqp_error(exc: errors.AMQPError) -> ApiError:
    """An AMQP error as RabbitMQ's management plugin answers it."""
    text_ = exc.text.split(" - ", 1)[1] if " - " in exc.text else exc.text
    code = exc.code
    if code == 404:
        return ApiError(404, exc.text, "not_found")
    if code == 403:
        return ApiError(401, text_ or "Access refused.", "not_authorised", CHALLENGE)
    return ApiError(400, text_, "bad_request")


def no_content() -> Response:
    return Response(status_code=204)


def created() -> Response:
    return Response(status_code=201)


def json_response(data: Any, status: int = 200) -> Response:
    try:
        return JSONResponse(data, status_code=status)
    except RecursionError:  # deeply nested headers: rendered without recursion
        return Response(dumps_deep(data), status_code=status, media_type="application/json")


def check_perm(broker: Broker, user: ApiUser, vhost: str, kind: str, name: str, perm: str) -> None:
    """broker.access's resource permission check for the API caller (as RabbitMQ's
    management plugin checks a user's AMQP permissions); 401 when refused."""
    if user.user is None:
        return
    try:
        broker.access.check(user.user, vhost, kind, name, perm)
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None


def check_vhost_access(broker: Broker, user: ApiUser, vhost: str) -> None:
    if user.user is None or user.is_admin:
        return
    try:
        broker.access.check_vhost(user.user, vhost)
    except errors.AMQPError:
        raise ApiError(401, "User not authorised to access virtual host", "not_authorised",
                       CHALLENGE) from None


def visible_vhosts(broker: Broker, user: ApiUser) -> list:
    """The vhosts the caller may list objects of."""
    if user.sees_all:
        return list(broker.vhosts.values())
    out = []
    for vhost in list(broker.vhosts.values()):
        try:
            check_vhost_access(broker, user, vhost.name)
        except ApiError:
            continue
        out.append(vhost)
    return out
