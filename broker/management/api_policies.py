"""/api/policies and /api/operator-policies over ``broker.policies`` (broker/policies),
which validates (PolicyError -> 400 with RabbitMQ's text) and applies at once."""
from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Route

from ..policies import PolicyError, PolicyNotFound, VhostNotFound
from .api_bindings import until_durable
from .auth import CHALLENGE, require
from .common import (
    broker_of,
    check_vhost_access,
    created,
    json_of,
    json_response,
    no_content,
    param,
    vhost_scope,
)
from .http import ApiError
from .listing import paginate

if TYPE_CHECKING:
    from ..broker import Broker


def _kind(request: Request) -> str:
    return "operator" if request.url.path.startswith("/api/operator-policies") else "policy"


async def _may_change(request: Request):
    """RabbitMQ: operator policies are the administrator's; policies the policymaker's
    (anyone else: "User not authorised to access object")."""
    if _kind(request) == "operator":
        return await require(request, "administrator")
    user = await require(request)
    if not user.has("policymaker"):
        raise ApiError(401, "User not authorised to access object", "not_authorised", CHALLENGE)
    return user


def _may_read(user) -> bool:
    # management users do not see policies; policymakers and monitoring do
    return user.has("policymaker") or user.sees_all


async def list_policies(request: Request):
    # listing: any management user, their vhosts only
    user, broker, scope = await vhost_scope(request, optional=True)
    vhost = scope.name if scope is not None else None
    lister = (broker.policies.list_operator_policies if _kind(request) == "operator"
              else broker.policies.list_policies)
    items = lister(vhost) if _may_read(user) else []
    if not user.sees_all:
        allowed = set()
        for name in {p["vhost"] for p in items}:
            try:
                check_vhost_access(broker, user, name)
                allowed.add(name)
            except ApiError:
                pass
        items = [p for p in items if p["vhost"] in allowed]
    return json_response(paginate(request, items, lambda p: p, lambda p: p["name"],
                                  lambda p: p["vhost"]))


async def get_policy(request: Request):
    user = await require(request)
    broker = broker_of(request)
    vhost, name = param(request, "vhost"), param(request, "name")
    check_vhost_access(broker, user, vhost)
    if not _may_read(user):
        raise ApiError(401, "User not authorised to access object", "not_authorised", CHALLENGE)
    getter = (broker.policies.get_operator_policy if _kind(request) == "operator"
              else broker.policies.get_policy)
    try:
        return json_response(getter(vhost, name))
    except (PolicyNotFound, VhostNotFound):
        raise ApiError(404, "Not Found") from None


def _object_access(broker: Broker, user, vhost: str) -> None:
    try:
        check_vhost_access(broker, user, vhost)
    except ApiError:
        raise ApiError(401, "User not authorised to access object", "not_authorised",
                       CHALLENGE) from None


async def put_policy(request: Request):
    user = await _may_change(request)
    broker = broker_of(request)
    vhost, name = param(request, "vhost"), param(request, "name")
    _object_access(broker, user, vhost)
    raw = await request.body()
    data = json_of(raw) if raw.strip() else {}
    policies = broker.policies
    operator = _kind(request) == "operator"
    getter = policies.get_operator_policy if operator else policies.get_policy
    try:
        getter(vhost, name)
        existed = True
    except (PolicyNotFound, VhostNotFound):
        existed = False
    try:
        (policies.put_operator_policy if operator else policies.put_policy)(vhost, name, data)
    except PolicyError as exc:
        raise ApiError(400, exc.text) from None
    except VhostNotFound:
        raise ApiError(404, "vhost_not_found", "not_found") from None
    await until_durable(broker.store)  # on every live node (--workers)
    return no_content() if existed else created()


async def delete_policy(request: Request):
    user = await _may_change(request)
    broker = broker_of(request)
    vhost, name = param(request, "vhost"), param(request, "name")
    _object_access(broker, user, vhost)
    policies = broker.policies
    try:
        if _kind(request) == "operator":
            policies.clear_operator_policy(vhost, name)
        else:
            policies.clear_policy(vhost, name)
    except (PolicyNotFound, VhostNotFound):
        raise ApiError(404, "Not Found") from None
    await until_durable(broker.store)  # on every live node (--workers)
    return no_content()


def routes() -> list:
    out = []
    for base in ("/api/policies", "/api/operator-policies"):
        out += [Route(base, list_policies),
                Route(base + "/{vhost}", list_policies),
                Route(base + "/{vhost}/{name}", get_policy, methods=["GET"]),
                Route(base + "/{vhost}/{name}", put_policy, methods=["PUT"]),
                Route(base + "/{vhost}/{name}", delete_policy, methods=["DELETE"])]
    return out
