"""The master side of a mirrored or quorum queue (``Mirroring``): an observer of the queue's
operation stream that sends its ops to every mirror, holds confirms for the in-sync ones
(a quorum queue's: for a majority, with its commit index) and records the in-sync set in
etcd. Not the syncs of new mirrors (``mirror_sync.py``) nor the mirror side
(``mirror_copy.py``)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..queues.ops import Op
from .etcd import CoordinationError, CoordinationUnavailable
from .link import forward_properties
from .mirror_ops import ENQUEUES, LEFT, MIRROR_HEADER, RESET, RETURNED, entry_chunks, pack_counts, seq_chunks
from .mirror_policy import replica_group
from .mirror_sync import Sync, catch_up, full_sync

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from .mirror import Mirrors

log = logging.getLogger("broker.cluster.mirror")


class _Nodes(dict):
    """mirror node -> state; ``version`` changes with every change (the batches of
    confirm tokens and the majority are computed again only then)."""

    version = 0

    def __setitem__(self, key, value) -> None:
        self.version += 1
        super().__setitem__(key, value)

    def __delitem__(self, key) -> None:
        self.version += 1
        super().__delitem__(key)

    def pop(self, *args):
        self.version += 1
        return super().pop(*args)

    def clear(self) -> None:
        self.version += 1
        super().clear()

    def update(self, *args, **kw) -> None:
        self.version += 1
        super().update(*args, **kw)


class _Batch:
    """The confirm tokens of the messages one flush sends while the same members were in
    sync (``owed``): one token per message, resolved once every owing member answered
    (or, for one that left the in-sync set, once the smaller set is recorded) -- not one
    token per message and member. ``answer`` is itself a token (True, or None: in doubt)."""

    __slots__ = ("left", "m", "owed", "seqs", "tokens", "version")

    def __init__(self, m: Mirroring, owed: tuple[str, ...], version: int):
        self.m = m
        self.owed = owed
        self.left = len(owed)
        self.version = version
        self.tokens: list = []  # the publishes' tokens (``ClusterStore.forward_started``)
        self.seqs: list[int] = []  # the held messages' seqs (the commit index)

    def answer(self, ok: bool | None) -> None:
        if self.left <= 0:
            return
        if ok:
            self.left -= 1
            if self.left:
                return
        else:
            self.left = 0
        tokens, self.tokens = self.tokens, []
        for token in tokens:
            token(ok)
        if ok and self.seqs:
            pending = self.m._pending
            for seq in self.seqs:
                n = pending.get(seq)
                if n:
                    pending[seq] = n - 1
            self.m._advance()


class Mirroring:
    """The master side of one queue: an observer of its operation stream."""

    def __init__(self, owner: Mirrors, queue: Queue, epoch: int):
        self.owner = owner
        self.queue = queue
        self.epoch = epoch
        self.outside: dict[int, Any] = {}  # seq -> entry delivered and not settled
        # mirror node -> "probing" | "syncing" | "in_sync" | "manual" | "failed"
        self.nodes: _Nodes = _Nodes()
        self.generation: dict[str, int] = {}  # per node: failures of an older sync are void
        self.isr_dirty = True  # the in-sync set in etcd may be larger than the real one
        self._isr_waiters: list = []  # confirms that wait for the in-sync record
        self.recorded: tuple = ()
        self._manual = False
        self._leaves: list[int] = []  # seqs that left, sent together (Mirrors.flusher)
        self._enqueued: list = []  # entries that entered, sent together
        self._returns: dict[int, int] = {}  # seq -> delivery count of entries that came back
        self._batches: list[_Batch] = []  # the confirm tokens of _enqueued
        self._batch: _Batch | None = None  # the one new messages join (nodes' version ...)
        self._batch_version = -1  # ... as of this one)
        self._majority: tuple | None = None  # (nodes' version, members) -> majority()
        self._leave_tokens: dict[str, list] = {}  # in-sync node -> tx.commit tokens of _leaves
        self.syncs: dict[str, Sync] = {}  # syncing node -> its sync
        self.gone: set[int] = set()  # seqs that left while a sync runs (not sent after)
        self.sync_counts: dict[str, list[int]] = {}  # syncing node -> [synced, total]
        self.progress_dirty = False  # sync counts changed since the last in-sync record
        # the node lost this queue's mastership (fenced, or another node holds it now):
        # every publish into it is nacked until it is master again or the copy is dropped
        self.deposed = False
        # a quorum queue (``replica_group``): replicated on its member group (this
        # node among them; None until read from its in-sync record or chosen), a confirm
        # needs a majority of the group in sync, and ha-* policies do not apply
        self.quorum = replica_group(queue)
        self.members: list[str] | None = None
        # a quorum queue's commit index: what it holds now is committed (its leader's term
        # starts with it); a new message is held from consumers until every confirm token
        # of its publish resolved (a majority has it) -- seq -> tokens outstanding
        self._pending: dict[int, int] = {}
        self._holding: int | None = None  # the seq whose tokens ``_token`` counts
        self.acked: dict[str, int] = {}  # member -> highest seq it confirmed (quorum_status)
        # entries of an earlier term up to this seq are held until a majority of the group
        # holds them under this term (Raft: a leader commits its predecessors' entries only
        # once it replicated its own log to a majority); ``record`` releases them
        self.inherited_top = 0
        if self.quorum:
            known = owner.inherited.pop((queue.vhost.name, queue.name), None)
            top = queue._next_seq - 1
            if known is None:  # this node led the queue before (a new term after a rejoin,
                # a restart): what it committed then is known, the rest is not
                known = queue.commit_seq if queue.commit_seq is not None else 0
            queue.commit_seq = min(known, top)
            if top > queue.commit_seq:
                self.inherited_top = top

    def majority(self) -> bool:
        """A majority of the member group (this node and its in-sync mirrors) has every
        message the in-sync mirrors confirmed; always true for a classic mirrored queue."""
        if not self.quorum:
            return True
        members = self.members
        if members is None:
            return False
        key = (self.nodes.version, id(members), len(members))
        cached = self._majority
        if cached is not None and cached[0] == key:
            return cached[1]
        me = self.owner.store.node.name
        have = 1 + sum(1 for n in members if n != me and self.nodes.get(n) == "in_sync")
        yes = have >= len(members) // 2 + 1
        self._majority = (key, yes)
        return yes

    # ---- the commit index ----
    def _token(self):
        """A confirm token of the publish being routed (``store.forward_started``); for a
        held message, counted: the message is committed once every one resolved true."""
        token = self.owner.store.forward_started()
        seq = self._holding
        if seq is None:
            return token
        self._pending[seq] += 1

        def done(ok: bool | None) -> None:
            token(ok)
            if ok:
                self._resolved(seq)
        return done

    def _resolved(self, seq: int) -> None:
        left = self._pending.get(seq)
        if left is None:
            return
        self._pending[seq] = left - 1
        if left == 1:
            self._advance()

    def _advance(self) -> None:
        """The commit index moves over every committed message at the head of the
        pending ones (commits are in order, as Raft's), and consumers get them."""
        pending = self._pending
        top = None
        while pending:
            seq = next(iter(pending))
            if pending[seq]:
                break
            del pending[seq]
            top = seq
        if top is None:
            return
        queue = self.queue
        if queue.commit_seq is not None and top > queue.commit_seq:
            queue.commit_seq = top
            if queue.consumers:
                queue.dispatch()

    def log_indexes(self) -> dict[str, int]:
        """quorum_status' Log Index per member: the leader's last seq, and the highest each
        follower confirmed (0: none yet in this term)."""
        me = self.owner.store.node.name
        return {n: self.queue._next_seq - 1 if n == me else self.acked.get(n, 0)
                for n in self.members or [me]}

    # ---- the operation stream ----
    def queue_op(self, queue: Queue, op: Op, entry) -> None:
        if op is Op.ENQUEUE and self.quorum and not self.deposed:
            self._pending[entry.seq] = 0
            self._holding = entry.seq
            try:
                self._queue_op(queue, op, entry)
            finally:
                self._holding = None
            if not self._pending.get(entry.seq):
                self._advance()
            return
        self._queue_op(queue, op, entry)

    def _queue_op(self, queue: Queue, op: Op, entry) -> None:
        if self.deposed and op is Op.ENQUEUE:
            self.owner.store.forward_started()(None)  # in doubt: its connection is closed
        if op is Op.DELIVER:
            self.outside[entry.seq] = entry
        elif op is Op.REQUEUE or op.leaves:
            self.outside.pop(entry.seq, None)
            if self.syncs and op.leaves:
                self.gone.add(entry.seq)
        if op is Op.ENQUEUE and self.quorum and not self.majority():
            # fewer than a majority of the group in sync: confirmed only once a majority is
            # (``record``), never on fewer copies
            self._isr_waiters.append(self._token())
            self.isr_dirty = True
            self.owner.wake()
        returned = op is Op.REQUEUE and self.quorum
        if not self.nodes or not (op is Op.ENQUEUE or op.leaves or returned):
            return
        # the ops of one pass of the event loop go to each mirror as one message
        if not self._leaves and not self._enqueued and not self._returns:
            self.owner.flush_soon(self)
        if returned:
            self._returns[entry.seq] = entry.delivery_count
            return
        if op is not Op.ENQUEUE:
            self._leaves.append(entry.seq)
            return
        self._enqueued.append(entry)
        if self.isr_dirty:
            self._isr_waiters.append(self._token())
        nodes = self.nodes
        batch = self._batch
        if self._batch_version != nodes.version:
            owed = tuple(n for n, state in nodes.items() if state == "in_sync")
            batch = self._batch = _Batch(self, owed, nodes.version) if owed else None
            self._batch_version = nodes.version
            if batch is not None:
                self._batches.append(batch)
        if batch is not None:
            batch.tokens.append(self.owner.store.forward_started())
            seq = self._holding
            if seq is not None:
                batch.seqs.append(seq)
                self._pending[seq] += 1

    def flush(self) -> None:
        """Send what the stream produced since the last flush: the new messages (their
        confirm tokens resolved by each in-sync mirror's answer), then the leaves."""
        enqueued, self._enqueued = self._enqueued, []
        leaves, self._leaves = self._leaves, []
        returns, self._returns = self._returns, {}
        batches, self._batches = self._batches, []
        self._batch, self._batch_version = None, -1
        leave_tokens, self._leave_tokens = self._leave_tokens, {}
        packed = entry_chunks(enqueued) if enqueued else []
        left = seq_chunks(leaves) if leaves else []
        # each op's properties and frames are built once for every node (``send``)
        packed_shared: list[dict] = [{} for _ in packed]
        left_shared: list[dict] = [{} for _ in left]
        for node, state in self.nodes.items():
            owed = [b.answer for b in batches if node in b.owed]
            if state in ("failed", "probing"):
                # out of the in-sync set since its tokens were taken (a probing member
                # failed, then started its catch-up, which begins from a snapshot taken
                # once it answered, so it gets no op): what it owed waits for the record
                # of the smaller set
                self._park(owed)
                self._park(leave_tokens.get(node, []))
                continue
            # a syncing or manual mirror gets the live ops too (it holds no confirm)
            if packed:
                self.send_all(node, ENQUEUES, packed,
                               self._batch_done(node, owed, enqueued[-1].seq), packed_shared)
            if returns:
                self.send(node, RETURNED, pack_counts(returns), self.done_for(node))
            if left:
                self.send_all(node, LEFT, left,
                               self._batch_done(node, leave_tokens.get(node, [])), left_shared)
        for batch in batches:
            self._park([batch.answer for node in batch.owed if node not in self.nodes])
        for node, mine in leave_tokens.items():
            if node not in self.nodes:
                self._park(mine)

    def settle_barrier(self) -> None:
        """A tx.commit settled messages of this queue: its commit-ok waits (through the
        cluster store's forwarded tokens) until every in-sync mirror applied the leaves
        produced so far."""
        if not self._leaves:
            return
        store = self.owner.store
        for node, state in self.nodes.items():
            if state == "in_sync":
                self._leave_tokens.setdefault(node, []).append(store.forward_started())

    def _park(self, tokens: list) -> None:
        """Confirms owed by a mirror that left the in-sync set: released once etcd records
        the smaller set (the message is on the master and on every mirror still in it)."""
        if tokens:
            self._isr_waiters.extend(tokens)
            self.isr_dirty = True
            self.owner.wake()

    def _batch_done(self, node: str, tokens: list, top: int = 0):
        failed = self.done_for(node)

        def done(ok: bool | None) -> None:
            if ok:
                if top > self.acked.get(node, 0):
                    self.acked[node] = top
                for token in tokens:
                    token(True)
                return
            failed(ok)
            self._park(tokens)
        return done

    def send(self, node: str, op: int, body: bytes, done, shared: dict | None = None) -> None:
        """``op`` with ``body`` to ``node``; ``shared``: what the nodes a flush sends the
        same op to share (its encoded properties and frames: built once)."""
        link = self.owner.store.link_for(node, self.queue.vhost.name)
        props_raw = shared.get("props") if shared is not None else None
        if props_raw is None:
            # the third field: 1 for a quorum queue's op (the member fsyncs its copy); the
            # fifth: the leader's commit index (a promoted member knows what it holds is
            # committed)
            props_raw = forward_properties({}, "", "", {MIRROR_HEADER: [
                self.epoch, op, 1 if self.quorum else 0, self.owner.store.node.name,
                self.queue.commit_seq or 0]})
            if shared is not None:
                shared["props"] = props_raw
        frames = shared.setdefault("frames", {}) if shared is not None else None
        if not link.publish_raw(self.queue.name, props_raw, body, done, frames):
            done(False)

    def send_all(self, node: str, op: int, bodies: list[bytes], done,
                 shared: list[dict] | None = None) -> None:
        """One op in several link messages: ``done(True)`` once the mirror took every
        part, ``done(ok)`` at the first part it did not. ``shared``: one dict per body
        (``send``)."""
        if len(bodies) == 1:
            self.send(node, op, bodies[0], done, shared[0] if shared else None)
            return
        left = [len(bodies)]

        def part(ok: bool | None) -> None:
            if left[0] <= 0:
                return
            if not ok:
                left[0] = 0
                done(ok)
                return
            left[0] -= 1
            if left[0] == 0:
                done(True)
        for i, body in enumerate(bodies):
            self.send(node, op, body, part, shared[i] if shared else None)

    def done_for(self, node: str):
        generation = self.generation.get(node, 0)

        def done(ok: bool | None) -> None:
            if not ok and self.generation.get(node, 0) == generation:
                self.mirror_failed(node)
        return done

    def mirror_failed(self, node: str) -> None:
        state = self.nodes.get(node)
        if state is None or state == "failed":
            return
        if state == "in_sync":
            log.warning("mirror %r of queue %r fell out of sync (link lost or op refused)",
                        node, self.queue.name)
        self.nodes[node] = "failed"
        self.generation[node] = self.generation.get(node, 0) + 1
        if node in self.syncs:
            self.end_sync(node)
        if state == "in_sync":
            self.isr_dirty = True
        self.owner.wake()

    # ---- membership and sync ----
    def set_nodes(self, wanted: list[str], manual: bool) -> None:
        for node in [n for n in self.nodes if n not in wanted]:
            state = self.nodes.pop(node)
            log.info("queue %r in vhost %r: mirror on node %r (%s) dropped: not wanted by the "
                     "policy among the live nodes", self.queue.name, self.queue.vhost.name,
                     node, state)
            if state == "in_sync":
                self.isr_dirty = True
            self.generation[node] = self.generation.get(node, 0) + 1
            if node in self.syncs:
                self.end_sync(node)  # else its leaves would be remembered for ever
        for node in wanted:
            if self.nodes.get(node) == "failed" and \
                    self.owner.store.link_for(node, self.queue.vhost.name).failing:
                continue  # not reachable: synced once its link is up again
            if node not in self.nodes or (self.nodes[node] == "failed" and not manual):
                if manual:
                    self.start_unsynced(node)
                else:
                    self.start_sync(node)
        # the publisher's confirm of a transient message waits for the mirrors too (seam of
        # the publish path), as RabbitMQ's mirrored queues do
        self.queue.confirms_later = bool(self.nodes) or self.quorum
        # a manual mirror gets nothing until ``cluster sync-queue``
        self._manual = manual
        if self.isr_dirty or self.recorded != self.record_key():
            self.owner.wake()

    def start_unsynced(self, node: str) -> None:
        """ha-sync-mode manual (as RabbitMQ): the mirror starts empty and gets only what
        enters from now on; out of the in-sync set until ``cluster sync-queue``."""
        self.generation[node] = self.generation.get(node, 0) + 1
        self.nodes[node] = "manual"
        self.syncs.pop(node, None)
        self.sync_counts.pop(node, None)
        self.send(node, RESET, b"", self.done_for(node))

    def start_sync(self, node: str) -> None:
        """Ask the mirror what copy of this queue it has (``probing``: it gets no op
        meanwhile); a complete copy of this epoch catches up from itself
        (``mirror_sync.catch_up``), anything else syncs from nothing (``mirror_sync.full_sync``)."""
        generation = self.generation[node] = self.generation.get(node, 0) + 1
        self.syncs.pop(node, None)
        self.sync_counts.pop(node, None)
        if not self.owner.probe(self, node, generation):
            full_sync(self, node, generation)
            return
        self.nodes[node] = "probing"

    def probed(self, node: str, generation: int, answer: dict | None) -> None:
        """The mirror's answer: its copy's epoch, highest seq and whether it was complete."""
        if self.generation.get(node) != generation or self.nodes.get(node) != "probing":
            return
        try:
            usable = (answer is not None and int(answer["epoch"]) == self.epoch
                      and answer.get("complete") is True)
            top = int(answer["max_seq"]) if usable and answer is not None else 0
        except (KeyError, TypeError, ValueError):
            usable, top = False, 0
        if usable:
            catch_up(self, node, generation, top)
        else:
            full_sync(self, node, generation)

    def end_sync(self, node: str) -> None:
        self.syncs.pop(node, None)
        self.sync_counts.pop(node, None)
        self.progress_dirty = True
        if not self.syncs:
            self.gone.clear()

    def sync_request(self, action: str) -> int:
        """``cluster sync-queue`` ("sync": every mirror not in sync starts its sync) or
        ``cancel-sync-queue`` ("cancel": syncing mirrors stop, unsynchronised); how many.
        A quorum queue's ``add:NODE`` / ``delete:NODE`` change its member group."""
        verb, _, name = action.partition(":")
        if verb in ("add", "delete"):
            return self.change_member(verb, name)
        count = 0
        for node, state in list(self.nodes.items()):
            if action == "sync" and state in ("manual", "failed"):
                self.start_sync(node)
                count += 1
            elif action == "cancel" and state == "syncing":
                self.generation[node] = self.generation.get(node, 0) + 1
                self.end_sync(node)
                self.nodes[node] = "manual"  # keeps the live ops, out of the in-sync set
                count += 1
        self.owner.wake()
        return count

    def change_member(self, verb: str, name: str) -> int:
        """rabbitmq-queues add_member / delete_member: a new member syncs (from its own copy
        if it has one of this epoch) and counts for the majority once in sync; a removed one
        leaves the in-sync record before anything is confirmed without it. The leader
        itself is not removed (1 if the group changed, else 0)."""
        if not self.quorum or self.members is None:
            return 0
        me = self.owner.store.node.name
        if verb == "add" and name and name not in self.members:
            self.members.append(name)
        elif verb == "delete" and name in self.members and name != me:
            self.members.remove(name)
        else:
            return 0
        self._majority = None
        log.info("queue %r in vhost %r: member %r %s (members: %s)", self.queue.name,
                 self.queue.vhost.name, name, "added" if verb == "add" else "removed",
                 ", ".join(self.members))
        self.isr_dirty = True
        self.owner.reconcile()
        self.owner.wake()
        return 1

    def in_sync(self) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s == "in_sync")

    def record_key(self) -> tuple:
        return (tuple(sorted(self.nodes)), tuple(self.in_sync()))

    async def record(self, shutdown: bool = False) -> bool:
        """Write the in-sync set to etcd; release the confirms that waited for it (in
        doubt if this node is no longer the master of its epoch; kept waiting while etcd
        does not answer: the node fences itself if that lasts). False if etcd did not answer.
        ``shutdown``: this node stops cleanly (ha-promote-on-shutdown applies, not
        ha-promote-on-failure)."""
        key = self.record_key()
        waiters, self._isr_waiters = self._isr_waiters, []
        self.isr_dirty = False
        self.progress_dirty = False
        if not self.majority():
            # a quorum queue's in-sync record never shrinks below a majority of its group:
            # whoever it names has every confirmed message, as nothing is confirmed until a
            # majority is in sync again (the confirms keep waiting)
            self._isr_waiters[:0] = waiters
            self.recorded = key
            return True
        try:
            ok = await self.owner.store.node.set_in_sync(
                self.queue.vhost.name, self.queue.name, sorted(self.nodes), self.in_sync(),
                {n: s for n, s in self.nodes.items() if s != "in_sync"},
                sync={n: {"synced": c[0], "total": c[1]} for n, c in self.sync_counts.items()},
                shutdown=shutdown, members=self.members if self.quorum else None)
        except (CoordinationUnavailable, CoordinationError) as exc:
            log.warning("in-sync set of queue %r not recorded: %s", self.queue.name, exc)
            self._isr_waiters[:0] = waiters
            self.isr_dirty = True
            return False
        if ok:
            self.recorded = key
            queue = self.queue
            if self.inherited_top and queue.commit_seq is not None:
                # a majority of the group holds the whole log under this term, and the
                # record naming it is written: what was inherited is committed
                if self.inherited_top > queue.commit_seq:
                    queue.commit_seq = self.inherited_top
                    if queue.consumers:
                        queue.dispatch()
                self.inherited_top = 0
        else:
            self.isr_dirty = True
        for token in waiters:
            token(True if ok else None)
        return True

    def detach(self) -> None:
        if self in self.queue.observers:
            self.queue.observers.remove(self)
        waiters, self._isr_waiters = self._isr_waiters, []
        for token in waiters:
            token(None)
        self.nodes.clear()
        self.syncs.clear()
        self.sync_counts.clear()
        self.gone.clear()
        self._pending.clear()
        self.queue.confirms_later = False

