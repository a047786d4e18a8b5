"""A virtual host: its exchanges, queues and bindings, and routing between them.

Every operation raises ``errors.AMQPError`` by name (``not_found``,
``precondition_failed``, ...) with RabbitMQ's explanation; broker/errors.py
decides codes, texts and channel-vs-connection closes.
"""
from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from . import errors
from .churn import Churn
from .direct_reply import REPLY_PREFIX, DirectReply
from .errors import Resource
from .exchanges import EXCHANGE_TYPES, Binding, Exchange
from .exchanges.default import DefaultExchange
from .publishing import Publishing
from .queues.args import (
    ArgumentError,
    TypeArgumentError,
    equivalence_mismatch,
    parse_queue_arguments,
)
from .queues.queue import Consumer, Queue
from .queues.types import CLASSIC, QUEUE_TYPES, make_queue, queue_type_of
from .routing import RESOLVERS
from .schemas import exchange as avro_exchange

if TYPE_CHECKING:
    from .streams.log import StreamStore

log = logging.getLogger("broker.vhost")

STANDARD_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                      ("amq.headers", "headers"), ("amq.match", "headers"))


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _stored(destination) -> bool:
    if destination.kind == "queue":
        return destination.store is not None
    return destination.durable


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


class EntityPolicies(Protocol):
    """What a vhost tells the policies (``broker/policies``) of its new entities."""

    def exchange_added(self, vhost: VirtualHost, exchange: Exchange) -> None: ...

    def queue_added(self, vhost: VirtualHost, queue: Queue) -> None: ...


@dataclass
class QueueDeclaration:
    """A queue a client declares, as a store's placement (``Store.check_placement``) reads
    it: the arguments as the client sent them."""
    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict


class VirtualHost:
    def __init__(self, name: str, timers, store=None):
        self.name = name
        self.timers = timers
        self.store = store
        self.queues: dict[str, Queue] = {}
        self.exchanges: dict[str, Exchange] = {}
        self.exchanges[""] = DefaultExchange(self.queues)
        for xname, xtype in STANDARD_EXCHANGES:
            self.exchanges[xname] = EXCHANGE_TYPES[xtype](xname, durable=True)
        self.on_queue_deleted: list[Callable[[Queue, list[Consumer]], None]] = []  # (queue, consumers)
        self.on_queue_added: list[Callable[[Queue], None]] = []  # declared or recovered (audit)
        self.churn = Churn()  # the broker's own, once it owns this vhost
        # broker/policies, once this vhost has any: new entities ask it
        self.policies: EntityPolicies | None = None
        # metadata default_queue_type (RabbitMQ 3.11+): the type of a new queue declared
        # without x-queue-type, where the type allows the declare (``with_default_type``)
        self.default_queue_type: str | None = None
        # the broker's direct reply-to consumers (Broker.create_vhost sets it)
        self.direct_reply: DirectReply | None = None
        # names standing for destinations created on first use (routing/): asked on misses only
        self.resolvers = list(RESOLVERS)
        # where stream queues keep their logs (``streams.log.StreamStore``; the broker's)
        self.streams: StreamStore | None = None
        # the publish path broker features re-enter routing through (dead letters); the
        # broker's once it owns this vhost
        self.publishing = Publishing.bare()

    # ---- naming helpers ----
    def exchange_resource(self, name: str) -> Resource:
        return Resource("exchange", name, self.name)

    def queue_resource(self, name: str) -> Resource:
        return Resource("queue", name, self.name)

    def get_exchange(self, name: str) -> Exchange:
        x = self.exchanges.get(name)
        if x is None:
            raise errors.not_found(self.exchange_resource(name))
        return x

    def find_queue(self, name: str) -> Queue | None:
        """The queue ``name`` as clients see it: None if missing or broker-internal."""
        q = self.queues.get(name)
        return None if q is None or q.internal else q

    def get_queue(self, name: str, owner) -> Queue:
        q = self.find_queue(name)
        if q is None:
            q = self.resolve_queue(name)
            if q is None:
                raise errors.not_found(self.queue_resource(name))
        self.check_owner(q, owner)
        return q

    def check_owner(self, q: Queue, owner) -> None:
        """405 unless ``owner`` may use ``q`` (not another connection's exclusive queue)."""
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise errors.resource_locked(self.queue_resource(q.name))

    # ---- exchanges ----
    def declare_exchange(self, name: str, type: str = "direct", *, passive: bool = False,
                         durable: bool = False, auto_delete: bool = False,
                         internal: bool = False, arguments: dict | None = None,
                         persist: bool = True) -> Exchange:
        """exchange.declare, in plain keywords."""
        if passive:
            if name == "":
                return self.exchanges[""]
            return self.get_exchange(name)
        if name == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        if name.startswith("amq.") and name not in self.exchanges:
            raise errors.access_refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        xtype = EXCHANGE_TYPES.get(type)
        if xtype is None:
            raise errors.command_invalid(f"unknown exchange type '{type}'")
        args = arguments or {}
        if durable and self.store is not None and (
                why := self.store.unstorable(name, args)) is not None:
            raise errors.precondition_failed(f"{why}: {self.exchange_resource(name)}")
        xtype.validate(args, self.exchange_resource(name))
        if avro_exchange.ARG in args:
            avro_exchange.validate_arguments(args, self.exchange_resource(name))
        existing = self.exchanges.get(name)
        if existing is not None:
            existing.check_equivalent(type, durable, auto_delete, internal, args,
                                      self.exchange_resource(name))
            return existing
        x = xtype(name, durable=durable, auto_delete=auto_delete, internal=internal,
                  arguments=args)
        self.exchanges[name] = x
        if self.policies is not None:
            self.policies.exchange_added(self, x)
        if persist and x.durable and self.store is not None:
            self.store.save_exchange(self, x)
        if persist:
            x.declared(self)
        return x

    def delete_exchange(self, name: str, *, if_unused: bool = False) -> None:
        """exchange.delete."""
        if name == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise errors.access_refused("deletion of system %s not allowed",
                                        self.exchange_resource(name))
        x = self.exchanges.get(name)
        if x is None:
            return  # idempotent, as RabbitMQ 3.x
        if if_unused and x.has_bindings:
            raise errors.precondition_failed("%s in use", self.exchange_resource(name))
        self._remove_exchange(x)

    def _remove_exchange(self, x: Exchange) -> None:
        if self.exchanges.get(x.name) is not x:
            return
        del self.exchanges[x.name]
        for binding in list(x.bindings.values()):
            x.remove_binding(binding.key)
            self._forget_binding(binding)
        # bindings where this exchange is the destination
        for other in list(self.exchanges.values()):
            for binding in [b for b in other.bindings.values() if b.destination is x]:
                other.remove_binding(binding.key)
                self._after_unbind(other)
        if x.durable and self.store is not None:
            self.store.delete_exchange(self, x)

    # ---- bindings ----
    def bind(self, source_name: str, destination, routing_key: str, arguments: dict,
             persist: bool = True) -> None:
        if source_name == "":
            raise errors.access_refused("operation not permitted on the default exchange")
        source = self.get_exchange(source_name)
        source.validate_binding(routing_key, arguments)
        if persist and self.store is not None and source.durable and _stored(destination) and (
                why := self.store.unstorable(routing_key, arguments, key=True)) is not None:
            raise errors.precondition_failed(
                f"routing key: {why}: binding from {self.exchange_resource(source_name)}")
        binding = Binding(source_name, destination, routing_key, arguments)
        if source.add_binding(binding):
            if destination.kind == "queue":
                destination.bindings.add((source_name, binding.key))
            if persist and self.store is not None and source.durable and _stored(destination):
                self.store.save_binding(self, binding)

    def unbind(self, source_name: str, destination, routing_key: str, arguments: dict,
               owner=None) -> None:
        """Remove a binding; idempotent as in RabbitMQ: a missing source, destination
        (``None``) or binding is not an error. Only an existing binding to another connection's
        exclusive queue is refused. The default-exchange checks are the caller's."""
        source = self.exchanges.get(source_name)
        if source is None or destination is None:
            return
        key = Binding(source_name, destination, routing_key, arguments).key
        if key not in source.bindings:
            return
        if destination.kind == "queue":
            self.check_owner(destination, owner)
        binding = source.remove_binding(key)
        if binding is not None:
            self._forget_binding(binding)
            self._after_unbind(source)

    def _forget_binding(self, binding: Binding) -> None:
        dest = binding.destination
        if dest.kind == "queue":
            dest.bindings.discard((binding.source, binding.key))
        if self.store is not None:
            src = self.exchanges.get(binding.source)
            if _stored(dest) and (src is None or src.durable):
                self.store.delete_binding(self, binding)

    def _after_unbind(self, source: Exchange) -> None:
        if source.auto_delete and not source.has_bindings:
            self._remove_exchange(source)

    # ---- queues ----
    def declare_queue(self, name: str = "", owner=None,
                      authorize: Callable[[str], None] | None = None, *, passive: bool = False,
                      durable: bool = False, exclusive: bool = False, auto_delete: bool = False,
                      arguments: dict | None = None) -> Queue:
        """queue.declare, in plain keywords (``name`` "": server-named); ``authorize(name)``
        (permissions, limits) runs once the name is known, before anything is created."""
        self.churn.queues_declared += 1
        server_named = name == ""
        if passive:
            if name == "":
                raise errors.not_found(self.queue_resource(name))
            q = self.get_queue(name, owner)
            q.touch()  # a passive declare is a use for x-expires, as RabbitMQ's queue.stat
            return q
        if name == "":
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        elif name.startswith("amq."):
            raise errors.access_refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        if authorize is not None:
            authorize(name)
        existing = self.queues.get(name)
        declaration = QueueDeclaration(name, durable, exclusive, auto_delete, arguments or {})
        args = self.with_default_type(declaration.arguments, existing,
                                      server_named=server_named, durable=durable,
                                      exclusive=exclusive, auto_delete=auto_delete)
        resource = self.queue_resource(name)
        if durable and self.store is not None and (
                why := self.store.unstorable(name, args)) is not None:
            raise errors.precondition_failed(f"{why}: {resource}")
        try:
            opts = parse_queue_arguments(args)
        except TypeArgumentError as exc:
            raise errors.precondition_failed("invalid type '%s' for arg '%s' in %s", exc.detail,
                                             exc.name, resource) from None
        except ArgumentError as exc:
            raise queue_type_of(args).argument_error(resource, exc) from None
        if existing is not None:
            self.check_owner(existing, owner)
            checks = [("auto_delete", existing.auto_delete, auto_delete)]
            if existing.exclusive_owner is None:  # RabbitMQ skips 'durable' for exclusive queues
                checks.insert(0, ("durable", existing.durable, durable))
            for arg, have, want in checks:
                if have != want:
                    raise errors.precondition_failed(
                        "inequivalent arg '%s' for %s: received '%s' but current is '%s'", arg,
                        resource, _b(want), _b(have))
            if (existing.exclusive_owner is not None) != bool(exclusive):
                raise errors.resource_locked(resource)
            mismatch = equivalence_mismatch(existing.arguments, args)
            if mismatch:
                raise errors.precondition_failed(mismatch.format(queue=name, vhost=self.name))
            existing.touch()
            return existing
        queue_type_of(args).check_declare(resource, durable, exclusive, auto_delete, args)
        if durable and not exclusive and self.store is not None:
            # a cluster's store places the queue's master (404 while its home node is
            # down); another node's master: the proxy that forwards to it
            placed = self.store.check_placement(self, name, declaration)
            if placed is not None:
                return placed
        q = make_queue(self, name, fresh=True, durable=durable,
                       exclusive_owner=owner if exclusive else None,
                       auto_delete=auto_delete, arguments=args, opts=opts)
        self.add_queue(q)
        self.churn.queues_created += 1
        for resolver in self.resolvers:
            resolver.queue_declared(self, q)
        return q

    def with_default_type(self, args: dict, existing: Queue | None, *, server_named: bool,
                          durable: bool, exclusive: bool, auto_delete: bool) -> dict:
        """``args`` with the vhost's default queue type when they name none, as RabbitMQ's
        ``rabbit_amqqueue:augment_declare_args``: only where the type takes the declare's
        properties (a quorum default leaves exclusive, auto-delete, transient and
        server-named queues classic). An existing queue keeps its type: a redeclare
        without x-queue-type matches it when it is the default's."""
        dqt = self.default_queue_type
        if not dqt or "x-queue-type" in args or dqt not in QUEUE_TYPES:
            return args
        qtype = QUEUE_TYPES[dqt]
        if existing is not None:
            if existing.queue_type is not qtype:
                return args
        elif ((exclusive and not qtype.exclusive) or (auto_delete and not qtype.auto_delete)
              or (not durable and not qtype.transient)
              or (server_named and qtype is not CLASSIC)):
            return args
        return {**args, "x-queue-type": dqt}

    def ensure_queue(self, name: str, durable: bool, arguments: dict) -> Queue:
        """The queue ``name``, declared as a client would if it does not exist (for
        entities an exchange owns); an existing one is returned as it is."""
        q = self.queues.get(name)
        if q is None:
            q = make_queue(self, name, fresh=True, durable=durable, arguments=arguments,
                           opts=parse_queue_arguments(arguments))
            self.add_queue(q)
        return q

    def add_queue(self, q: Queue, persist: bool = True) -> None:
        self.queues[q.name] = q
        if self.policies is not None and not q.internal:
            self.policies.queue_added(self, q)
        if self.store is not None and q.keeps_definition:
            # a store wrapper (the cluster's) names the store messages go to
            q.attach_store(self.store.message_store)
            if persist:
                self.store.save_queue(self, q)
        for callback in self.on_queue_added:
            callback(q)

    def delete_queue(self, q: Queue, reason: str = "deleted") -> int:
        if self.queues.get(q.name) is not q:
            return 0
        count = q.message_count if q.queue_type.counts_on_delete else 0
        del self.queues[q.name]
        self.churn.queues_deleted += 1
        self.churn.retire(q)
        for source_name, key in list(q.bindings):
            source = self.exchanges.get(source_name)
            if source is not None:
                binding = source.remove_binding(key)
                if binding is not None:
                    self._after_unbind(source)
        q.bindings.clear()
        consumers = q.on_deleted()
        if q.store is not None:
            self.store.delete_queue(self, q)
        for callback in self.on_queue_deleted:
            callback(q, consumers)
        log.debug("queue %r deleted (%s)", q.name, reason)
        return count

    def delete_queue_checked(self, name: str, owner, *, if_unused: bool = False,
                             if_empty: bool = False) -> int:
        """queue.delete."""
        q = self.find_queue(name)
        if q is None:
            return 0
        self.check_owner(q, owner)
        if if_unused and q.consumers:
            raise errors.precondition_failed("%s in use", self.queue_resource(name))
        if if_empty and q.message_count:
            raise errors.precondition_failed("%s not empty", self.queue_resource(name))
        return self.delete_queue(q)

    def drop_owner(self, owner) -> None:
        """The owning connection is gone: its exclusive queues go with it."""
        for q in [q for q in self.queues.values() if q.exclusive_owner is owner]:
            self.delete_queue(q, reason="owner closed")

    # ---- routing ----
    def route(self, exchange_name: str, routing_key: str, message) -> list:
        """Queues a message published to ``exchange_name`` reaches (deduplicated).

        Follows exchange-to-exchange bindings (each exchange visited once) and
        alternate exchanges; CC/BCC headers add routing keys as in RabbitMQ.
        """
        x = self.exchanges.get(exchange_name)
        if x is None:
            return []
        x.stats_publish_in += 1
        properties = message.properties if message is not None else None
        headers = properties.get("headers") if properties is not None else None
        keys = None
        if headers and ("CC" in headers or "BCC" in headers):
            keys = [routing_key]
            for h in ("CC", "BCC"):
                extra = headers.get(h)
                if isinstance(extra, list):
                    keys.extend(_text(k) for k in extra)
        if keys is None and not x.alternate_exchange:
            # the common case: one exchange, one key, no e2e bindings or alternate to follow
            dests = x.route(routing_key, headers, properties)
            if all(d.kind == "queue" for d in dests):
                if not dests and not exchange_name:
                    if routing_key.startswith(REPLY_PREFIX):
                        self._route_reply(message)
                        return []
                    if self.resolvers:
                        found = self._route_resolved(routing_key, message)
                        x.stats_publish_out += len(found)
                        return found
                if len(dests) > 1:
                    dests = list(dict.fromkeys(dests))
                x.stats_publish_out += len(dests)
                return dests
        queues: dict = {}
        self._route_into(x, keys or [routing_key], headers, properties, queues, set())
        x.stats_publish_out += len(queues)
        return list(queues)

    def _route_reply(self, message) -> None:
        """A default-exchange key naming a direct reply-to requester (no queue can have
        that name: amq. is reserved): the reply goes straight to its consumer, whichever
        protocol published it (AMQP, the HTTP API, a transaction's check-back, STOMP,
        MQTT); it reaches no queue, so the publisher sees it unroutable, as on RabbitMQ."""
        if message is not None and self.direct_reply is not None:
            self.direct_reply.route(self.name, message)

    # ---- destinations created on first use (routing/: virtual topics, composites) ----
    def resolve_exchange(self, name: str) -> Exchange | None:
        """The exchange a missing name stands for, created now; None if none does."""
        for resolver in self.resolvers:
            x = resolver.exchange(self, name)
            if x is not None:
                return x
        return None

    def resolve_queue(self, name: str) -> Queue | None:
        """The queue a missing name stands for, created and bound now; None if none does."""
        for resolver in self.resolvers:
            q = resolver.queue(self, name)
            if q is not None:
                return q
        return None

    def _route_resolved(self, routing_key: str, message) -> list:
        # a default-exchange key that names no queue may name a virtual topic or a composite
        for resolver in self.resolvers:
            name = resolver.route_key(self, routing_key)
            if name is not None and name in self.exchanges:
                return self.route(name, routing_key, message)
        return []

    def _route_into(self, x: Exchange, keys: list, headers, properties, queues: dict,
                    seen: set) -> None:
        seen.add(x.name)
        found = False
        for key in keys:
            for dest in x.route(key, headers, properties):
                if dest.kind == "queue":
                    queues[dest] = None
                    found = True
                elif dest.name not in seen:
                    before = len(queues)
                    self._route_into(dest, keys, headers, properties, queues, seen)
                    found = found or len(queues) > before
        if not found and x.alternate_exchange:
            ae = self.exchanges.get(x.alternate_exchange)
            if ae is not None and ae.name not in seen:
                self._route_into(ae, keys, headers, properties, queues, seen)
