"""The AMQP 0-9-1 channel's exchange and queue methods (declare, bind, purge, delete) and
their permission checks; not basic.*, publishing or settlement (amqp_channel.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import errors
from ..amqp import spec
from ..direct_reply import REPLY_PREFIX, REPLY_QUEUE

if TYPE_CHECKING:
    from ..vhost import VirtualHost


class EntityMethods:
    """Mixed into ``Channel``: what these methods use of it."""
    authz: Any
    vhost: VirtualHost
    session: Any
    last_queue: str | None
    _deferred_cancels: list | None

    def reply(self, method: spec.Method) -> None:
        raise NotImplementedError

    def reply_when_durable(self, store: Any, method: spec.Method) -> None:
        raise NotImplementedError

    def _reply_stored(self, method: spec.Method) -> None:
        """``method`` once the vhost's store has the definition change (a cluster's: once
        every live node applied it, so the client's next connection finds it anywhere)."""
        if self.vhost.store is None:
            self.reply(method)
        else:
            self.reply_when_durable(self.vhost.store, method)

    # ---- exchange class ----
    def on_exchange_declare(self, m) -> None:
        authz = self.authz
        if authz is not None and not m.passive and m.exchange:
            authz.check("exchange", m.exchange, "configure")
            ae = (m.arguments or {}).get("alternate-exchange")
            if isinstance(ae, (str, bytes)) and m.exchange not in self.vhost.exchanges:
                authz.check("exchange", m.exchange, "read")
                authz.check("exchange", ae.decode() if isinstance(ae, bytes) else ae, "write")
        self.vhost.declare_exchange(m.exchange, m.type, passive=m.passive, durable=m.durable,
                                    auto_delete=m.auto_delete, internal=m.internal,
                                    arguments=m.arguments)
        if not m.nowait:
            self._reply_stored(spec.Exchange.DeclareOk())

    def on_exchange_delete(self, m) -> None:
        if self.authz is not None and m.exchange and not m.exchange.startswith("amq."):
            self.authz.check("exchange", m.exchange, "configure")
        self.vhost.delete_exchange(m.exchange, if_unused=m.if_unused)
        if not m.nowait:
            self._reply_stored(spec.Exchange.DeleteOk())

    def _authorize_binding(self, kind: str, destination: str, source: str, key: str) -> None:
        """RabbitMQ's binding checks: write on the destination, read on the source, and
        the topic permission (read) of a topic source on the binding key."""
        authz = self.authz
        if authz is None:
            return
        authz.check(kind, destination, "write")
        if source == "" or (kind == "exchange" and destination == ""):
            return  # refused by the operation itself (the default exchange)
        authz.check("exchange", source, "read")
        x = self.vhost.exchanges.get(source)
        if x is not None and authz.topics and x.type_name == "topic":
            authz.check_topic(source, key, "read")

    def on_exchange_bind(self, m) -> None:
        self._authorize_binding("exchange", m.destination, m.source, m.routing_key)
        dest = self.vhost.get_exchange(m.destination)
        if m.destination == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        self.vhost.bind(m.source, dest, m.routing_key, m.arguments)
        if not m.nowait:
            self._reply_stored(spec.Exchange.BindOk())

    def on_exchange_unbind(self, m) -> None:
        self._authorize_binding("exchange", m.destination, m.source, m.routing_key)
        if m.destination == "" or m.source == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        self.vhost.unbind(m.source, self.vhost.exchanges.get(m.destination), m.routing_key,
                          m.arguments)
        if not m.nowait:
            self._reply_stored(spec.Exchange.UnbindOk())

    # ---- queue class ----
    def _queue_name(self, name: str) -> str:
        if name == "":
            if self.last_queue is None:
                raise errors.amqp_error("not_found", "no previously declared queue")
            return self.last_queue
        return name

    def _authorize_queue(self, name: str, arguments: dict) -> None:
        """queue.declare of ``name`` (server-named ones too): configure on it; with a
        dead-letter exchange, read on it and write on that exchange; then max-queues."""
        authz = self.authz
        if authz is None:
            return
        authz.check("queue", name, "configure")
        dlx = (arguments or {}).get("x-dead-letter-exchange")
        if isinstance(dlx, (str, bytes)):
            authz.check("queue", name, "read")
            authz.check("exchange", dlx.decode() if isinstance(dlx, bytes) else dlx, "write")
        if name not in self.vhost.queues:
            self.session.broker.access.check_queue_limit(self.vhost, name)

    def on_queue_declare(self, m) -> None:
        if m.queue.startswith(REPLY_QUEUE) and self._declare_reply_queue(m):
            return
        q = self.vhost.declare_queue(
            m.queue, self.session,
            None if self.authz is None or m.passive
            else lambda name: self._authorize_queue(name, m.arguments),
            passive=m.passive, durable=m.durable, exclusive=m.exclusive,
            auto_delete=m.auto_delete, arguments=m.arguments)
        self.last_queue = q.name
        if m.nowait:
            return
        ok = spec.Queue.DeclareOk(q.name, q.message_count, q.consumer_count)
        if q.store is None and (q.exclusive_owner is not None or m.passive):  # no one else sees it
            self.reply(ok)
        else:
            # acknowledged once the definition is durable (a crash must not lose the queue)
            # and, transient too, known to every cluster node (others may use it at once)
            self._reply_stored(ok)

    def _declare_reply_queue(self, m) -> bool:
        """RabbitMQ's answers for the direct reply-to pseudo-queue (0 messages, 1 consumer)
        and, passively, for a reply name whose requester is live; False: not one of those."""
        name = m.queue
        if name != REPLY_QUEUE:
            if not (m.passive and name.startswith(REPLY_PREFIX)):
                return False
            if not self.session.broker.direct_reply.exists(name):
                raise errors.not_found(self.vhost.queue_resource(name))
        self.last_queue = name
        if not m.nowait:
            self.reply(spec.Queue.DeclareOk(name, 0, 1))
        return True

    def on_queue_bind(self, m) -> None:
        self._authorize_binding("queue", self._queue_name(m.queue), m.exchange, m.routing_key)
        q = self.vhost.get_queue(self._queue_name(m.queue), self.session)
        self.vhost.bind(m.exchange, q, m.routing_key, m.arguments)
        if not m.nowait:
            self._reply_stored(spec.Queue.BindOk())

    def on_queue_unbind(self, m) -> None:
        self._authorize_binding("queue", self._queue_name(m.queue), m.exchange, m.routing_key)
        if m.exchange == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        self.vhost.unbind(m.exchange, self.vhost.find_queue(self._queue_name(m.queue)),
                          m.routing_key, m.arguments, self.session)
        self._reply_stored(spec.Queue.UnbindOk())

    def on_queue_purge(self, m) -> None:
        if self.authz is not None:
            self.authz.check("queue", self._queue_name(m.queue), "read")
        q = self.vhost.get_queue(self._queue_name(m.queue), self.session)
        count = q.purge()
        if not m.nowait:
            self.reply(spec.Queue.PurgeOk(count))

    def on_queue_delete(self, m) -> None:
        name = self._queue_name(m.queue)
        if self.authz is not None:
            self.authz.check("queue", name, "configure")
        # RabbitMQ sends delete-ok before the basic.cancel of this channel's own consumers.
        self._deferred_cancels = []
        try:
            count = self.vhost.delete_queue_checked(name, self.session, if_unused=m.if_unused,
                                                    if_empty=m.if_empty)
        finally:
            deferred, self._deferred_cancels = self._deferred_cancels, None
        if not m.nowait:
            self._reply_stored(spec.Queue.DeleteOk(count))
        for tag in deferred:
            self.reply(spec.Basic.Cancel(tag, True))
