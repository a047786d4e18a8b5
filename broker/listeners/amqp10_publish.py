"""An AMQP 1.0 connection's publishing: transfers on its publishing links through the one
publish path (``broker.publishing``), settled with RabbitMQ 4's outcomes (accepted once
routed, and stored for a persistent message in a durable queue; released when it routed
nowhere; rejected when a queue refused it), the publisher's credit, scheduled delivery.
Not links' attaching (``amqp10_session``) nor consuming (``amqp10_links``).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proton import Disposition

from .. import errors
from ..amqp.fields import encode_properties
from ..amqp10 import addresses, mapping
from ..amqp10.events import MessageReceived
from ..message import Message
from ..publishing import ROUTED, STORING, TAKEN, UNROUTABLE
from .amqp10_links import ORIGINAL, InLink
from .amqp10_tx import TxnError

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import Queue

MAX_KEY = 255
# transfers a publishing link may have in flight, topped up at half: a few hundred made the
# client wait for a flow frame every 128 transfers (RabbitMQ 3.10's plugin grants 65536).
# Memory stays bounded by the reads: every transfer is read out of proton as it arrives
PUBLISH_CREDIT = 2048

# AMQP 0-9-1 reply codes as AMQP 1.0 error conditions
_CONDITIONS = {404: "amqp:not-found", 403: "amqp:unauthorized-access",
               405: "amqp:resource-locked", 406: "amqp:precondition-failed",
               530: "amqp:unauthorized-access", 501: "amqp:decode-error",
               541: "amqp:internal-error"}


def condition_of(exc: errors.AMQPError) -> str:
    return _CONDITIONS.get(exc.code, "amqp:internal-error")


def description_of(exc: errors.AMQPError) -> str:
    # RabbitMQ 4's texts are the 0-9-1 ones without the "NOT_FOUND - " prefix
    return exc.text.partition(" - ")[2] or exc.text


# Scheduled delivery as ActiveMQ Artemis and Azure take it over AMQP 1.0: to the scheduler's
# AMQ_SCHEDULED_DELAY (ms)
_DELAY = "x-opt-delivery-delay"
_DELIVERY_TIME = "x-opt-delivery-time"


def _schedule(headers: dict) -> None:
    delay = headers.get(_DELAY)
    at = headers.get(_DELIVERY_TIME)
    if isinstance(at, int) and not isinstance(at, bool):  # ms since the epoch
        delay = at - int(time.time() * 1000)
    if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0:
        headers["AMQ_SCHEDULED_DELAY"] = delay


class Amqp10Publishing:
    """The publishing part of ``Amqp10Session`` (a mixin: the session's attributes)."""

    broker: Broker
    conn: Any
    vhost: Any
    authz: Any
    username: str | None
    is_publisher: bool
    ended: bool
    flow_queues: set | frozenset
    in_links: dict[Any, InLink]
    coordinator: Any
    management: Any
    wake: Callable[[], None]
    _check_target: Callable[[addresses.Target], Any]
    metrics_protocol: str | None

    if TYPE_CHECKING:  # the session's (session_base.FlowControlledSession): a PublishOrigin
        def queue_over_threshold(self, queue: Queue) -> None: ...

    # ---- publishing ----
    def _on_message(self, ev: MessageReceived) -> None:
        inlink = self.in_links.get(ev.link.key)
        conn = self.conn
        if inlink is None:
            coordinator = self.coordinator
            if coordinator is not None and ev.link.key in coordinator.links:
                coordinator.control(ev)
                conn.grant(ev.link, PUBLISH_CREDIT)
            elif self.management is not None and ev.link.key in self.management.requests:
                self.management.request(ev)
            return
        try:
            outcome = self._publish(inlink, ev)
        except addresses.AddressError as exc:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 ("amqp:invalid-field", str(exc)))
            outcome = None
        except errors.AMQPError as exc:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 (condition_of(exc), description_of(exc)))
            outcome = None
        except ValueError as exc:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 ("amqp:decode-error", str(exc)))
            outcome = None
        except TxnError as exc:
            conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                 (exc.condition, exc.description))
            outcome = None
        if outcome is not None:
            self._settle(ev, outcome)
        if ev.link.credit < PUBLISH_CREDIT // 2 and not self.flow_queues:
            conn.grant(ev.link, PUBLISH_CREDIT)

    def _settle(self, ev: MessageReceived, outcome: tuple) -> None:
        conn = self.conn
        kind, cond = outcome
        if kind == "txn":  # held until the discharge; accepted then if committed
            conn.settle_transactional(ev.delivery, cond, Disposition.ACCEPTED)
            return
        if kind == "store" and not ev.settled:
            def stored() -> None:
                if not self.ended:
                    conn.settle_incoming(ev.delivery, Disposition.ACCEPTED)
                    self.wake()

            def failed() -> None:
                if not self.ended:
                    conn.settle_incoming(ev.delivery, Disposition.REJECTED,
                                         ("amqp:internal-error",
                                          "the store could not write the message"))
                    self.wake()
            self.vhost.store.when_durable(stored, on_failure=failed)
            return
        state = {"store": Disposition.ACCEPTED, "accepted": Disposition.ACCEPTED,
                 "released": Disposition.RELEASED, "rejected": Disposition.REJECTED}[kind]
        conn.settle_incoming(ev.delivery, state, cond)

    def _publish(self, inlink: InLink, ev: MessageReceived) -> tuple:
        incoming = mapping.decode(ev.data)
        target = inlink.target
        if target is None:
            if not incoming.to:
                raise addresses.AddressError("message without 'to' on a link without target")
            target = addresses.parse_target(incoming.to)
            self._check_target(target)
        exchange = target.exchange
        key = target.key if target.key is not None else (incoming.subject or "")
        if len(key.encode()) > MAX_KEY:
            raise errors.precondition_failed("routing key longer than %d bytes", MAX_KEY)
        authz = self.authz
        if authz.topics:
            authz.check_topic(exchange, key, "write")
        props = incoming.properties
        headers = props.get("headers")
        if headers and (_DELAY in headers or _DELIVERY_TIME in headers):
            _schedule(headers)
        if "user_id" in props and props["user_id"] != self.username:
            raise errors.precondition_failed(
                "user_id property set to '%s' but authenticated user was '%s'",
                props["user_id"], self.username)
        self.is_publisher = True
        message = Message(exchange, key, encode_properties(props), props, incoming.body)
        ORIGINAL[message] = ev.data
        if ev.txn_id is not None:
            if self.coordinator is None:
                raise TxnError("amqp:transaction:unknown-id",
                               f"unknown transaction {ev.txn_id!r}")
            self.coordinator.publish(ev.txn_id, message)
            return "txn", ev.txn_id
        return self._route(message)

    def _route(self, message: Message) -> tuple:
        """("accepted" | "store" | "released" | "rejected", condition) from the one publish
        path's outcome, as RabbitMQ 4 settles: released when no queue took it."""
        outcome = self.broker.publishing.publish(self, message, answered=True)
        if outcome is TAKEN or outcome is ROUTED:
            return "accepted", None
        if outcome is STORING:
            return ("store" if message.persistent else "accepted"), None
        if outcome is UNROUTABLE:
            return "released", None
        return "rejected", ("amqp:resource-limit-exceeded",
                            "a queue refused the message (x-overflow reject-publish, or its "
                            "store is failing)")

    # the publish path's calls back (no confirms or returns on AMQP 1.0: dispositions)
    def confirm_decided(self, seq: int, ok: bool, external: bool = False) -> None:
        pass

    def send_return(self, message: Message, code: int, text: str) -> None:
        pass
