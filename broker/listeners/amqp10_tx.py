"""AMQP 1.0 local transactions on the broker's side: the coordinator a client attaches a
link to, and what a transaction holds until it is discharged.

The same model as AMQP 0-9-1's ``tx.select`` (``Channel.on_tx_commit``): a transactional
transfer is checked (address, permissions, ``user-id``) when it arrives and held, not
routed; a transactional disposition of a delivery is held and the delivery stays the
link's. A discharge with ``fail`` drops the held messages (never routed) and gives the
deliveries back to their links (still unsettled on the broker's side, requeued when the
link goes); a commit routes every held message through the one publish path in one go
(no other publish runs between them) and applies the dispositions, then accepts the
discharge once what the publish path waits for (the store, mirrors, a stream's log) has
the messages, as a commit-ok. (``broker/transactions`` is another thing: RocketMQ's half
messages with check-backs, decided by control messages any protocol can publish.)

A transaction belongs to the connection; a detached coordinator link or a closed
connection rolls its open transactions back (spec 4.3)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from proton import Disposition

from ..amqp10 import transactions as spec
from ..amqp10.events import MessageReceived
from ..publishing import when_all

if TYPE_CHECKING:
    from ..message import Message
    from .amqp10_links import OutLink
    from .amqp10_session import Amqp10Session

log = logging.getLogger("broker.amqp10")

MAX_TRANSACTIONS = 64  # open transactions per connection
UNKNOWN_ID = "amqp:transaction:unknown-id"


class TxnError(Exception):
    def __init__(self, condition: str, description: str):
        super().__init__(description)
        self.condition = condition
        self.description = description


class Txn:
    __slots__ = ("control", "publishes", "settles")

    def __init__(self, control: int):
        self.control = control  # the key of the coordinator link that declared it
        self.publishes: list[Message] = []
        # (outcome, undeliverable-here, the link, its delivery tag, the Unacked item)
        self.settles: list[tuple[int, bool, OutLink, Any, Any]] = []


class Coordinator:
    """The transactions of one connection."""

    def __init__(self, session: Amqp10Session):
        self.session = session
        self.links: set[int] = set()  # coordinator links (their keys)
        self.open: dict[bytes, Txn] = {}
        self._next = 0

    # ---- the coordinator link ----
    def control(self, ev: MessageReceived) -> None:
        """A declare or discharge on a coordinator link."""
        conn = self.session.conn
        try:
            request = spec.parse_control(ev.data)
        except spec.ControlError as exc:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 ("amqp:decode-error", str(exc)))
            return
        if isinstance(request, spec.Declare):
            if request.global_id is not None:
                conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                     ("amqp:not-implemented",
                                      "distributed transactions are not supported"))
                return
            if len(self.open) >= MAX_TRANSACTIONS:
                conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                     ("amqp:resource-limit-exceeded",
                                      f"more than {MAX_TRANSACTIONS} open transactions on "
                                      "one connection"))
                return
            self._next += 1
            txn_id = b"txn-%d" % self._next
            self.open[txn_id] = Txn(ev.link.key)
            conn.settle_declared(ev.delivery, txn_id)
            return
        txn = self.open.pop(request.txn_id, None)
        if txn is None:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 (UNKNOWN_ID, f"unknown transaction {request.txn_id!r}"))
            return
        if request.fail:
            self._rollback(txn)
            conn.settle_incoming(ev.delivery, Disposition.ACCEPTED)
            return
        self._commit(txn, ev)

    def link_detached(self, key: int) -> None:
        self.links.discard(key)
        for txn_id, txn in list(self.open.items()):
            if txn.control == key:
                del self.open[txn_id]
                self._rollback(txn)

    # ---- work under a transaction ----
    def _txn(self, txn_id: bytes) -> Txn:
        txn = self.open.get(txn_id)
        if txn is None:
            raise TxnError(UNKNOWN_ID, f"unknown transaction {txn_id!r}")
        return txn

    def publish(self, txn_id: bytes, message: Message) -> None:
        self._txn(txn_id).publishes.append(message)

    def settle(self, txn_id: bytes, out: OutLink, tag, item, outcome: int,
               undeliverable: bool) -> None:
        self._txn(txn_id).settles.append((outcome, undeliverable, out, tag, item))

    def link_gone(self, out: OutLink) -> None:
        """A consuming link goes: its deliveries held by a transaction are its own again
        (so they are requeued with the link's other unsettled ones)."""
        for txn in self.open.values():
            kept = []
            for entry in txn.settles:
                if entry[2] is out:
                    out.unacked[entry[3]] = entry[4]
                else:
                    kept.append(entry)
            txn.settles = kept

    def connection_lost(self) -> None:
        txns = list(self.open.values())
        self.open.clear()
        for txn in txns:
            self._rollback(txn)

    # ---- discharge ----
    def _rollback(self, txn: Txn) -> None:
        # the held messages are dropped unrouted; the deliveries are the links' again
        for _outcome, _undeliverable, out, tag, item in txn.settles:
            if out.link.key in self.session.out_links:
                out.unacked[tag] = item
        txn.publishes.clear()
        txn.settles.clear()

    def _commit(self, txn: Txn, ev: MessageReceived) -> None:
        session = self.session
        conn = session.conn
        waits: list = []
        publishing = session.broker.publishing
        for message in txn.publishes:
            publishing.publish(session, message, waits=waits)
        queues = set()
        for outcome, undeliverable, out, _tag, item in txn.settles:
            session.apply_outcome(out, item, outcome, undeliverable)
            queues.add(item.queue)
        for q in queues:
            if q.consumers:
                q.dispatch()

        def committed() -> None:
            if not session.ended:
                conn.settle_incoming(ev.delivery, Disposition.ACCEPTED)
                session.wake()

        def failed() -> None:
            if not session.ended:
                conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                     ("amqp:internal-error", "the transaction's messages "
                                      "could not be made durable"))
                session.wake()
        when_all(waits, committed, failed)
