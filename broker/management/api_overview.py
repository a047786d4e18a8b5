"""/api/overview, /api/nodes, /api/whoami, /api/vhosts, /api/aliveness-test and
/api/health/checks/*."""
from __future__ import annotations

import glob
import html
import os
import shutil
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.routing import Route

from .. import __version__, errors
from ..broker import process_rss
from ..exchanges import EXCHANGE_TYPES
from .api_bindings import until_durable
from .auth import require
from .common import (
    NODE,
    amqp_error,
    body,
    broker_of,
    check_vhost_access,
    created,
    json_response,
    no_content,
    param,
    visible_vhosts,
)
from .http import ApiError
from .listing import paginate
from .stats import CHURN_FIELDS, churn_counts, rate_details, with_deliver_get

if TYPE_CHECKING:
    from ..broker import Broker

STARTED = time.time()

_DESCRIPTIONS = {"direct": "AMQP direct exchange, as per the AMQP specification",
                 "fanout": "AMQP fanout exchange, as per the AMQP specification",
                 "headers": "AMQP headers exchange, as per the AMQP specification",
                 "topic": "AMQP topic exchange, as per the AMQP specification"}


def exchange_types() -> list[dict]:
    return [{"name": n, "description": _DESCRIPTIONS.get(n, f"{n} exchange"), "enabled": True}
            for n in sorted(EXCHANGE_TYPES)]


async def auth(request: Request) -> JSONResponse:
    """How the console logs in (no login needed to ask): OAuth 2 when the console has a
    client id and a provider and the broker takes tokens. RabbitMQ 3.10's keys (enable_uaa,
    uaa_client_id, uaa_location) and 3.11's (oauth_enabled, oauth_client_id,
    oauth_provider_url, oauth_scopes)."""
    config = request.app.state.broker.config
    enabled = bool(config.management_oauth_client_id and config.management_oauth_provider_url
                   and config.oauth2_resource_server_id)
    client_id = (config.management_oauth_client_id or "") if enabled else ""
    provider = (config.management_oauth_provider_url or "") if enabled else ""
    return JSONResponse({"enable_uaa": enabled, "uaa_client_id": client_id,
                         "uaa_location": provider, "oauth_enabled": enabled,
                         "oauth_client_id": client_id, "oauth_provider_url": provider,
                         "oauth_scopes": config.management_oauth_scopes if enabled else ""})


async def whoami(request: Request) -> JSONResponse:
    user = await require(request)
    return JSONResponse({"name": user.name, "tags": sorted(user.tags)})


def _totals(broker: Broker, vhosts) -> tuple[dict, dict]:
    queues = consumers = ready = unacked = exchanges = 0
    for v in vhosts:
        exchanges += len(v.exchanges)
        for q in v.queues.values():
            if q.internal:
                continue
            queues += 1
            consumers += len(q.consumers)
            ready += q.message_count
            unacked += q.unacked_count
    sessions = [s for s in list(broker.sessions) if s.vhost in vhosts]
    channels = sum(len(s.channels) for s in sessions)
    objects = {"channels": channels, "connections": len(sessions), "consumers": consumers,
               "exchanges": exchanges, "queues": queues}
    return objects, {"messages": ready + unacked, "messages_ready": ready,
                     "messages_unacknowledged": unacked}


def _listeners(broker: Broker) -> list[dict]:
    config = broker.config
    http = broker.http_server
    out = [{"node": NODE, "protocol": "amqp", "ip_address": config.host,
            "port": http.amqp_port or config.port, "socket_opts": {}}]
    if http.port:
        host = config.http_host if config.http_host is not None else config.host
        out.append({"node": NODE, "protocol": "http", "ip_address": host, "port": http.port,
                    "socket_opts": {}})
    return out


async def overview(request: Request) -> JSONResponse:
    user = await require(request)
    broker = broker_of(request)
    vhosts = visible_vhosts(broker, user)
    objects, totals = _totals(broker, vhosts)
    from ..cluster.view import listings
    parts = await listings(broker, "totals", user, None)
    if parts is not None:  # a cluster (--workers): every node's connections and messages
        for key in ("connections", "channels", "consumers"):
            objects[key] = sum(p[key] for p in parts)
        totals = {key: sum(p[key] for p in parts) for key in totals}
    sampler = broker.stats_sampler
    rates = sampler.overview_rates()
    t = broker.message_totals.current()
    stats = rate_details(with_deliver_get(t), rates)
    queue_totals = {}
    for key, value in totals.items():
        queue_totals[key] = value
        queue_totals[key + "_details"] = {"rate": round(rates.get(key, 0.0), 1)}
    out = {
        "management_version": __version__, "rates_mode": "basic",
        "sample_retention_policies": {"global": [600], "basic": [600], "detailed": [600]},
        "exchange_types": exchange_types(), "product_version": __version__,
        "product_name": "TrioMQ", "rabbitmq_version": "3.10.8", "cluster_name": NODE,
        "erlang_version": "n/a", "erlang_full_version": "n/a",
        "disable_stats": False, "enable_queue_totals": True,
        "message_stats": stats, "queue_totals": queue_totals,
        "churn_rates": rate_details(dict(zip(CHURN_FIELDS, churn_counts(broker), strict=True)),
                                    sampler.churn_rates()),
        "object_totals": objects, "statistics_db_event_queue": 0, "node": NODE,
        "listeners": _listeners(broker), "contexts": [],  # RabbitMQ's overview has none
        # TrioMQ: what the last start read back, and whether it still does
        "recovery": broker.recovery.as_dict(),
    }
    if "samples" in request.query_params or request.query_params.get("msg_rates_age"):
        # the console's graphs: the ring of overview samples (time ms, counters)
        out["samples"] = [{"timestamp": int(ts * 1000), **values}
                          for ts, values in sampler.overview]
    return JSONResponse(out)


def _node(broker: Broker) -> dict:
    return {
        "name": NODE, "type": "disc", "running": True, "being_drained": False,
        "os_pid": str(os.getpid()), "mem_used": process_rss(), "mem_limit": broker.memory_limit,
        "mem_alarm": any(a.startswith("memory") for a in broker.alarms),
        "disk_free_limit": broker.config.disk_free_limit,
        "disk_free_alarm": "disk" in broker.alarms,
        "disk_free": _disk_free(broker), "fd_total": _fd_limit(), "fd_used": _fd_used(),
        "sockets_total": _fd_limit(), "sockets_used": len(broker.sessions),
        "proc_total": 0, "proc_used": 0, "processors": os.cpu_count() or 1,
        "uptime": int((time.time() - STARTED) * 1000), "run_queue": 0, "rates_mode": "basic",
        "exchange_types": exchange_types(),
        "auth_mechanisms": [{"name": m, "description": d, "enabled": True} for m, d in
                            (("PLAIN", "SASL PLAIN authentication mechanism"),
                             ("AMQPLAIN", "QPid AMQPLAIN mechanism"),
                             ("EXTERNAL", "TLS client certificate (CN) authentication"))],
        "applications": [{"name": "triomq", "description": "TrioMQ", "version": __version__}],
        "partitions": [], "cluster_links": [], "alarms": sorted(broker.alarms),
        "enabled_plugins": ["rabbitmq_management", "rabbitmq_prometheus"],
        "listeners": _listeners(broker), "contexts": _contexts(broker),
        **_node_extras(broker),
    }


def _contexts(broker: Broker) -> list[dict]:
    """The HTTP listener as RabbitMQ's node lists its web contexts (the port a string)."""
    http = broker.http_server
    if not http.port:
        return []
    return [{"description": "RabbitMQ Management", "path": "/",
             "cowboy_opts": "[{sendfile,false}]", "port": str(http.port)}]


_NODE_COUNTERS = (
    "gc_num", "gc_bytes_reclaimed", "context_switches", "io_read_count", "io_read_bytes",
    "io_read_avg_time", "io_write_count", "io_write_bytes", "io_write_avg_time",
    "io_sync_count", "io_sync_avg_time", "io_seek_count", "io_seek_avg_time",
    "io_reopen_count", "mnesia_ram_tx_count", "mnesia_disk_tx_count",
    "msg_store_read_count", "msg_store_write_count", "queue_index_write_count",
    "queue_index_read_count", "connection_created", "connection_closed",
    "channel_created", "channel_closed", "queue_declared", "queue_created", "queue_deleted")


def _proc_io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(": ") for line in f)}
    except (OSError, ValueError):
        return {}


def _node_extras(broker: Broker) -> dict:
    """The rest of RabbitMQ's node fields: process counters where this process has them
    (garbage collections, context switches, reads and writes), 0 where the Erlang VM's own
    (mnesia, the message store) have no counterpart here; every counter with
    its ``_details``, as RabbitMQ's basic rates mode gives them."""
    import gc
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    io = _proc_io()
    values = dict.fromkeys(_NODE_COUNTERS, 0)
    values.update(gc_num=sum(g["collections"] for g in gc.get_stats()),
                  context_switches=usage.ru_nvcsw + usage.ru_nivcsw,
                  io_read_count=io.get("syscr", 0), io_read_bytes=io.get("read_bytes", 0),
                  io_write_count=io.get("syscw", 0), io_write_bytes=io.get("write_bytes", 0))
    values.update(zip(CHURN_FIELDS, churn_counts(broker), strict=True))
    churn_rates = broker.stats_sampler.churn_rates()
    out: dict = {}
    for name, value in values.items():
        out[name] = value
        out[name + "_details"] = {"rate": round(churn_rates.get(name, 0.0), 1)}
    for name in ("mem_used", "fd_used", "sockets_used", "proc_used", "disk_free"):
        out[name + "_details"] = {"rate": 0.0}
    config = broker.config
    out.update({
        "log_files": [], "db_dir": str(config.data_dir), "config_files": [],
        "net_ticktime": 60, "mem_calculation_strategy": "rss",
        "ra_open_file_metrics": {}, "metrics_gc_queue_length": {},
    })
    return out


def _disk_free(broker: Broker) -> int:
    try:
        st = os.statvfs(broker.config.data_dir)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def _fd_limit() -> int:
    try:
        import resource
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return 0


def _fd_used() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


async def nodes(request: Request) -> JSONResponse:
    await require(request, "monitoring")
    return JSONResponse([_node(broker_of(request))])


def _memory(broker: Broker) -> dict:
    """RabbitMQ's ``?memory=true`` breakdown, in the categories that have a meaning here:
    message bodies held by queues, bytes waiting in connections' output buffers, the rest of
    the process; ``total`` is the resident set (the strategy memory alarms use)."""
    rss = process_rss()
    queues = sum(q.ready_bytes for v in list(broker.vhosts.values())
                 for q in list(v.queues.values()))
    output = sum(s.conn.pending_output for s in list(broker.sessions))
    return {"queue_procs": queues, "connection_writers": output,
            "other_proc": max(0, rss - queues - output), "strategy": "rss",
            "total": {"rss": rss, "allocated": rss, "erlang": rss}}


async def node(request: Request) -> JSONResponse:
    await require(request, "monitoring")
    if param(request, "name") != NODE:
        raise ApiError(404, "Not Found")
    broker = broker_of(request)
    out = _node(broker)
    if request.query_params.get("memory") == "true":
        out["memory"] = _memory(broker)
    return JSONResponse(out)


async def cluster_name(request: Request) -> JSONResponse:
    await require(request)
    return JSONResponse({"name": NODE})


async def global_parameters(request: Request) -> JSONResponse:
    """RabbitMQ's cluster-wide runtime parameters: here only the cluster name."""
    await require(request, "policymaker")
    return JSONResponse([{"name": "cluster_name", "value": NODE}])


_SECRET_FIELDS = ("default_pass",)


async def environment(request: Request) -> JSONResponse:
    """The node's configuration (``ctl environment``, as rabbitmqctl's prints the Erlang
    application environment): administrator only, secrets masked. TrioMQ's own path."""
    await require(request, "administrator")
    import dataclasses
    config = broker_of(request).config
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)  # each dataclass field, by its name
        if f.name in _SECRET_FIELDS and value:
            value = "********"
        elif isinstance(value, str) and "://" in value and "@" in value:
            scheme, _, rest = value.partition("://")  # a DSN's password
            creds, _, host = rest.rpartition("@")
            user = creds.split(":", 1)[0]
            value = f"{scheme}://{user}:********@{host}" if ":" in creds else value
        elif not isinstance(value, (str, int, float, bool, type(None), list, dict)):
            value = str(value)
        out[f.name] = value
    return JSONResponse(out)


async def extensions(request: Request) -> JSONResponse:
    await require(request)
    return JSONResponse([])


# ---- vhosts --------------------------------------------------------------------------------


def vhost_json(broker: Broker, name: str, info: dict | None, traffic: dict | None = None,
               octets: dict | None = None) -> dict:
    vhost = broker.vhosts.get(name)
    ready = unacked = 0
    if vhost is not None:
        for q in vhost.queues.values():
            if not q.internal:
                ready += q.message_count
                unacked += q.unacked_count
    info = info or {}
    if traffic is None:
        traffic = broker.message_totals.by_vhost()
    counts = traffic.get(name)
    extra = {}
    if counts is not None:  # as RabbitMQ: message_stats once the vhost saw traffic
        rates = broker.stats_sampler.vhost_rates(name)
        extra["message_stats"] = rate_details(with_deliver_get(counts), with_deliver_get(rates))
    if octets is None:
        octets = broker.message_totals.octets_by_vhost()
    if name in octets:  # as RabbitMQ: once the vhost had a connection
        recv, send = octets[name]
        extra.update(rate_details({"recv_oct": recv, "send_oct": send},
                                  broker.stats_sampler.vhost_octet_rates(name)))
    return {**extra, "cluster_state": {NODE: "running"},
            "default_queue_type": info.get("default_queue_type", "undefined"),
            "description": info.get("description", ""),
            "messages": ready + unacked, "messages_details": {"rate": 0.0},
            "messages_ready": ready, "messages_ready_details": {"rate": 0.0},
            "messages_unacknowledged": unacked,
            "messages_unacknowledged_details": {"rate": 0.0},
            "metadata": {"description": info.get("description", ""),
                         "tags": list(info.get("tags", []))},
            "name": name, "tags": list(info.get("tags", [])), "tracing": False}


def _vhost_infos(broker: Broker) -> dict:
    infos = {v["name"]: v for v in broker.access.list_vhosts()}
    for name in broker.vhosts:
        infos.setdefault(name, {"name": name})
    return infos


async def list_vhosts(request: Request):
    user = await require(request)
    broker = broker_of(request)
    names = {v.name for v in visible_vhosts(broker, user)}
    infos = _vhost_infos(broker)
    items = [(n, infos[n]) for n in sorted(infos) if n in names]
    traffic = broker.message_totals.by_vhost()
    octets = broker.message_totals.octets_by_vhost()
    return json_response(paginate(request, items,
                                  lambda p: vhost_json(broker, p[0], p[1], traffic, octets),
                                  lambda p: p[0]))


async def get_vhost(request: Request):
    user = await require(request)
    broker = broker_of(request)
    name = param(request, "vhost")
    infos = _vhost_infos(broker)
    if name not in infos:
        raise ApiError(404, "Not Found")
    check_vhost_access(broker, user, name)
    return json_response(vhost_json(broker, name, infos[name]))


async def put_vhost(request: Request):
    user = await require(request, "administrator")
    broker = broker_of(request)
    name = param(request, "vhost")
    data = await body(request, {"description", "tags", "default_queue_type", "tracing", "name",
                                "vhost"})
    existed = name in broker.vhosts
    from ..security import DefinitionError
    try:
        broker.access.add_vhost(name, data.get("description", ""), data.get("tags"),
                                data.get("default_queue_type"))
        if not existed and broker.access.user(user.name) is not None:
            # as RabbitMQ: the creator gets full permissions in the new vhost
            broker.access.set_permissions(user.name, name, ".*", ".*", ".*")
    except DefinitionError as exc:
        raise ApiError(400, str(exc)) from None
    await until_durable(broker.store)  # on every live node (--workers)
    return no_content() if existed else created()


async def delete_vhost(request: Request):
    await require(request, "administrator")
    broker = broker_of(request)
    from ..security import NotFound
    try:
        broker.access.delete_vhost(param(request, "vhost"))
    except NotFound:
        raise ApiError(404, "Not Found") from None
    await until_durable(broker.store)  # on every live node (--workers)
    return no_content()


# ---- health --------------------------------------------------------------------------------


async def aliveness(request: Request):
    """Declare aliveness-test in the vhost, publish to it and get the message back."""
    user = await require(request)
    broker = broker_of(request)
    name = param(request, "vhost")
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise ApiError(404, "Not Found")
    check_vhost_access(broker, user, name)
    from .api_messages import publish_message
    try:
        q = vhost.declare_queue("aliveness-test")
    except errors.AMQPError as exc:
        raise amqp_error(exc) from None
    publish_message(broker, vhost, "", "aliveness-test", {}, b"test_message", user.name)
    entry = q.get()
    if entry is None:
        return JSONResponse({"status": "failed", "reason": "no message"}, status_code=503)
    q.settled(entry)
    return JSONResponse({"status": "ok"})


def _ok() -> JSONResponse:
    return JSONResponse({"status": "ok"})


def _failed(reason: str, **extra) -> JSONResponse:
    return JSONResponse({"status": "failed", "reason": reason, **extra}, status_code=503)


async def health_alarms(request: Request):
    await require(request)
    broker = broker_of(request)
    if broker.alarms:
        return _failed("resource alarm(s) in effect in the cluster",
                       alarms=[{"node": NODE, "resource": a} for a in sorted(broker.alarms)])
    return _ok()


async def health_virtual_hosts(request: Request):
    await require(request)
    return _ok()  # every vhost of this node runs in the broker's loop


async def health_port(request: Request):
    await require(request)
    broker = broker_of(request)
    try:
        port = int(request.path_params["port"])
    except ValueError:
        raise ApiError(400, "port must be an integer") from None
    ports = {entry["port"] for entry in _listeners(broker)}
    if port in ports:
        return JSONResponse({"status": "ok", "port": port})
    return _failed(f"No active listener on port {port}", missing=port, ports=sorted(ports))


async def health_protocol(request: Request):
    await require(request)
    broker = broker_of(request)
    proto = request.path_params["protocol"]
    protocols = {entry["protocol"] for entry in _listeners(broker)}
    if proto in protocols or (proto == "amqp091" and "amqp" in protocols):
        return JSONResponse({"status": "ok", "protocol": proto})
    return _failed(f"No active listener for protocol {proto}", missing=proto,
                   protocols=sorted(protocols))


async def health_simple_ok(request: Request):
    await require(request)
    return _ok()


async def healthchecks_node(request: Request):
    """RabbitMQ's older /api/healthchecks/node[/{node}]: ok unless an alarm is in effect."""
    await require(request)
    broker = broker_of(request)
    if "node" in request.path_params and param(request, "node") != NODE:
        raise ApiError(404, "Not Found")
    if broker.alarms:
        return JSONResponse({"status": "failed",
                             "reason": "resource alarm(s) in effect: "
                                       + ", ".join(sorted(broker.alarms))})
    return _ok()


async def api_index(request: Request):
    """/api/index.html: the routes this broker serves (RabbitMQ's page documents its API)."""
    broker = broker_of(request)
    # starlette's route kinds: a Host has no path
    paths = sorted({r.path for r in broker.http_routes if getattr(r, "path", "")})
    rows = "".join(f"<tr><td><code>{html.escape(p)}</code></td></tr>" for p in paths)
    return HTMLResponse("<!DOCTYPE html><html><head><title>TrioMQ Management HTTP API"
                        "</title></head><body><h1>TrioMQ Management HTTP API</h1>"
                        "<p>The paths below answer as RabbitMQ's management plugin's do; "
                        "see docs/management.md.</p><table>" + rows + "</table></body></html>")


def rabbitmqadmin_path() -> str | None:
    """RabbitMQ's rabbitmqadmin script if installed on this host (TrioMQ ships none)."""
    found = shutil.which("rabbitmqadmin")
    if found:
        return found
    for candidate in sorted(glob.glob("/usr/lib/rabbitmq/lib/rabbitmq_server-*/plugins/"
                                      "rabbitmq_management-*/priv/www/cli/rabbitmqadmin")):
        return candidate
    return None


async def cli_rabbitmqadmin(request: Request):
    """/cli/rabbitmqadmin, unauthenticated as in RabbitMQ: the script, served from this
    host's RabbitMQ install when there is one."""
    path = rabbitmqadmin_path()
    if path is None:
        raise ApiError(404, "rabbitmqadmin is not installed on this host")
    return FileResponse(path, media_type="text/plain")


def routes() -> list:
    return [
        Route("/api/auth", auth),
        Route("/api/whoami", whoami),
        Route("/api/overview", overview),
        Route("/api/cluster-name", cluster_name),
        Route("/api/extensions", extensions),
        Route("/api/global-parameters", global_parameters),
        Route("/api/environment", environment),
        Route("/api/nodes", nodes),
        Route("/api/nodes/{name}", node),
        Route("/api/vhosts", list_vhosts),
        Route("/api/vhosts/{vhost}", get_vhost, methods=["GET"]),
        Route("/api/vhosts/{vhost}", put_vhost, methods=["PUT"]),
        Route("/api/vhosts/{vhost}", delete_vhost, methods=["DELETE"]),
        Route("/api/aliveness-test/{vhost}", aliveness),
        Route("/api/health/checks/alarms", health_alarms),
        Route("/api/health/checks/local-alarms", health_alarms),
        Route("/api/health/checks/virtual-hosts", health_virtual_hosts),
        Route("/api/health/checks/port-listener/{port}", health_port),
        Route("/api/health/checks/protocol-listener/{protocol}", health_protocol),
        Route("/api/health/checks/certificate-expiration/{within}/{unit}", health_simple_ok),
        Route("/api/health/checks/node-is-mirror-sync-critical", health_simple_ok),
        Route("/api/health/checks/node-is-quorum-critical", health_simple_ok),
        Route("/api/healthchecks/node", healthchecks_node),
        Route("/api/healthchecks/node/{node}", healthchecks_node),
        Route("/api/index.html", api_index),
        Route("/cli/rabbitmqadmin", cli_rabbitmqadmin),
    ]


