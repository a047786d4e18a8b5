"""A quorum queue's member group changed over the management API (what ``ctl add_member``
and ``delete_member`` call, as rabbitmq-queues' verbs): ``PUT`` / ``DELETE``
``/api/queues/{vhost}/{name}/members/{node}`` (administrator).

The request goes to the queue's leader through etcd (``syncreq/VHOST/QUEUE`` with the
action ``add:NODE`` or ``delete:NODE``, which the leader watches, as ``cluster sync-queue``
does), so any node takes it; the leader changes the group (``mirror_master.Mirroring.change_member``)
and records it in the queue's in-sync record. 202: sent to the leader; 404: no such queue
or node; 400: not a quorum queue, or the leader itself to delete (RabbitMQ moves the
leadership first; not built).
"""
from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def routes() -> list:
    """The routes (any broker's management API: 404 without a cluster)."""
    from ..management.common import param, vhost_scope
    from ..management.http import ApiError

    async def change(request: Request) -> Response:
        from .mirror_policy import replica_group
        from .node import queue_key
        from .store import ClusterStore
        user, broker, vhost = await vhost_scope(request)
        store = broker.store
        if not isinstance(store, ClusterStore):
            raise ApiError(404, "Not Found")
        if not user.has("administrator"):
            raise ApiError(401, "Not administrator user", "not_authorised")
        name, member = param(request, "name"), param(request, "node")
        q = vhost.find_queue(name)
        if q is None:
            raise ApiError(404, "Not Found")
        if not replica_group(q):
            raise ApiError(400, f"{name} is not a quorum queue")
        if member not in (store.known_members() or set()):
            raise ApiError(404, f"{member} is not a node of this cluster")
        leader = store.master_of(vhost.name, name)
        if leader is None:
            raise ApiError(503, f"queue '{name}' in vhost '{vhost.name}' has no leader now")
        verb = "add" if request.method == "PUT" else "delete"
        if verb == "delete" and member == leader:
            raise ApiError(400, f"{member} is the leader of queue '{name}': not removed")
        await store.coord.put(f"{store.node.prefix}syncreq/{queue_key(vhost.name, name)}",
                              json.dumps({"action": f"{verb}:{member}",
                                          "at": time.time()}).encode())
        return Response(status_code=202)

    return [Route("/api/queues/{vhost}/{name}/members/{node}", change,
                  methods=["PUT", "DELETE"])]
