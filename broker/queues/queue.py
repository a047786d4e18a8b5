"""A classic queue: ready messages, consumers, delivery and settlement.

Everything here is synchronous and runs on the event loop's thread: a publish
enqueues and dispatches to consumers in the same call, so the hot path has no
task per message. Features (TTL, dead-lettering, priority, max-length) live in
their own modules; this class wires them in.
"""
from __future__ import annotations

from collections import deque

from . import max_length, ttl
from .args import QueueOptions
from .dead_letter import dead_letter
from .entry import QueueEntry
from .fifo import FifoReady
from .priority import PriorityReady, message_priority


def _make_retry(queue):
    try:
        from .retry import make_retry_policy
    except ImportError:
        return None
    return make_retry_policy(queue)


class Consumer:
    __slots__ = ("tag", "tag_raw", "channel", "queue", "no_ack", "exclusive", "priority",
                 "prefetch", "unacked", "arguments")

    def __init__(self, tag: str, channel, queue: "Queue", no_ack: bool, exclusive: bool,
                 priority: int, prefetch: int, arguments: dict):
        self.tag = tag
        raw = tag.encode("utf-8", "surrogateescape")
        self.tag_raw = bytes((len(raw),)) + raw
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.priority = priority
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def can_take(self) -> bool:
        ch = self.channel
        if not ch.can_deliver:
            return False
        if self.no_ack:
            return True
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        if ch.global_prefetch and ch.unacked_count >= ch.global_prefetch:
            return False
        return True


class Queue:
    kind = "queue"

    def __init__(self, vhost, name: str, durable: bool = False, exclusive_owner=None,
                 auto_delete: bool = False, arguments: dict | None = None,
                 opts: QueueOptions | None = None):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments or {}
        self.opts = opts or QueueOptions()
        self.ready = (PriorityReady(self.opts.max_priority) if self.opts.max_priority
                      else FifoReady())
        self.ready_bytes = 0
        self.unacked_count = 0
        self.consumers: list[Consumer] = []  # registration order
        self._groups: list[tuple[int, deque]] = []  # (priority, consumers) highest first
        self._next_seq = 1
        self.bindings: set = set()  # (exchange name, binding key) pointing here
        self.deleted = False
        self._had_consumer = False
        self._expiry = ttl.ExpiryTimer(self)
        self._expires_handle = None
        self.stats_published = 0
        self.stats_delivered = 0
        self.store = None  # set by the vhost for durable queues with a persistent store
        # Retry-with-backoff policy (queues/retry.py) when x-retry-delays/x-delivery-limit are set.
        self.retry = _make_retry(self)
        self.touch()

    # ---- info ----
    @property
    def message_count(self) -> int:
        return len(self.ready)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    @property
    def in_use(self) -> bool:
        return bool(self.consumers)

    # ---- publishing ----
    def enqueue(self, message, *, entry: QueueEntry | None = None) -> bool:
        """Add a message; False if refused by x-overflow=reject-publish(-dlx)."""
        opts = self.opts
        size = len(message.body)
        if (opts.max_length is not None or opts.max_length_bytes is not None) \
                and opts.overflow != "drop-head" and max_length.would_overflow(self, size):
            if opts.overflow == "reject-publish-dlx":
                dead_letter(self, [QueueEntry(message, 0)], "maxlen")
            return False
        if entry is None:
            seq = self._next_seq
            self._next_seq = seq + 1
            expires_at = None
            if opts.message_ttl is not None or "expiration" in message.properties:
                expires_at = ttl.deadline(opts.message_ttl, message.properties,
                                          self.vhost.timers.now())
            entry = QueueEntry(message, seq, expires_at,
                               message_priority(message.properties, opts.max_priority)
                               if opts.max_priority else 0)
            if self.store is not None and message.persistent:
                self.store.enqueue(self, entry)
        else:
            if entry.seq >= self._next_seq:
                self._next_seq = entry.seq + 1
        self.stats_published += 1
        self.ready.append(entry)
        self.ready_bytes += size
        if self.consumers:
            self.dispatch()
        if opts.max_length is not None or opts.max_length_bytes is not None:
            dropped = max_length.drop_head(self)
            if dropped:
                self._discard(dropped, "maxlen")
        if entry.expires_at is not None and len(self.ready):
            self._expiry.arm()
        return True

    # ---- delivery ----
    def dispatch(self) -> None:
        ready = self.ready
        if not ready or not self.consumers:
            return
        now = None
        expired = None
        while ready:
            consumer = self._pick_consumer()
            if consumer is None:
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
            self._mark_delivered(entry)
            if not consumer.no_ack:
                consumer.unacked += 1
                self.unacked_count += 1
            consumer.channel.deliver(consumer, self, entry)
            if consumer.no_ack:
                self.settled(entry)
        if expired:
            self._discard(expired, "expired")
        if self._expiry.at is not None or (now is not None and ready):
            self._expiry.arm()

    def _mark_delivered(self, entry: QueueEntry) -> None:
        entry.delivery_count += 1
        self.stats_delivered += 1
        if self.store is not None and entry.delivery_count == 1 and entry.message.persistent:
            self.store.delivered(self, entry)  # so a crash brings it back redelivered=true

    def _pick_consumer(self) -> Consumer | None:
        consumers = self.consumers
        if len(consumers) == 1 or self.opts.single_active_consumer:
            c = consumers[0]
            return c if c.can_take() else None
        for _prio, group in self._groups:
            for _ in range(len(group)):
                c = group[0]
                group.rotate(-1)
                if c.can_take():
                    return c
        return None

    def get(self):
        """basic.get: the next live entry, or None."""
        self.touch()
        now = self.vhost.timers.now()
        expired = []
        result = None
        while self.ready:
            entry = self.ready.popleft()
            self.ready_bytes -= len(entry.message.body)
            if ttl.is_expired(entry, now):
                expired.append(entry)
                continue
            self._mark_delivered(entry)
            result = entry
            break
        if expired:
            self._discard(expired, "expired")
        self._expiry.arm()
        return result

    # ---- settlement (called by channels) ----
    def ack(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self._unacked_done(consumer)
        self.settled(entry)

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        """Rejected without requeue: dead-letter (reason 'rejected') or drop."""
        self._unacked_done(consumer)
        if self.retry is not None and self.retry.on_rejected(entry, requeue=False):
            return
        self._discard([entry], "rejected")

    def requeue(self, entries: list) -> None:
        """Return unacked messages to their original positions, marked redelivered."""
        for entry, consumer in entries:
            self._unacked_done(consumer)
            if self.deleted:
                continue
            if self.retry is not None and self.retry.on_rejected(entry, requeue=True):
                continue
            entry.redelivered = True
            self.ready.requeue(entry)
            self.ready_bytes += len(entry.message.body)
        if not self.deleted:
            self.dispatch()
            self._expiry.arm()

    def _unacked_done(self, consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked -= 1
            self.unacked_count -= 1
        elif self.unacked_count:
            self.unacked_count -= 1

    def settled(self, entry: QueueEntry) -> None:
        if self.store is not None and entry.message.persistent:
            self.store.remove(self, entry)

    def _discard(self, entries: list, reason: str) -> None:
        if self.opts.dead_letter_exchange is not None:
            dead_letter(self, entries, reason)
        for entry in entries:
            self.settled(entry)

    def expire_ready(self, now: float) -> None:
        expired = []
        ready = self.ready
        while ready:
            head = ready.peek()
            if head.expires_at is None or head.expires_at > now:
                break
            ready.popleft()
            self.ready_bytes -= len(head.message.body)
            expired.append(head)
        if expired:
            self._discard(expired, "expired")

    # ---- consumers ----
    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self._had_consumer = True
        for prio, group in self._groups:
            if prio == consumer.priority:
                group.append(consumer)
                break
        else:
            self._groups.append((consumer.priority, deque([consumer])))
            self._groups.sort(key=lambda g: -g[0])
        self.touch()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        for i, (prio, group) in enumerate(self._groups):
            if prio == consumer.priority:
                group.remove(consumer)
                if not group:
                    del self._groups[i]
                break
        self.touch()
        if not self.consumers and self.auto_delete and self._had_consumer:
            self.vhost.delete_queue(self, reason="auto-delete")
        elif self.consumers:
            self.dispatch()

    @property
    def exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    # ---- management ----
    def purge(self) -> int:
        entries = self.ready.clear()
        self.ready_bytes = 0
        for entry in entries:
            self.settled(entry)
        self._expiry.cancel()
        return len(entries)

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

    def on_deleted(self) -> list:
        """Tear down; returns the consumers that must be told (basic.cancel)."""
        self.deleted = True
        self._expiry.cancel()
        if self._expires_handle is not None:
            self._expires_handle.cancel()
            self._expires_handle = None
        consumers = list(self.consumers)
        self.consumers.clear()
        self._groups.clear()
        for entry in self.ready.clear():
            self.settled(entry)
        self.ready_bytes = 0
        return consumers
