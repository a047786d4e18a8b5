"""The same queue view from every node: what the management API (and ``ctl list_queues``,
which reads it) shows of a durable queue in a cluster.

A queue's counts live on its master. For a queue mastered on this node the view is local;
for one mastered on another node (a proxy here) this node asks the master over the link:
one stats request per master node and vhost, published on the link with the header
``STATS_REQUEST`` (the queue names in the body), answered by the master over its own link
back with ``STATS_ANSWER`` (``forward.forwarded_publish`` takes both). The answer carries
the counts and the cluster fields, all from the master: ``node`` and ``leader`` (the
master), ``members`` (master and mirrors; a quorum queue's member group), ``online`` (those
of them up), ``slave_nodes``
and ``synchronised_slave_nodes`` (RabbitMQ's classic mirrored queue fields) and ``term``
(the master's epoch). A master that does not answer within ``ANSWER_TIMEOUT``: the
queue's ``state`` is ``"unreachable"`` (counts unknown, left as this node has them: 0);
no master now: ``"down"``, as RabbitMQ shows a queue whose node is down.
"""
from __future__ import annotations

import itertools
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

import trio

from ..queues.stream import StreamQueue

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..vhost import VirtualHost
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.view")

STATS_REQUEST = "x-triomq-stats"  # [request id, asking node]
STATS_ANSWER = "x-triomq-stats-answer"  # [request id]
ANSWER_TIMEOUT = 2.0
# the fields of a queue's JSON object the master's answer replaces
_COUNTS = ("messages", "messages_ready", "messages_unacknowledged", "messages_ram",
           "messages_ready_ram", "messages_unacknowledged_ram", "message_bytes",
           "message_bytes_ready", "message_bytes_ram", "consumers")


def _noop(ok: bool | None) -> None:
    """A stats request or answer needs no confirm: a lost one is a timeout."""


class QueueViews:
    """This node's side of the queue view: asks masters, answers as a master."""

    def __init__(self, store: ClusterStore):
        self.store = store
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list]] = {}

    # ---- as a master ----
    def local(self, vhost: VirtualHost, q: Queue) -> dict:
        """The cluster fields of ``q``, mastered on this node (its counts are local)."""
        store = self.store
        me = store.node.name
        m = store.node.mastership(vhost.name, q.name)
        mirroring = store.mirrors.masters.get((vhost.name, q.name))
        nodes = dict(mirroring.nodes) if mirroring is not None else {}
        live = store.live_nodes()
        mirrors = sorted(nodes)
        # a quorum queue's members are its group, down ones included (as RabbitMQ lists them)
        members = list(mirroring.members) if mirroring is not None and mirroring.members \
            else [me, *mirrors]
        # a stream's replica group (stream_replicas.py); its log index: the offset each
        # member committed, its commit index: what a majority has (confirmed)
        group = store.stream_replicas.groups.get((vhost.name, q.name))
        stream_log = q.log if isinstance(q, StreamQueue) else None
        replicas = stream_log.replica_offsets if stream_log is not None else None
        if group is not None and group.get("leader") == me:
            members = list(group.get("members", members))
        return {"node": me, "leader": me, "members": members,
                "online": [n for n in members if n == me or n in live],
                "slave_nodes": mirrors,
                "synchronised_slave_nodes": sorted(n for n, s in nodes.items()
                                                   if s == "in_sync"),
                "term": m.epoch if m is not None else None,
                "state": "running" if m is not None else "down",
                # a quorum queue's log as quorum_status shows it (seqs: what entered)
                "log_index": mirroring.log_indexes() if mirroring is not None
                and mirroring.quorum else {me: stream_log.committed_offset, **replicas}
                if replicas is not None and stream_log is not None else None,
                "commit_index": stream_log.durable_offset
                if replicas is not None and stream_log is not None else q.commit_seq}

    def answer(self, asking: str, vhost_name: str, header: list, body: bytes) -> None:
        """A stats request from ``asking``'s link: answer on this node's link to it."""
        try:
            request_id = int(header[0])
            names = json.loads(body)
        except (TypeError, ValueError, IndexError):
            return
        vhost = self.store.broker.vhosts.get(vhost_name) if self.store.broker else None
        out: dict[str, Any] = {}
        if isinstance(names, dict) and "listing" in names:  # the management API's (below)
            out = {"listing": _listing(self.store.broker, names)}
        elif isinstance(names, dict):  # a master asks about this node's copy (mirror.py)
            out = {"copy": self.store.mirrors.copy_info(vhost_name, str(names.get("copy")))}
        elif vhost is not None and isinstance(names, list):
            from .forward import ProxyQueue
            for name in names:
                q = vhost.queues.get(name) if isinstance(name, str) else None
                if q is None or isinstance(q, ProxyQueue):
                    continue  # not (or no longer) mastered here
                ready, unacked = q.message_count, q.unacked_count
                ready_bytes = q.ready_bytes
                out[name] = {"messages": ready + unacked, "messages_ready": ready,
                             "messages_unacknowledged": unacked,
                             "messages_ram": ready + unacked, "messages_ready_ram": ready,
                             "messages_unacknowledged_ram": unacked,
                             "message_bytes": ready_bytes, "message_bytes_ready": ready_bytes,
                             "message_bytes_ram": ready_bytes, "consumers": len(q.consumers),
                             **self.local(vhost, q)}
        link = self.store.link_for(asking, vhost_name)
        link.publish("", "", "", {}, json.dumps(out).encode(), _noop,
                     {STATS_ANSWER: [request_id]})

    # ---- as the node asked ----
    def answered(self, header: list, body: bytes) -> None:
        try:
            waiting = self._waiting.get(int(header[0]))
            data = json.loads(body)
        except (TypeError, ValueError, IndexError):
            return
        if waiting is not None and isinstance(data, dict):
            waiting[1].append(data)
            waiting[0].set()

    async def ask_copy(self, node: str, vhost_name: str, queue: str) -> dict | None:
        """``node``'s copy of a queue: {epoch, max_seq, complete}; None when it has none
        or did not answer."""
        answer = await self._ask(node, vhost_name, {"copy": queue})
        copy = answer.get("copy") if answer is not None else None
        return copy if isinstance(copy, dict) else None

    async def _ask(self, master: str, vhost_name: str, names: Any) -> dict | None:
        request_id = next(self._ids)
        event = trio.Event()
        result: list = []
        self._waiting[request_id] = (event, result)
        try:
            link = self.store.link_for(master, vhost_name)

            def sent(ok: bool | None) -> None:
                if not ok:
                    event.set()  # not delivered: no answer will come
            if not link.publish("", "", "", {}, json.dumps(names).encode(), sent,
                                {STATS_REQUEST: [request_id, self.store.node.name]}):
                return None
            with trio.move_on_after(ANSWER_TIMEOUT):
                await event.wait()
            return result[0] if result else None
        finally:
            self._waiting.pop(request_id, None)

    async def overlays(self, pairs) -> dict[tuple[str, str], dict]:
        """For each (vhost, queue) of ``pairs`` the cluster queue's view to lay over its
        JSON object (``apply``); queues the cluster does not know are left out."""
        from .forward import ProxyQueue
        store = self.store
        out: dict[tuple[str, str], dict] = {}
        asks: dict[tuple[str, str], list[str]] = {}
        for vhost, q in pairs:
            key = (vhost.name, q.name)
            if isinstance(q, ProxyQueue):
                master = store.master_of(*key)
                if master is None or master == store.node.name:
                    out[key] = {"node": q.master, "leader": None, "members": [q.master],
                                "online": [], "slave_nodes": [],
                                "synchronised_slave_nodes": [], "term": None, "state": "down"}
                else:
                    asks.setdefault((master, vhost.name), []).append(q.name)
            elif q.durable and store.node.mastership(vhost.name, q.name) is not None:
                out[key] = self.local(vhost, q)
        answers: dict[tuple[str, str], dict | None] = {}

        async def ask(master: str, vhost_name: str, names: list[str]) -> None:
            answers[(master, vhost_name)] = await self._ask(master, vhost_name, names)
        if asks:
            async with trio.open_nursery() as nursery:
                for (master, vhost_name), names in asks.items():
                    nursery.start_soon(ask, master, vhost_name, names)
        for (master, vhost_name), names in asks.items():
            answer = answers.get((master, vhost_name))
            for name in names:
                view = (answer or {}).get(name)
                out[(vhost_name, name)] = view if isinstance(view, dict) else {
                    "node": master, "leader": master, "members": [master], "online": [],
                    "slave_nodes": [], "synchronised_slave_nodes": [], "term": None,
                    "state": "unreachable"}
        return out


def apply(obj: dict, overlay: dict | None) -> dict:
    """``obj`` (a queue's JSON object) with the cluster's view of it."""
    if overlay:
        obj.update({k: v for k, v in overlay.items() if k in _COUNTS or k in _FIELDS})
        if "messages_ready" in overlay:
            obj["backing_queue_status"] = {"mode": "default", "len": overlay["messages_ready"]}
    return obj


_FIELDS = ("node", "leader", "members", "online", "slave_nodes", "synchronised_slave_nodes",
           "term", "state", "log_index", "commit_index")


async def queue_overlays(broker: Any, pairs: list) -> dict[tuple[str, str], dict]:
    """The management API's entry: {} without a cluster."""
    from .store import ClusterStore
    store = broker.store
    if not isinstance(store, ClusterStore) or not pairs:
        return {}
    try:
        return await store.views.overlays(pairs)
    except Exception:  # a listing must not fail for the cluster's extra fields
        log.exception("cluster queue view failed")
        return {}


# ---- the management API's listings across nodes (--workers: one broker to clients) ----
def _listing(broker: Any, request: dict) -> Any:
    """This node's part of a listing another node's management API asked for: its client
    connections', channels' or consumers' JSON objects as the asking user may see them
    (``request``: kind, user, all, vhost), or ``totals`` of its own objects."""
    from ..management import api_connections as api
    from ..management.entity_json import consumer_json
    from .link import LINK_USER
    user, sees_all, vhost = request.get("user"), request.get("all"), request.get("vhost")
    sessions = [s for s in api._open_sessions(broker) if api._user_of(s) != LINK_USER
                and (sees_all or api._user_of(s) == user)
                and (vhost is None or s.vhost.name == vhost)]
    kind = request.get("listing")
    if kind == "connections":
        return [api.connection_json(s) for s in sessions]
    channels = [ch for s in sessions for ch in list(s.channels.values())]
    if kind == "channels":
        return [api.channel_json(broker, ch) for ch in channels]
    if kind == "consumers":
        return [consumer_json(c, ch.session.vhost.name) for ch in channels
                for c in ch.consumers.values()]
    from .forward import ProxyQueue
    ready = unacked = 0
    for v in list(broker.vhosts.values()):
        if vhost is None or v.name == vhost:
            for q in v.queues.values():
                if not q.internal and not isinstance(q, ProxyQueue):
                    ready += q.message_count
                    unacked += q.unacked_count
    return {"connections": len(sessions), "channels": len(channels),
            "consumers": sum(len(ch.consumers) for ch in channels),
            "messages": ready + unacked, "messages_ready": ready,
            "messages_unacknowledged": unacked}


async def listings(broker: Any, kind: str, user: Any, vhost: str | None) -> list | None:
    """``kind`` (connections, channels, consumers, totals) from this node and every other
    live node of the cluster, each node's part as ``_listing`` makes it; None without a
    cluster (the caller lists its own). A node that does not answer within
    ``ANSWER_TIMEOUT`` is left out."""
    module = sys.modules.get(f"{__package__}.store")
    # without a cluster its store module was never imported (etcd, httpx: ~0.5 s, seconds
    # while a recovery thread holds the GIL): the HTTP API must not import it to answer
    store = broker.store
    if module is None or not isinstance(store, module.ClusterStore):
        return None
    request = {"listing": kind, "user": user.name, "all": bool(user.sees_all), "vhost": vhost}
    parts: list = [_listing(broker, request)]
    me = store.node.name

    async def ask(node: str) -> None:
        answer = await store.views._ask(node, "/", request)
        if answer is not None and "listing" in answer:
            parts.append(answer["listing"])
    async with trio.open_nursery() as nursery:
        for node in sorted(store.live_nodes() - {me}):
            if store._addresses.get(node):
                nursery.start_soon(ask, node)
    return parts
