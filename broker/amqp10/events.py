"""What an AMQP 1.0 connection (``connection.ServerConnection``) hands the broker: its
events, and the JMS selector of an attaching link's source. Not the connection's state
machine nor the deliveries' handles (``deliveries``).
"""
from __future__ import annotations

from dataclasses import dataclass

from proton import Delivery, Described, Link


@dataclass
class SaslInit:
    mechanism: str
    response: bytes
    hostname: str | None


@dataclass
class NoSasl:
    """The client sent the AMQP header without SASL: anonymous, if the broker allows it."""


@dataclass
class ConnectionOpened:
    hostname: str | None
    container: str | None


@dataclass
class LinkAttached:
    """The peer attached a link. ``link.is_receiver`` on the broker's side: the client
    sends (publishes) to ``address``; else the client receives from ``address``."""
    link: Link
    address: str | None
    dynamic: bool
    selector: str | None = None  # a JMS selector in the source's filter (consumers)
    coordinator: bool = False  # a link to the transaction coordinator (publishing side)


@dataclass
class MessageReceived:
    """A whole message on a receiving link (its transfers assembled)."""
    link: Link
    delivery: Delivery
    data: bytes
    settled: bool
    txn_id: bytes | None = None  # a transactional transfer's transaction


@dataclass
class OutcomeReceived:
    """The client's disposition of a delivery the broker sent."""
    link: Link
    delivery: Delivery
    outcome: int  # Disposition.ACCEPTED/RELEASED/REJECTED/MODIFIED, 0: settled without one
    delivery_failed: bool
    undeliverable_here: bool
    txn_id: bytes | None = None  # a transactional disposition's transaction


@dataclass
class CreditGiven:
    link: Link


@dataclass
class LinkDetached:
    link: Link
    closed: bool


@dataclass
class SessionEnded:
    key: int  # the ``key`` of its links' ``session_key``


@dataclass
class ConnectionClosed:
    pass


@dataclass
class ProtocolError:
    description: str


Event10 = (SaslInit | NoSasl | ConnectionOpened | LinkAttached | MessageReceived
           | OutcomeReceived | CreditGiven | LinkDetached | SessionEnded | ConnectionClosed
           | ProtocolError)


# the JMS selector filter as Qpid JMS and ActiveMQ send it (by descriptor: symbol or code)
_SELECTOR_DESCRIPTORS = ("apache.org:selector-filter:string", 0x0000468C00000004)


def selector(term) -> str | None:
    """The JMS selector of a source's filter set, or None."""
    f = term.filter
    f.rewind()
    if not f.next():
        return None
    try:
        filters = f.get_object()
    except Exception:  # an undecodable filter set: no selector
        return None
    if not isinstance(filters, dict):
        return None
    for value in filters.values():
        if isinstance(value, Described) and value.descriptor in _SELECTOR_DESCRIPTORS \
                and isinstance(value.value, str):
            return value.value
    return None
