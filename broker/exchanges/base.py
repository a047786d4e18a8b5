"""The exchange-type contract (``ExchangeType``) and the base every type builds on.

An exchange type is one module in this package: a subclass of ``Exchange`` that
indexes bindings for its routing rule, registered by type name in
``broker/exchanges/__init__.py``. The vhost never looks at a type's name: it asks the
type to validate its declaration, its bindings and a redeclaration's equivalence.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeAlias, runtime_checkable

from .. import errors
from ..errors import Resource

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..vhost import VirtualHost

    #: Where a binding points, what routing returns: a queue or an exchange.
    Destination: TypeAlias = "Queue | Exchange"
    #: A binding's identity: (destination kind, destination name, routing key, arguments
    #: frozen by ``_freeze``).
    BindingKey: TypeAlias = tuple[str, str, str, Any]


@runtime_checkable
class ExchangeType(Protocol):
    """What the vhost and the channel require of an exchange, whatever its type.

    Every method is synchronous and runs on the broker's event loop: none may block.
    An exchange owns its bindings table and its routing index, nothing else; the
    destinations it returns are owned by the vhost.
    """

    kind: ClassVar[str]  # "exchange" (queues say "queue"): bindings may point at either
    type_name: ClassVar[str]  # the AMQP type name clients declare, e.g. "topic"
    name: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]
    alternate_exchange: str | None
    bindings: dict[BindingKey, Binding]

    @classmethod
    def validate(cls, arguments: dict[str, Any], resource: Resource) -> None:
        """Check the arguments of exchange.declare before anything is created.

        Returns None. Raises ``errors.AMQPError`` (406 PRECONDITION_FAILED, naming
        ``resource``) for arguments this type refuses; nothing has changed then.
        """

    def check_equivalent(self, type_name: str, durable: bool, auto_delete: bool, internal: bool,
                         arguments: dict[str, Any], resource: Resource) -> None:
        """Check a redeclaration against this exchange, as RabbitMQ's equivalence rules.

        Returns None when equivalent. Raises ``errors.AMQPError`` 406 naming the first
        inequivalent argument; the exchange is unchanged either way.
        """

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        """Check a binding's key and arguments (headers' x-match, consistent-hash's weight).

        Returns None. Raises ``errors.AMQPError`` 406; no binding is added then.
        """

    def add_binding(self, binding: Binding) -> bool:
        """Index ``binding``; False (and no change) when an identical one exists."""

    def remove_binding(self, key: BindingKey) -> Binding | None:
        """Remove the binding with this key from the table and the index; None if absent."""

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        """Destinations (queues or exchanges) a message with this key/headers reaches
        (``properties``: the message's basic properties, for types that route on them).

        May contain duplicates; never raises for any key or headers a client can send.
        Runs once per published message and routing key (CC/BCC add keys), on the hot path:
        it must not change the bindings or the index; per-message bookkeeping (the
        deduplication exchange's cache) is the only state a type may update here.
        """

    @property
    def has_bindings(self) -> bool:
        """True while any binding has this exchange as its source."""

    def apply_policy(self, policy: str | None, definition: dict[str, Any]) -> None:
        """Run with the policy ``policy`` (its validated ``definition``; None and ``{}``
        when none applies) from the next publish on. Never raises."""

    def declared(self, vhost: VirtualHost) -> None:
        """Called once after a client declared this (new) exchange, not at recovery: a
        type may create what it owns through ``vhost``'s public methods (the
        consistent-hash exchange's partition queues). Raises ``errors.AMQPError``."""


class Binding:
    __slots__ = ("arguments", "destination", "key", "routing_key", "source")

    def __init__(self, source: str, destination: Destination, routing_key: str,
                 arguments: dict[str, Any]) -> None:
        self.source = source
        self.destination = destination  # a Queue or an Exchange object
        self.routing_key = routing_key
        self.arguments = arguments or {}
        self.key: BindingKey = (destination.kind, destination.name, routing_key, _freeze(self.arguments))


# markers of a frozen table/array's bounds: equal to nothing a client can send
_TABLE, _ARRAY, _END = object(), object(), object()


def _freeze(value: object) -> Any:
    """Binding arguments as a hashable key: tables and arrays flattened into one tuple of
    tokens (a table's keys sorted), walked with an explicit stack. Nested tuples would
    need recursion to build and to compare, and arguments may be nested as deep as a
    frame holds (18,000 levels)."""
    if not isinstance(value, (dict, list)):
        return bytes(value) if isinstance(value, bytearray) else value
    if not value:
        return ()  # no arguments: the common case
    out: list[object] = []
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            out.append(_TABLE)
            stack.append(_END)
            for k, v in sorted(item.items(), key=lambda kv: kv[0], reverse=True):
                stack.append(v)
                stack.append(k)
        elif isinstance(item, list):
            out.append(_ARRAY)
            stack.append(_END)
            stack.extend(reversed(item))
        else:
            out.append(bytes(item) if isinstance(item, bytearray) else item)
    return tuple(out)


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _text(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _quoted(value: Any) -> str:
    return "none" if value is None else f"'{value}'"


class Exchange:
    """The shared implementation of ``ExchangeType``: identity, bindings table, checks.

    A type overrides ``_index_add``/``_index_remove``/``route``, and
    ``argument_problem``/``validate_binding`` when it has arguments of its own.
    """
    kind: ClassVar[Literal["exchange"]] = "exchange"
    type_name: ClassVar[str] = ""
    # left out of the management API's listings and the exported definitions
    hidden: ClassVar[bool] = False

    def __init__(self, name: str, durable: bool = False, auto_delete: bool = False,
                 internal: bool = False, arguments: dict[str, Any] | None = None) -> None:
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = arguments or {}
        self.bindings: dict[BindingKey, Binding] = {}
        alt = self.arguments.get("alternate-exchange")
        self.alternate_exchange = alt.decode() if isinstance(alt, bytes) else alt
        self.policy: str | None = None  # the policy in force (broker/policies), for the API
        self.effective_policy_definition: dict[str, Any] = {}
        # messages routed from here (vhost.route) and the queues they reached, for the API
        self.stats_publish_in = self.stats_publish_out = 0

    # ---- declaration checks ----
    @classmethod
    def validate(cls, arguments: dict[str, Any], resource: Resource) -> None:
        ae = arguments.get("alternate-exchange")
        if ae is not None and not isinstance(ae, (bytes, str)):
            raise errors.precondition_failed(
                "invalid arg 'alternate-exchange' for %s: {unacceptable_type,%s}", resource,
                type(ae).__name__)
        problem = cls.argument_problem(arguments)
        if problem:
            raise errors.precondition_failed(problem)

    @classmethod
    def argument_problem(cls, arguments: dict[str, Any]) -> str | None:
        """RabbitMQ's explanation of why this type refuses ``arguments``; None if fine."""
        return None

    def check_equivalent(self, type_name: str, durable: bool, auto_delete: bool, internal: bool,
                         arguments: dict[str, Any], resource: Resource) -> None:
        for arg, have, want in (("type", self.type_name, type_name),
                                ("durable", _b(self.durable), _b(durable)),
                                ("auto_delete", _b(self.auto_delete), _b(auto_delete)),
                                ("internal", _b(self.internal), _b(internal))):
            if have != want:
                raise errors.precondition_failed(
                    "inequivalent arg '%s' for %s: received '%s' but current is '%s'", arg,
                    resource, want, have)
        have_ae = _text(self.arguments.get("alternate-exchange"))
        want_ae = _text(arguments.get("alternate-exchange"))
        if have_ae != want_ae:
            raise errors.precondition_failed(
                "inequivalent arg 'alternate-exchange' for %s: received %s but current is %s",
                resource, _quoted(want_ae), _quoted(have_ae))

    def validate_binding(self, routing_key: str, arguments: dict[str, Any]) -> None:
        return None

    def apply_policy(self, policy: str | None, definition: dict[str, Any]) -> None:
        """Run with this (validated) policy definition from the next publish on (``{}``:
        none). Its ``alternate-exchange`` applies unless the exchange's own argument sets
        one, as RabbitMQ's ``rabbit_policy:get_arg``."""
        self.policy = policy
        self.effective_policy_definition = dict(definition)
        alt = self.arguments.get("alternate-exchange")
        if alt is None:
            alt = definition.get("alternate-exchange")
        self.alternate_exchange = alt.decode() if isinstance(alt, bytes) else alt

    # Subclasses index bindings for routing.
    def _index_add(self, binding: Binding) -> None:
        raise NotImplementedError

    def _index_remove(self, binding: Binding) -> None:
        raise NotImplementedError

    def route(self, routing_key: str, headers: dict[str, Any] | None,
              properties: dict[str, Any] | None = None) -> list[Destination]:
        """Destinations (queues or exchanges) matching; may contain duplicates."""
        raise NotImplementedError

    def add_binding(self, binding: Binding) -> bool:
        if binding.key in self.bindings:
            return False
        self.bindings[binding.key] = binding
        self._index_add(binding)
        return True

    def remove_binding(self, key: BindingKey) -> Binding | None:
        binding = self.bindings.pop(key, None)
        if binding is not None:
            self._index_remove(binding)
        return binding

    @property
    def has_bindings(self) -> bool:
        return bool(self.bindings)

    def declared(self, vhost: VirtualHost) -> None:
        return None
