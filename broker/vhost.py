"""A virtual host: its exchanges, queues and bindings, and routing between them.

Every operation raises ``ChannelException``/``ConnectionException`` with the
code and text RabbitMQ sends, so the channel layer only translates.
"""
from __future__ import annotations

import base64
import logging
import os

from .amqp import spec
from .amqp.connection import ChannelException, ConnectionException
from .exchanges import EXCHANGE_TYPES, Binding, Exchange
from .exchanges.default import DefaultExchange
from .exchanges.headers import match_mode
from .queues.args import (
    ArgumentError,
    TypeArgumentError,
    equivalence_mismatch,
    parse_queue_arguments,
)
from .queues.queue import Queue

log = logging.getLogger("broker.vhost")

STANDARD_EXCHANGES = (("amq.direct", "direct"), ("amq.fanout", "fanout"), ("amq.topic", "topic"),
                      ("amq.headers", "headers"), ("amq.match", "headers"))


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _stored(destination) -> bool:
    if destination.kind == "queue":
        return destination.store is not None
    return destination.durable


def _quoted(value) -> str:
    return "none" if value is None else f"'{value}'"


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


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
        self.on_queue_deleted = []  # callbacks(queue, consumers)

    # ---- naming helpers ----
    def _no_exchange(self, name: str) -> str:
        return f"NOT_FOUND - no exchange '{name}' in vhost '{self.name}'"

    def _no_queue(self, name: str) -> str:
        return f"NOT_FOUND - no queue '{name}' in vhost '{self.name}'"

    def _locked(self, name: str) -> str:
        return (f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost "
                f"'{self.name}'. It could be originally declared on another connection or the "
                f"exclusive property value does not match that of the original declaration.")

    def get_exchange(self, name: str, method=None) -> Exchange:
        x = self.exchanges.get(name)
        if x is None:
            raise ChannelException(spec.NOT_FOUND, self._no_exchange(name), method)
        return x

    def get_queue(self, name: str, owner, method=None) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise ChannelException(spec.NOT_FOUND, self._no_queue(name), method)
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise ChannelException(spec.RESOURCE_LOCKED, self._locked(name), method)
        return q

    # ---- exchanges ----
    def declare_exchange(self, m, persist: bool = True) -> Exchange:
        name = m.exchange
        if m.passive:
            if name == "":
                return self.exchanges[""]
            return self.get_exchange(name, m)
        if name == "":
            raise ChannelException(spec.ACCESS_REFUSED,
                                   "ACCESS_REFUSED - operation not permitted on the default exchange", m)
        if name.startswith("amq.") and name not in self.exchanges:
            raise ChannelException(
                spec.ACCESS_REFUSED,
                f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'", m)
        xtype = EXCHANGE_TYPES.get(m.type)
        if xtype is None:
            raise ConnectionException(spec.COMMAND_INVALID,
                                      f"COMMAND_INVALID - unknown exchange type '{m.type}'", m)
        args = m.arguments or {}
        self._validate_exchange_args(xtype, args, m)
        existing = self.exchanges.get(name)
        if existing is not None:
            for arg, have, want in (("type", existing.type_name, m.type),
                                    ("durable", _b(existing.durable), _b(m.durable)),
                                    ("auto_delete", _b(existing.auto_delete), _b(m.auto_delete)),
                                    ("internal", _b(existing.internal), _b(m.internal))):
                if have != want:
                    raise ChannelException(
                        spec.PRECONDITION_FAILED,
                        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange '{name}' in vhost "
                        f"'{self.name}': received '{want}' but current is '{have}'", m)
            have_ae = _text(existing.arguments.get("alternate-exchange"))
            want_ae = _text(args.get("alternate-exchange"))
            if have_ae != want_ae:
                raise ChannelException(
                    spec.PRECONDITION_FAILED,
                    f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{name}' "
                    f"in vhost '{self.name}': received {_quoted(want_ae)} but current is "
                    f"{_quoted(have_ae)}", m)
            return existing
        x = xtype(name, durable=m.durable, auto_delete=m.auto_delete, internal=m.internal,
                  arguments=args)
        self.exchanges[name] = x
        if persist and x.durable and self.store is not None:
            self.store.save_exchange(self, x)
        return x

    def _validate_exchange_args(self, xtype, args: dict, m) -> None:
        ae = args.get("alternate-exchange")
        if ae is not None and not isinstance(ae, (bytes, str)):
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - invalid arg 'alternate-exchange' for exchange '{m.exchange}' in "
                f"vhost '{self.name}': {{unacceptable_type,{type(ae).__name__}}}", m)
        extra_check = getattr(xtype, "validate_arguments", None)
        if extra_check is not None:
            problem = extra_check(args)
            if problem:
                raise ChannelException(spec.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {problem}", m)

    def delete_exchange(self, m) -> None:
        name = m.exchange
        if name == "":
            raise ChannelException(
                spec.ACCESS_REFUSED, "ACCESS_REFUSED - operation not permitted on the default exchange",
                m)
        if name.startswith("amq."):
            raise ChannelException(
                spec.ACCESS_REFUSED,
                f"ACCESS_REFUSED - deletion of system exchange '{name}' in vhost '{self.name}' not "
                f"allowed", m)
        x = self.exchanges.get(name)
        if x is None:
            return  # idempotent, as RabbitMQ 3.x
        if m.if_unused and x.has_bindings:
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - exchange '{name}' in vhost '{self.name}' in use", m)
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
    def _check_binding_args(self, source: Exchange, arguments: dict, m) -> None:
        if source.type_name == "headers" and match_mode(arguments or {}) is None:
            mode = arguments.get("x-match")
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - Invalid x-match field value <<\"{_text(mode)}\">>; expected "
                f"all, any, all-with-x, or any-with-x", m)

    def bind(self, source_name: str, destination, routing_key: str, arguments: dict, m,
             persist: bool = True) -> None:
        if source_name == "":
            raise ChannelException(spec.ACCESS_REFUSED,
                                   "ACCESS_REFUSED - operation not permitted on the default exchange", m)
        source = self.get_exchange(source_name, m)
        self._check_binding_args(source, arguments, m)
        binding = Binding(source_name, destination, routing_key, arguments)
        if source.add_binding(binding):
            if destination.kind == "queue":
                destination.bindings.add((source_name, binding.key))
            if persist and self.store is not None and source.durable and _stored(destination):
                self.store.save_binding(self, binding)

    def unbind(self, source_name: str, destination, routing_key: str, arguments: dict, owner=None,
               m=None) -> None:
        """Remove a binding; idempotent as in RabbitMQ: a missing source, destination
        (``None``) or binding is not an error. Only an existing binding to another connection's
        exclusive queue is refused. The default-exchange checks are the caller's."""
        source = self.exchanges.get(source_name)
        if source is None or destination is None:
            return
        key = Binding(source_name, destination, routing_key, arguments).key
        if key not in source.bindings:
            return
        if destination.kind == "queue" and destination.exclusive_owner is not None \
                and destination.exclusive_owner is not owner:
            raise ChannelException(spec.RESOURCE_LOCKED, self._locked(destination.name), m)
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
    def declare_queue(self, m, owner) -> Queue:
        name = m.queue
        if m.passive:
            if name == "":
                raise ChannelException(spec.NOT_FOUND, self._no_queue(name), m)
            return self.get_queue(name, owner, m)
        if name == "":
            name = "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        elif name.startswith("amq."):
            raise ChannelException(
                spec.ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'", m)
        args = m.arguments or {}
        try:
            opts = parse_queue_arguments(args)
        except TypeArgumentError as exc:
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - invalid type '{exc.detail}' for arg '{exc.name}' in queue "
                f"'{name}' in vhost '{self.name}'", m) from None
        except ArgumentError as exc:
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - invalid arg '{exc.name}' for queue '{name}' in vhost "
                f"'{self.name}': {exc.detail}", m) from None
        existing = self.queues.get(name)
        if existing is not None:
            if existing.exclusive_owner is not None and existing.exclusive_owner is not owner:
                raise ChannelException(spec.RESOURCE_LOCKED, self._locked(name), m)
            checks = [("auto_delete", existing.auto_delete, m.auto_delete)]
            if existing.exclusive_owner is None:  # RabbitMQ skips 'durable' for exclusive queues
                checks.insert(0, ("durable", existing.durable, m.durable))
            for arg, have, want in checks:
                if have != want:
                    raise ChannelException(
                        spec.PRECONDITION_FAILED,
                        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{name}' in vhost "
                        f"'{self.name}': received '{_b(want)}' but current is '{_b(have)}'", m)
            if (existing.exclusive_owner is not None) != bool(m.exclusive):
                raise ChannelException(spec.RESOURCE_LOCKED, self._locked(name), m)
            mismatch = equivalence_mismatch(existing.arguments, args)
            if mismatch:
                raise ChannelException(
                    spec.PRECONDITION_FAILED,
                    "PRECONDITION_FAILED - " + mismatch.format(queue=name, vhost=self.name), m)
            existing.touch()
            return existing
        q = Queue(self, name, durable=m.durable, exclusive_owner=owner if m.exclusive else None,
                  auto_delete=m.auto_delete, arguments=args, opts=opts)
        self.add_queue(q)
        return q

    def add_queue(self, q: Queue, persist: bool = True) -> None:
        self.queues[q.name] = q
        # Exclusive queues die with their connection, so they are never stored (as RabbitMQ).
        if q.durable and self.store is not None and q.exclusive_owner is None:
            q.store = self.store
            if persist:
                self.store.save_queue(self, q)

    def delete_queue(self, q: Queue, reason: str = "deleted") -> int:
        if self.queues.get(q.name) is not q:
            return 0
        count = q.message_count
        del self.queues[q.name]
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

    def delete_queue_checked(self, m, owner) -> int:
        q = self.queues.get(m.queue)
        if q is None:
            return 0
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise ChannelException(spec.RESOURCE_LOCKED, self._locked(m.queue), m)
        if m.if_unused and q.consumers:
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - queue '{m.queue}' in vhost '{self.name}' in use", m)
        if m.if_empty and q.message_count:
            raise ChannelException(
                spec.PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - queue '{m.queue}' in vhost '{self.name}' not empty", m)
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
        headers = message.properties.get("headers") if message is not None else None
        keys = None
        if headers and ("CC" in headers or "BCC" in headers):
            keys = [routing_key]
            for h in ("CC", "BCC"):
                extra = headers.get(h)
                if isinstance(extra, list):
                    keys.extend(_text(k) for k in extra)
        if keys is None and x.type_name == "direct" and not x.alternate_exchange:
            # the common case: one exchange, one key, no e2e bindings to follow
            dests = x.route(routing_key, headers)
            if all(d.kind == "queue" for d in dests):
                return dests if len(dests) < 2 else list(dict.fromkeys(dests))
        queues: dict = {}
        self._route_into(x, keys or [routing_key], headers, queues, set())
        return list(queues)

    def _route_into(self, x: Exchange, keys: list, headers, queues: dict, seen: set) -> None:
        seen.add(x.name)
        found = False
        for key in keys:
            for dest in x.route(key, headers):
                if dest.kind == "queue":
                    queues[dest] = None
                    found = True
                elif dest.name not in seen:
                    before = len(queues)
                    self._route_into(dest, keys, headers, queues, seen)
                    found = found or len(queues) > before
        if not found and x.alternate_exchange:
            ae = self.exchanges.get(x.alternate_exchange)
            if ae is not None and ae.name not in seen:
                self._route_into(ae, keys, headers, queues, seen)
