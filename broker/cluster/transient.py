"""Transient queues (non-durable, exclusive, auto-delete) in the cluster's view.

RabbitMQ's clients see every queue from every node, transient ones too; with ``--workers N``
the processes are nodes that clients must not tell apart, so an RPC reply queue declared on
one process has to take the replies a responder publishes on another. A transient queue is
never stored; it is registered in etcd under ``defs/tqueue/VHOST/NAME`` (the node, its
flags and arguments) as soon as it is declared and unregistered when it goes (deleted, its
exclusive owner's connection closed, auto-deleted). Every other node holds a
``ProxyQueue`` for it, as for a durable queue mastered elsewhere: publishes are forwarded
over the link, consumers consume through it. An exclusive queue's proxy is owned by no
connection of that node, so a client there gets 405 RESOURCE_LOCKED for a declare,
consume, bind or delete, as RabbitMQ answers any connection but the owner; publishing to
it is allowed, as there. Bindings from durable exchanges to a transient queue are shared
like those of durable queues (``defs/binding``), written by the node that makes them: a
queue's binding set tells this module of each (``_Bindings``), since the vhost stores
bindings of stored queues only. A node that restarts (a crashed worker) drops its own records:
its transient queues died with the process.

Open: the registration reaches the other nodes through etcd a few milliseconds after the
declare-ok; a publish on another node before it arrives is unroutable there.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING

from .forward import ProxyQueue
from .store_defs import _args_in, _args_out, _q

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..vhost import VirtualHost
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.transient")

SECTION = "tqueue"


class _Bindings(set):
    """A transient queue's binding set that tells the registry what is added and removed
    (``VirtualHost.bind``, ``unbind``, ``delete_queue`` change the set; nothing else
    says so for a queue without a store)."""

    def __init__(self, items, added, removed) -> None:
        super().__init__(items)
        self._added = added
        self._removed = removed

    def add(self, item) -> None:
        if item not in self:
            super().add(item)
            self._added(item)

    def discard(self, item) -> None:
        if item in self:
            super().discard(item)
            self._removed(item)

    def clear(self) -> None:
        for item in list(self):
            self.discard(item)


class _ForeignOwner:
    """The exclusive owner of another node's exclusive queue here: no local connection."""

    __slots__ = ("node",)

    def __init__(self, node: str) -> None:
        self.node = node


def shared(q: Queue) -> bool:
    """Whether ``q`` is registered as a transient queue of this node."""
    return not isinstance(q, ProxyQueue) and not q.keeps_definition and not q.internal


class TransientQueues:
    """This node's transient queues in etcd, other nodes' as proxies here."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store
        self._vhosts: set[str] = set()
        # (vhost, queue) -> {binding in the queue's set: its defs/binding key}
        self._bound: dict[tuple[str, str], dict] = {}

    def install(self, vhost: VirtualHost) -> None:
        """Register ``vhost``'s transient queues from now on (idempotent)."""
        if vhost.name in self._vhosts:
            return
        self._vhosts.add(vhost.name)
        vhost.on_queue_added.append(partial(self._added, vhost))
        vhost.on_queue_deleted.append(partial(self._deleted, vhost))
        for q in list(vhost.queues.values()):
            self._added(vhost, q)

    def install_all(self) -> None:
        """At recovery: every vhost, and this node's records left by a previous process
        (killed: its transient queues are gone) dropped."""
        store = self.store
        for vhost in list(store.broker.vhosts.values()):
            self.install(vhost)
        head = store._defs(SECTION, "")
        for key, value in list(store._known.items()):
            if key.startswith(head) and value.get("master") == store.node.name:
                vhost = store.broker.vhosts.get(value.get("vhost"))
                q = vhost.queues.get(value.get("name")) if vhost is not None else None
                if q is None or not shared(q):
                    store._queue_write(key, None)

    def _key(self, vhost_name: str, name: str) -> str:
        return self.store._defs(SECTION, _q(vhost_name), _q(name))

    def _added(self, vhost: VirtualHost, q: Queue) -> None:
        if not shared(q):
            return
        keys: dict = {}
        self._bound[(vhost.name, q.name)] = keys
        q.bindings = _Bindings(q.bindings, partial(self._bound_one, vhost, q, keys),
                               partial(self._unbound_one, keys))
        for item in list(q.bindings):  # a queue there before the registry was installed
            self._bound_one(vhost, q, keys, item)
        self.store._queue_write(self._key(vhost.name, q.name), {
            "vhost": vhost.name, "name": q.name, "master": self.store.node.name,
            "durable": q.durable, "exclusive": q.exclusive_owner is not None,
            "auto_delete": q.auto_delete, "arguments": _args_out(q.arguments)})

    def _deleted(self, vhost: VirtualHost, q: Queue, consumers: object = None) -> None:
        if shared(q):
            self.store._queue_write(self._key(vhost.name, q.name), None)
            for key in self._bound.pop((vhost.name, q.name), {}).values():
                self.store._queue_write(key, None)

    def _bound_one(self, vhost: VirtualHost, q: Queue, keys: dict, item) -> None:
        source = vhost.exchanges.get(item[0])
        binding = source.bindings.get(item[1]) if source is not None else None
        if binding is None or not source.durable:  # type: ignore[union-attr]
            return  # a transient exchange is not shared in the cluster
        store = self.store
        key = store._binding_key(vhost, binding)
        keys[item] = key
        store._queue_write(key, {
            "vhost": vhost.name, "source": binding.source, "destination_kind": "queue",
            "destination": q.name, "routing_key": binding.routing_key,
            "arguments": _args_out(binding.arguments)})

    def _unbound_one(self, keys: dict, item) -> None:
        key = keys.pop(item, None)
        if key is not None:
            self.store._queue_write(key, None)

    # ---- other nodes' records (the store's watch) ----
    def put(self, value: dict) -> None:
        store = self.store
        vhost = store.broker.vhosts.get(value["vhost"])
        master = str(value.get("master", ""))
        if vhost is None or master == store.node.name:
            return
        self.install(vhost)
        existing = vhost.queues.get(value["name"])
        if isinstance(existing, ProxyQueue):
            existing.retarget(master)
            return
        if existing is not None:  # declared here too before the record arrived: ours stays
            log.warning("transient %s is declared on nodes %r and %r",
                        vhost.queue_resource(value["name"]), master, store.node.name)
            return
        proxy = ProxyQueue(vhost, value["name"], bool(value.get("durable", False)),
                           bool(value.get("auto_delete", False)),
                           _args_in(value.get("arguments", "")), master, store.link_for, store)
        if value.get("exclusive"):
            proxy.exclusive_owner = _ForeignOwner(master)
        vhost.add_queue(proxy, persist=False)

    def delete(self, value: dict) -> None:
        vhost = self.store.broker.vhosts.get(value["vhost"])
        q = vhost.queues.get(value["name"]) if vhost is not None else None
        if isinstance(q, ProxyQueue) and q.master == value.get("master"):
            q.forwarding = False  # gone on its node: nothing to send back
            vhost.delete_queue(q, reason="deleted on its node")  # type: ignore[union-attr]
