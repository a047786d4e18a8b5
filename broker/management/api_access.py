"""/api/users, /api/permissions, /api/topic-permissions, /api/user-limits and
/api/vhost-limits: thin HTTP over ``broker.access`` (broker/security), which validates
(DefinitionError -> 400 naming the field, NotFound -> 404) and persists."""
from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route

from ..security import DefinitionError, NotFound
from .api_bindings import until_durable
from .auth import require
from .common import body, broker_of, check_vhost_access, created, json_response, no_content, param
from .http import ApiError
from .listing import paginate


def _call(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except DefinitionError as exc:
        raise ApiError(400, str(exc)) from None
    except NotFound as exc:
        raise ApiError(404, str(exc) or "Not Found", "Object Not Found") from None


def user_json(record: dict) -> dict:
    return {"name": record["name"], "password_hash": record.get("password_hash", ""),
            "hashing_algorithm": record.get("hashing_algorithm",
                                            "rabbit_password_hashing_sha256"),
            "tags": list(record.get("tags", [])), "limits": dict(record.get("limits", {}))}


# ---- users -----------------------------------------------------------------------------


async def list_users(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    users = [user_json(u) for u in access.list_users()]
    return json_response(paginate(request, users, lambda u: u, lambda u: u["name"]))


async def users_without_permissions(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    with_perms = {p["user"] for p in access.list_permissions()}
    return json_response([user_json(u) for u in access.list_users()
                          if u["name"] not in with_perms])


async def get_user(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    user = access.user(param(request, "user"))
    if user is None:
        raise ApiError(404, "Not Found")
    return json_response(user_json(user.record()))


async def put_user(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    name = param(request, "user")
    data = await body(request, {"password", "password_hash", "hashing_algorithm", "tags",
                                "limits", "name", "vhost"})
    if "password" not in data and "password_hash" not in data and access.user(name) is None:
        raise ApiError(400, "field 'password' or 'password_hash': one of them is required")
    existed = access.user(name) is not None
    _call(access.put_user, name, password=data.get("password"),
          password_hash=data.get("password_hash"),
          hashing_algorithm=data.get("hashing_algorithm"), tags=data.get("tags", ""),
          limits=data.get("limits"))
    await until_durable(broker_of(request).store)  # on every live node (--workers)
    return no_content() if existed else created()


async def delete_user(request: Request):
    await require(request, "administrator")
    _call(broker_of(request).access.delete_user, param(request, "user"))
    await until_durable(broker_of(request).store)  # on every live node (--workers)
    return no_content()


async def bulk_delete_users(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    data = await body(request, {"users"}, required=("users",))
    names = data["users"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ApiError(400, "field 'users': expected a list of user names")
    for name in names:
        if access.user(name) is not None:
            _call(access.delete_user, name)
    return no_content()


async def user_permissions(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    name = param(request, "user")
    if access.user(name) is None:
        raise ApiError(404, "Not Found")
    kind = "topic" if request.url.path.endswith("topic-permissions") else "perm"
    lister = access.list_topic_permissions if kind == "topic" else access.list_permissions
    return json_response(lister(user=name))


# ---- permissions -----------------------------------------------------------------------------


async def list_permissions(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    topic = "topic-permissions" in request.url.path
    vhost = param(request, "vhost") if "vhost" in request.path_params else None
    if vhost is not None and vhost not in broker_of(request).vhosts:
        raise ApiError(404, "Not Found")
    items = (access.list_topic_permissions if topic else access.list_permissions)(vhost=vhost)
    return json_response(items)


async def get_permission(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    topic = request.url.path.startswith("/api/topic-permissions")
    vhost, user = param(request, "vhost"), param(request, "user")
    items = (access.list_topic_permissions if topic else access.list_permissions)(
        user=user, vhost=vhost)
    if not items:
        raise ApiError(404, "Not Found")
    return json_response(items if topic else items[0])


async def put_permission(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    vhost, user = param(request, "vhost"), param(request, "user")
    if vhost not in broker_of(request).vhosts:
        raise ApiError(400, f"vhost_not_found: no vhost '{vhost}'")
    if access.user(user) is None:
        raise ApiError(400, f"user_not_found: no user '{user}'")
    if request.url.path.startswith("/api/topic-permissions"):
        data = await body(request, {"exchange", "write", "read", "vhost", "user"},
                          required=("exchange", "write", "read"))
        existed = bool(access.list_topic_permissions(user=user, vhost=vhost))
        _call(access.set_topic_permissions, user, vhost, data["exchange"], data["write"],
              data["read"])
    else:
        data = await body(request, {"configure", "write", "read", "vhost", "user"},
                          required=("configure", "write", "read"))
        existed = bool(access.list_permissions(user=user, vhost=vhost))
        _call(access.set_permissions, user, vhost, data["configure"], data["write"],
              data["read"])
    await until_durable(broker_of(request).store)  # on every live node (--workers)
    return no_content() if existed else created()


async def delete_permission(request: Request):
    await require(request, "administrator")
    access = broker_of(request).access
    vhost, user = param(request, "vhost"), param(request, "user")
    if request.url.path.startswith("/api/topic-permissions"):
        _call(access.clear_topic_permissions, user, vhost)
    else:
        _call(access.clear_permissions, user, vhost)
    await until_durable(broker_of(request).store)  # on every live node (--workers)
    return no_content()


# ---- limits --------------------------------------------------------------------------------


async def list_vhost_limits(request: Request):
    user = await require(request)
    broker = broker_of(request)
    out = []
    only = param(request, "vhost") if "vhost" in request.path_params else None
    for info in broker.access.list_vhosts():
        if only is not None and info["name"] != only:
            continue
        if info.get("limits"):
            if not user.sees_all:
                check_vhost_access(broker, user, info["name"])
            out.append({"vhost": info["name"], "value": info["limits"]})
    return json_response(out)


async def put_vhost_limit(request: Request):
    await require(request, "administrator")
    data = await body(request, {"value", "vhost", "name"}, required=("value",))
    _call(broker_of(request).access.set_vhost_limits, param(request, "vhost"),
          {param(request, "name"): data["value"]})
    return no_content()


async def delete_vhost_limit(request: Request):
    await require(request, "administrator")
    _call(broker_of(request).access.clear_vhost_limits, param(request, "vhost"),
          param(request, "name"))
    return no_content()


async def list_user_limits(request: Request):
    user = await require(request)  # others' limits: administrators only
    access = broker_of(request).access
    only = param(request, "user") if "user" in request.path_params else None
    return json_response([{"user": u["name"], "value": u["limits"]} for u in access.list_users()
                          if u.get("limits") and (only is None or u["name"] == only)
                          and (user.is_admin or u["name"] == user.name)])


async def put_user_limit(request: Request):
    await require(request, "administrator")
    data = await body(request, {"value", "vhost", "name", "user"}, required=("value",))
    _call(broker_of(request).access.set_user_limits, param(request, "user"),
          {param(request, "name"): data["value"]})
    return no_content()


async def delete_user_limit(request: Request):
    await require(request, "administrator")
    _call(broker_of(request).access.clear_user_limits, param(request, "user"),
          param(request, "name"))
    return no_content()




def routes() -> list:
    P = "/{vhost}/{user}"
    return [
        Route("/api/users", list_users),
        Route("/api/users/without-permissions", users_without_permissions),
        Route("/api/users/bulk-delete", bulk_delete_users, methods=["POST"]),
        Route("/api/users/{user}", get_user, methods=["GET"]),
        Route("/api/users/{user}", put_user, methods=["PUT"]),
        Route("/api/users/{user}", delete_user, methods=["DELETE"]),
        Route("/api/users/{user}/permissions", user_permissions),
        Route("/api/users/{user}/topic-permissions", user_permissions),
        Route("/api/permissions", list_permissions),
        Route("/api/vhosts/{vhost}/permissions", list_permissions),
        Route("/api/permissions" + P, get_permission, methods=["GET"]),
        Route("/api/permissions" + P, put_permission, methods=["PUT"]),
        Route("/api/permissions" + P, delete_permission, methods=["DELETE"]),
        Route("/api/topic-permissions", list_permissions),
        Route("/api/vhosts/{vhost}/topic-permissions", list_permissions),
        Route("/api/topic-permissions" + P, get_permission, methods=["GET"]),
        Route("/api/topic-permissions" + P, put_permission, methods=["PUT"]),
        Route("/api/topic-permissions" + P, delete_permission, methods=["DELETE"]),
        Route("/api/vhost-limits", list_vhost_limits),
        Route("/api/vhost-limits/{vhost}", list_vhost_limits),
        Route("/api/vhost-limits/{vhost}/{name}", put_vhost_limit, methods=["PUT"]),
        Route("/api/vhost-limits/{vhost}/{name}", delete_vhost_limit, methods=["DELETE"]),
        Route("/api/user-limits", list_user_limits),
        Route("/api/user-limits/{user}", list_user_limits),
        Route("/api/user-limits/{user}/{name}", put_user_limit, methods=["PUT"]),
        Route("/api/user-limits/{user}/{name}", delete_user_limit, methods=["DELETE"]),
    ]
