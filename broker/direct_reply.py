"""Direct reply-to: RPC replies without a reply queue, as RabbitMQ's ``amq.rabbitmq.reply-to``.

A requester's channel consumes (no-ack) from the pseudo-queue ``amq.rabbitmq.reply-to``, then
publishes requests with ``reply_to=amq.rabbitmq.reply-to``: the broker rewrites that to
``amq.rabbitmq.reply-to.<node>.<key>``, a name only this broker hands out. A reply published to
the default exchange with that routing key goes straight to the consumer (no queue): it is
never routed to a queue, so a mandatory reply is always returned (312 NO_ROUTE), delivered or
not, and a reply for a requester that is gone is dropped — RabbitMQ's behaviour.

``<node>`` names the node the requester is connected to: a reply published on another node
of a cluster is handed to ``forward`` (set by the cluster), which sends it to that node.

Core: no persistence, cluster, management or listener imports.
"""
from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .message import Message

REPLY_QUEUE = "amq.rabbitmq.reply-to"
REPLY_PREFIX = REPLY_QUEUE + "."


def _token(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def node_of(name: str) -> str | None:
    """The node named in a reply name ``amq.rabbitmq.reply-to.<node>.<key>`` (None: not one)."""
    token, dot, key = name[len(REPLY_PREFIX):].partition(".")
    if not dot or not key or not name.startswith(REPLY_PREFIX):
        return None
    try:
        return base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    except (binascii.Error, ValueError):
        return None


class Channel(Protocol):
    """What a reply delivery uses of an AMQP channel (listeners/amqp_channel.py), which the
    core may not import."""
    closed: bool
    conn: Any
    number: int
    next_tag: int
    stats_deliver_no_ack: int
    session: Any


class ReplyConsumer:
    """A channel's consumer of ``amq.rabbitmq.reply-to`` (at most one a channel)."""

    __slots__ = ("channel", "name", "tag", "tag_raw")

    def __init__(self, channel: Channel, tag: str, name: str):
        self.channel = channel
        self.tag = tag
        raw = tag.encode("utf-8", "surrogateescape")
        self.tag_raw = bytes((len(raw),)) + raw
        self.name = name  # what the channel's requests carry as reply_to


class DirectReply:
    """The broker's reply consumers by reply name."""

    def __init__(self, node: str = "") -> None:
        self.consumers: dict[str, ReplyConsumer] = {}
        # cluster: (node, vhost, message) -> None, sends a reply to the node its requester is
        # on; None when the broker is alone (a reply naming another node is dropped)
        self.forward: Callable[[str, str, Message], None] | None = None
        self.node = node

    @property
    def node(self) -> str:
        return self._node

    @node.setter
    def node(self, node: str) -> None:
        # alone, a per-process token: a name handed out before a restart routes nowhere
        self._node = node
        self._node_token = _token(node.encode() if node else os.urandom(6))

    def register(self, channel: Channel, tag: str) -> ReplyConsumer:
        name = f"{REPLY_PREFIX}{self._node_token}.{_token(os.urandom(18))}"
        rc = self.consumers[name] = ReplyConsumer(channel, tag, name)
        return rc

    def unregister(self, rc: ReplyConsumer) -> None:
        self.consumers.pop(rc.name, None)

    def is_local(self, name: str) -> bool:
        return name[len(REPLY_PREFIX):].partition(".")[0] == self._node_token

    def exists(self, name: str) -> bool:
        """A passive declare's answer: the requester is live here, or the name is well-formed
        and names another node (whose consumers are not known here)."""
        if name in self.consumers:
            return True
        if self.is_local(name) or self.forward is None:
            return False
        return node_of(name) is not None

    def deliver_here(self, message: Message) -> None:
        """A reply another node forwarded here: to its consumer, if still there."""
        rc = self.consumers.get(message.routing_key)
        if rc is not None:
            deliver(rc, message)

    def reaches(self, name: str) -> bool:
        """Whether a reply to ``name`` goes to its requester: a live consumer here, or a
        well-formed name of another node's (the audit trail records it as replied)."""
        if name in self.consumers:
            return True
        return self.forward is not None and not self.is_local(name) and node_of(name) is not None

    def unrouted_outcome(self, message: Message, mandatory: bool) -> str:
        """The audit outcome of a publish that reached no queue: ``replied`` for a direct
        reply its requester got (returned too when mandatory, as on RabbitMQ)."""
        if (not message.exchange and message.routing_key.startswith(REPLY_PREFIX)
                and self.reaches(message.routing_key)):
            return "replied"
        return "returned" if mandatory else "unroutable"

    def route(self, vhost: str, message: Message) -> bool:
        """A reply published to the default exchange with a reply name as routing key
        (``VirtualHost.route``, whatever the protocol): delivered to its consumer here, or
        forwarded to the requester's node. False: dropped (the requester is gone)."""
        name = message.routing_key
        rc = self.consumers.get(name)
        if rc is not None:
            return deliver(rc, message)
        forward = self.forward
        if forward is None or self.is_local(name):
            return False  # the requester is gone: dropped, as RabbitMQ does
        node = node_of(name)
        if node is None:
            return False
        forward(node, vhost, message)
        return True


def deliver(rc: ReplyConsumer, message: Message) -> bool:
    ch = rc.channel
    if ch.closed:
        return False
    # RabbitMQ sends the channel's next delivery tag without taking it (a no-ack delivery
    # that nothing will settle)
    ch.conn.deliver(ch.number, rc.tag_raw, ch.next_tag, False, message.exchange,
                    message.routing_key, message.props_raw, message.body)
    ch.stats_deliver_no_ack += 1
    ch.session.wake()
    return True
