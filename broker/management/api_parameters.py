"""/api/parameters: RabbitMQ's runtime parameters of the components this broker has —
``vhost-limits`` (over ``broker.access``) and ``operator_policy`` (over
``broker.policies``) — as rabbitmqadmin's ``list parameters`` / ``declare parameter`` use
them. Other components (federation, shovel) do not exist here: 400."""
from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Route

from ..policies import PolicyError, PolicyNotFound, VhostNotFound
from ..security import DefinitionError, NotFound
from .auth import require
from .common import (
    broker_of,
    check_vhost_access,
    created,
    json_of,
    json_response,
    no_content,
    param,
)
from .http import ApiError

if TYPE_CHECKING:
    from ..broker import Broker

COMPONENTS = ("vhost-limits", "operator_policy")


def _all(broker: Broker) -> list[dict]:
    out = []
    for v in broker.access.list_vhosts():
        if v.get("limits"):
            out.append({"vhost": v["name"], "component": "vhost-limits", "name": "limits",
                        "value": dict(v["limits"])})
    out += broker.policies.export().get("parameters", [])
    return out


async def list_parameters(request: Request):
    user = await require(request, "policymaker")
    broker = broker_of(request)
    component = param(request, "component") if "component" in request.path_params else None
    vhost = param(request, "vhost") if "vhost" in request.path_params else None
    if component is not None and component not in COMPONENTS:
        raise ApiError(400, f"component {component} not found")
    items = [p for p in _all(broker) if (component is None or p["component"] == component)
             and (vhost is None or p["vhost"] == vhost)]
    if not user.is_admin:
        seen = []
        for p in items:
            try:
                check_vhost_access(broker, user, p["vhost"])
            except ApiError:
                continue
            seen.append(p)
        items = seen
    return json_response(items)


async def get_parameter(request: Request):
    await require(request, "policymaker")
    broker = broker_of(request)
    component, vhost, name = (param(request, k) for k in ("component", "vhost", "name"))
    for p in _all(broker):
        if (p["component"], p["vhost"], p["name"]) == (component, vhost, name):
            return json_response(p)
    raise ApiError(404, "Not Found")


async def put_parameter(request: Request):
    component, vhost, name = (param(request, k) for k in ("component", "vhost", "name"))
    await require(request, "administrator" if component == "operator_policy" else "policymaker")
    broker = broker_of(request)
    raw = await request.body()
    data = json_of(raw)
    if not isinstance(data, dict) or "value" not in data:
        raise ApiError(400, "field 'value': missing")
    value = data["value"]
    try:
        if component == "vhost-limits":
            if not isinstance(value, dict):
                raise ApiError(400, "field 'value': expected a JSON object of limits")
            existed = any(p["component"] == component and p["vhost"] == vhost
                          for p in _all(broker))
            broker.access.set_vhost_limits(vhost, value)
        elif component == "operator_policy":
            try:
                broker.policies.get_operator_policy(vhost, name)
                existed = True
            except (PolicyNotFound, VhostNotFound):
                existed = False
            broker.policies.put_operator_policy(vhost, name, value)
        else:
            raise ApiError(400, f"component {component} not found")
    except DefinitionError as exc:
        raise ApiError(400, str(exc)) from None
    except PolicyError as exc:
        raise ApiError(400, exc.text) from None
    except (NotFound, VhostNotFound):
        raise ApiError(404, "vhost_not_found", "not_found") from None
    return no_content() if existed else created()


async def delete_parameter(request: Request):
    component, vhost, name = (param(request, k) for k in ("component", "vhost", "name"))
    await require(request, "administrator" if component == "operator_policy" else "policymaker")
    broker = broker_of(request)
    try:
        if component == "vhost-limits":
            broker.access.clear_vhost_limits(vhost)
        elif component == "operator_policy":
            broker.policies.clear_operator_policy(vhost, name)
        else:
            raise ApiError(400, f"component {component} not found")
    except (NotFound, PolicyNotFound, VhostNotFound):
        raise ApiError(404, "Not Found") from None
    return no_content()


def routes() -> list:
    base = "/api/parameters"
    return [Route(base, list_parameters),
            Route(base + "/{component}", list_parameters),
            Route(base + "/{component}/{vhost}", list_parameters),
            Route(base + "/{component}/{vhost}/{name}", get_parameter, methods=["GET"]),
            Route(base + "/{component}/{vhost}/{name}", put_parameter, methods=["PUT"]),
            Route(base + "/{component}/{vhost}/{name}", delete_parameter, methods=["DELETE"])]
