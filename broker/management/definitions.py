"""/api/definitions: export and import in RabbitMQ's JSON format.

An import is all or nothing: every section is validated first (the security model's users,
vhosts, permissions and limits by ``broker.access.validate``; policies by
``broker.policies.check_import``; exchanges, queues and bindings here, including equivalence
with what exists), and only then applied. The one exception, as in RabbitMQ: a binding whose
source or destination is nowhere (neither existing nor in the file) is skipped with a warning
and the rest imported. Other features add sections through
``broker.definition_sections`` (objects with ``export(vhost) -> dict``, ``check(defs)``
raising ValueError with the field, ``apply(defs)``).
"""
from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .. import __version__, errors
from ..exchanges import EXCHANGE_TYPES
from ..queues.args import ArgumentError, equivalence_mismatch, parse_queue_arguments
from ..queues.types import QUEUE_TYPES, queue_type_of
from .api_bindings import until_durable
from .auth import require
from .common import broker_of, json_of, jsonable, param
from .http import ApiError

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("broker.management")


class ImportError_(ValueError):
    """One line naming the item and field that is wrong."""


def export(broker: Broker, vhost_name: str | None = None) -> dict:
    out: dict = {"rabbit_version": "3.10.8", "rabbitmq_version": "3.10.8",
                 "product_name": "TrioMQ", "product_version": __version__}
    sec = broker.access.export()
    parameters = list(sec.get("parameters", []))
    pol = broker.policies.export(vhost_name)
    policies: list = pol.get("policies", [])
    parameters += pol.get("parameters", [])
    exchanges, queues, bindings = [], [], []
    for vhost in list(broker.vhosts.values()):
        if vhost_name is not None and vhost.name != vhost_name:
            continue
        for x in vhost.exchanges.values():
            if x.name == "" or x.name.startswith("amq.") or x.hidden:
                continue
            exchanges.append({"name": x.name, "vhost": vhost.name, "type": x.type_name,
                              "durable": x.durable, "auto_delete": x.auto_delete,
                              "internal": x.internal, "arguments": jsonable(x.arguments)})
        for q in vhost.queues.values():
            if q.internal or q.exclusive_owner is not None:
                continue
            queues.append({"name": q.name, "vhost": vhost.name, "durable": q.durable,
                           "auto_delete": q.auto_delete, "arguments": jsonable(q.arguments)})
        for x in vhost.exchanges.values():
            if x.name == "":
                continue
            for b in x.bindings.values():
                d = b.destination
                if d.internal or (d.kind == "queue" and d.exclusive_owner is not None):
                    continue
                bindings.append({"source": x.name, "vhost": vhost.name, "destination": d.name,
                                 "destination_type": d.kind, "routing_key": b.routing_key,
                                 "arguments": jsonable(b.arguments)})
    if vhost_name is None:
        out.update({"users": sec.get("users", []), "vhosts": sec.get("vhosts", []),
                    "permissions": sec.get("permissions", []),
                    "topic_permissions": sec.get("topic_permissions", []),
                    "parameters": parameters, "global_parameters": [],
                    "policies": policies})
    else:
        out.update({"parameters": [p for p in parameters if p.get("vhost") == vhost_name],
                    "policies": policies})
    out.update({"queues": queues, "exchanges": exchanges, "bindings": bindings})
    for section in broker.definition_sections:
        for key, value in section.export(vhost_name).items():
            out.setdefault(key, []).extend(value)
    return out


def _list(defs: dict, key: str) -> list:
    value = defs.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ImportError_(f"{key}: must be a list")
    return value


def _bool(item: dict, where: str, key: str, default: bool) -> bool:
    value = item.get(key, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise ImportError_(f"{where}.{key}: must be true or false")
    return value


def _str(item: dict, where: str, key: str, default: str | None = None) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise ImportError_(f"{where}.{key}: must be a string")
    return value


def _args(item: dict, where: str) -> dict:
    value = item.get("arguments") or {}
    if not isinstance(value, dict):
        raise ImportError_(f"{where}.arguments: must be a JSON object")
    return value


def check_entities(broker: Broker, defs: dict, vhosts_to_come: set[str], only_vhost: str | None):
    """Validated (exchanges, queues, bindings) lists, each item normalised."""
    def vhost_of(item: dict, where: str) -> str:
        v = only_vhost if only_vhost is not None else _str(item, where, "vhost")
        if v not in broker.vhosts and v not in vhosts_to_come:
            raise ImportError_(f"{where}.vhost: no vhost '{v}'")
        return v

    exchanges, queues, bindings = [], [], []
    new_x: set[tuple[str, str]] = set()
    new_q: set[tuple[str, str]] = set()
    for i, item in enumerate(_list(defs, "exchanges")):
        where = f"exchanges[{i}]"
        if not isinstance(item, dict):
            raise ImportError_(f"{where}: must be a JSON object")
        v = vhost_of(item, where)
        name = _str(item, where, "name")
        xtype = _str(item, where, "type")
        if xtype not in EXCHANGE_TYPES:
            raise ImportError_(f"{where}.type: unknown exchange type '{xtype}'")
        if name == "" or name.startswith("amq."):
            continue  # as RabbitMQ: the standard exchanges are not imported
        args = _args(item, where)
        x_durable = _bool(item, where, "durable", True)
        x_auto_delete = _bool(item, where, "auto_delete", False)
        x_internal = _bool(item, where, "internal", False)
        entry = {"vhost": v, "name": name, "type": xtype, "durable": x_durable,
                 "auto_delete": x_auto_delete, "internal": x_internal, "arguments": args}
        vhost = broker.vhosts.get(v)
        existing = vhost.exchanges.get(name) if vhost is not None else None
        if existing is not None:
            try:
                existing.check_equivalent(xtype, x_durable, x_auto_delete, x_internal, args,
                                          _resource("exchange", name, v))
            except errors.AMQPError as exc:
                raise ImportError_(f"{where}: {exc.text.split(' - ', 1)[-1]}") from None
        else:
            try:
                EXCHANGE_TYPES[xtype].validate(args, _resource("exchange", name, v))
            except errors.AMQPError as exc:
                raise ImportError_(f"{where}.arguments: {exc.text.split(' - ', 1)[-1]}") from None
        exchanges.append(entry)
        new_x.add((v, name))
    for i, item in enumerate(_list(defs, "queues")):
        where = f"queues[{i}]"
        if not isinstance(item, dict):
            raise ImportError_(f"{where}: must be a JSON object")
        v = vhost_of(item, where)
        name = _str(item, where, "name")
        if not name or name.startswith("amq."):
            raise ImportError_(f"{where}.name: '{name}' is not a valid queue name")
        args = _args(item, where)
        qtype = item.get("type")  # newer exports name the type beside the arguments
        if qtype is not None and "x-queue-type" not in args:
            if qtype not in QUEUE_TYPES:
                raise ImportError_(f"{where}.type: unknown queue type '{qtype}'")
            args = dict(args, **{"x-queue-type": qtype})
        try:
            parse_queue_arguments(args)
        except ArgumentError as exc:
            raise ImportError_(f"{where}.arguments.{exc.name}: {exc.detail}") from None
        durable = _bool(item, where, "durable", True)
        auto_delete = _bool(item, where, "auto_delete", False)
        entry = {"vhost": v, "name": name, "durable": durable, "auto_delete": auto_delete,
                 "arguments": args}
        vhost = broker.vhosts.get(v)
        existing_q = vhost.find_queue(name) if vhost is not None else None
        if existing_q is None:
            try:  # a new queue: what its type refuses (quorum: auto-delete, transient)
                queue_type_of(args).check_declare(_resource("queue", name, v), durable, False,
                                                  auto_delete, args)
            except errors.AMQPError as exc:
                raise ImportError_(f"{where}: {exc.text.split(' - ', 1)[-1]}") from None
        if existing_q is not None:
            if existing_q.exclusive_owner is not None:
                raise ImportError_(f"{where}: queue '{name}' in vhost '{v}' is exclusive to a "
                                   f"connection")
            for key, value in (("durable", existing_q.durable),
                               ("auto_delete", existing_q.auto_delete)):
                if value != entry[key]:
                    raise ImportError_(f"{where}.{key}: inequivalent with the existing queue "
                                       f"'{name}' in vhost '{v}'")
            mismatch = equivalence_mismatch(existing_q.arguments, args)
            if mismatch:
                raise ImportError_(f"{where}.arguments: "
                                   + mismatch.format(queue=name, vhost=v))
        queues.append(entry)
        new_q.add((v, name))
    for i, item in enumerate(_list(defs, "bindings")):
        where = f"bindings[{i}]"
        if not isinstance(item, dict):
            raise ImportError_(f"{where}: must be a JSON object")
        v = vhost_of(item, where)
        source = _str(item, where, "source")
        dest = _str(item, where, "destination")
        kind = _str(item, where, "destination_type", "queue")
        if kind not in ("queue", "exchange"):
            raise ImportError_(f"{where}.destination_type: must be queue or exchange")
        vhost = broker.vhosts.get(v)
        if source == "":
            continue  # the default exchange's implicit bindings
        # a dangling binding (its source or destination neither exists nor comes with the
        # file) is skipped and the rest imported, as RabbitMQ does: exports taken while
        # queues came and went have them, and refusing the whole file would lose the rest
        if (v, source) not in new_x and (vhost is None or source not in vhost.exchanges):
            log.warning("definitions: %s skipped: no exchange '%s' in vhost '%s'",
                        where, source, v)
            continue
        if kind == "queue":
            ok = (v, dest) in new_q or (vhost is not None and vhost.find_queue(dest) is not None)
        else:
            ok = (v, dest) in new_x or (vhost is not None and dest in vhost.exchanges)
        if not ok:
            log.warning("definitions: %s skipped: no %s '%s' in vhost '%s'", where, kind,
                        dest, v)
            continue
        bindings.append({"vhost": v, "source": source, "destination": dest,
                         "destination_type": kind,
                         "routing_key": _str(item, where, "routing_key", ""),
                         "arguments": _args(item, where)})
    return exchanges, queues, bindings


def _resource(kind: str, name: str, vhost: str):
    return errors.Resource(kind, name, vhost)


def import_definitions(broker: Broker, defs, only_vhost: str | None = None) -> None:
    """Validate everything, then apply; raises ImportError_ (nothing changed)."""
    if not isinstance(defs, dict):
        raise ImportError_("definitions: must be a JSON object")
    access = broker.access
    from ..policies import PolicyError, VhostNotFound
    from ..security import DefinitionError
    sec_plan = None
    vhosts_to_come: set[str] = set()
    if only_vhost is None:
        for i, v in enumerate(_list(defs, "vhosts")):
            if not isinstance(v, dict) or not isinstance(v.get("name"), str):
                raise ImportError_(f"vhosts[{i}].name: must be a string")
            vhosts_to_come.add(v["name"])
        try:
            sec_plan = access.validate(defs)
        except DefinitionError as exc:
            raise ImportError_(str(exc)) from None
    elif only_vhost not in broker.vhosts:
        raise ImportError_(f"vhost: no vhost '{only_vhost}'")
    pol_defs = defs
    if only_vhost is not None:
        pol_defs = dict(defs, policies=[dict(p, vhost=only_vhost) for p in
                                        _list(defs, "policies") if isinstance(p, dict)])
    try:
        broker.policies.check_import(pol_defs, vhosts_to_come)
    except PolicyError as exc:
        raise ImportError_(f"policies: {exc.text}") from None
    except VhostNotFound as exc:
        raise ImportError_(f"policies: no vhost '{exc}'") from None
    exchanges, queues, bindings = check_entities(broker, defs, vhosts_to_come, only_vhost)
    sections = list(broker.definition_sections)
    for section in sections:
        try:
            section.check(defs)
        except ValueError as exc:
            raise ImportError_(str(exc)) from None
    # ---- apply: nothing below may fail on input any more ----
    if sec_plan is not None:
        from ..security.definitions import apply
        apply(access, sec_plan)
    for name in vhosts_to_come:
        broker.create_vhost(name)
    broker.policies.import_(pol_defs, vhosts_to_come)
    for x in exchanges:
        broker.vhosts[x["vhost"]].declare_exchange(
            x["name"], x["type"], durable=x["durable"], auto_delete=x["auto_delete"],
            internal=x["internal"], arguments=x["arguments"])
    for q in queues:
        broker.vhosts[q["vhost"]].declare_queue(
            q["name"], durable=q["durable"], auto_delete=q["auto_delete"],
            arguments=q["arguments"])
    for b in bindings:
        vhost = broker.vhosts[b["vhost"]]
        dest = (vhost.find_queue(b["destination"]) if b["destination_type"] == "queue"
                else vhost.exchanges.get(b["destination"]))
        vhost.bind(b["source"], dest, b["routing_key"], b["arguments"])
    for section in sections:
        section.apply(defs)


async def get_definitions(request: Request):
    await require(request, "administrator")
    broker = broker_of(request)
    vhost = param(request, "vhost") if "vhost" in request.path_params else None
    if vhost is not None and vhost not in broker.vhosts:
        raise ApiError(404, "Not Found")
    headers = {}
    if "download" in request.query_params:
        # the client names the file: only characters a header and a file name can carry
        name = re.sub(r"[^A-Za-z0-9._ -]", "_", request.query_params["download"])[:200]
        headers["content-disposition"] = f'attachment; filename="{name or "definitions.json"}"'
    return JSONResponse(export(broker, vhost), headers=headers)


async def post_definitions(request: Request):
    await require(request, "administrator")
    broker = broker_of(request)
    vhost = param(request, "vhost") if "vhost" in request.path_params else None
    raw = await request.body()
    ctype = request.headers.get("content-type", "")
    if ctype.startswith("multipart/form-data") or ctype.startswith(
            "application/x-www-form-urlencoded"):
        form = await request.form()
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raw = (upload or "").encode()
        else:
            raw = await upload.read()
    defs = json_of(raw)
    try:
        import_definitions(broker, defs, vhost)
    except ImportError_ as exc:
        raise ApiError(400, str(exc)) from None
    await until_durable(broker.store)  # on every live node (--workers)
    return _no_content()


def _no_content():
    from starlette.responses import Response
    return Response(status_code=204)


def routes() -> list:
    return [
        Route("/api/definitions", get_definitions, methods=["GET"]),
        Route("/api/definitions", post_definitions, methods=["POST"]),
        Route("/api/definitions/{vhost}", get_definitions, methods=["GET"]),
        Route("/api/definitions/{vhost}", post_definitions, methods=["POST"]),
    ]
