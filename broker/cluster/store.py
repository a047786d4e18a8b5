"""The cluster's view of a node's store: definitions and metadata go to etcd as well.

``ClusterStore`` wraps the node's own store (journal, SQL, memory) and is what the broker
gets as ``broker.store``. Messages never pass through it: queues attach the wrapped store
(``message_store``) as their observer, so the hot path is unchanged. What it adds:

* **Definitions to etcd.** Every ``save_/delete_exchange``, ``_binding``, ``_queue`` and
  ``save_/delete_meta`` (users, vhosts, permissions, policies, ... of every feature) goes to
  the local store as before and is queued for etcd under ``defs/``; a background task
  writes the queue in transactions (coalesced by key, so a burst of changes to one record
  is one write). Each value names the node it came from.
* **Catch-up.** ``open()`` joins the cluster and reads ``defs/``; ``recover()`` first lets
  the local store recover, then hands every metadata record from etcd to
  ``broker.restore_meta`` (before the recovery hooks, so a joining node takes the cluster's
  users instead of creating its defaults) and declares the cluster's exchanges and
  bindings. Local durable exchanges etcd does not know are published (union).
* **Live changes.** A watch on ``defs/`` applies other nodes' changes through the owning
  feature's public API (``broker.access``, ``broker.policies``, the vhost), with the etcd
  echo of those calls suppressed.
* **Queue masters.** A durable queue saved here is claimed in etcd (``node.claim_master``);
  a deleted one is released. Its definition and its bindings go to ``defs/queue`` and
  ``defs/binding``, so every other node holds a ``forward.ProxyQueue`` for it and routes
  to it; a new durable queue's master is placed by its locator (``check_placement``).
* **Links.** The links to other nodes (``link.Link``, one per node and vhost) run in this
  store's nursery; the cluster's link user and the master-side publish hook are set up at
  recovery (``forward.py``).
* **Fencing.** When the node's lease view runs out, ``broker.on_store_fenced`` closes every
  connection and refuses new ones until the lease is renewed.
"""
from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ..message import Message
from ..persistence.base import Store, StoreUnavailable
from ..queues.types import queue_type_of
from .etcd import CoordinationError, CoordinationUnavailable, Coordinator
from .forward import LOCATORS, ProxyQueue, choose_master, forward_reply, forwarded_publish
from .link import LINK_USER, Link, link_password
from .mirror import Mirrors
from .node import ClusterJoinError, ClusterNode
from .store_defs import LOCAL_KINDS, ClusterDefinitions, _args_out, _q
from .stream_replicas import StreamReplicas
from .stream_stepdown import bindings_of, keeping_copy, rebind
from .transient import TransientQueues
from .view import QueueViews

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import Queue
    from ..vhost import VirtualHost

log = logging.getLogger("broker.cluster.defs")

class _Forwards:
    """The publishes forwarded to masters and mirrors since the last ``when_durable``: its
    callback runs once they are all confirmed and the local store's writes are durable; a
    nack makes it ``on_failure``; one in doubt (a link lost before the peer answered)
    closes the publishing connection with 541, as a store write in doubt does
    (``Broker.on_store_failure``): neither a confirm nor a nack would be true."""

    __slots__ = ("callback", "channel", "doubt", "failed", "fired", "on_failure", "waiting")

    def __init__(self, channel: Any) -> None:
        self.waiting = 0
        self.failed = False
        self.doubt = False
        self.fired = False
        self.channel = channel  # the channel whose publish routed here, if known
        self.callback: Any = None
        self.on_failure: Any = None

    def started(self):
        self.waiting += 1
        return self.done

    def done(self, ok: bool | None) -> None:
        self.waiting -= 1
        if ok is None:
            self.doubt = True
        elif not ok:
            self.failed = True
        self.check()

    def check(self) -> None:
        if self.waiting or self.fired or self.callback is None:
            return
        self.fired = True
        if self.doubt and self.channel is not None and not self.channel.closed:
            from .. import errors
            self.channel.session.force_close(errors.internal_error(
                "cluster: a publish forwarded to another node is in doubt (the link to it "
                "was lost before it answered)"))
            return
        if not self.failed and not self.doubt:
            self.callback()
        elif self.on_failure is not None:
            self.on_failure()



class ClusterStore(ClusterDefinitions, Store):
    """``inner`` plus the cluster (see the module docstring). Every ``Store`` method the
    core calls is the inner store's, except the definitions, ``open``/``recover``/``run``/
    ``close``; backend extras (``paged_ready``, ``read_message``, ...) are reached through
    ``message_store``, the inner store the queues attach, never through this wrapper."""

    capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, inner: Store, coord: Coordinator, node: ClusterNode):
        super().__init__(coord, node)
        self.inner = inner
        self.flush_stats = inner.flush_stats  # the inner store's figures (/metrics)
        self._joined = False  # joined by prepare (before the broker listens) or open
        self.name = inner.name
        self.capabilities = inner.capabilities  # type: ignore[misc]  # the inner store's, per instance
        self._nursery: trio.Nursery | None = None
        self._forwards: _Forwards | None = None
        self._pressure: set[str] = set()  # links over their bounds
        self.link_password = link_password(node.settings.secret, node.prefix)
        self.publishing: Any = None  # the channel whose publish is being routed (forward.py)
        self.mirrors = Mirrors(self)
        self.views = QueueViews(self)  # the same queue view from every node (view.py)
        self.stream_replicas = StreamReplicas(self)  # streams across nodes
        self.transients = TransientQueues(self)  # transient queues seen from every node
        node.on_fenced.append(self._fenced)


    # ---- life cycle ----
    async def prepare(self) -> None:
        """Join the cluster before the broker listens: a node the cluster refuses (wrong
        secret, name in use, etcd unreachable) stops with its one line, never listening."""
        if self._joined:
            return
        try:
            await self.node.join()
            everything, self._revision = await self.coord.get_prefix(self.node.prefix)
            defs = self._defs("")
            self._snapshot = [kv for kv in everything if kv.key.startswith(defs)]
            for kv in everything:
                self._track(kv.key, kv.value)
        except (CoordinationUnavailable, CoordinationError, ClusterJoinError) as exc:
            await self.coord.aclose()
            raise StoreUnavailable(f"cluster: {exc}") from None
        self._joined = True

    async def open(self) -> None:
        await self.prepare()
        try:
            await self.inner.open()
        except BaseException:
            await self.node.leave()
            await self.coord.aclose()
            raise

    def recover(self, broker: Broker) -> None:
        self.broker = broker
        self.inner.recover(broker)
        records = []
        for kv in self._snapshot:
            try:
                payload = json.loads(kv.value)
            except ValueError:
                log.warning("skipping unreadable cluster definition %s", kv.key)
                continue
            self._known[kv.key] = payload.get("d", {})
            records.append((kv.key, payload.get("d", {})))
        self._snapshot = []
        seeded = self._defs("meta", "access", "initialized") in self._known
        self._applying = True
        try:
            # metadata first (vhosts before what lives in them), then exchanges, then bindings
            order = {"meta": 0, "exchange": 1, "queue": 2, "tqueue": 2, "binding": 3}
            records.sort(key=lambda r: order.get(self._section(r[0]), 3))
            for key, value in records:
                try:
                    self._apply_put(key, value, recovering=True)
                except Exception as exc:  # one bad record must not keep the node down
                    log.warning("could not apply cluster definition %s: %s", key, exc)
        finally:
            self._applying = False
        if seeded:
            broker.recovery_hooks.append(self._drop_local_only)
        else:
            broker.recovery_hooks.append(self._publish_local_meta)
        broker.recovery_hooks.append(self._ensure_link_user)
        broker.drain_hooks.append(self.mirrors.shutdown)  # ha-promote-on-shutdown
        self._drop_superseded()
        # before the other hooks: a forwarded publish is the queue's, nobody else's
        broker.publish_hooks.insert(0, partial(forwarded_publish, self, broker.direct_reply))
        # direct reply-to: reply names say which node the requester is on
        broker.direct_reply.node = self.node.name
        broker.direct_reply.forward = self._forward_reply
        # a link's deliveries wait on the other node's consumer, which has its own timeout
        broker.consumer_timeouts.exempt_users.add(LINK_USER)
        self._publish_local()
        self.transients.install_all()
        self.stream_replicas.install(broker)  # streams' replica groups and copies
        # mirror copies kept on disk, to catch up from (the proxies exist now)
        try:
            self.mirrors.load()
        except OSError as exc:
            log.warning("mirror copies on disk not read: %s", exc)

    def _publish_local(self) -> None:
        """Union at join: durable exchanges, exchange-to-exchange bindings and durable queues
        of this node that etcd does not list yet."""
        from ..persistence.records import binding_def
        for vhost in list(self.broker.vhosts.values()):
            for x in list(vhost.exchanges.values()):
                if x.durable and x.name and not x.name.startswith("amq."):
                    if self._exchange_key(vhost, x) not in self._known:
                        self.save_exchange(vhost, x)
                    for b in list(x.bindings.values()):
                        bd = binding_def(vhost, b)
                        if bd.destination_kind == "exchange" and self._binding_key(vhost, b) \
                                not in self._known:
                            self.save_binding(vhost, b)
            for q in list(vhost.queues.values()):
                if q.durable and q.keeps_definition and not q.internal:
                    self._claims[(vhost.name, q.name)] = True
                    if self._queue_key(vhost, q.name) not in self._known:
                        self._queue_write(self._queue_key(vhost, q.name), self._queue_def(vhost, q))
                    for source, bkey in list(q.bindings):
                        x = vhost.exchanges.get(source)
                        b = x.bindings.get(bkey) if x is not None else None
                        if b is not None and x.durable and self._binding_key(vhost, b) not in self._known:
                            self.save_binding(vhost, b)
        self._wake.set()

    def _drop_superseded(self) -> None:
        """Queues this node's store recovered that another node masters now (a mirror
        was promoted while this node was down): the local copy is stale; it is dropped
        and the queue becomes a proxy of its master here. With no master now (the whole
        cluster restarts) the home record decides: a promotion moved it to the promoted
        node, whose store has what was confirmed after the failover; claiming the stale
        copy here would lose that."""
        for vhost in list(self.broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                master = self._masters.get((vhost.name, q.name)) \
                    or self._homes.get((vhost.name, q.name))
                if isinstance(q, ProxyQueue) or not q.durable or master is None \
                        or master == self.node.name:
                    continue
                log.warning("queue %r in vhost %r is mastered by node %r now: this node's "
                            "stale copy (%d messages) is dropped", q.name, vhost.name, master,
                            q.message_count)
                bindings = bindings_of(vhost, q)
                self._applying = True
                try:
                    with keeping_copy(q):  # a stream's log is cut back, not copied again
                        vhost.delete_queue(q, reason="superseded by a promoted mirror")
                finally:
                    self._applying = False
                rebind(vhost, self._add_proxy(vhost, q.name, master, q.auto_delete,
                                              dict(q.arguments)), bindings, persist=False)

    # ---- forwarding (forward.py, link.py) ----
    def _ensure_link_user(self, vhost_name: str | None = None) -> None:
        """The user other nodes' links log in as, with every permission on each vhost
        (or on ``vhost_name``); its password comes from the cluster secret."""
        access = self.broker.access
        if access is None:
            return
        if access.authenticate(LINK_USER, self.link_password, "127.0.0.1") is None:
            access.put_user(LINK_USER, password=self.link_password, tags=[])
        for name in [vhost_name] if vhost_name else list(self.broker.vhosts):
            if name in self.broker.vhosts and (LINK_USER, name) not in access.perms:
                access.set_permissions(LINK_USER, name, ".*", ".*", ".*")

    def _forward_reply(self, node: str, vhost: str, message: Message) -> None:
        """A direct reply published here for a requester on ``node`` (a cluster member)."""
        if node != self.node.name and node in self._addresses:
            forward_reply(self.link_for(node, vhost), message)

    def link_for(self, node: str, vhost: str) -> Link:
        """The link to ``node`` for ``vhost``, started on first use."""
        link = self._links.get((node, vhost))
        if link is None:
            self._ensure_link_user(vhost)
            def pressure(on: bool, n: str = node) -> None:
                self._link_pressure(n, on)
            link = Link(node, self._addresses.get(node, ""), vhost, self.link_password, pressure,
                        confirm_timeout=self.node.ttl)
            self._links[(node, vhost)] = link
            if self._nursery is not None:
                self._nursery.start_soon(self._run_link, link)
        return link

    async def _run_link(self, link: Link) -> None:
        async with trio.open_nursery() as nursery:
            # what is held for the first connection is answered (nacked) in bounded time
            nursery.start_soon(link.held_watchdog)
            while not link.address:  # the node is not up (yet): its queues are unavailable
                await trio.sleep(0.5)
                link.address = self._addresses.get(link.node, "")
            await link.run()

    @property
    def nursery(self) -> trio.Nursery | None:
        """The cluster's nursery (background work of the mirrors), once running."""
        return self._nursery

    def known_members(self) -> set[str] | None:
        """The cluster's members (ha-mode nodes checks its names), or None while applying
        another node's change (it was checked there; members may differ for a moment)."""
        return None if self._applying else self._members | {self.node.name}

    def live_nodes(self) -> set[str]:
        return self._live | {self.node.name}

    def master_of(self, vhost: str, queue: str) -> str | None:
        """The queue's master node as etcd has it (None: none now)."""
        return self._masters.get((vhost, queue))

    def node_down(self, node: str) -> bool:
        return node != self.node.name and node not in self._live

    def _link_pressure(self, node: str, on: bool) -> None:
        """A link over its bounds blocks this node's publishers (a resource alarm) until
        the master has caught up."""
        name = f"cluster link to {node}"
        if self.broker is not None:
            self.broker.set_alarm(name, on)

    def forward_started(self):
        """A proxy queue forwards a publish: the callable to call with the master's
        answer; the next ``when_durable`` waits for it."""
        forwards = self._forwards
        if forwards is None or forwards.channel is not self.publishing:
            # left by a publish answered without waiting for them (refused before it was
            # sent, or not durable): they are not this publish's, whose answer they would
            # otherwise decide (and send by the other publish's channel)
            forwards = self._forwards = _Forwards(self.publishing)
        return forwards.started()

    def settle_barrier(self, channel) -> None:
        """``channel``'s tx.commit acknowledged or rejected messages of mirrored queues: the
        next ``when_durable`` (its commit-ok) waits until their mirrors applied that."""
        self.publishing = channel
        self.mirrors.settle_barrier()

    @property
    def message_store(self) -> Store:
        return self.inner  # what queues attach (vhost.add_queue): messages skip the wrapper

    def forward_abandoned(self, done) -> None:
        """The publish ``done`` was for could not be sent: nothing will call it."""
        if self._forwards is not None:
            self._forwards.waiting -= 1

    def when_durable(self, callback, on_failure=None) -> None:
        gen = self.defsync.claim()
        if gen:  # a definition change: answered once every live node applied it
            callback = self.defsync.then(gen, callback)
        forwards, self._forwards = self._forwards, None
        self.publishing = None  # the routing of that publish is over
        if forwards is None:
            self.inner.when_durable(callback, on_failure)
            return
        forwards.callback = callback
        forwards.on_failure = on_failure
        forwards.waiting += 1  # the local store's own writes
        self.inner.when_durable(lambda: forwards.done(True), lambda: forwards.done(False))

    def _add_proxy(self, vhost: VirtualHost, name: str, master: str, auto_delete: bool,
                   arguments: dict) -> ProxyQueue:
        from .stream_reads import proxy_class  # a stream's proxy reads this node's copy
        proxy = proxy_class(arguments)(vhost, name, True, auto_delete, arguments, master,
                                       self.link_for, self)
        vhost.add_queue(proxy, persist=False)
        return proxy

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for link in self._links.values():
                nursery.start_soon(self._run_link, link)
            nursery.start_soon(self.node.run)
            nursery.start_soon(self.mirrors.run)
            nursery.start_soon(self.mirrors.flusher)
            nursery.start_soon(self._writer)
            nursery.start_soon(self._watcher)
            nursery.start_soon(self.defsync.run)
            await self.inner.run()
            await trio.sleep_forever()

    async def close(self) -> None:
        try:
            with trio.move_on_after(self.node.settings.etcd_timeout) as scope:
                scope.shield = True
                await self._flush()
        except (CoordinationUnavailable, CoordinationError) as exc:
            log.warning("cluster definitions not written at stop: %s", exc)
        await self.node.leave()
        await self.coord.aclose()
        await self.inner.close()

    # ---- fencing ----
    def _fenced(self, fenced: bool, reason: str) -> None:
        if self.broker is not None:
            self.broker.on_store_fenced(self, fenced, reason=f"cluster: {reason}")
            if not fenced:  # back after a lost lease: a promoted mirror may hold some queues
                # the rejoin's claims read etcd just now; the watch may not have caught up
                # (after a partition it lags): without this a stale copy would stay, deposed
                for vq, holder in self.node.conflicts.items():
                    self._masters[vq] = holder
                for vq in self.node.masters:
                    self._masters[vq] = self.node.name
                self._drop_superseded()
        self.mirrors.wake()

    def check_placement(self, vhost: VirtualHost, name: str, m=None):
        """A client declares the new durable queue ``name`` on this node: None to create it
        here, or the ``ProxyQueue`` of a master placed on another node by the queue's
        locator (``x-queue-master-locator``, else the policy's ``queue-master-locator``,
        else ``client-local``), declared there through the link. 404 while its home node
        is down; 406 for an unknown locator."""
        from .. import errors
        home = self._homes.get((vhost.name, name))
        if home is not None and home != self.node.name:
            if home not in self._live:  # RabbitMQ's answer for a durable queue whose node is down
                raise errors.AMQPError(
                    "not_found", f"home node '{home}' of durable {vhost.queue_resource(name)} is "
                    f"down or inaccessible")
            target = home  # its definition has not reached this node yet
        else:
            arguments = dict(m.arguments or {}) if m is not None else {}
            qtype = queue_type_of(arguments)  # quorum: x-queue-leader-locator
            locator = qtype.placement_locator(arguments)
            source = f"arg '{qtype.locator_argument}'"
            if locator is None and self.broker.policies is not None:
                locator = self.broker.policies.effective(vhost.name, "queue", name, qtype)[
                    2].get("queue-master-locator")
                source = "policy key 'queue-master-locator'"
            if isinstance(locator, bytes):
                locator = locator.decode("utf-8", "replace")
            if locator is None:
                return None
            if locator not in LOCATORS:
                raise errors.precondition_failed(
                    "invalid %s for %s: %r is not one of %s", source, vhost.queue_resource(name),
                    locator, ", ".join(LOCATORS))
            counts: dict[str, int] = {}
            for node in self._homes.values():
                counts[node] = counts.get(node, 0) + 1
            live = sorted(self._live | {self.node.name})
            target = choose_master(locator, self.node.name, live, counts)
            if target == self.node.name:
                return None
        arguments = dict(m.arguments or {}) if m is not None else {}
        proxy = self._add_proxy(vhost, name, target, bool(m.auto_delete) if m is not None
                                else False, arguments)
        # the master creates it locally: its own locator must not send it on again
        remote_args = dict(arguments, **{queue_type_of(arguments).locator_argument:
                                         "client-local"})
        from ..amqp import spec
        proxy.link.control(spec.Queue.Declare(0, name, False, True, False, proxy.auto_delete,
                                              False, remote_args))
        self._homes[(vhost.name, name)] = target
        return proxy


    def save_exchange(self, vhost: VirtualHost, exchange) -> None:
        self.inner.save_exchange(vhost, exchange)
        self._queue_write(self._exchange_key(vhost, exchange), {
            "vhost": vhost.name, "name": exchange.name, "type": exchange.type_name,
            "auto_delete": exchange.auto_delete, "internal": exchange.internal,
            "arguments": _args_out(exchange.arguments)})

    def delete_exchange(self, vhost: VirtualHost, exchange) -> None:
        self.inner.delete_exchange(vhost, exchange)
        self._queue_write(self._exchange_key(vhost, exchange), None)

    def save_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        if isinstance(queue, ProxyQueue):
            return  # its master's node stores it
        self.inner.save_queue(vhost, queue)
        if not self._applying:
            self._claims[(vhost.name, queue.name)] = True
            # counted at once: the watch brings this node's own record back later, and a
            # locator placing the next queue must already see this one (min-masters)
            self._homes[(vhost.name, queue.name)] = self.node.name
            self._queue_write(self._queue_key(vhost, queue.name), self._queue_def(vhost, queue))
            self._wake.set()

    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None:
        if isinstance(queue, ProxyQueue):
            return  # deleted on its master through the link (ProxyQueue.on_deleted)
        self.inner.delete_queue(vhost, queue)
        if not self._applying:
            self._claims[(vhost.name, queue.name)] = False
            self._homes.pop((vhost.name, queue.name), None)
            self._queue_write(self._queue_key(vhost, queue.name), None)
            # its bindings went with it (the vhost drops them without a store call each)
            head = self._defs("binding", _q(vhost.name), "")
            for key, value in list(self._known.items()):
                if key.startswith(head) and value.get("destination_kind") == "queue" \
                        and value.get("destination") == queue.name:
                    self._queue_write(key, None)
            self._wake.set()

    def save_binding(self, vhost: VirtualHost, binding) -> None:
        if not isinstance(binding.destination, ProxyQueue):  # the master's node stores it
            self.inner.save_binding(vhost, binding)
        self._queue_write(self._binding_key(vhost, binding), {
            "vhost": vhost.name, "source": binding.source,
            "destination_kind": binding.destination.kind,
            "destination": binding.destination.name, "routing_key": binding.routing_key,
            "arguments": _args_out(binding.arguments)})

    def delete_binding(self, vhost: VirtualHost, binding) -> None:
        if not isinstance(binding.destination, ProxyQueue):
            self.inner.delete_binding(vhost, binding)
        self._queue_write(self._binding_key(vhost, binding), None)

    def save_meta(self, kind: str, key: str, value: dict) -> None:
        self.inner.save_meta(kind, key, value)
        vhost = self.broker.vhosts.get(key) if kind == "vhost" and self.broker else None
        if vhost is not None:  # a vhost made live here or applied from another node
            self.transients.install(vhost)
        if kind not in LOCAL_KINDS:
            self._queue_write(self._defs("meta", _q(kind), _q(key)), dict(value))

    def delete_meta(self, kind: str, key: str) -> None:
        self.inner.delete_meta(kind, key)
        if kind not in LOCAL_KINDS:
            self._queue_write(self._defs("meta", _q(kind), _q(key)), None)

    # ---- messages: the inner store's ----
    def queue_op(self, queue: Queue, op, entry) -> None:
        self.inner.queue_op(queue, op, entry)

    def enqueue(self, queue: Queue, entry) -> None:
        self.inner.enqueue(queue, entry)

    def delivered(self, queue: Queue, entry) -> None:
        self.inner.delivered(queue, entry)

    def remove(self, queue: Queue, entry) -> None:
        self.inner.remove(queue, entry)

    def sidecar_path(self, name: str) -> str | None:
        return self.inner.sidecar_path(name)
