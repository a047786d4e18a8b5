"""ctl verbs for a stream's replicas, with rabbitmq-streams' names, arguments, banners and
error texts: ``add_replica [-p VHOST] QUEUE NODE`` and ``delete_replica [-p VHOST] QUEUE
NODE``, over ``/api/stream/replicas/{vhost}/{name}/{node}`` (``cluster/stream_members.py``).
Errors print as rabbitmq-streams prints them (``Error:`` and the reason on its own line)
and exit 70 (69: the broker unreachable, the node not running, not a cluster)."""
from __future__ import annotations

from argparse import Namespace
from typing import Any

from .core import EX_SOFTWARE, EX_UNAVAILABLE, Api, CtlError, Verb, q, register


def _change(api: Api, a: Namespace, method: str) -> None:
    path = f"/stream/replicas/{q(a.vhost)}/{q(a.queue)}/{q(a.node)}"
    try:
        api.call(method, path, not_found=("Error:\n{:error, :not_found}", EX_SOFTWARE))
    except CtlError as exc:
        text = str(exc)
        if text.startswith("HTTP 503: "):  # node_not_running, no group yet
            raise CtlError("Error:\n" + text[len("HTTP 503: "):], EX_UNAVAILABLE) from None
        if text.startswith("Error") or exc.status == EX_UNAVAILABLE:
            raise
        raise CtlError("Error:\n" + text, EX_SOFTWARE) from None


def add_replica(api: Api, a: Namespace) -> None:
    _change(api, a, "PUT")


def delete_replica(api: Api, a: Namespace) -> None:
    _change(api, a, "DELETE")


_ARGS: list[tuple[str, dict[str, Any]]] = [("queue", {"help": "stream queue name"}), ("node", {})]
register(Verb("add_replica", "Adds a stream queue replica on the given node.", add_replica,
              _ARGS, vhost=True,
              banner=lambda a: f"Adding a replica for queue {a.queue} on node {a.node}..."))
register(Verb("delete_replica", "Removes a stream queue replica on the given node.",
              delete_replica, _ARGS, vhost=True,
              banner=lambda a: f"Removing a replica of queue {a.queue} on node {a.node}..."))
