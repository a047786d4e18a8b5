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

import itertools
import logging
import os
import struct
from typing import TYPE_CHECKING, Any

import trio

from ..message import Message
from ..queues.ops import Op
from .copylog import CopyLog, copy_path, replay
from .etcd import CoordinationError, CoordinationUnavailable

if TYPE_CHECKING:
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.mirror")

MIRROR_HEADER = "x-triomq-mirror"
RESET = 0  # op code: start a copy of this epoch (empty)
SYNCED = 99  # op code: the snapshot is complete
LEAVES = 50  # op code: the entries of these seqs left the queue (the seqs: the route key)
ENQUEUES = 51  # op code: these messages entered the queue (body: ``pack_entries``)
LEFT = 52  # op code: the entries of these seqs left the queue (body: ``pack_seqs``)
# op code: a catch-up from the mirror's own copy starts (body: the highest seq the mirror
# has, then the seqs up to it the queue still holds: the others left while it was away)
KEEP = 53
# op code: these entries came back to the queue (nack/reject with requeue, a consumer
# gone): their delivery counts (body: ``pack_counts``), so that x-delivery-count and the
# delivery limit carry on across a failover (a quorum queue's)
RETURNED = 54
_REC = struct.Struct(">QHHII")
_SEQ = struct.Struct(">Q")
_COUNT = struct.Struct(">QI")
# An op is one message on the link: its body is cut in frames of the negotiated size, but
# each op stays well under the largest message a node takes, so a purge or an ack of
# tens of thousands of messages goes as several ops (the seqs once went in a header: one
# frame, which a purge of 30,001 messages made larger than the frame size).
_SEQS_PER_OP = 16384  # 128 KiB of seqs
_OP_BYTES = 8 << 20  # messages packed per op (one larger message goes alone)


def pack_seqs(seqs) -> bytes:
    return b"".join(_SEQ.pack(seq) for seq in seqs)


def unpack_seqs(data: bytes) -> list[int]:
    if len(data) % _SEQ.size:
        raise struct.error("truncated seqs")
    return [s for (s,) in _SEQ.iter_unpack(data)]


def pack_counts(counts: dict[int, int]) -> bytes:
    return b"".join(_COUNT.pack(seq, min(n, 0xFFFFFFFF)) for seq, n in counts.items())


def unpack_counts(data: bytes) -> list[tuple[int, int]]:
    if len(data) % _COUNT.size:
        raise struct.error("truncated counts")
    return list(_COUNT.iter_unpack(data))


def pack_copy(entries: dict) -> bytes:
    """A copy's entries (seq -> (exchange, routing key, raw properties, body)) packed as
    ``pack_entries`` packs queue entries."""
    parts = []
    for seq, (exchange, key, props, body) in entries.items():
        ex = exchange.encode("utf-8", "surrogateescape")
        rk = key.encode("utf-8", "surrogateescape")
        parts += [_REC.pack(seq, len(ex), len(rk), len(props), len(body)), ex, rk, props, body]
    return b"".join(parts)


def seq_chunks(seqs: list[int]) -> list[bytes]:
    """``seqs`` packed in ops of at most ``_SEQS_PER_OP``."""
    return [pack_seqs(seqs[i:i + _SEQS_PER_OP]) for i in range(0, len(seqs), _SEQS_PER_OP)]


def entry_chunks(entries) -> list[bytes]:
    """``entries`` packed in ops of about ``_OP_BYTES`` at most (at least one entry each)."""
    out: list[bytes] = []
    chunk: list = []
    size = 0
    for e in entries:
        n = len(e.message.body) + len(e.message.props_raw) + 600
        if chunk and size + n > _OP_BYTES:
            out.append(pack_entries(chunk))
            chunk, size = [], 0
        chunk.append(e)
        size += n
    if chunk:
        out.append(pack_entries(chunk))
    return out


def pack_entries(entries) -> bytes:
    """Entries as one body: per entry seq, exchange, routing key, raw properties, body."""
    parts = []
    for e in entries:
        m = e.message
        ex = m.exchange.encode("utf-8", "surrogateescape")
        rk = m.routing_key.encode("utf-8", "surrogateescape")
        parts += [_REC.pack(e.seq, len(ex), len(rk), len(m.props_raw), len(m.body)), ex, rk,
                  m.props_raw, m.body]
    return b"".join(parts)


def unpack_entries(data: bytes):
    """``pack_entries`` back: (seq, (exchange, routing key, raw properties, body))."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        seq, nx, nk, np_, nb = _REC.unpack_from(view, pos)
        pos += _REC.size
        ex = bytes(view[pos:pos + nx]).decode("utf-8", "surrogateescape")
        pos += nx
        rk = bytes(view[pos:pos + nk]).decode("utf-8", "surrogateescape")
        pos += nk
        props = bytes(view[pos:pos + np_])
        pos += np_
        body = bytes(view[pos:pos + nb])
        pos += nb
        yield seq, (ex, rk, props, body)
_SYNC_BATCH = 512  # messages per op while a new mirror synchronises
_PROMOTE_SLICE = 2000  # messages built per step when a copy becomes the queue


# which mirrors keep their slot under ha-mode exactly: in sync first, then those on their
# way, then the failed (they resync anyway), then new nodes
_KEEP = {"in_sync": 0, "syncing": 1, "probing": 1, "manual": 1, "failed": 2}


def wanted_mirrors(definition: dict, master: str, live: list[str],
                   current: dict[str, str] | None = None) -> list[str]:
    """The nodes that should mirror a queue mastered on ``master`` under the policy
    ``definition`` (ha-mode all | exactly | nodes), among the ``live`` nodes. ``current``:
    the mirrors now and their states; under ``exactly`` they keep their slots (an in-sync
    mirror is never evicted for a node that comes back), new nodes fill what is free in
    name order."""
    mode = definition.get("ha-mode")
    others = sorted(n for n in live if n != master)
    if mode == "all":
        return others
    if mode == "exactly":
        count = definition.get("ha-params")
        if not isinstance(count, int) or count < 1:
            return []
        states = current or {}
        others.sort(key=lambda n: (_KEEP.get(states.get(n, ""), 3), n))
        return sorted(others[:count - 1])
    if mode == "nodes":
        names = definition.get("ha-params")
        if not isinstance(names, list):
            return []
        return [n for n in others if n in {str(x) for x in names}]
    return []


def check_ha_nodes(policies, index: int, policy) -> None:
    """A policy's ``ha-mode: nodes`` list may name only members of the running cluster
    (refused naming ha-params). A node without a cluster takes any names, as RabbitMQ
    does (it never checks them: names of no node are ignored when mirrors are placed)."""
    from ..policies.validate import PolicyError
    definition = policy.definition
    if "ha-mode" in definition and policy.name not in _WARNED:
        _WARNED.add(policy.name)
        log.warning("policy %r: classic queue mirroring (ha-mode) is deprecated, as in "
                    "RabbitMQ 3.13 (removed in 4.0): declare quorum queues "
                    "(x-queue-type: quorum) instead (docs/cluster.md)", policy.name)
    if definition.get("ha-mode") != "nodes":
        return
    members = policies.broker.store.known_members()
    params = definition.get("ha-params")
    if members is None or not isinstance(params, list):
        return
    unknown = [n for n in params if isinstance(n, str) and n not in members]
    if unknown:
        raise PolicyError(f"ha-params: {', '.join(repr(n) for n in unknown)} "
                          f"{'is not a member' if len(unknown) == 1 else 'are not members'} "
                          f"of this cluster (members: {', '.join(sorted(members))})",
                          "ha-params")


_WARNED: set[str] = set()  # policies whose deprecation was logged (once per process)


def _register_check() -> None:
    from ..policies.validate import POLICY_CHECKS
    if check_ha_nodes not in POLICY_CHECKS:
        POLICY_CHECKS.append(check_ha_nodes)


_register_check()


def replica_group(queue) -> bool:
    """A queue the cluster replicates on a member group with majority confirms (its
    type's ``initial_group_size`` argument: quorum queues), not by ha-* policies."""
    return queue.queue_type.name == "quorum"


def _fsync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fsync(fd)


def _sync_dir(path: str) -> None:
    """fsync the directory of ``path`` (a rename into it is durable after this)."""
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class MirrorCopy:
    """A mirror node's copy of a queue: the messages in the queue, by seq."""

    __slots__ = ("commit", "counts", "durable", "entries", "epoch", "keep", "keep_max", "loaded",
                 "log", "master", "synced", "was_synced")

    def __init__(self, epoch: int, master: str, durable: bool = False):
        self.epoch = epoch
        self.durable = durable  # a quorum member's copy: fsynced before each confirm
        self.master = master
        # seq -> (exchange, routing key, raw properties, body), in the queue's order
        self.entries: dict[int, tuple[str, str, bytes, bytes]] = {}
        self.counts: dict[int, int] = {}  # seq -> deliveries returned (RETURNED), if any
        self.synced = False
        self.log: CopyLog | None = None  # on disk (copylog.py), when the store has a directory
        # read from disk at start: never promoted until caught up again (it may lack what
        # the master confirmed while this node was away)
        self.loaded = False
        self.was_synced = False  # a loaded copy was complete when written: it may catch up
        self.keep_max: int | None = None  # a catch-up runs: seqs up to this not kept leave
        self.keep: set[int] = set()
        # the leader's commit index as its ops said it (a quorum queue's): what a promoted
        # copy holds up to it is committed; what lies above is not known to be
        self.commit = 0


class _Sync:
    """One mirror's sync in progress, sent in batches by seq: each batch is read from the
    queue when it is sent (a paged queue is read back a batch at a time, never all at once:
    one step reading 50,000 messages kept a new leader from renewing its lease)."""

    __slots__ = ("cursor", "exhausted", "finished", "flying", "generation", "pos", "snapshot",
                 "top")

    def __init__(self, generation: int, cursor: int, top: int, snapshot: list | None):
        self.generation = generation
        self.cursor = cursor  # every entry with a seq up to it was sent (or had left)
        self.top = top  # the last seq when the sync began: later ones go as live ops
        # the ready entries in order, taken at the start, for a ready store that cannot be
        # read in steps (in memory: cheap); None: read from the queue at each batch
        self.snapshot = snapshot
        self.pos = 0
        self.flying = 0  # batches not confirmed yet (two at most)
        self.exhausted = False  # every batch was sent
        self.finished = False  # SYNCED sent


class Mirroring:
    """The master side of one queue: an observer of its operation stream."""

    def __init__(self, owner: Mirrors, queue, epoch: int):
        self.owner = owner
        self.queue = queue
        self.epoch = epoch
        self.outside: dict[int, Any] = {}  # seq -> entry delivered and not settled
        self.nodes: dict[str, str] = {}  # mirror node -> "syncing" | "in_sync" | "failed"
        self.generation: dict[str, int] = {}  # per node: failures of an older sync are void
        self.isr_dirty = True  # the in-sync set in etcd may be larger than the real one
        self._isr_waiters: list = []  # confirms that wait for the in-sync record
        self.recorded: tuple = ()
        self._manual = False
        self._leaves: list[int] = []  # seqs that left, sent together (Mirrors.flusher)
        self._enqueued: list = []  # entries that entered, sent together
        self._returns: dict[int, int] = {}  # seq -> delivery count of entries that came back
        self._tokens: dict[str, list] = {}  # in-sync node -> confirm tokens of _enqueued
        self._leave_tokens: dict[str, list] = {}  # in-sync node -> tx.commit tokens of _leaves
        self._syncs: dict[str, _Sync] = {}  # syncing node -> its sync
        self._gone: set[int] = set()  # seqs that left while a sync runs (not sent after)
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
        if self.members is None:
            return False
        me = self.owner.store.node.name
        have = 1 + sum(1 for n in self.members if n != me and self.nodes.get(n) == "in_sync")
        return have >= len(self.members) // 2 + 1

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
    def queue_op(self, queue, op: Op, entry) -> None:
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

    def _queue_op(self, queue, op: Op, entry) -> None:
        if self.deposed and op is Op.ENQUEUE:
            self.owner.store.forward_started()(None)  # in doubt: its connection is closed
        if op is Op.DELIVER:
            self.outside[entry.seq] = entry
        elif op is Op.REQUEUE or op.leaves:
            self.outside.pop(entry.seq, None)
            if self._syncs and op.leaves:
                self._gone.add(entry.seq)
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
        for node, state in self.nodes.items():
            if state == "in_sync":
                self._tokens.setdefault(node, []).append(self._token())

    def flush(self) -> None:
        """Send what the stream produced since the last flush: the new messages (their
        confirm tokens resolved by each in-sync mirror's answer), then the leaves."""
        enqueued, self._enqueued = self._enqueued, []
        leaves, self._leaves = self._leaves, []
        returns, self._returns = self._returns, {}
        tokens, self._tokens = self._tokens, {}
        leave_tokens, self._leave_tokens = self._leave_tokens, {}
        packed = entry_chunks(enqueued) if enqueued else []
        left = seq_chunks(leaves) if leaves else []
        for node, state in self.nodes.items():
            mine = tokens.get(node, [])
            if state == "failed":
                self._park(mine)
                self._park(leave_tokens.get(node, []))
                continue
            if state == "probing":
                continue  # its catch-up starts from a snapshot taken once it answered
            # a syncing or manual mirror gets the live ops too (it holds no confirm)
            if packed:
                self._send_all(node, ENQUEUES, packed,
                               self._batch_done(node, mine, enqueued[-1].seq))
            if returns:
                self._send(node, RETURNED, pack_counts(returns), self._done_for(node))
            if left:
                self._send_all(node, LEFT, left,
                               self._batch_done(node, leave_tokens.get(node, [])))
        for table in (tokens, leave_tokens):
            for node, mine in table.items():
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
        failed = self._done_for(node)

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

    def _send(self, node: str, op: int, body: bytes, done) -> None:
        link = self.owner.store.link_for(node, self.queue.vhost.name)
        # the third field: 1 for a quorum queue's op (the member fsyncs its copy); the fifth:
        # the leader's commit index (a promoted member knows what it holds is committed)
        extra = {MIRROR_HEADER: [self.epoch, op, 1 if self.quorum else 0,
                                 self.owner.store.node.name, self.queue.commit_seq or 0]}
        if not link.publish(self.queue.name, "", "", {}, body, done, extra):
            done(False)

    def _send_all(self, node: str, op: int, bodies: list[bytes], done) -> None:
        """One op in several link messages: ``done(True)`` once the mirror took every
        part, ``done(ok)`` at the first part it did not."""
        if len(bodies) == 1:
            self._send(node, op, bodies[0], done)
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
        for body in bodies:
            self._send(node, op, body, part)

    def _done_for(self, node: str):
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
        if node in self._syncs:
            self._end_sync(node)
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
            if node in self._syncs:
                self._end_sync(node)  # else its leaves would be remembered for ever
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
        self._syncs.pop(node, None)
        self.sync_counts.pop(node, None)
        self._send(node, RESET, b"", self._done_for(node))

    def start_sync(self, node: str) -> None:
        """Ask the mirror what copy of this queue it has (``probing``: it gets no op
        meanwhile); a complete copy of this epoch catches up from itself
        (``_catch_up``), anything else syncs from nothing (``_full_sync``)."""
        generation = self.generation[node] = self.generation.get(node, 0) + 1
        self._syncs.pop(node, None)
        self.sync_counts.pop(node, None)
        if not self.owner.probe(self, node, generation):
            self._full_sync(node, generation)
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
            self._catch_up(node, generation, top)
        else:
            self._full_sync(node, generation)

    def _held(self) -> tuple[list[int], dict[int, int]]:
        """The seqs the queue holds (ready and delivered-unsettled), in order, and the
        delivery counts of those that came back (a delivered one: so far), without reading
        a paged message back."""
        ready = self.queue.ready
        index = getattr(ready, "seq_counts", None)
        if index is not None:
            seqs, counts = index()
        else:
            seqs, counts = [], {}
            for e in ready:
                seqs.append(e.seq)
                if e.delivery_count:
                    counts[e.seq] = e.delivery_count
        for e in self.outside.values():
            seqs.append(e.seq)
            if e.delivery_count > 1:
                counts[e.seq] = e.delivery_count - 1
        seqs.sort()
        return seqs, counts

    def _snapshot(self) -> list | None:
        """None when the ready store is read a batch at a time (``entries_after``: a paged
        queue, in seq order), else its entries now (in memory: cheap)."""
        ready = self.queue.ready
        if hasattr(ready, "entries_after"):
            seqs = ready.seq_counts()[0]
            if all(a < b for a, b in itertools.pairwise(seqs)):
                return None
        return sorted(ready, key=lambda e: e.seq)

    def _catch_up(self, node: str, generation: int, top: int) -> None:
        """KEEP (the seqs up to ``top`` the queue still holds: the mirror drops the others,
        they left while it was away), then the messages after ``top`` in batches, then
        SYNCED. Sound because the copy is the queue as it was at one moment (ops apply in
        order, a copy on disk is complete) and seqs only grow: what the queue holds up to
        ``top`` was in the queue then, so the copy has it."""
        self.nodes[node] = "syncing"
        seqs, counts = self._held()
        keep = [seq for seq in seqs if seq <= top]
        head = _SEQ.pack(top)
        bodies = [head + chunk for chunk in seq_chunks(keep)] or [head]
        fail = self._done_for(node)
        self._send_all(node, KEEP, bodies, fail)
        counts = {seq: n for seq, n in counts.items() if seq <= top}
        if self.quorum and counts:  # returns made while it was away
            self._send(node, RETURNED, pack_counts(counts), fail)
        missing = len(seqs) - len(keep)
        sync = _Sync(generation, top, self.queue._next_seq - 1, self._snapshot())
        self._syncs[node] = sync
        self.sync_counts[node] = [0, missing]
        self.progress_dirty = True
        log.info("queue %r: mirror %r catches up from its own copy (%d messages kept, %d to "
                 "send)", self.queue.name, node, len(keep), missing)
        self._sync_next(node)

    def _full_sync(self, node: str, generation: int) -> None:
        """RESET, then the queue's messages in batches of ``ha-sync-batch-size`` (at most
        two batches unconfirmed, so the queue and the link keep serving meanwhile), then
        SYNCED: once that is confirmed the mirror joins the in-sync set. The live ops go
        to it meanwhile; a message that leaves before its batch is sent is skipped."""
        self.nodes[node] = "syncing"
        self._send(node, RESET, b"", self._done_for(node))
        self._syncs[node] = _Sync(generation, 0, self.queue._next_seq - 1, self._snapshot())
        self.sync_counts[node] = [0, len(self.queue.ready) + len(self.outside)]
        self.progress_dirty = True
        self._sync_next(node)

    def _sync_batch_size(self) -> int:
        size = (self.queue.effective_policy_definition or {}).get("ha-sync-batch-size")
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 \
            else _SYNC_BATCH

    def _next_batch(self, sync: _Sync, size: int) -> list:
        """The next entries of a sync: up to ``size`` ready ones after its cursor, and the
        delivered-unsettled ones in the same range of seqs. Each live entry is in one of the
        two when its range is read; one that left before is not needed (its LEFT went
        live), one that comes later goes live."""
        top = sync.top
        if sync.snapshot is None:
            got = self.queue.ready.entries_after(sync.cursor, size)
            if len(got) < size or got[-1].seq >= top:
                sync.exhausted = True
            got = [e for e in got if e.seq <= top]
        else:
            low = sync.cursor
            got = [e for e in sync.snapshot[sync.pos:sync.pos + size]
                   if e.seq > low and e.seq not in self._gone]
            sync.pos += size
            sync.exhausted = sync.pos >= len(sync.snapshot)
        low = sync.cursor
        high = top if sync.exhausted else got[-1].seq if got else low
        batch = {e.seq: e for e in got}
        for e in self.outside.values():
            if low < e.seq <= high:
                batch[e.seq] = e
        sync.cursor = high
        return [batch[seq] for seq in sorted(batch)]

    def _sync_next(self, node: str) -> None:
        sync = self._syncs.get(node)
        if sync is None or sync.finished:
            return
        generation = sync.generation
        size = self._sync_batch_size()
        fail = self._done_for(node)
        while sync.flying < 2 and not sync.exhausted:
            batch = self._next_batch(sync, size)
            if not batch:
                continue
            sync.flying += 1
            self._send_all(node, ENQUEUES, entry_chunks(batch),
                           self._sync_batch_done(node, generation, len(batch), fail))
            if self.quorum:  # the delivery counts of what it sent (a delivered one: so far)
                counts = {e.seq: e.delivery_count - (e.seq in self.outside) for e in batch}
                counts = {seq: n for seq, n in counts.items() if n > 0}
                if counts:
                    self._send(node, RETURNED, pack_counts(counts), fail)
        if not sync.exhausted or sync.flying:
            return
        sync.finished = True  # every batch confirmed: SYNCED, once
        top = sync.top

        def synced(ok: bool | None) -> None:
            if self.generation.get(node) != generation or self.nodes.get(node) != "syncing":
                return
            self._end_sync(node)
            if ok:
                self.nodes[node] = "in_sync"
                if top > self.acked.get(node, 0):
                    self.acked[node] = top
                self.owner.wake()
            else:
                fail(False)
        self._send(node, SYNCED, b"", synced)

    def _sync_batch_done(self, node: str, generation: int, count: int, fail):
        def done(ok: bool | None) -> None:
            sync = self._syncs.get(node)
            if sync is None or sync.generation != generation:
                return  # cancelled, or an older sync
            if not ok:
                self._end_sync(node)
                fail(ok)
                return
            sync.flying -= 1
            counts = self.sync_counts.get(node)
            if counts is not None:
                counts[0] += count
                self.progress_dirty = True
            self._sync_next(node)
        return done

    def _end_sync(self, node: str) -> None:
        self._syncs.pop(node, None)
        self.sync_counts.pop(node, None)
        self.progress_dirty = True
        if not self._syncs:
            self._gone.clear()

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
                self._end_sync(node)
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
        self._syncs.clear()
        self.sync_counts.clear()
        self._gone.clear()
        self._pending.clear()
        self.queue.confirms_later = False


class _Promoted:
    """Sets the flags of a promoted copy's entries as they enter the queue (before a paged
    ready list writes them out: setting them afterwards would read every one back): each
    may have been delivered by the old leader (RabbitMQ's redelivered flag), and the count
    of those that came back carries on (x-delivery-count, the delivery limit)."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}  # id of the message -> its deliveries returned

    def queue_op(self, queue, op: Op, entry) -> None:
        if op is Op.ENQUEUE:
            entry.redelivered = True
            count = self.counts.pop(id(entry.message), 0)
            if count:
                from ..queues.retry import restore_delivery_count
                restore_delivery_count(queue, entry, count)


class Mirrors:
    """Both roles of this node: master of some queues (``Mirroring``), mirror of others
    (``MirrorCopy``); ``run()`` in the cluster store's nursery reconciles and promotes."""

    def __init__(self, store: ClusterStore):
        self.store = store
        self.masters: dict[tuple[str, str], Mirroring] = {}
        self.copies: dict[tuple[str, str], MirrorCopy] = {}
        self._wake = trio.Event()
        self.promotions = 0
        self._to_flush: list[Mirroring] = []
        self._flush_wake = trio.Event()
        self._directory: str | None = None  # where copies are kept on disk (copylog.py)
        # quorum member copies written since their last fsync, and the link confirms that
        # wait for it: one fsync per file for every op that arrived meanwhile (group
        # commit), in a thread, then the confirms (``decided``, ``syncer``)
        self._unsynced: dict[str, CopyLog] = {}
        self._sync_waiting: list = []
        self._sync_wake = trio.Event()
        self.caught_up = 0  # syncs that started from the mirror's own copy (tests, status)
        # a promoted queue: (vhost, queue) -> the seq up to which its entries are known to be
        # committed (the old leader's commit index its ops carried), for its ``Mirroring``
        self.inherited: dict[tuple[str, str], int] = {}

    # ---- copies on disk ----
    def directory(self) -> str | None:
        if self._directory is None:
            path = self.store.sidecar_path("mirror-copies")
            if path is None:
                return None
            os.makedirs(path, exist_ok=True)
            self._directory = path
        return self._directory

    def _new_log(self, vhost: str, queue: str, copy: MirrorCopy) -> None:
        directory = self.directory()
        if directory is None:
            return
        try:
            copy.log = CopyLog.create(copy_path(directory, vhost, queue), {
                "vhost": vhost, "queue": queue, "epoch": copy.epoch, "master": copy.master},
                durable=copy.durable)
        except OSError as exc:
            log.warning("copy of queue %r not kept on disk: %s", queue, exc)
            copy.log = None

    def _write(self, vhost: str, queue: str, copy: MirrorCopy, kind: bytes,
               payload: bytes) -> None:
        if copy.log is None:
            return
        try:
            copy.log.append(kind, payload)
            if copy.durable:
                self._unsynced[copy.log.path] = copy.log
            if copy.log.wants_compaction():
                self._rewrite(vhost, queue, copy)
        except OSError as exc:  # the copy stays good in memory; a restart resyncs it
            log.warning("copy of queue %r not kept on disk: %s", queue, exc)
            copy.log.remove()
            copy.log = None

    def _rewrite(self, vhost: str, queue: str, copy: MirrorCopy) -> None:
        """The file rewritten from the copy (compaction, and the end of a catch-up)."""
        if copy.log is None:
            return
        path = copy.log.path
        copy.log.close()
        tmp = CopyLog.create(path + ".tmp", {"vhost": vhost, "queue": queue,
                                             "epoch": copy.epoch, "master": copy.master})
        body = pack_copy(copy.entries)
        tmp.append(b"E", body)
        copy.counts = {seq: n for seq, n in copy.counts.items() if seq in copy.entries}
        if copy.counts:
            tmp.append(b"C", pack_counts(copy.counts))
        if copy.synced:
            tmp.append(b"S", b"")
        if copy.durable:
            tmp.sync()
        size = tmp.size
        tmp.close()
        os.replace(path + ".tmp", path)
        if copy.durable:
            _sync_dir(path)
        copy.log = CopyLog(path, size, durable=copy.durable)
        copy.log.live = len(body)

    def _forget(self, key: tuple[str, str]) -> None:
        copy = self.copies.pop(key, None)
        if copy is not None and copy.log is not None:
            copy.log.remove()
            copy.log = None

    def load(self) -> None:
        """The copies kept on disk (``ClusterStore.recover``, after the proxies exist): a
        copy of a queue that is a proxy here is kept to catch up from; any other is
        dropped (the queue is gone, or mastered here now)."""
        directory = self.directory()
        broker = self.store.broker
        if directory is None or broker is None:
            return
        from .forward import ProxyQueue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not name.endswith(".copy"):
                if name.endswith(".tmp"):
                    os.unlink(path)
                continue
            got = replay(path)
            header = got[0] if got is not None else {}
            vhost = broker.vhosts.get(header.get("vhost"))
            queue = header.get("queue")
            if got is None or vhost is None or not isinstance(vhost.queues.get(queue),
                                                               ProxyQueue):
                os.unlink(path)
                continue
            _header, records, size = got
            copy = MirrorCopy(int(header.get("epoch", 0)), str(header.get("master", "")),
                              durable=self._quorum(vhost.name, str(queue)))
            try:
                for kind, payload in records:
                    if kind == b"E":
                        copy.entries.update(unpack_entries(payload))
                    elif kind == b"L":
                        for seq in unpack_seqs(payload):
                            copy.entries.pop(seq, None)
                            copy.counts.pop(seq, None)
                    elif kind == b"C":
                        copy.counts.update(unpack_counts(payload))
                    elif kind == b"S":
                        copy.was_synced = True
                    elif kind == b"U":
                        copy.was_synced = False
            except (struct.error, UnicodeError):
                os.unlink(path)
                continue
            copy.loaded = True
            copy.log = CopyLog(path, size, durable=copy.durable)
            copy.log.live = sum(len(e[2]) + len(e[3]) for e in copy.entries.values())
            self.copies[(vhost.name, str(queue))] = copy
            log.info("queue %r in vhost %r: copy of epoch %d read from disk (%d messages, %s)",
                     queue, vhost.name, copy.epoch, len(copy.entries),
                     "complete" if copy.was_synced else "incomplete")

    def _quorum(self, vhost: str, queue: str) -> bool:
        broker = self.store.broker
        v = broker.vhosts.get(vhost) if broker is not None else None
        q = v.queues.get(queue) if v is not None else None
        return q is not None and replica_group(q)

    def copy_info(self, vhost: str, queue: str) -> dict | None:
        """What a master's probe is told of this node's copy of a queue."""
        copy = self.copies.get((vhost, queue))
        if copy is None:
            return None
        return {"epoch": copy.epoch, "max_seq": max(copy.entries, default=0),
                "complete": (copy.synced or copy.was_synced) and copy.keep_max is None}

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

    # ---- mirror role: ops from a master's link (forward.forwarded_publish) ----
    def apply(self, vhost: str, queue: str, header: list, routing_key: str = "",
              body: bytes = b"") -> bool:
        """Apply one op; False (nacked) when it is not of this copy's epoch."""
        try:
            epoch, op, master = int(header[0]), int(header[1]), header[3]
            durable = header[2] == 1  # a quorum queue's op: the copy is fsynced
        except (TypeError, ValueError, IndexError):
            return False
        if isinstance(master, bytes):
            master = master.decode()
        key = (vhost, queue)
        copy = self.copies.get(key)
        if op == RESET:
            if copy is not None and copy.epoch > epoch:
                return False  # a deposed master
            if copy is not None and copy.log is not None:
                copy.log.remove()
            # the flag, or this node's proxy of the queue (from a node that sends 0)
            copy = self.copies[key] = MirrorCopy(epoch, str(master),
                                                 durable=durable or self._quorum(vhost, queue))
            self._new_log(vhost, queue, copy)
            return True
        if copy is None or copy.epoch != epoch:
            return False
        if len(header) > 4:
            try:
                commit = int(header[4])
            except (TypeError, ValueError):
                return False
            if commit > copy.commit:
                copy.commit = commit
        if op == LEFT:
            entries = copy.entries
            try:
                seqs = unpack_seqs(body)
            except struct.error:
                return False
            gone = 0
            for seq in seqs:
                copy.counts.pop(seq, None)
                e = entries.pop(seq, None)
                if e is not None:
                    gone += len(e[2]) + len(e[3])
            if copy.log is not None:
                copy.log.live -= gone
            self._write(vhost, queue, copy, b"L", body)
        elif op == RETURNED:
            try:
                counts = unpack_counts(body)
            except struct.error:
                return False
            for seq, n in counts:
                if seq in copy.entries:
                    copy.counts[seq] = n
            self._write(vhost, queue, copy, b"C", body)
        elif op == LEAVES:  # from a node of an earlier version: the seqs in the route key
            entries = copy.entries
            try:
                seqs = [int(text) for text in routing_key.split(",")]
            except ValueError:
                return False
            for seq in seqs:
                entries.pop(seq, None)
            self._write(vhost, queue, copy, b"L", pack_seqs(seqs))
        elif op == SYNCED:
            copy.synced = True
            if copy.keep_max is not None:  # the end of a catch-up: what left meanwhile goes
                top, keep = copy.keep_max, copy.keep
                for seq in [s for s in copy.entries if s <= top and s not in keep]:
                    del copy.entries[seq]
                    copy.counts.pop(seq, None)
                copy.keep_max, copy.keep = None, set()
                copy.loaded = False
                try:
                    self._rewrite(vhost, queue, copy)
                except OSError as exc:
                    log.warning("copy of queue %r not kept on disk: %s", queue, exc)
                    if copy.log is not None:
                        copy.log.remove()
                    copy.log = None
            else:
                copy.loaded = False
                self._write(vhost, queue, copy, b"S", b"")
        elif op == KEEP:
            try:
                top = _SEQ.unpack_from(body)[0]
                seqs = unpack_seqs(body[_SEQ.size:])
            except struct.error:
                return False
            if copy.keep_max is None:
                copy.keep_max = top
                copy.synced = False
                self._write(vhost, queue, copy, b"U", b"")  # not complete until SYNCED
            copy.keep.update(seqs)
        elif op == ENQUEUES:
            try:
                copy.entries.update(unpack_entries(body))
            except (struct.error, UnicodeError):
                return False
            if copy.log is not None:
                copy.log.live += len(body)
            self._write(vhost, queue, copy, b"E", body)
        else:
            return False
        return True

    def sync_request(self, vhost: str, queue: str, action: str) -> None:
        """A ``cluster sync-queue`` / ``cancel-sync-queue`` request seen in etcd."""
        mirroring = self.masters.get((vhost, queue))
        if mirroring is not None:
            n = mirroring.sync_request(action)
            log.info("queue %r in vhost %r: %s requested (%d mirrors)", queue, vhost,
                     "sync" if action == "sync" else "cancel-sync", n)

    def drop_copy(self, vhost: str, queue: str) -> None:
        self._forget((vhost, queue))

    # ---- both roles, in the background ----
    def decided(self, channel, seq: int, ok: bool) -> None:
        """The link's confirm of an applied op: at once, unless a quorum member's copy
        was written since its last fsync (then once the syncer fsynced it)."""
        if ok and self._unsynced:
            self._sync_waiting.append((channel, seq))
            self._sync_wake.set()
            return
        channel.confirm_decided(seq, ok)

    async def syncer(self) -> None:
        """fsync the quorum copies written meanwhile (duplicated descriptors: a copy
        replaced or dropped during the fsync keeps its file open until it is done), then
        confirm what waited for them; a failed fsync nacks them."""
        while True:
            await self._sync_wake.wait()
            self._sync_wake = trio.Event()
            logs, self._unsynced = list(self._unsynced.values()), {}
            waiting, self._sync_waiting = self._sync_waiting, []
            ok = True
            fds = []
            try:
                fds = [log_.dup() for log_ in logs if not log_.closed]
                await trio.to_thread.run_sync(_fsync_all, fds)
            except OSError as exc:
                log.warning("quorum copies not synced to disk: %s", exc)
                ok = False
            finally:
                for fd in fds:
                    os.close(fd)
            for channel, seq in waiting:
                channel.confirm_decided(seq, ok, external=True)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.syncer)
            await self._run()

    async def _run(self) -> None:
        while True:
            # woken by what matters (a master key gone, a node up or down, a mirror that
            # failed or synced); the timeout catches policy changes
            # (every 0.5 s while a sync runs: its progress goes to etcd, for ``status``)
            syncing = any(m._syncs for m in self.masters.values())
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

    async def promote(self, vhost, proxy, copy: MirrorCopy, epoch: int) -> None:
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
        vhost.delete_queue(proxy, reason="promoted to master here")
        if replica_group(q):
            self.inherited[(vhost.name, name)] = committed
        vhost.add_queue(q, persist=False)  # stored above
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


