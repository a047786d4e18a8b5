"""Queue types: what ``x-queue-type`` makes of a queue, decided in one place.

Each type declares its capabilities -- the arguments it accepts, whether it may be
exclusive, transient or auto-delete, whether a channel's global QoS applies to its
consumers, its delivery limit, its dead-letter strategies, the policy ``apply-to``
that selects it -- and every path that makes a queue (client declare, the management
API, definitions import, recovery, cluster placement) asks ``queue_type_of`` /
``check_declare`` rather than looking at the argument itself.

* ``classic``: RabbitMQ's classic queue (priorities, every transient flavour).
* ``quorum``: RabbitMQ 4's quorum queue on one node: durable, never exclusive or
  auto-delete, a delivery limit (20 unless set; a negative limit is none) with the
  ``x-delivery-count`` header on redeliveries, ``x-dead-letter-strategy``
  (at-least-once: a dead letter leaves the queue once its targets have it, see
  ``dead_letter.dead_letter_confirmed``), no global QoS for its consumers.
  Replication is the cluster's (``initial_group_size``); on one node it is a durable
  queue like any other, crash-safe through the same store.
* ``stream``: a replayable log (``queues/stream.py``, a ``StreamQueue`` over
  ``broker/streams/log.py``): durable only, never exclusive or auto-delete, no global
  QoS; its arguments (``stream_args.py``) are x-max-age, x-max-length-bytes and
  x-stream-max-segment-size-bytes.

``make_queue`` builds the queue object of a declaration: the type's own class where it
has one (``queue_class``), else ``Queue``.

Texts are RabbitMQ 3.10's (checked against a running 3.10 with pika).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

from .. import errors
from ..errors import Resource
from . import stream_args  # noqa: F401 - registers the stream arguments' validators
from .args import (
    ArgumentError,
    QueueOptions,
    non_neg_int,
    one_of,
    positive_int,
    register_queue_argument,
)

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .queue import Queue

# Every queue argument RabbitMQ itself knows (rabbit_amqqueue's declare_args plus the
# queue types' own): one of these that a type does not accept is refused with
# "... of queue type rabbit_X_queue"; arguments nobody knows are ignored, as RabbitMQ does.
RABBIT_ARGUMENTS = frozenset({
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-dead-letter-strategy", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
    "x-max-in-memory-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
    "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size", "x-max-age",
    "x-stream-max-segment-size-bytes", "x-initial-cluster-size", "x-queue-leader-locator",
    "x-queue-master-locator", "x-delivery-limit",
})

register_queue_argument("x-dead-letter-strategy",
                        one_of("at-most-once", "at-least-once", reason="invalid_dlx_strategy"))
register_queue_argument("x-quorum-initial-group-size", positive_int)
register_queue_argument("x-queue-leader-locator",
                        one_of("client-local", "balanced", "random", "least-leaders",
                               reason="invalid_queue_locator_arg"), equivalence=False)
register_queue_argument("x-max-in-memory-length", non_neg_int, equivalence=False)
register_queue_argument("x-max-in-memory-bytes", non_neg_int, equivalence=False)


@dataclass(frozen=True)
class QueueType:
    name: str
    module: str  # RabbitMQ's name for it in error texts
    arguments: frozenset[str]  # the RABBIT_ARGUMENTS it accepts
    policy_apply_to: str  # the policy apply-to selecting only this type
    exclusive: bool = True
    transient: bool = True  # may be non-durable
    auto_delete: bool = True
    global_qos: bool = True  # a channel's global prefetch limits its consumers
    mirrored: bool = True  # ha-* policies replicate it (a cluster's classic mirroring)
    default_delivery_limit: int | None = None
    delivery_count_header: bool = False  # x-delivery-count on every redelivery
    dead_letter_strategies: tuple[str, ...] = ("at-most-once",)
    overflow: tuple[str, ...] = ("drop-head", "reject-publish", "reject-publish-dlx")
    available: bool = True
    # the argument naming the node a new queue goes to in a cluster (its values mapped onto
    # the cluster's placement strategies by ``placement_locator``)
    locator_argument: str = "x-queue-master-locator"
    # RabbitMQ 4's quorum priorities: two levels served 2:1 (``priority.py``)
    two_level_priority: bool = False
    # "module:Class" of a type with its own message storage (``make_queue``); "" = Queue
    queue_class: str = ""
    # queue.delete-ok counts the messages deleted (a stream answers 0, as RabbitMQ)
    counts_on_delete: bool = True

    # ---- declare ----
    def check_declare(self, resource: Resource, durable: bool, exclusive: bool,
                      auto_delete: bool, arguments: dict[str, Any]) -> None:
        """A new queue of this type: RabbitMQ's checks in RabbitMQ's order (arguments,
        auto-delete, exclusive, durable, then whether the type is enabled)."""
        for name in arguments:
            if name in RABBIT_ARGUMENTS and name not in self.arguments:
                raise errors.precondition_failed("invalid arg '%s' for %s of queue type %s",
                                                 name, resource, self.module)
        for refused, prop in ((auto_delete and not self.auto_delete, "auto-delete"),
                              (exclusive and not self.exclusive, "exclusive-owner"),
                              (not durable and not self.transient, "non-durable")):
            if refused:
                raise errors.precondition_failed("invalid property '%s' for %s", prop, resource)
        if not self.available:
            raise errors.internal_error(
                "Cannot declare a queue '%s' of type '%s' on node '%s': the corresponding "
                "feature flag is disabled", resource, self.module, NODE_NAME)

    def argument_error(self, resource: Resource, exc: ArgumentError) -> errors.AMQPError:
        """An invalid value of an argument this type does not take at all is answered
        as the type's refusal (RabbitMQ checks the type's arguments first)."""
        if exc.name in RABBIT_ARGUMENTS and exc.name not in self.arguments:
            return errors.precondition_failed("invalid arg '%s' for %s of queue type %s",
                                              exc.name, resource, self.module)
        return errors.precondition_failed("invalid arg '%s' for %s: %s", exc.name, resource,
                                          exc.detail)

    # ---- running ----
    def effective(self, opts: QueueOptions) -> QueueOptions:
        """The options a queue of this type runs with, from its arguments and policy
        (``args.with_policy``): the type's delivery limit where none is set, a negative
        one dropped, an overflow mode the type lacks replaced by its default (RabbitMQ's
        quorum queue warns and uses drop-head for reject-publish-dlx)."""
        extra = opts.extra
        limit = extra.get("x-delivery-limit", self.default_delivery_limit)
        changes: dict[str, Any] = {}
        if limit != extra.get("x-delivery-limit") or (limit is not None and limit < 0):
            extra = dict(extra)
            if limit is None or limit < 0:
                extra.pop("x-delivery-limit", None)
            else:
                extra["x-delivery-limit"] = limit
            changes["extra"] = extra
        if opts.overflow not in self.overflow:
            changes["overflow"] = self.overflow[0]
        if self.two_level_priority:
            changes["max_priority"] = 1
            changes["two_level_priority"] = True
        return replace(opts, **changes) if changes else opts

    def dead_letters_at_least_once(self, opts: QueueOptions) -> bool:
        """RabbitMQ's rule: at-least-once needs a DLX and reject-publish overflow, else
        the queue dead-letters at most once."""
        return ("at-least-once" in self.dead_letter_strategies
                and opts.extra.get("x-dead-letter-strategy") == "at-least-once"
                and opts.dead_letter_exchange is not None and opts.overflow == "reject-publish")

    def placement_locator(self, arguments: dict[str, Any]) -> object:
        """The cluster's placement strategy for a new queue with these arguments (None:
        no argument; an unknown value is returned as it is, for the caller's refusal)."""
        value = arguments.get(self.locator_argument)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str) and self.locator_argument == "x-queue-leader-locator":
            return _LEADER_LOCATORS.get(value, value)
        return value

    def initial_group_size(self, arguments: dict[str, Any]) -> int | None:
        """How many nodes a replicated type starts on (the cluster's placement)."""
        if self.mirrored:
            return None
        size = arguments.get("x-quorum-initial-group-size")
        return size if isinstance(size, int) and not isinstance(size, bool) else None


# x-queue-leader-locator (quorum, stream) as the cluster's placement strategies
_LEADER_LOCATORS = {"client-local": "client-local", "balanced": "min-masters",
                    "least-leaders": "min-masters", "random": "random"}

# The node name in texts that name one (a single-node broker's, as RabbitMQ's default).
NODE_NAME = "rabbit@localhost"

_CLASSIC_ARGS = frozenset({
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
    "x-queue-version", "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
    # this broker's retry feature (queues/retry.py) gives classic queues a delivery limit
    "x-delivery-limit",
})
_QUORUM_ARGS = frozenset({
    "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy",
    "x-expires", "x-max-length", "x-max-length-bytes", "x-max-in-memory-length",
    "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer", "x-queue-type",
    "x-quorum-initial-group-size", "x-delivery-limit", "x-message-ttl",
    "x-queue-leader-locator",
})
_STREAM_ARGS = frozenset({
    "x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator",
})

CLASSIC = QueueType("classic", "rabbit_classic_queue", _CLASSIC_ARGS, "classic_queues")
QUORUM = QueueType("quorum", "rabbit_quorum_queue", _QUORUM_ARGS, "quorum_queues",
                   exclusive=False, transient=False, auto_delete=False, global_qos=False,
                   mirrored=False, default_delivery_limit=20,
                   locator_argument="x-queue-leader-locator",
                   delivery_count_header=True, two_level_priority=True,
                   dead_letter_strategies=("at-most-once", "at-least-once"),
                   overflow=("drop-head", "reject-publish"))
STREAM = QueueType("stream", "rabbit_stream_queue", _STREAM_ARGS, "streams",
                   exclusive=False, transient=False, auto_delete=False, global_qos=False,
                   mirrored=False, locator_argument="x-queue-leader-locator",
                   queue_class="broker.queues.stream:StreamQueue", counts_on_delete=False)

QUEUE_TYPES: dict[str, QueueType] = {t.name: t for t in (CLASSIC, QUORUM, STREAM)}
# policy apply-to values that select queues, by type (None: every queue)
QUEUE_APPLY_TO = {"queues": None, **{t.policy_apply_to: t for t in QUEUE_TYPES.values()}}


def queue_type_of(arguments: dict[str, Any] | None) -> QueueType:
    """The type of a queue with these (validated) arguments; classic without one."""
    value = (arguments or {}).get("x-queue-type")
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return QUEUE_TYPES.get(value, CLASSIC) if isinstance(value, str) else CLASSIC


# A queue variant -- a Queue subclass with its own ready store, e.g. the scheduler's
# ScheduledQueue for ``amq.triomq.scheduled`` -- is recreated at recovery as that variant,
# not as a plain Queue (``persistence.recovery.new_queue``).
# name -> factory(broker, vhost, name, **Queue keyword arguments) -> Queue
QUEUE_VARIANTS: dict[str, Callable[..., Queue]] = {}


def register_queue_variant(name: str, factory: Callable[..., Queue]) -> None:
    """Recreate the stored queue ``name`` with ``factory`` (see QUEUE_VARIANTS)."""
    QUEUE_VARIANTS[name] = factory


def make_queue(vhost: VirtualHost, name: str, *, fresh: bool = False, **kwargs: Any) -> Queue:
    """The queue for a declaration (``Queue`` keyword arguments): the type's own class
    where it has one. ``fresh``: a new queue (not recovered), whose type may drop what an
    earlier queue of the same name left in its own storage."""
    import importlib
    qtype = queue_type_of(kwargs.get("arguments"))
    if qtype.queue_class:
        module, cls = qtype.queue_class.split(":")
        return cast("Queue", getattr(importlib.import_module(module), cls)(vhost, name, fresh=fresh,
                                                                            **kwargs))
    from .queue import Queue
    return Queue(vhost, name, **kwargs)
