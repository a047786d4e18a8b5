"""Mirrored queues by policy (ha-mode, ha-params, ha-sync-mode, ha-sync-batch-size,
ha-promote-on-failure, ha-promote-on-shutdown).

Built on the queue operation stream (``broker/queues/ops.py``): the master's ``Mirroring``
is an observer of its queue, as the store is, and sends what the store gets -- each
ENQUEUE (with the message) and each leaving op -- to every mirror node over the link
(``link.py``), each op carrying the master's **epoch**. A mirror node keeps a
``MirrorCopy`` per queue (in memory, and on disk: ``copylog.py``) and applies the same
stream; a mirror that comes back with a complete copy of the master's epoch catches up
from it (``Mirroring.start_sync``: only what it lacks is sent).

* **Confirms.** An ENQUEUE sent to an in-sync mirror takes a token of the cluster store's
  forwarded writes, so the publisher's confirm waits until every in-sync mirror confirmed
  it (``ClusterStore.when_durable``). A mirror that nacks or whose link drops leaves the
  in-sync set; until etcd records the smaller set, every new publish waits for that
  write, so a confirm is never given for a message an in-sync-in-etcd mirror lacks.
* **In-sync set in etcd** (``isr/VHOST/QUEUE``), written with ``ClusterNode.set_in_sync``:
  only under the master's epoch (a deposed master cannot write it).
* **Sync.** A new mirror gets RESET, then every message the queue holds (ready and
  delivered-unsettled), in batches of ``ha-sync-batch-size`` (two unconfirmed at most:
  the queue keeps serving), then SYNCED; once that is confirmed it joins the in-sync set.
  Its messages synced / total go to the in-sync record for ``cluster status``.
  ha-sync-mode manual: the mirror starts empty and gets the live ops, out of the in-sync
  set until ``cluster sync-queue``.
* **Fencing.** A copy takes ops only from its epoch; a RESET of a newer epoch replaces it,
  so a deposed master's ops are nacked. A master that lost its lease is fenced (the node
  closes every connection) before etcd can let anyone else take the queue.
* **Promotion.** When the master key is gone (lease expired or revoked), a mirror whose
  copy's epoch is the in-sync record's epoch and that is in its in-sync set (or any
  mirror, with "always": ha-promote-on-shutdown when the master marked its clean stop in
  the record, else ha-promote-on-failure) claims the master key in a create-only
  transaction; the winner turns its copy into the queue (every message redelivered=true:
  it may have been delivered before), stored in its own store, and mirrors it on.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..message import Message
from ..queues.ops import Op
from .etcd import CoordinationError, CoordinationUnavailable
from .mirror_copy import MirrorCopies, MirrorCopy
from .mirror_master import Mirroring
from .mirror_policy import replica_group, wanted_mirrors
from .stream_stepdown import bindings_of, rebind

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..vhost import VirtualHost
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.mirror")

_PROMOTE_SLICE = 2000  # messages built per step when a copy becomes the queue


class _Promoted:
    """Sets the flags of a promoted copy's entries as they enter the queue (before a paged
    ready list writes them out: setting them afterwards would read every one back): each
    may have been delivered by the old leader (RabbitMQ's redelivered flag), and the count
    of those that came back carries on (x-delivery-count, the delivery limit)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # id of the message -> its deliveries returned

    def queue_op(self, queue: Queue, op: Op, entry) -> None:
        if op is Op.ENQUEUE:
            entry.redelivered = True
            count = self.counts.pop(id(entry.message), 0)
            if count:
                from ..queues.retry import restore_delivery_count
                restore_delivery_count(queue, entry, count)



class Mirrors(MirrorCopies):
    """Both roles of this node: master of some queues (``Mirroring``), mirror of others
    (``MirrorCopies``); ``run()`` in the cluster store's nursery reconciles and promotes."""

    def __init__(self, store: ClusterStore):
        super().__init__(store)
        self.masters: dict[tuple[str, str], Mirroring] = {}
        self._wake = trio.Event()
        self.promotions = 0
        self._to_flush: list[Mirroring] = []
        self._flush_wake = trio.Event()
        # a promoted queue: (vhost, queue) -> the seq up to which its entries are known to be
        # committed (the old leader's commit index its ops carried), for its ``Mirroring``
        self.inherited: dict[tuple[str, str], int] = {}


    def probe(self, mirroring: Mirroring, node: str, generation: int) -> bool:
        """Ask ``node`` (in the background) about its copy of the queue; False when it
        cannot be asked (then the sync starts from nothing)."""
        nursery = self.store.nursery
        if nursery is None:
            return False
        queue = mirroring.queue

        async def ask() -> None:
            answer = await self.store.views.ask_copy(node, queue.vhost.name, queue.name)
            try:
                mirroring.probed(node, generation, answer)
            except Exception:  # a bug must not take the broker down: the mirror fails
                log.exception("sync of queue %r to mirror %r failed", queue.name, node)
                mirroring.mirror_failed(node)
        nursery.start_soon(ask)
        return True

    def wake(self) -> None:
        self._wake.set()

    def flush_soon(self, mirroring: Mirroring) -> None:
        self._to_flush.append(mirroring)
        self._flush_wake.set()

    def settle_barrier(self) -> None:
        for mirroring in self._to_flush:  # the queues with ops not yet sent
            mirroring.settle_barrier()

    async def flusher(self) -> None:
        while True:
            await self._flush_wake.wait()
            self._flush_wake = trio.Event()
            batch, self._to_flush = self._to_flush, []
            for mirroring in batch:
                try:
                    mirroring.flush()
                except Exception:  # a bug must not take the broker down
                    log.exception("mirroring of queue %r failed", mirroring.queue.name)

    def sync_request(self, vhost: str, queue: str, action: str) -> None:
        """A ``cluster sync-queue`` / ``cancel-sync-queue`` request seen in etcd."""
        mirroring = self.masters.get((vhost, queue))
        if mirroring is not None:
            n = mirroring.sync_request(action)
            log.info("queue %r in vhost %r: %s requested (%d mirrors)", queue, vhost,
                     "sync" if action == "sync" else "cancel-sync", n)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.syncer)
            await self._run()

    async def _run(self) -> None:
        while True:
            # woken by what matters (a master key gone, a node up or down, a mirror that
            # failed or synced); the timeout catches policy changes
            # (every 0.5 s while a sync runs: its progress goes to etcd, for ``status``)
            syncing = any(m.syncs for m in self.masters.values())
            with trio.move_on_after(0.5 if syncing else 1.0):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                self.reconcile()
                for mirroring in list(self.masters.values()):
                    if mirroring.quorum and mirroring.members is None:
                        await self.load_members(mirroring)
                backoff = False
                for mirroring in list(self.masters.values()):
                    if mirroring.isr_dirty or mirroring.recorded != mirroring.record_key() \
                            or mirroring.progress_dirty:
                        backoff = not await mirroring.record() or backoff
                await self.promote_orphans()
                if backoff:  # etcd did not answer: every publish wakes us, do not spin
                    await trio.sleep(0.25)
            except (CoordinationUnavailable, CoordinationError) as exc:
                log.warning("mirroring: %s", exc)
                await trio.sleep(0.5)
            except Exception:  # a bug must not take the broker down
                log.exception("mirroring failed")
                await trio.sleep(0.5)

    def reconcile(self) -> None:
        """Follow the queues this node masters and their policies."""
        store = self.store
        node = store.node
        broker = store.broker
        if broker is None:
            return
        from .forward import ProxyQueue
        live = sorted(store.live_nodes())
        seen = set()
        for vhost in list(broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                if isinstance(q, ProxyQueue) or not q.durable or q.internal \
                        or not q.keeps_definition:
                    continue
                key = (vhost.name, q.name)
                m = node.mastership(vhost.name, q.name)
                mirroring = self.masters.get(key)
                if m is None:
                    if mirroring is not None and mirroring.queue is q:
                        mirroring.deposed = True
                        seen.add(key)
                    continue
                seen.add(key)
                if mirroring is not None and (mirroring.queue is not q or mirroring.epoch != m.epoch):
                    mirroring.detach()
                    mirroring = None
                if mirroring is None:
                    mirroring = self.masters[key] = Mirroring(self, q, m.epoch)
                    q.observers.append(mirroring)
                mirroring.deposed = False
                if mirroring.quorum:  # its member group, not ha-* policies
                    if mirroring.members is None:
                        q.confirms_later = True
                        continue  # read or chosen first (``load_members``)
                    mirroring.set_nodes([n for n in mirroring.members
                                         if n != node.name and n in live], False)
                    continue
                definition = q.effective_policy_definition or {}
                wanted = wanted_mirrors(definition, node.name, live, mirroring.nodes)
                mirroring.set_nodes(wanted, definition.get("ha-sync-mode") == "manual")
        for key in [k for k in self.masters if k not in seen]:
            self.masters.pop(key).detach()

    async def load_members(self, mirroring: Mirroring) -> None:
        """A quorum queue mastered here: its member group from its in-sync record (a
        promoted or restarted leader keeps the group), else a new group of
        ``x-quorum-initial-group-size`` (3 unless set) live nodes: this one and the next
        ones by name (so followers spread over the cluster)."""
        store = self.store
        q = mirroring.queue
        me = store.node.name
        kv = await store.coord.get(store.node.isr_key(q.vhost.name, q.name))
        if self.masters.get((q.vhost.name, q.name)) is not mirroring:
            return
        members = (kv.json() if kv is not None else {}).get("members")
        if isinstance(members, list) and me in members:
            mirroring.members = [str(n) for n in members]
        else:
            size = q.queue_type.initial_group_size(q.arguments) or 3
            others = sorted(n for n in store.live_nodes() if n != me)
            others = [n for n in others if n > me] + [n for n in others if n < me]
            mirroring.members = [me, *others[:max(0, size - 1)]]
            log.info("queue %r in vhost %r: quorum members %s", q.name, q.vhost.name,
                     ", ".join(mirroring.members))
        mirroring.isr_dirty = True
        self.reconcile()

    async def promote_orphans(self) -> None:
        """Copies whose master is gone: promote this node if it may (module docstring)."""
        store = self.store
        for key, copy in list(self.copies.items()):
            if store.master_of(*key) is not None:
                continue
            vhost_name, queue = key
            vhost = store.broker.vhosts.get(vhost_name)
            proxy = vhost.queues.get(queue) if vhost is not None else None
            from .forward import ProxyQueue
            if not isinstance(proxy, ProxyQueue):
                self._forget(key)  # deleted meanwhile
                continue
            if copy.loaded:
                continue  # read from disk, not caught up: it may lack what was confirmed
            kv = await store.coord.get(store.node.isr_key(vhost_name, queue))
            record = kv.json() if kv is not None else {}
            # a master that stopped cleanly said so in the record of its epoch
            how = "shutdown" if record.get("shutdown") and record.get("epoch") == copy.epoch \
                else "failure"
            # a quorum queue's leader is always one of the in-sync record's members (they
            # have every confirmed message): ha-* policies do not apply to it
            always = (proxy.effective_policy_definition or {}).get(f"ha-promote-on-{how}") \
                == "always" and not replica_group(proxy)
            eligible = (record.get("epoch") == copy.epoch
                        and store.node.name in record.get("in_sync", []) and copy.synced)
            if not eligible and not always:
                continue
            if self.copies.get(key) is not copy:
                continue
            m = await store.node.claim_if_free(vhost_name, queue)
            if m is None:
                continue
            self._forget(key)
            if not eligible:
                log.warning("queue %r in vhost %r: promoting a mirror that is not in sync "
                            "(ha-promote-on-%s always): what it lacks is lost", queue,
                            vhost_name, how)
            await self.promote(vhost, proxy, copy, m.epoch)

    async def promote(self, vhost: VirtualHost, proxy, copy: MirrorCopy, epoch: int) -> None:
        """The copy becomes the queue. It is built and stored in slices with a checkpoint
        between them, beside the proxy (which keeps this node's publishers and consumers
        meanwhile, as before the promotion), then swapped in: a copy of 50,000 messages
        stored in one step kept the event loop from renewing the lease in time (TTL 2 s),
        and the promoted leader fenced itself."""
        from ..amqp.fields import decode_properties
        from ..queues.args import parse_queue_arguments
        from ..queues.queue import Queue
        name = proxy.name
        arguments = dict(proxy.arguments)
        q = Queue(vhost, name, durable=True, auto_delete=proxy.auto_delete, arguments=arguments,
                  opts=parse_queue_arguments(arguments))
        store = vhost.store
        store.save_queue(vhost, q)
        q.attach_store(store.message_store)
        flags = _Promoted()
        q.observers.append(flags)
        seqs = sorted(copy.entries)
        committed = 0  # the new seq of the last entry known to be committed
        for start in range(0, len(seqs), _PROMOTE_SLICE):
            for seq in seqs[start:start + _PROMOTE_SLICE]:
                exchange, key, props_raw, body = copy.entries[seq]
                message = Message(exchange, key, props_raw, decode_properties(props_raw), body)
                if copy.counts.get(seq):
                    flags.counts[id(message)] = copy.counts[seq]
                q.enqueue(message)
                if seq <= copy.commit:
                    committed = q._next_seq - 1
            await trio.lowlevel.checkpoint()
            if vhost.queues.get(name) is not proxy:  # deleted meanwhile
                store.delete_queue(vhost, q)
                return
        q.observers.remove(flags)
        # this node's consumers of the queue stay (as on RabbitMQ), unless they asked for
        # basic.cancel at a failover (x-cancel-on-ha-failover)
        consumers = list(proxy.consumers)
        for consumer in consumers:
            proxy.remove_consumer(consumer)
        proxy.forwarding = False
        bindings = bindings_of(vhost, proxy)  # the vhost drops them with the proxy
        vhost.delete_queue(proxy, reason="promoted to master here")
        if replica_group(q):
            self.inherited[(vhost.name, name)] = committed
        vhost.add_queue(q, persist=False)  # stored above
        rebind(vhost, q, bindings, persist=True)  # this node's store keeps them from now on
        for consumer in consumers:
            if consumer.channel.closed:
                continue
            if consumer.arguments.get("x-cancel-on-ha-failover") is True:
                consumer.channel.consumer_cancelled_by_broker(consumer)
                continue
            # the consumer object moves to the queue it now consumes from (the channel
            # settles its deliveries through ``consumer.queue``)
            consumer.queue = q
            q.add_consumer(consumer)
        self.promotions += 1
        log.warning("queue %r in vhost %r: promoted to master on this node (epoch %d, %d "
                    "messages, old master %r)", name, vhost.name, epoch, len(copy.entries),
                    copy.master)
        self.reconcile()  # mirrored (and its publishes held for a majority) from now on
        self.wake()

    async def shutdown(self) -> None:
        """A clean stop (``broker.drain_hooks``, before the lease is revoked): send what is
        pending to the mirrors and mark each in-sync record as a shutdown, so that
        ha-promote-on-shutdown, not -on-failure, decides which mirror may take over."""
        with trio.move_on_after(self.store.node.settings.etcd_timeout) as scope:
            scope.shield = True
            for mirroring in list(self.masters.values()):
                try:
                    mirroring.flush()
                    if mirroring.nodes and self.store.node.serving:
                        await mirroring.record(shutdown=True)
                except (CoordinationUnavailable, CoordinationError) as exc:
                    log.warning("queue %r: shutdown not recorded: %s", mirroring.queue.name, exc)

    def status(self) -> dict:
        return {"masters": {f"{v}/{q}": dict(m.nodes) for (v, q), m in self.masters.items()},
                "copies": {f"{v}/{q}": {"epoch": c.epoch, "messages": len(c.entries),
                                        "synced": c.synced}
                           for (v, q), c in self.copies.items()},
                "promotions": self.promotions}


