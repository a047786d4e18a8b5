"""A classic queue: ready messages, consumers, delivery and settlement.

Everything here is synchronous and runs on the event loop's thread: a publish
enqueues and dispatches to consumers in the same call, so the hot path has no
task per message. Features (TTL, dead-lettering, priority, max-length) live in
their own modules; this class wires them in.
"""
from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar, Literal, cast

from .. import errors
from . import max_length, ttl
from .args import QueueOptions
from .consumer import Consumer as Consumer  # re-exported: callers import it from here
from .dead_letter import dead_letter, dead_letter_confirmed
from .dedup import make_queue_dedup
from .entry import QueueEntry
from .fifo import FifoReady
from .flow import FlowQueue
from .group import group_of
from .message_groups import message_groups_of
from .ops import PAGES_MESSAGES, ObserverList, Op
from .policy import PolicyQueue, make_retry
from .priority import PriorityReady, message_priority
from .selective import dispatch_selective
from .stored import StoredQueue
from .types import queue_type_of

if TYPE_CHECKING:

    from ..exchanges.base import BindingKey
    from ..message import Message
    from ..timers import TimerHandle
    from ..vhost import VirtualHost
    from .consumer import AdmittedChannel
    from .flow import FlowWaiter
    from .ready import ReadyStore
    from .stored import Durability

_ENQUEUE, _DELIVER, _REQUEUE, _SETTLE = Op.ENQUEUE, Op.DELIVER, Op.REQUEUE, Op.SETTLE


class Queue(FlowQueue, PolicyQueue, StoredQueue):
    kind: ClassVar[Literal["queue"]] = "queue"
    # A broker-internal queue (the scheduler's) is invisible to clients, as RabbitMQ's
    # internal entities are: 404 to every operation, never routed to by name.
    internal = False
    # A queue whose publisher confirms wait for another node (the cluster's proxy of a
    # queue mastered elsewhere), persistent message or not.
    confirms_later = False
    # A queue with its own durability (a stream's log): an object whose
    # ``when_durable(callback, on_failure)`` publisher confirms wait for instead of the store's.
    durability: Durability | None = None
    # Messages with a higher seq are held from consumers and basic.get (a replicated quorum
    # queue's leader: not yet on a majority, so a failover could lose them); None: no hold.
    commit_seq: int | None = None

    def __init__(self, vhost: VirtualHost, name: str, durable: bool = False,
                 exclusive_owner: object | None = None,
                 auto_delete: bool = False, arguments: dict[str, Any] | None = None,
                 opts: QueueOptions | None = None):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        # classic, quorum (queues/types.py): its capabilities shape the options it runs with
        self.queue_type = queue_type_of(self.arguments)
        self._base_opts = opts or QueueOptions()  # from the arguments alone; a policy combines
        self.opts = self.queue_type.effective(self._base_opts)
        # The policy in force (broker/policies): names and the merged definition, for
        # the management API; None / {} without one.
        self.policy: str | None = None
        self.operator_policy: str | None = None
        self.effective_policy_definition: dict[str, Any] = {}
        # Retry-with-backoff policy (queues/retry.py) when x-retry-delays/x-delivery-limit are set.
        self.retry = make_retry(self)
        self.dedup = make_queue_dedup(self)  # x-message-deduplication (queues/dedup.py)
        # Follow the operation stream (queues/ops.py): the store of a durable queue, tests.
        self.observers = ObserverList()
        # The audit trail's context while it follows this queue (broker/audit), and the id
        # of the last message this queue refused (overflow, duplicate): the trail reads it.
        self.audit_ctx: tuple[str, str] | None = None
        self.refused_id = 0
        # Why the entries of the leaving ops being emitted by ``discard`` leave ("rejected",
        # "expired", "maxlen", "delivery_limit"), else None: observers may read it (ops.py).
        self.leave_reason: str | None = None
        self.ready = self._new_ready()
        self.ready_bytes = 0
        self.unacked_count = 0
        self.unacked_bytes = 0  # bodies delivered and not yet settled (Prometheus, the API)
        self.consumers: list[Consumer] = []  # registration order
        self._selective = 0  # consumers with an x-filter: dispatch then looks past the head
        self._groups: list[tuple[int, deque[Consumer]]] = []  # (priority, consumers) highest first
        self._next_seq = 1
        # (exchange name, binding key) pointing here
        self.bindings: set[tuple[str, BindingKey]] = set()
        self.deleted = False
        self._had_consumer = False
        self._expiry = ttl.ExpiryTimer(self)
        self._expires_handle: TimerHandle | None = None
        self.stats_published = 0
        self.stats_delivered = 0
        self.stats_acked = 0
        # (stats_delivered counts every delivery and get; these split it as RabbitMQ does)
        self.stats_deliver_no_ack = self.stats_get = self.stats_get_no_ack = 0
        self.stats_get_empty = self.stats_redeliver = 0
        # set by attach_store for durable queues with a persistent store (persistence/base.py's
        # MessageStore, which the core may not import)
        self.store: Any = None
        self.flow_waiters: set[FlowWaiter] | None = None  # sessions in flow because of this queue
        # x-consumer-group: a partition whose active consumer the group chooses (group.py)
        self.group = group_of(self)
        # x-message-groups: JMSXGroupID groups, one consumer each (message_groups.py); the
        # queue then dispatches through its selective path
        self.message_groups = message_groups_of(self.opts)
        if self.message_groups is not None:
            self._selective += 1
        self._flow_low = 0
        self._flow_low_bytes: float = math.inf
        # no consumer could take at the last dispatch: enqueue only appends until the next one
        # (every credit return dispatches: ack, requeue, window, link credit, drained output)
        self._no_credit = False
        self.touch()

    def _new_ready(self) -> ReadyStore:
        """The ready-message store (``ready.ReadyStore``) this queue starts with.

        Queue variants override it. ``self.opts`` and ``self.retry`` are set when
        it is called; an ordered retry policy wraps the store it is given.
        """
        opts = self.opts
        ready: ReadyStore = (PriorityReady(opts.max_priority, opts.two_level_priority)
                             if opts.max_priority else FifoReady())
        if self.dedup is not None:
            ready = self.dedup.unpaged(ready)
        if self.retry is not None:
            ready = self.retry.wrap_ready(ready)
        return ready

    @property
    def keeps_definition(self) -> bool:
        """Whether a persistent store keeps this queue (exclusive queues die with their
        connection, so they are never stored, as in RabbitMQ)."""
        return self.durable and self.exclusive_owner is None

    def attach_store(self, store: Any) -> None:
        """Make ``store`` the persistence of this (durable) queue and its observer.

        A store declaring the ``PAGES_MESSAGES`` capability offers
        ``paged_ready(queue, entries)``; a plain FIFO or priority queue then hands
        its entries over to that paged ready store.
        """
        self.store = store
        if store not in self.observers:
            self.observers.append(store)
        if PAGES_MESSAGES in store.capabilities and type(self.ready) in (FifoReady, PriorityReady):
            self.ready = store.paged_ready(self, self.ready.clear())

    def _emit(self, op: Op, entry: QueueEntry) -> None:
        for observer in self.observers:
            observer.queue_op(self, op, entry)

    # ---- info ----
    @property
    def message_count(self) -> int:
        ready = self.ready
        return len(ready) + ready.stored_behind

    def type_info(self) -> dict[str, Any]:
        """What the management API lists beside the common queue fields (a type's own)."""
        return {}

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def in_use(self) -> bool:
        return bool(self.consumers)

    # ---- publishing ----
    def enqueue(self, message: Message, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        """Add a message; False if refused by x-overflow=reject-publish(-dlx).

        ``reported``: a client's publish, which its session reports to the audit trail
        (``ops.ObserverList``). A refused message's id is kept in ``refused_id``."""
        opts = self.opts
        size = len(message.body)
        if (opts.max_length is not None or opts.max_length_bytes is not None) \
                and opts.overflow != "drop-head" and max_length.would_overflow(self, size):
            self.refused_id = message.id
            if opts.overflow == "reject-publish-dlx":
                dead_letter(self, [QueueEntry(message, 0)], "maxlen")
            return False
        if self.dedup is not None and not self.dedup.admit(message, entry):
            self.refused_id = message.id
            return True  # a duplicate is dropped, its publisher confirmed
        if entry is None:
            seq = self._next_seq
            self._next_seq = seq + 1
            expires_at = None
            if opts.message_ttl is not None or "expiration" in message.properties:
                expires_at = ttl.deadline(opts.message_ttl, message.properties,
                                          self.vhost.timers.now())
            entry = QueueEntry(message, seq, expires_at,
                               message_priority(message.properties, opts.max_priority,
                                                opts.two_level_priority)
                               if opts.max_priority else 0)
            observers = self.observers.unreported if reported else self.observers
            if observers:
                for observer in observers:
                    observer.queue_op(self, _ENQUEUE, entry)
        else:
            if entry.seq >= self._next_seq:
                self._next_seq = entry.seq + 1
        self.stats_published += 1
        ready = self.ready
        dispatch = self.consumers and not self._no_credit
        if (dispatch and not ready and not ready.stored_behind and entry.expires_at is None
                and self.commit_seq is None and not self._selective):
            # append + dispatch with nothing else ready, minus the ready list's round trip
            consumer = self._pick_consumer()
            if consumer is not None:
                self.deliver_to(consumer, entry)
                if self.flow_waiters:
                    self.flow_check()
                return True
            self._no_credit = True
            dispatch = False
        ready.append(entry)
        self.ready_bytes += size
        if dispatch:
            self.dispatch()
        if opts.max_length is not None or opts.max_length_bytes is not None:
            dropped = max_length.drop_head(self)
            if dropped:
                self.discard(dropped, "maxlen")
        if entry.expires_at is not None and len(self.ready):
            self._expiry.arm()
        return True

    # ---- delivery ----
    def dispatch(self) -> None:
        self._no_credit = False
        ready = self.ready
        if not ready or not self.consumers:
            return
        if self._selective:
            self._dispatch_selective()
            return
        now = None
        expired = None
        commit = self.commit_seq
        while ready:
            if commit is not None and cast("QueueEntry", ready.peek()).seq > commit:
                break
            consumer = self._pick_consumer()
            if consumer is None:
                self._no_credit = True
                break
            entry = ready.popleft()
            self.ready_bytes -= len(entry.message.body)
            if entry.expires_at is not None:
                if now is None:
                    now = self.vhost.timers.now()
                if entry.expires_at < now:
                    if expired is None:
                        expired = []
                    expired.append(entry)
                    continue
            self.deliver_to(consumer, entry)
        if expired:
            self.discard(expired, "expired")
        if self._expiry.at is not None or (now is not None and ready):
            self._expiry.arm()
        if self.flow_waiters:
            self.flow_check()

    def deliver_to(self, consumer: Consumer, entry: QueueEntry) -> None:
        """Hand ``entry``, taken from the ready list, to ``consumer`` (counted, settled at
        once for a no-ack consumer)."""
        self._mark_delivered(entry)
        if not consumer.no_ack:
            consumer.unacked += 1
            self.unacked_count += 1
            self.unacked_bytes += len(entry.message.body)
        consumer.channel.deliver(consumer, self, entry)
        protocol = consumer.channel.metrics_protocol
        if protocol is not None and protocol != "amqp091":  # (amqp091: the rest)
            self.vhost.churn.delivered(protocol, self, consumer.no_ack, entry.redelivered)
        if consumer.no_ack:
            self.stats_deliver_no_ack += 1
            self.settled(entry)

    def _dispatch_selective(self) -> None:
        dispatch_selective(self)

    def _mark_delivered(self, entry: QueueEntry) -> None:
        entry.delivery_count += 1
        self.stats_delivered += 1
        if entry.redelivered:
            self.stats_redeliver += 1
        if self.observers.unreported:  # a store notes it: a crash brings it back redelivered
            for observer in self.observers.unreported:
                observer.queue_op(self, _DELIVER, entry)

    def _pick_consumer(self) -> Consumer | None:
        consumers = self.consumers
        if self.group is not None:
            return self.group.active(self)
        if len(consumers) == 1 or self.opts.single_active_consumer:
            c = consumers[0]
            return c if c.can_take() else None
        for _prio, group in self._groups:
            for _ in range(len(group)):
                c = group[0]
                group.rotate(-1)
                if c.can_take():
                    return c
                if c.prefetch and c.unacked >= c.prefetch and not c.no_ack:
                    group.pop()  # the rotation just put it last
                    c.parked = True
        return None

    def credit_changed(self, consumer: Consumer) -> None:
        """``consumer`` may take deliveries again (an ack, a requeue, a raised prefetch):
        back into the rotation, last, if it was parked at its limit."""
        if consumer.parked and (not consumer.prefetch or consumer.unacked < consumer.prefetch):
            consumer.parked = False
            self._group(consumer.priority).append(consumer)

    def _group(self, priority: int) -> deque[Consumer]:
        for prio, group in self._groups:
            if prio == priority:
                return group
        group = deque()
        self._groups.append((priority, group))
        self._groups.sort(key=lambda g: -g[0])
        return group

    def get(self) -> QueueEntry | None:
        """basic.get: the next live entry, or None."""
        self.touch()
        now = self.vhost.timers.now()
        expired = []
        result = None
        commit = self.commit_seq
        while self.ready:
            if commit is not None and cast("QueueEntry", self.ready.peek()).seq > commit:
                break
            entry = self.ready.popleft()
            self.ready_bytes -= len(entry.message.body)
            if ttl.is_expired(entry, now):
                expired.append(entry)
                continue
            self._mark_delivered(entry)
            result = entry
            break
        if expired:
            self.discard(expired, "expired")
        self._expiry.arm()
        return result

    # ---- settlement (called by channels) ----
    def ack(self, entry: QueueEntry, consumer: Consumer | None, reported: bool = False) -> None:
        """``reported``: the client's session reports the ack to the audit trail."""
        self.stats_acked += 1
        self._unacked_done(consumer)
        self._unacked_bytes_done(entry)
        if consumer is not None:
            protocol = consumer.channel.metrics_protocol
            if protocol is not None and protocol != "amqp091":
                self.vhost.churn.acked(protocol, self)
        self.settled(entry, reported)

    def refuse_negative(self) -> None:
        """basic.nack / basic.reject of one of its deliveries: a type may refuse them."""

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """Rejected without requeue: dead-letter (reason 'rejected') or drop."""
        self._unacked_done(consumer)
        self._unacked_bytes_done(entry)
        if self.retry is not None and self.retry.on_rejected(entry, requeue=False):
            return
        self.discard([entry], "rejected")

    def requeue(self, entries: list[tuple[QueueEntry, Consumer | None]]) -> None:
        """Return unacked messages to their original positions, marked redelivered."""
        for entry, consumer in entries:
            self._unacked_done(consumer)
            self._unacked_bytes_done(entry)
            if self.deleted:
                self._left(entry, Op.DELETE)
                continue
            if self.retry is not None and self.retry.on_rejected(entry, requeue=True):
                continue
            entry.redelivered = True
            self.put_back(entry)
        if not self.deleted:
            self.dispatch()
            self._expiry.arm()

    def _unacked_bytes_done(self, entry: QueueEntry) -> None:
        # floored: a settlement the count never saw (see _unacked_done) must not go below 0
        # .size: a paged-out delivery's message (the journal's) knows it without its body
        self.unacked_bytes = max(0, self.unacked_bytes - entry.message.size)

    def _unacked_done(self, consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked -= 1
            self.unacked_count -= 1
            if consumer.parked:
                self.credit_changed(consumer)
        elif self.unacked_count:
            self.unacked_count -= 1

    def put_back(self, entry: QueueEntry) -> None:
        """Return a delivered entry to the ready list at its place (emits REQUEUE).

        The caller dispatches afterwards if it wants the entry delivered again.
        """
        self.ready.requeue(entry)
        self.ready_bytes += len(entry.message.body)
        if self.observers:
            self._emit(_REQUEUE, entry)

    def settled(self, entry: QueueEntry, reported: bool = False) -> None:
        """``entry`` left the queue for good: acked, no-ack delivery, dropped (SETTLE)."""
        self._left(entry, _SETTLE, reported)

    def _left(self, entry: QueueEntry, op: Op, reported: bool = False) -> None:
        observers = self.observers.unreported if reported else self.observers
        if observers:
            for observer in observers:
                observer.queue_op(self, op, entry)
        if self.retry is not None:
            self.retry.on_settled(entry)
        if self.dedup is not None:
            self.dedup.left(entry)

    def discard(self, entries: list[QueueEntry], reason: str) -> None:
        """Entries leave: dead-lettered if the queue has a DLX, else dropped."""
        dlx = self.opts.dead_letter_exchange is not None
        if dlx and self.queue_type.dead_letters_at_least_once(self.opts):
            dead_letter_confirmed(self, entries, reason)  # each leaves once its targets have it
            return
        dead_letter(self, entries, reason)  # without a DLX: only counted (Prometheus)
        op = Op.EXPIRE if reason == "expired" else Op.DEAD_LETTER if dlx else _SETTLE
        self.leave_reason = reason
        for entry in entries:
            self._left(entry, op)
        self.leave_reason = None

    def withdraw(self, entries: list[QueueEntry]) -> int:
        """Take back entries still in the ready list whose publish was nacked (the
        store could not write them): they leave with SETTLE, never delivered, never
        dead-lettered. Entries already delivered are left alone. Returns how many left.
        O(1) for entries at the tail, else O(ready): for store failures, not the hot path."""
        wanted = {id(e) for e in entries}
        if not wanted or not self.ready:
            return 0
        gone: list[QueueEntry] = []
        ready = self.ready
        while ready and len(gone) < len(wanted):  # fast path: fresh publishes sit at the tail
            entry = ready.pop_tail()
            if id(entry) not in wanted:
                ready.append(entry)
                break
            gone.append(entry)
        if len(gone) < len(wanted) and ready:
            kept: list[QueueEntry] = []
            for entry in ready.clear():
                (gone if id(entry) in wanted else kept).append(entry)
            for entry in kept:
                ready.append(entry)
        for entry in gone:
            self.ready_bytes -= len(entry.message.body)
            self._left(entry, _SETTLE)
        return len(gone)

    def expire_ready(self, now: float) -> None:
        expired = []
        ready = self.ready
        while ready:
            head = cast("QueueEntry", ready.peek())
            if head.expires_at is None or head.expires_at > now:
                break
            ready.popleft()
            self.ready_bytes -= len(head.message.body)
            expired.append(head)
        if expired:
            self.discard(expired, "expired")

    # ---- consumers ----
    def admit_consumer(self, channel: AdmittedChannel, no_ack: bool = False,
                       arguments: dict[str, Any] | None = None) -> None:
        """basic.consume, before anything changes: a queue type without global QoS refuses
        a channel that has a global prefetch (RabbitMQ: 540, the connection closes); a
        queue type may refuse no_ack or the consumer's arguments (streams)."""
        if channel.global_prefetch and not self.queue_type.global_qos:
            raise errors.not_implemented("%s does not support global qos",
                                         self.vhost.queue_resource(self.name))

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        if consumer.selector is not None:
            self._selective += 1
        self._had_consumer = True
        self._group(consumer.priority).append(consumer)
        self.touch()
        if self.group is not None:
            self.group.rebalance()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if consumer.selector is not None:
            self._selective -= 1
        if consumer.parked:
            consumer.parked = False  # not in the rotation
        else:
            for i, (prio, group) in enumerate(self._groups):
                if prio == consumer.priority:
                    group.remove(consumer)
                    if not group:
                        del self._groups[i]
                    break
        self.touch()
        if self.message_groups is not None:
            self.message_groups.consumer_left(consumer)
        if self.group is not None:
            self.group.rebalance()
        if not self.consumers and self.auto_delete and self._had_consumer:
            self.vhost.delete_queue(self, reason="auto-delete")
        elif self.consumers:
            self.dispatch()
        if self.flow_waiters:
            self.flow_check()

    @property
    def exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    # ---- management ----
    def purge(self) -> int:
        count = self.message_count  # with a backlog the SQL store deletes unread (sql_paged)
        entries = self.ready.clear()
        self.ready_bytes = 0
        for entry in entries:
            self._left(entry, Op.PURGE)
        self._expiry.cancel()
        if self.flow_waiters:
            self.flow_check()
        return count

    def touch(self) -> None:
        """Note activity for x-expires (consumers, get, redeclare)."""
        if self.opts.expires is None or self.deleted:
            return
        if self._expires_handle is not None:
            self._expires_handle.cancel()
        self._expires_handle = self.vhost.timers.call_later(
            self.opts.expires / 1000.0, self._expires_fire)

    def _expires_fire(self) -> None:
        self._expires_handle = None
        if self.deleted:
            return
        if self.consumers:
            self.touch()
            return
        self.vhost.delete_queue(self, reason="expired")

    def on_deleted(self) -> list[Consumer]:
        """Tear down; returns the consumers that must be told (basic.cancel)."""
        self.deleted = True
        self._expiry.cancel()
        if self._expires_handle is not None:
            self._expires_handle.cancel()
            self._expires_handle = None
        consumers = list(self.consumers)
        self.consumers.clear()
        self._groups.clear()
        if self.group is not None:
            self.group.remove(self)
        for entry in self.ready.clear():
            self._left(entry, Op.DELETE)
        self.ready_bytes = 0
        if self.flow_waiters:
            self.flow_check()
        return consumers
