"""Users, vhosts, permissions, topic permissions and limits in RabbitMQ's definitions JSON
(``GET /api/definitions``): ``export``, and an import that validates everything first
(``validate``: DefinitionError naming the field, e.g. ``users[2].tags``) and then applies
(``apply``), so an import is all or nothing. Keys owned by other features (queues,
exchanges, bindings, policies, other parameters) are left to them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from . import model
from .model import USER_LIMITS, VHOST_LIMITS, DefinitionError
from .passwords import SHA256, hash_password

if TYPE_CHECKING:
    from ..services import AccessServices

_USER_KEYS = {"name", "password_hash", "hashing_algorithm", "tags", "limits", "password"}
_VHOST_KEYS = {"name", "description", "tags", "metadata", "default_queue_type", "limits",
               "tracing"}
_PERM_KEYS = {"user", "vhost", "configure", "write", "read"}
_TOPIC_KEYS = {"user", "vhost", "exchange", "write", "read"}


def export(access) -> dict:
    vhosts = []
    parameters = []
    for v in access.list_vhosts():
        entry = {"name": v["name"], "description": v["description"], "tags": v["tags"],
                 "metadata": {"description": v["description"], "tags": v["tags"]}}
        if v.get("default_queue_type"):
            # RabbitMQ 3.11+ exports it in the metadata; older importers read the top level
            entry["default_queue_type"] = v["default_queue_type"]
            entry["metadata"]["default_queue_type"] = v["default_queue_type"]
        vhosts.append(entry)
        if v["limits"]:  # RabbitMQ keeps vhost limits as a runtime parameter
            parameters.append({"vhost": v["name"], "component": "vhost-limits",
                               "name": "limits", "value": dict(v["limits"])})
    return {"users": access.list_users(), "vhosts": vhosts,
            "permissions": access.list_permissions(),
            "topic_permissions": access.list_topic_permissions(), "parameters": parameters}


def _list(defs: dict, key: str) -> list:
    value = defs.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionError(key, "must be a list")
    return value


def _str(field: str, value: object, default: str = "") -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise DefinitionError(field, "must be a string")
    return value


def validate(access, defs: object) -> dict:
    """The import plan for ``defs``; raises DefinitionError at the first bad field."""
    if not isinstance(defs, dict):
        raise DefinitionError("definitions", "must be a JSON object")
    plan: dict = {"users": [], "vhosts": [], "permissions": [], "topic_permissions": [],
                  "vhost_limits": []}
    users = set(access.users)
    for i, u in enumerate(_list(defs, "users")):
        f = f"users[{i}]"
        model.only_keys(f, u, _USER_KEYS)
        name = model.name(f"{f}.name", u.get("name"))
        password = None
        if u.get("password") is not None:
            password = _str(f"{f}.password", u["password"])
            phash, algo = hash_password(password), SHA256
        else:
            phash, algo = model.password_hash(f"{f}.password_hash", u.get("password_hash"),
                                              u.get("hashing_algorithm"))
        plan["users"].append({"name": name, "password_hash": phash, "hashing_algorithm": algo,
                              "tags": list(model.tags(f"{f}.tags", u.get("tags"))),
                              "limits": model.limits(f"{f}.limits", u.get("limits"), USER_LIMITS),
                              # a password (not a hash) also gives SCRAM credentials
                              "password": password})
        users.add(name)
    vhosts = set(access.vhost_info)
    for i, v in enumerate(_list(defs, "vhosts")):
        f = f"vhosts[{i}]"
        model.only_keys(f, v, _VHOST_KEYS)
        name = model.name(f"{f}.name", v.get("name"))
        meta = v.get("metadata") or {}
        if not isinstance(meta, dict):
            raise DefinitionError(f"{f}.metadata", "must be an object")
        description = _str(f"{f}.description", v.get("description", meta.get("description")))
        tags = v.get("tags", meta.get("tags")) or []
        if isinstance(tags, str):
            tags = [t.strip() for t in tags.split(",") if t.strip()]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise DefinitionError(f"{f}.tags", "must be a list of strings")
        plan["vhosts"].append({"name": name, "description": description, "tags": tags,
                               "default_queue_type": _str(
                                   f"{f}.default_queue_type",
                                   v.get("default_queue_type", meta.get("default_queue_type")))})
        if v.get("limits"):
            plan["vhost_limits"].append(
                (name, model.limits(f"{f}.limits", v["limits"], VHOST_LIMITS)))
        vhosts.add(name)
    for i, p in enumerate(_list(defs, "parameters")):
        f = f"parameters[{i}]"
        if not isinstance(p, dict):
            raise DefinitionError(f, "must be an object")
        if p.get("component") != "vhost-limits":
            continue  # another feature's parameter
        vhost = model.name(f"{f}.vhost", p.get("vhost"))
        if vhost not in vhosts:
            raise DefinitionError(f"{f}.vhost", f"no such vhost '{vhost}'")
        plan["vhost_limits"].append((vhost, model.limits(f"{f}.value", p.get("value"), VHOST_LIMITS)))
    for key, keys, out in (("permissions", _PERM_KEYS, plan["permissions"]),
                           ("topic_permissions", _TOPIC_KEYS, plan["topic_permissions"])):
        for i, p in enumerate(_list(defs, key)):
            f = f"{key}[{i}]"
            model.only_keys(f, p, keys)
            user = model.name(f"{f}.user", p.get("user"))
            vhost = model.name(f"{f}.vhost", p.get("vhost"))
            if user not in users:
                raise DefinitionError(f"{f}.user", f"no such user '{user}'")
            if vhost not in vhosts:
                raise DefinitionError(f"{f}.vhost", f"no such vhost '{vhost}'")
            entry = {"user": user, "vhost": vhost}
            if "exchange" in keys:
                entry["exchange"] = model.name(f"{f}.exchange", p.get("exchange"), allow_empty=True)
            for perm in ("configure", "write", "read") if "configure" in keys else ("write", "read"):
                entry[perm] = model.pattern(f"{f}.{perm}", p.get(perm, ""))
            out.append(entry)
    return plan


def apply(access, plan: dict) -> None:
    """Apply a plan from ``validate`` (cannot fail on input any more)."""
    for u in plan["users"]:
        if u["password"] is not None:
            access.put_user(u["name"], password=u["password"], tags=u["tags"],
                            limits=u["limits"])
        else:
            access.put_user(u["name"], password_hash=u["password_hash"],
                            hashing_algorithm=u["hashing_algorithm"], tags=u["tags"],
                            limits=u["limits"])
    for v in plan["vhosts"]:
        access.add_vhost(v["name"], v["description"], v["tags"], v["default_queue_type"] or None)
    for vhost, limits in plan["vhost_limits"]:
        access.set_vhost_limits(vhost, limits)
    for p in plan["permissions"]:
        access.set_permissions(p["user"], p["vhost"], p["configure"], p["write"], p["read"])
    for p in plan["topic_permissions"]:
        access.set_topic_permissions(p["user"], p["vhost"], p["exchange"], p["write"], p["read"])


def read_definitions(path: str) -> dict:
    """The definitions JSON in ``path``, checked against an empty broker (users and vhosts
    it refers to must be defined in it, or be the defaults); raises DefinitionError."""
    import json
    from types import SimpleNamespace
    from typing import cast

    from .access import AccessControl
    try:
        with open(path, encoding="utf-8") as f:
            defs = json.load(f)
    except OSError as exc:
        raise DefinitionError("file", exc.strerror or str(exc)) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DefinitionError("file", f"not valid JSON: {exc}") from None
    # a scratch AccessControl that only validates: of its services it reads the vhosts
    scratch = AccessControl(cast("AccessServices", SimpleNamespace(vhosts={"/": None})))
    validate(scratch, defs)
    return defs
