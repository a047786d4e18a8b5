"""A stream's replica group changed over the management API (what ``ctl add_replica`` and
``delete_replica`` call, as rabbitmq-streams' verbs): ``PUT`` / ``DELETE``
``/api/stream/replicas/{vhost}/{name}/{node}`` (administrator; any node of the cluster
takes it).

The group is the record in etcd (``streams/VHOST/QUEUE``, ``stream_replicas.py``); the
change is a compare-and-swap on it (``replace`` at the revision read: two changes at once
do not lose one). The nodes reconcile with the record each round: the leader's log leads
the new group (``StreamLog.set_replicas``: a majority of the new group confirms), an added
node copies the leader's log from its first chunk, a removed node stops copying and
deletes its copy. The leader removed steps down and the others elect the next one, as
RabbitMQ elects another leader first (``stream_stepdown.py``).

Answers, with RabbitMQ's texts where RabbitMQ has one (``rabbit_stream_queue``,
rabbitmq-streams): 204 done (adding a member, removing a node that is not one: nothing to
do); 404 no such queue; 400 ``Cannot add replicas to a classic queue`` / ``... quorum
queue`` (and ``Cannot delete replicas from ...``), ``Cannot delete the last member of a
stream``; 503 ``node_not_running`` (the node to add is not a live member of the cluster), or the
stream has no group record yet.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..queues.stream import StreamQueue

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .store import ClusterStore

ATTEMPTS = 5  # compare-and-swap retries against concurrent writers of the record


class MemberChangeError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status


def _queue_type(q) -> str:
    """The queue's type, on its leader (the queue) as on other nodes (their proxy)."""
    return "stream" if isinstance(q, StreamQueue) else q.queue_type.name


async def change_replicas(store: ClusterStore, vhost: VirtualHost, name: str, node: str, add: bool) -> bool:
    """Add ``node`` to, or remove it from, the replica group of stream ``name``; True when
    the group changed, False when there was nothing to do. ``MemberChangeError`` when
    refused."""
    q = vhost.find_queue(name)
    if q is None:
        raise MemberChangeError(404, "not_found")
    kind = _queue_type(q)
    if kind != "stream":
        raise MemberChangeError(400, f"Cannot add replicas to a {kind} queue" if add
                                else f"Cannot delete replicas from a {kind} queue")
    if add and node not in store.live_nodes():
        raise MemberChangeError(503, "node_not_running")
    from .node import queue_key  # the coordinator (etcd, httpx): imported in a cluster only
    key = store.node.key("streams", queue_key(vhost.name, name))
    for _ in range(ATTEMPTS):
        kv = await store.coord.get(key)
        if kv is None:
            raise MemberChangeError(503, f"stream '{name}' in vhost '{vhost.name}' has no "
                                         f"replica group yet")
        group = kv.json()
        members = list(group.get("members", []))
        if add == (node in members):
            return False  # already a member / not one: nothing to do, as RabbitMQ
        if not add and len(members) <= 1:
            raise MemberChangeError(400, "Cannot delete the last member of a stream")
        members = [*members, node] if add else [m for m in members if m != node]
        group["members"] = members
        if await store.coord.replace(key, json.dumps(group).encode(), kv.mod_revision):
            # this node's view shows the change at once (its next round reads it from etcd):
            # an answer here must not be followed by a listing of the old group
            store.stream_replicas.groups[(vhost.name, name)] = group
            return True
    raise MemberChangeError(503, "the replica group changed meanwhile: try again")


def routes() -> list:
    """The routes (any broker's management API: 404 without a cluster)."""
    from ..management.common import param, vhost_scope
    from ..management.http import ApiError

    async def change(request: Request) -> Response:
        from .store import ClusterStore
        user, broker, vhost = await vhost_scope(request)
        store = broker.store
        if not isinstance(store, ClusterStore):
            raise ApiError(404, "Not Found")
        if not user.has("administrator"):
            raise ApiError(401, "Not administrator user", "not_authorised")
        try:
            await change_replicas(store, vhost, param(request, "name"),
                                  param(request, "node"), request.method == "PUT")
        except MemberChangeError as exc:
            raise ApiError(exc.status, str(exc)) from None
        return Response(status_code=204)

    return [Route("/api/stream/replicas/{vhost}/{name}/{node}", change,
                  methods=["PUT", "DELETE"])]
