"""Transactional ("half") messages, as RocketMQ's, for any AMQP 0-9-1 client.

``install(broker)`` is called from ``Broker.__init__``: it declares the reserved
exchange ``amq.triomq.transaction`` in every vhost (clients may publish to it, not
declare or delete it), registers the ``HeldQueue`` variant (so recovery recreates
``amq.triomq.transactions`` as one), puts the publish hook *first* (a half message is
never scheduled, routed or deduplicated before its decision) and adds a recovery hook.
Modules: ``spec`` (wire contract, validation), ``messages`` (stored / committed /
check-back copies), ``held_queue`` (the queue variant), ``core`` (``Transactions``).
See docs/transactions.md.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import errors
from ..scheduler.spec import AMQ_HEADERS, X_DELAY
from .core import Transactions
from .held_queue import HELD_QUEUE, HeldQueue
from .spec import (
    CONTROL_EXCHANGE,
    X_DEFAULT,
    X_TRANSACTION,
    TransactionError,
    default_argument,
    parse_decision,
)

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import TransactionServices
    from ..vhost import VirtualHost

__all__ = ["CONTROL_EXCHANGE", "HELD_QUEUE", "HeldQueue", "Transactions", "install"]


def make_publish_hook(transactions: Transactions):
    def hook(channel, message, mandatory: bool, seq: int) -> bool:
        headers = message.properties.get("headers")
        is_control = message.exchange == CONTROL_EXCHANGE
        if not is_control and (not headers or X_TRANSACTION not in headers):
            return False
        try:
            if is_control:
                decision, txid = parse_decision(message.routing_key, headers or {},
                                                message.properties.get("message_id"))
                transactions.decide(channel, decision, txid, seq)
            else:
                _refuse_scheduled(channel, message, headers)
                transactions.prepare(channel, message, seq)
        except TransactionError as exc:
            raise errors.precondition_failed("%s", exc) from None
        return True

    return hook


def _refuse_scheduled(channel, message, headers: dict) -> None:
    # As in RocketMQ, a half message cannot also be delayed: its delivery time is its commit.
    x = channel.vhost.exchanges.get(message.exchange)
    delayed = x is not None and x.type_name == "x-delayed-message" and X_DELAY in headers
    names = ([X_DELAY] if delayed else []) + [h for h in AMQ_HEADERS if h in headers]
    if names:
        raise TransactionError(f"invalid header '{names[0]}': a message with header "
                               f"'{X_TRANSACTION}' cannot be scheduled")


def _recovered_queue(broker: Broker, vhost: VirtualHost, name: str, **_queue_kwargs) -> HeldQueue:
    """Queue-variant factory: the stored internal queue comes back as a HeldQueue."""
    return broker.transactions.new_queue(vhost)


def install(broker: Broker, services: TransactionServices) -> Transactions:
    """Half messages on the root's ``services``, wired into ``broker``'s hooks;
    ``Broker.__init__`` keeps them as ``broker.transactions``."""
    from ..exchanges import EXCHANGE_TYPES
    from ..persistence.recovery import register_queue_variant
    from ..queues.args import register_queue_argument

    register_queue_argument(X_DEFAULT, default_argument)
    transactions = Transactions(services)
    for vhost in broker.vhosts.values():
        if CONTROL_EXCHANGE not in vhost.exchanges:
            vhost.exchanges[CONTROL_EXCHANGE] = EXCHANGE_TYPES["direct"](CONTROL_EXCHANGE,
                                                                         durable=True)
    broker.publish_hooks.insert(0, make_publish_hook(transactions))
    register_queue_variant(HELD_QUEUE, _recovered_queue)
    broker.recovery_hooks.append(transactions.recovered)
    return transactions
