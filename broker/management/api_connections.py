"""/api/connections (list, show, close), /api/channels and /api/consumers."""
from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.routing import Route

from .. import errors
from .auth import require
from .common import (
    NODE,
    broker_of,
    json_response,
    jsonable,
    no_content,
    param,
    vhost_scope,
)
from .http import ApiError
from .listing import paginate
from .stats import (
    CHANNEL_FIELDS,
    CONNECTION_COUNTS,
    channel_counts,
    connection_counts,
    rate_details,
    with_deliver_get,
)

if TYPE_CHECKING:
    from ..broker import Broker
    from ..listeners.amqp_session import Session
    from ..listeners.session_base import ProtocolSession
    from ..vhost import VirtualHost

# first time the API saw each connection (ms since the epoch), for "connected_at"
_first_seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _local_port(session: Session | ProtocolSession, info: dict | None = None) -> int:
    """The listener port of the connection: its protocol's (``connection_info``), else
    the AMQP port."""
    port = (info if info is not None else session.connection_info()).get("port")
    return port or session.broker.http_server.amqp_port or session.broker.config.port


def connection_name(session: Session | ProtocolSession) -> str:
    return f"{session.peer} -> 127.0.0.1:{_local_port(session)}"


def _peer(session: Session | ProtocolSession) -> tuple[str, int]:
    host, _, port = session.peer.rpartition(":")
    try:
        return host, int(port)
    except ValueError:
        return session.peer, 0


def _user_of(session: Session | ProtocolSession) -> str:
    return session.conn.username or ""


def _open_sessions(broker: Broker) -> list:
    return [s for s in list(broker.sessions) if s.vhost is not None and not s.closed]


def _visible(broker: Broker, user, session: Session | ProtocolSession) -> bool:
    if user.sees_all:
        return True
    return _user_of(session) == user.name  # RabbitMQ: management users see their own


def connection_json(session: Session | ProtocolSession) -> dict:
    conn = session.conn
    host, port = _peer(session)
    connected = _first_seen.setdefault(session, int(time.time() * 1000))
    state = "blocked" if session.blocked_sent else ("flow" if session.flow_queues else "running")
    info = session.connection_info()  # protocol, channel_max, frame_max, timeout ...
    out = {"channels": len(session.channels), "connected_at": connected, "host": "127.0.0.1",
           "name": connection_name(session), "node": NODE, "peer_cert_issuer": None,
           "peer_cert_subject": None, "peer_cert_validity": None, "peer_host": host,
           "peer_port": port,
           "send_pend": conn.pending_output, "ssl": session.tls,
           "ssl_cipher": None, "ssl_hash": None, "ssl_key_exchange": None,
           "ssl_protocol": None, "state": state,
           "type": "network", "user": _user_of(session),
           "user_who_performed_action": _user_of(session),
           "vhost": session.vhost.name if session.vhost is not None else None}
    out.update(info)
    counts = dict(zip(CONNECTION_COUNTS, connection_counts(session), strict=True))
    out.update(rate_details(counts, session.broker.stats_sampler.connection_rates(session)))
    for name in ("recv_cnt", "send_cnt"):  # RabbitMQ gives these no rate
        del out[name + "_details"]
    out["port"] = _local_port(session, info)
    out["client_properties"] = props = jsonable(info.get("client_properties", {}))
    given = props.get("connection_name") if isinstance(props, dict) else None
    if isinstance(given, str) and given:  # as RabbitMQ: only when the client named it
        out["user_provided_name"] = given
    return out


def channel_ref(ch) -> dict:
    session = ch.session
    host, port = _peer(session)
    return {"connection_name": connection_name(session),
            "name": f"{connection_name(session)} ({ch.number})", "node": NODE,
            "number": ch.number, "peer_host": host, "peer_port": port, "user": _user_of(session)}


def channel_json(broker: Broker, ch) -> dict:
    session = ch.session
    host, port = _peer(session)
    counts = dict(zip(CHANNEL_FIELDS, channel_counts(ch), strict=True))
    stats = rate_details(with_deliver_get(counts),
                         with_deliver_get(broker.stats_sampler.channel_rates(ch)))
    return {"acks_uncommitted": len(ch.tx_acks) if ch.tx is not None else 0,
            "confirm": ch.confirm,
            "connection_details": {"name": connection_name(session), "peer_host": host,
                                   "peer_port": port},
            "consumer_count": len(ch.consumers),
            "global_prefetch_count": ch.global_prefetch,
            "message_stats": stats,
            "messages_unacknowledged": len(ch.unacked),
            "messages_uncommitted": len(ch.tx) if ch.tx is not None else 0,
            "messages_unconfirmed": len(ch._unconfirmed) if ch.confirm else 0,
            "name": f"{connection_name(session)} ({ch.number})", "node": NODE,
            "number": ch.number, "prefetch_count": ch.prefetch,
            "state": "running" if ch.flow_active else "flow",
            "transactional": ch.tx is not None, "user": _user_of(session),
            "user_who_performed_action": _user_of(session),
            "vhost": session.vhost.name if session.vhost is not None else None}




async def list_connections(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    merged = await _everywhere(broker, "connections", user, vhost)
    if merged is not None:
        return json_response(paginate(request, merged, dict, _named))
    sessions = [s for s in _open_sessions(broker) if _visible(broker, user, s)
                and (vhost is None or s.vhost is vhost)]
    return json_response(paginate(request, sessions, connection_json, connection_name))


def _session_named(request: Request, user):
    broker = broker_of(request)
    name = param(request, "name")
    for s in _open_sessions(broker):
        if connection_name(s) == name:
            if not _visible(broker, user, s):
                break
            return s
    raise ApiError(404, "Not Found")


async def get_connection(request: Request):
    user = await require(request)
    return json_response(connection_json(_session_named(request, user)))


async def close_connection(request: Request):
    user = await require(request)
    session = _session_named(request, user)
    if not user.is_admin and _user_of(session) != user.name:
        raise ApiError(401, "Not administrator user", "not_authorised")
    reason = request.headers.get("x-reason") or "Closed via management plugin"
    session.force_close(errors.connection_forced(reason))
    return no_content()


async def connection_channels(request: Request):
    user = await require(request)
    session = _session_named(request, user)
    broker = broker_of(request)
    return json_response([channel_json(broker, ch) for ch in list(session.channels.values())])


def _channels(broker: Broker, user, vhost: VirtualHost | None = None) -> list:
    out: list = []
    for s in _open_sessions(broker):
        if not _visible(broker, user, s) or (vhost is not None and s.vhost is not vhost):
            continue
        out.extend(ch for ch in s.channels.values() if not ch.released)
    return out


def _channel_name(ch) -> str:
    return f"{connection_name(ch.session)} ({ch.number})"


async def list_channels(request: Request):
    user, broker, vhost = await vhost_scope(request, optional=True)
    merged = await _everywhere(broker, "channels", user, vhost)
    if merged is not None:
        return json_response(paginate(request, merged, dict, _named))
    chans = _channels(broker, user, vhost)
    return json_response(paginate(request, chans, lambda ch: channel_json(broker, ch),
                                  _channel_name))


async def get_channel(request: Request):
    user = await require(request)
    broker = broker_of(request)
    name = param(request, "name")
    for ch in _channels(broker, user):
        if _channel_name(ch) == name:
            out = channel_json(broker, ch)
            from .entity_json import consumer_json
            out["consumer_details"] = [consumer_json(c, ch.session.vhost.name)
                                       for c in ch.consumers.values()]
            return json_response(out)
    raise ApiError(404, "Not Found")


async def list_consumers(request: Request):
    from .entity_json import consumer_json
    user, broker, vhost = await vhost_scope(request, optional=True)
    merged = await _everywhere(broker, "consumers", user, vhost)
    if merged is not None:
        return json_response(merged)
    out: list[dict] = []
    for ch in _channels(broker, user, vhost):
        for c in ch.consumers.values():
            out.append(consumer_json(c, ch.session.vhost.name))
    return json_response(out)


async def _everywhere(broker: Broker, kind: str, user, vhost: VirtualHost | None) -> list | None:
    """In a cluster (``--workers``: one broker to clients) every node's ``kind`` objects,
    the nodes' links left out; None without one."""
    from ..cluster.view import listings
    parts = await listings(broker, kind, user, vhost.name if vhost is not None else None)
    return None if parts is None else [o for part in parts for o in part]


def _named(obj: dict) -> str:
    return obj["name"]


def routes() -> list:
    return [
        Route("/api/connections", list_connections),
        Route("/api/vhosts/{vhost}/connections", list_connections),
        Route("/api/connections/{name}", get_connection, methods=["GET"]),
        Route("/api/connections/{name}", close_connection, methods=["DELETE"]),
        Route("/api/connections/{name}/channels", connection_channels),
        Route("/api/channels", list_channels),
        Route("/api/vhosts/{vhost}/channels", list_channels),
        Route("/api/channels/{name}", get_channel),
        Route("/api/consumers", list_consumers),
        Route("/api/consumers/{vhost}", list_consumers),
    ]
