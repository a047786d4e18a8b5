"""Forwarding: a client on any node uses a queue whose master is another node.

Every node holds, for each durable queue mastered elsewhere, a ``ProxyQueue`` under the
queue's name in its vhost: routing, bindings, permissions and policies work on it as on
any queue, and it hands the work to the master over the node's link (``link.py``):

* a message routed to it is published on the link, and the publisher's confirm waits for
  the master's (``ClusterStore.when_durable`` waits for the forwarded publishes the
  routing just made; a nack or a link lost before the master answered is a nack);
* a consumer on it becomes a consumer on a channel of the link, with a bounded prefetch
  window; deliveries go to the local client as they arrive (buffered up to that window
  while the client's socket is full), its acks, rejects and requeues go back on the link;
* queue.declare / bind / unbind / purge / delete are sent to the master in order.

On the master, ``forwarded_publish`` (a publish hook) takes a forwarded publish from a
link session and enqueues it into the queue with its original exchange and routing key.

Not forwarded: basic.get (540 NOT_IMPLEMENTED naming the master: consume instead, or
connect to it), and declare-ok's counts are 0 (the master's are not known synchronously).
"""
from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from .. import errors
from ..direct_reply import REPLY_PREFIX
from ..message import Message
from ..queues.entry import QueueEntry
from ..queues.queue import Queue
from .link import LINK_USER, ROUTE_HEADER, Link, RemoteConsumer

if TYPE_CHECKING:
    from ..direct_reply import DirectReply
    from ..queues.queue import Consumer
    from ..vhost import VirtualHost
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.forward")

LOCATORS = ("client-local", "min-masters", "random")
_TAG_SPAN = 1 << 40  # remote delivery tag + generation * span: unique across reconnects


def choose_master(locator: str, local: str, live: list[str], masters: dict[str, int]) -> str:
    """The node a new durable queue's master goes to: ``client-local`` (the node the
    client is connected to), ``min-masters`` (the live node mastering fewest queues; ties
    to the local node, then by name) or ``random`` (a live node)."""
    if locator == "client-local" or not live:
        return local
    if locator == "random":
        return random.choice(sorted(live))
    return min(sorted(live), key=lambda n: (masters.get(n, 0), n != local, n))


class _Proxied:
    """A local consumer of a proxy queue and its consumer on the link."""

    __slots__ = ("buffer", "consumer", "proxy", "remote")

    def __init__(self, proxy: ProxyQueue, consumer: Consumer, remote: RemoteConsumer | None):
        self.proxy = proxy
        self.consumer = consumer
        self.remote = remote
        self.buffer: list[QueueEntry] = []  # arrived while the client could not take them

    def remote_delivered(self, tag: int, redelivered: bool, exchange: str, routing_key: str,
                         props_raw: bytes, body: bytes) -> None:
        remote = self.remote
        if remote is None:
            return
        message = self.proxy.delivered_message(exchange, routing_key, props_raw, body)
        entry = QueueEntry(message, tag)
        entry.redelivered = redelivered
        entry.loc = remote.generation * _TAG_SPAN + tag
        self.buffer.append(entry)
        self.flush()

    def flush(self) -> None:
        consumer = self.consumer
        channel = consumer.channel
        buffer = self.buffer
        while buffer and channel.can_deliver:
            entry = buffer.pop(0)
            channel.deliver(consumer, self.proxy, entry)
            self.proxy.stats_delivered += 1
            if consumer.no_ack:
                self.settle(entry, "ack")

    def settle(self, entry: QueueEntry, how: str) -> None:
        if self.remote is not None:
            generation, tag = divmod(entry.loc, _TAG_SPAN)
            self.remote.settle(tag, generation, how)

    def remote_cancelled(self, reason: str) -> None:
        log.info("consumer %r of queue %r cancelled: %s", self.consumer.tag, self.proxy.name,
                 reason)
        self.proxy.remote_consumer_gone(self)


class ProxyQueue(Queue):
    """A queue whose master is the node ``master``: see the module docstring."""

    #: the publisher's confirm waits for the master's (publishing.py's confirm stage)
    confirms_later = True
    #: callable(node) -> bool, the cluster store's ``node_down``; None during
    #: ``Queue.__init__``, whose ``touch()`` does not ask it
    master_down: Any = None

    def __init__(self, vhost: VirtualHost, name: str, durable: bool, auto_delete: bool, arguments: dict,
                 master: str, links: Any, store: Any):
        from ..queues.args import parse_queue_arguments
        try:
            opts = parse_queue_arguments(arguments)
        except Exception:  # the master validated them; a newer argument unknown here
            opts = None
        super().__init__(vhost, name, durable=durable, auto_delete=auto_delete,
                         arguments=arguments, opts=opts)
        self.master = master
        self._links = links  # callable (node, vhost) -> Link
        self.store = store  # the cluster store: confirms go through its when_durable
        self.forwarding = True  # False once the master deleted it (no delete sent back)
        self.master_down = store.node_down
        self._proxied: dict[Consumer, _Proxied] = {}

    @property
    def keeps_definition(self) -> bool:
        return False  # the master's node stores it, not this one

    @property
    def link(self) -> Link:
        return self._links(self.master, self.vhost.name)

    def touch(self) -> None:
        """A declare or passive declare: 404 while the master's node is down, as RabbitMQ
        answers for a durable queue whose home node is down (x-expires is the master's)."""
        down = self.master_down
        if down is not None and down(self.master):
            raise errors.AMQPError(
                "not_found", f"home node '{self.master}' of durable "
                f"{self.vhost.queue_resource(self.name)} is down or inaccessible")

    @property
    def message_count(self) -> int:
        return 0  # the master's count is not known synchronously

    # ---- publishing ----
    def enqueue(self, message, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        store: Any = self.store
        done = store.forward_started()
        if not self.link.publish(self.name, message.exchange, message.routing_key,
                                 message.properties, message.body, done):
            store.forward_abandoned(done)
            self.refused_id = message.id
            return False  # the master is unreachable: nacked, as an unavailable queue
        self.stats_published += 1
        return True

    # ---- consuming ----
    def delivered_message(self, exchange: str, routing_key: str, props_raw: bytes,
                          body: bytes) -> Message:
        """A delivery that came over the link, as a message of this node."""
        from ..amqp.fields import decode_properties
        return Message(exchange, routing_key, props_raw, decode_properties(props_raw), body)

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        proxied = _Proxied(self, consumer, None)
        link = self.link
        # a no-ack consumer still acks on the link, as it takes the messages: bounded
        proxied.remote = RemoteConsumer(link, self.name, False, consumer.prefetch,
                                        consumer.arguments, proxied)
        self._proxied[consumer] = proxied
        link.consume(proxied.remote)

    def remove_consumer(self, consumer: Consumer) -> None:
        proxied = self._proxied.pop(consumer, None)
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if proxied is not None and proxied.remote is not None:
            proxied.remote.cancel()

    def retarget(self, master: str) -> None:
        """The queue has a new master (a mirror was promoted): consumers follow it (what
        they had unacknowledged is redelivered by the new master, redelivered=true)."""
        if master == self.master:
            return
        self.master = master
        link = self.link
        for proxied in list(self._proxied.values()):
            if proxied.consumer.arguments.get("x-cancel-on-ha-failover") is True:
                if proxied.remote is not None:
                    proxied.remote.cancel()
                self.remote_consumer_gone(proxied)  # basic.cancel, as asked
                continue
            if proxied.remote is not None:
                proxied.remote.cancel()
            proxied.buffer.clear()
            proxied.remote = RemoteConsumer(link, self.name, False, proxied.consumer.prefetch,
                                            proxied.consumer.arguments, proxied)
            link.consume(proxied.remote)

    def remote_consumer_gone(self, proxied: _Proxied) -> None:
        consumer = proxied.consumer
        if self._proxied.pop(consumer, None) is None:
            return
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        consumer.channel.consumer_cancelled_by_broker(consumer)

    def dispatch(self) -> None:
        for proxied in list(self._proxied.values()):
            if proxied.buffer:
                proxied.flush()

    def credit_changed(self, consumer: Consumer) -> None:
        """The prefetch window on the link stays as subscribed."""

    def get(self):
        raise errors.not_implemented(
            "basic.get on %s, whose master is node '%s': use basic.consume, or connect to '%s'",
            self.vhost.queue_resource(self.name), self.master, self.master)

    def ack(self, entry: QueueEntry, consumer: Consumer | None, reported: bool = False) -> None:
        self.stats_acked += 1
        proxied = self._proxied.get(consumer) if consumer is not None else None
        if proxied is not None and not consumer.no_ack:  # type: ignore[union-attr]
            proxied.settle(entry, "ack")

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        proxied = self._proxied.get(consumer) if consumer is not None else None
        if proxied is not None:
            proxied.settle(entry, "reject")

    def requeue(self, entries: list) -> None:
        for entry, consumer in entries:
            proxied = self._proxied.get(consumer) if consumer is not None else None
            if proxied is not None:
                proxied.settle(entry, "requeue")

    def settled(self, entry: QueueEntry, reported: bool = False) -> None:
        """Nothing is held here."""

    # ---- definitions, forwarded ----
    def purge(self) -> int:
        from ..amqp import spec
        self.link.control(spec.Queue.Purge(0, self.name, False))
        return 0

    def on_deleted(self) -> list:
        consumers = list(self.consumers)
        for consumer in consumers:
            self.remove_consumer(consumer)
        self.deleted = True
        if self.forwarding:
            from ..amqp import spec
            self.link.control(spec.Queue.Delete(0, self.name, False, False, False))
        return consumers


def _reply_sent(ok: bool | None) -> None:
    """A forwarded direct reply needs no answer: routed to no queue, nobody waits on it."""


def forward_reply(link: Link, message: Message) -> None:
    """A direct reply for a requester connected to the link's node: published there under
    its reply name, where ``forwarded_publish`` hands it to the requester's channel. Dropped
    while the link is down, as a reply to a requester that is gone."""
    link.publish(message.routing_key, "", message.routing_key, message.properties, message.body,
                 _reply_sent)


def forwarded_publish(store: ClusterStore, direct_reply: DirectReply, channel, message: Message,
                      mandatory: bool, seq: int) -> bool:
    """Publish hook on the master (``store`` and ``direct_reply`` bound by the cluster
    store's recovery): a publish forwarded by another node's link goes into the queue it
    names, with its original exchange and routing key; anything else is not taken (False)."""
    user = channel.session.user
    if user is None or user.name != LINK_USER:
        # whose publish a forward or a mirror op now started belongs to (in doubt: closed)
        store.publishing = channel
        return False
    headers = message.properties.get("headers")
    route = headers.get(ROUTE_HEADER) if isinstance(headers, dict) else None
    if not isinstance(route, list) or len(route) != 2:
        return False
    from ..amqp.fields import encode_properties
    from .mirror_ops import MIRROR_HEADER
    vhost = channel.vhost
    from .view import STATS_ANSWER, STATS_REQUEST
    stats = headers.get(STATS_REQUEST), headers.get(STATS_ANSWER)  # type: ignore[union-attr]
    if stats != (None, None):  # a queue view asked by another node, or its answer (view.py)
        if isinstance(stats[0], list) and len(stats[0]) == 2:
            asking = stats[0][1]
            store.views.answer(asking.decode() if isinstance(asking, bytes) else str(asking),
                               vhost.name, stats[0], message.body)
        elif isinstance(stats[1], list):
            store.views.answered(stats[1], message.body)
        if seq:
            channel.confirm_decided(seq, True)
        return True
    mirror_op = headers.get(MIRROR_HEADER)  # type: ignore[union-attr]
    if mirror_op is not None:  # an op of a queue this node mirrors (mirror.py)
        mirrors = store.mirrors
        seqs = route[1].decode() if isinstance(route[1], bytes) else str(route[1])
        ok = isinstance(mirror_op, list) and mirrors is not None and mirrors.apply(
            vhost.name, message.routing_key, mirror_op, seqs, message.body)
        if seq and mirrors is not None:
            mirrors.decided(channel, seq, bool(ok))  # a quorum copy: after its fsync
        elif seq:
            channel.confirm_decided(seq, bool(ok))
        return True
    props = dict(message.properties)
    rest = {k: v for k, v in headers.items()  # type: ignore[union-attr]
            if k != ROUTE_HEADER and k != MIRROR_HEADER}
    if rest:
        props["headers"] = rest
    else:
        props.pop("headers", None)
    exchange, key = (r.decode("utf-8", "surrogateescape") if isinstance(r, bytes) else str(r)
                     for r in route)
    original = Message(exchange, key, encode_properties(props), props, message.body)
    if key.startswith(REPLY_PREFIX) and not exchange:  # a direct reply (forward_reply)
        direct_reply.deliver_here(original)
        if seq:
            channel.confirm_decided(seq, True)
        return True
    store.publishing = channel  # the link's: in doubt, the link is closed
    q = vhost.queues.get(message.routing_key)
    if q is None or isinstance(q, ProxyQueue):
        # not (or no longer) mastered here: the forwarding node's publisher gets a nack
        if seq:
            channel.confirm_decided(seq, False)
        return True
    accepted = q.enqueue(original)
    if seq:
        if accepted and q.store is not None and (original.persistent or q.confirms_later):
            vhost.store.when_durable(
                lambda s=seq: channel.confirm_decided(s, True, external=True),
                on_failure=lambda s=seq: channel.confirm_decided(s, False, external=True))
        else:
            channel.confirm_decided(seq, accepted)
    return True
