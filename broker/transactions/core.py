"""``Transactions``: holds half messages, applies decisions, asks producers, applies defaults.

A prepared message is kept (stored first, if persistent and the store is durable) in the
vhost's ``HeldQueue`` and one broker timer is armed for it. Each time the timer fires
before a decision, a check-back goes to the producer's ``reply_to`` and the next wait is
twice as long (capped); after ``check_max`` check-backs the default decision applies.

Commit = route the committed copy as a new publish to the original exchange and routing
key, *then* remove the stored half message, so a crash in between can repeat a delivery
but never lose one (the journal writes both in order; SQL in one transaction).
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from .. import errors
from ..errors import Resource
from ..internal_queues import InternalQueues
from ..publishing import Source
from ..queues.entry import QueueEntry
from .held_queue import HeldQueue
from .messages import check_copy, committed_copy, prepared_at_ms, stored_copy
from .spec import COMMIT, ROLLBACK, Policy, TransactionError, parse_prepare, queue_default, text

if TYPE_CHECKING:
    from ..services import TransactionServices
    from ..timers import TimerHandle
    from ..vhost import VirtualHost

log = logging.getLogger("broker.transactions")

DECIDED_KEPT = 10_000  # per vhost: recently decided ids, so a repeated decision is harmless
_DONE = {COMMIT: "committed", "rollback": "rolled back"}


class Pending:
    """One prepared transaction: its stored message and where its check-backs are."""

    __slots__ = ("attempt", "due_ms", "entry", "handle", "message", "policy", "txid", "vhost")

    def __init__(self, txid: str, vhost: str, message, entry: QueueEntry | None, policy: Policy):
        self.txid = txid
        self.vhost = vhost
        self.message = message  # the stored copy (with its prepare time)
        self.entry = entry  # its stored entry, None for a transient one
        self.policy = policy
        self.attempt = 1  # the next check-back's number; check_max + 1 = the default
        self.due_ms = 0  # wall clock of the next attempt
        self.handle: TimerHandle | None = None


class Transactions:
    def __init__(self, services: TransactionServices, clock=time.time) -> None:
        self.services = services  # the composition root's, never the whole broker
        self.timers = services.timers
        self.clock = clock  # wall clock: prepare times survive restarts
        self.tables: dict[str, dict[str, Pending]] = {}  # vhost -> txid -> Pending
        self.decided: dict[str, OrderedDict[str, str]] = {}  # vhost -> txid -> outcome
        self.queues: InternalQueues[HeldQueue] = InternalQueues(
            lambda vhost: HeldQueue(self, vhost))
        self.stats = {"prepared": 0, "committed": 0, "rolled_back": 0, "checks": 0,
                      "defaults": 0, "recovered": 0}

    # ---- tables and the internal queue ----
    def table(self, vhost_name: str) -> dict[str, Pending]:
        t = self.tables.get(vhost_name)
        if t is None:
            t = self.tables[vhost_name] = {}
        return t

    def new_queue(self, vhost: VirtualHost) -> HeldQueue:
        return self.queues.new(vhost)

    def held_queue(self, vhost: VirtualHost) -> HeldQueue:
        return self.queues.of(vhost)

    def pending_ids(self, vhost_name: str = "/") -> list[str]:
        return list(self.table(vhost_name))

    # ---- the publish hook's two entry points ----
    def prepare(self, channel, message, seq: int) -> None:
        """A half message: validate, hold (stored if persistent), confirm once stored."""
        vhost = channel.vhost
        txid, policy = parse_prepare(message.headers, message.properties.get("message_id"))
        table = self.table(vhost.name)
        if txid in table:
            raise TransactionError(f"{self._resource(vhost, txid)} is already prepared")
        # ``mandatory`` is not checked here: routing is not side-effect free for every
        # exchange type (deduplication remembers what it routed), and the commit could not
        # be returned anyway; the message is routed once, at its commit.
        now_ms = int(self.clock() * 1000)
        q = self.held_queue(vhost)
        stored = stored_copy(message, now_ms)
        entry = q.write(stored) if q.store is not None and message.persistent else None
        p = Pending(txid, vhost.name, stored, entry, policy)
        table[txid] = p
        decided = self.decided.get(vhost.name)
        if decided is not None:
            decided.pop(txid, None)  # an id may be used again once decided
        self.stats["prepared"] += 1
        self._arm(p, 1, now_ms + policy.delay_ms(1))
        self._confirm(channel, seq, q if entry is not None else None)

    def decide(self, channel, decision: str, txid: str, seq: int) -> None:
        """A decision published by a client: apply it, confirm once it is durable."""
        vhost = channel.vhost
        p = self.table(vhost.name).get(txid)
        if p is None:
            decided = self.decided.get(vhost.name)
            past = decided.get(txid) if decided is not None else None
            if past is None:
                raise errors.not_found(self._resource(vhost, txid))
            if not past.startswith(_DONE[decision]):
                raise errors.precondition_failed("cannot %s %s: it was already %s", decision,
                                                 self._resource(vhost, txid), past)
            if seq:  # the same decision again (e.g. a check-back answered twice): done
                channel.confirm_decided(seq, True)
            return
        self._finish(vhost, p, decision, _DONE[decision], channel)
        q = self.queues.get(vhost.name)
        self._confirm(channel, seq, q if q is not None and q.store is not None else None)

    # ---- deciding ----
    def _finish(self, vhost: VirtualHost | None, p: Pending, decision: str, outcome: str, channel=None,
                only: list | None = None) -> None:
        """Apply ``decision``; a commit routes the message (to the queues ``only``, when
        a default decided per destination queue)."""
        table = self.table(p.vhost)
        del table[p.txid]
        if p.handle is not None:
            p.handle.cancel()
        if decision == COMMIT and vhost is not None:
            out = committed_copy(p.message)
            # the publish path past its hooks (this one took it): the deciding channel (any
            # protocol's origin), or the broker itself for a default decision; a default
            # decided per queue leaves out the queues whose default is rollback
            drop = None
            if only is not None:
                kept = {id(q) for q in only}
                drop = lambda q: id(q) not in kept  # noqa: E731
            self.services.publishing.publish(channel or self._origin(vhost), out, hooks=False,
                                           drop=drop)
            self.stats["committed"] += 1
        else:
            self.stats["rolled_back"] += 1
        if p.entry is not None:  # after the commit's enqueues: a crash repeats, never loses
            q = self.queues.get(p.vhost)
            if q is not None:
                q.forget(p.entry)
        decided = self.decided.get(p.vhost)
        if decided is None:
            decided = self.decided[p.vhost] = OrderedDict()
        decided[p.txid] = outcome
        if len(decided) > DECIDED_KEPT:
            decided.popitem(last=False)

    def _origin(self, vhost: VirtualHost) -> Source:
        """The publisher of what the broker decides without a client (a default decision,
        a check-back): a ``Source`` the audit trail records as the peer ``transactions``."""
        return Source(vhost, None, "transactions")

    def _confirm(self, channel, seq: int, stored_in: HeldQueue | None) -> None:
        if not seq:
            return
        if stored_in is None:
            channel.confirm_decided(seq, True)
            return
        stored_in.store.when_durable(
            lambda: channel.confirm_decided(seq, True, external=True),
            on_failure=lambda: channel.confirm_decided(seq, False, external=True))

    # ---- check-backs and the default ----
    def _arm(self, p: Pending, attempt: int, due_ms: int) -> None:
        p.attempt = attempt
        p.due_ms = due_ms
        delay = max(0.0, due_ms / 1000.0 - self.clock())
        p.handle = self.timers.call_later(delay, lambda: self._due(p))

    def _due(self, p: Pending) -> None:
        if self.table(p.vhost).get(p.txid) is not p:
            return
        p.handle = None
        vhost = self.services.vhosts.get(p.vhost)
        policy = p.policy
        if p.attempt > policy.check_max:
            self.stats["defaults"] += 1
            after = (f"by default after {policy.check_max} "
                     f"check-back{'s' if policy.check_max != 1 else ''}")
            decision, only = policy.default, None
            if decision is None:  # the destination queues decide, each for itself
                out = committed_copy(p.message)
                targets = vhost.route(out.exchange, out.routing_key, out) if vhost else []
                only = [q for q in targets if queue_default(q) == COMMIT]
                decision = COMMIT if only else ROLLBACK
                if only and len(only) < len(targets):
                    after += f" (committed to {len(only)} of {len(targets)} queues: " \
                             f"the others' default is rollback)"
            outcome = f"{_DONE[decision]} {after}"
            log.info("transaction %r in vhost %r: no decision, %s", p.txid, p.vhost, outcome)
            self._finish(vhost, p, decision, outcome, only=only)
            return
        wait = policy.delay_ms(p.attempt + 1)
        reply_to = text(p.message.properties.get("reply_to"))
        if reply_to and vhost is not None:
            check = check_copy(p.message, p.txid, p.attempt, wait)
            # the broker's own message: no hook takes it over (an x-delay the half message
            # carries is for its commit, not its check-backs)
            self.services.publishing.publish(self._origin(vhost), check, hooks=False)
            self.stats["checks"] += 1
        self._arm(p, p.attempt + 1, p.due_ms + wait)

    # ---- recovery ----
    def adopt(self, q: HeldQueue, entry: QueueEntry) -> bool:
        """A stored half message handed back to ``q`` at start-up: hold it again and
        resume its check-back schedule from its prepare time."""
        message = entry.message
        try:
            txid, policy = parse_prepare(message.headers, message.properties.get("message_id"))
        except TransactionError as exc:
            log.warning("dropping a stored half message: %s", exc)
            q.forget(entry)
            return False
        table = self.table(q.vhost.name)
        old = table.get(txid)
        if old is not None:  # two stored copies of one id: keep the newer one
            if old.entry is not None and old.entry.seq > entry.seq:
                q.forget(entry)
                return False
            if old.handle is not None:
                old.handle.cancel()
            if old.entry is not None:
                q.forget(old.entry)
        now_ms = int(self.clock() * 1000)
        prepared = prepared_at_ms(message)
        if prepared is None:
            prepared = now_ms
        p = Pending(txid, q.vhost.name, message, entry, policy)
        table[txid] = p
        attempt, due = _resume(policy, prepared, now_ms)
        self._arm(p, attempt, due)
        self.stats["recovered"] += 1
        return True

    def recovered(self) -> None:
        """Recovery hook: log what came back."""
        if self.stats["recovered"]:
            log.info("recovered %d prepared transactions", self.stats["recovered"])

    @staticmethod
    def _resource(vhost: VirtualHost, txid: str) -> Resource:
        return Resource("transaction", txid, vhost.name)


def _resume(policy: Policy, prepared_ms: int, now_ms: int) -> tuple[int, int]:
    """(next attempt, its wall-clock ms) for a half message found at start-up.

    The schedule runs from the prepare time, as if the broker had been up; check-backs
    that fell in the downtime are not repeated. If the whole window passed while the
    broker was down, the producer still gets one check-back now (and one more
    interval to answer) before the default applies.
    """
    due = prepared_ms
    for attempt in range(1, policy.final_attempt + 1):
        due += policy.delay_ms(attempt)
        if due > now_ms:
            return attempt, due
    if policy.check_max:
        return policy.check_max, now_ms
    return policy.final_attempt, now_ms + policy.timeout_ms
