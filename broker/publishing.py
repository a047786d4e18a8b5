"""The one publish path: every message a client or a broker feature publishes enters the
routing core through ``Publishing.publish``, whatever the protocol.

Its stages, in this order (one call, on the loop's thread, no await):

0. **schema** (``schemas/exchange.py``): a body that does not conform to the exchange's
   Avro schema (argument or policy) is refused with the 406 AMQP's channel raises, which
   each origin turns into its own error; a feature's own publishes (``hooks=False``) were
   checked when they entered.
1. **hooks** (``Publishing.hooks``, ``hook(origin, message, mandatory, seq) -> bool``):
   cluster forwarding and half messages first, then the scheduler (``x-delay``,
   ``AMQ_SCHEDULED_*``) and Hermes' Avro topics. A hook may take the message over (it then
   confirms or returns it through the origin when ``seq`` / ``mandatory`` ask) or refuse it
   (raises ``errors.AMQPError``, which the origin turns into its protocol's error).
2. **route** (``VirtualHost.route``): exchanges, alternate exchanges, resolvers, direct
   reply-to, deduplicating exchanges.
3. **store refusal** (``refuses_persistent``): a persistent message whose publisher hears
   the outcome is refused before any queue sees it while one of its queues' store fails.
4. **enqueue** (``Queue.enqueue(message, reported=True)``): overflow, TTL, priority, the
   queue's store.
5. **flow control**: a queue with consumers over ``flow_high`` messages (or
   ``flow_high_bytes``) asks the origin to slow down (``origin.queue_over_threshold``).
6. **audit** (``audit.published``), when the trail is on (not for the broker's own
   status messages, ``audited=False``).
7. **confirm** (``seq``, AMQP's publisher confirms): at once, or once the store made the
   message durable (``when_durable``; a cluster store waits for masters and mirrors).

What comes before is the protocol's own (its frame's checks with its own error codes:
permissions, the exchange, ``user_id``, ``expiration``, AMQP transactions' buffering; the
AMQP 0-9-1 channel also checks the Avro schema first, to nack in confirm mode); alarms
stop a publisher's reads at the edge. The outcome tells the origin what to answer when it
is not an AMQP confirm (a PUBACK, a STOMP receipt, an HTTP status). This module is core:
it knows the audit trail and the store only through the calls above.

The Stream protocol writes its records into a stream's log itself (chunks stay opaque:
the broker never builds a message to store one); only its audit stage runs here
(``appended``), for what it wrote and what it refused.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .schemas import exchange as avro_exchange

if TYPE_CHECKING:
    from .direct_reply import DirectReply
    from .message import Message
    from .queues.queue import Queue
    from .queues.stored import Durability
    from .vhost import VirtualHost

# outcomes of Publishing.publish
TAKEN = "taken"  # a hook took the message over (scheduled, held, forwarded, refused by it)
UNROUTABLE = "unroutable"  # no queue (a direct reply may have reached its requester)
REFUSED = "refused"  # a store of its queues cannot write: no queue got it
NACKED = "nacked"  # routed, and at least one queue refused it (overflow reject-publish)
ROUTED = "routed"  # every queue took it; nothing to wait for
STORING = "storing"  # every queue took it; durable once the store (or a stream's log) says so

_INF = float("inf")
Hook = Callable[["PublishOrigin", "Message", bool, int], bool]


class PublishOrigin(Protocol):
    """Who publishes: an AMQP channel, an MQTT or STOMP session, or a ``Source`` (HTTP
    publishes, the broker's own messages). Hooks read ``vhost`` and ``session`` (its
    connection: ``broker``, ``user``, ``force_close``); the audit trail reads
    ``audit_ctx``."""

    @property
    def vhost(self) -> VirtualHost | None:
        """Where it publishes; None only for a protocol session before its login, which
        publishes nothing then (``publish`` refuses such an origin)."""

    @property
    def metrics_protocol(self) -> str | None:
        """The ``protocol`` label its publishes count under in ``Publishing.by_protocol``
        (None: counted elsewhere, or not at all)."""

    def confirm_decided(self, seq: int, ok: bool, external: bool = False) -> None: ...

    def send_return(self, message: Message, code: int, text: str) -> None: ...

    def queue_over_threshold(self, queue: Queue) -> None: ...


class PublishAudit(Protocol):
    """What the path asks of the audit trail (``audit.recorder.AuditTrail``)."""

    def published(self, origin: PublishOrigin, message: Message, queues: list[Queue],
                  outcome: str, tag: int | None) -> None: ...


class FlowLimits(Protocol):
    """The flow-control thresholds the path reads per publish (``Config``'s, which may
    change at run time)."""

    @property
    def flow_high(self) -> int: ...
    @property
    def flow_high_bytes(self) -> int: ...


class Source:
    """An origin without a connection: an HTTP publish (Hermes, the management API) or a
    message the broker makes itself (MQTT ``$SYS``). It has nothing to confirm, return or
    slow down: its caller answers from the outcome."""

    __slots__ = ("audit_ctx", "vhost")
    closed = False
    user = None
    metrics_protocol: str | None = None  # the API's publishes count as amqp091 elsewhere

    def __init__(self, vhost: VirtualHost, user: str | None, peer: str | None) -> None:
        self.vhost = vhost
        self.audit_ctx = (vhost.name, user, peer, None)

    @property
    def session(self) -> Source:
        return self

    def confirm_decided(self, seq: int, ok: bool, external: bool = False) -> None:
        pass

    def send_return(self, message: Message, code: int, text: str) -> None:
        pass

    def queue_over_threshold(self, queue: Queue) -> None:
        pass

    def force_close(self, exc: Exception) -> None:
        pass  # no connection: its caller hears the failure through the outcome


class _NoFlow:
    flow_high = 0
    flow_high_bytes = 0


class Publishing:
    """The publish path of one broker; ``Broker.publishing``. Its services are handed in
    (``refuses_persistent``, ``direct_reply``) or set once the feature exists (``audit``,
    by ``Broker.__init__`` after the trail's install; ``hooks``, by each feature's
    install)."""

    def __init__(self, config: FlowLimits, direct_reply: DirectReply,
                 refuses_persistent: Callable[[list[Queue]], bool]) -> None:
        self.hooks: list[Hook] = []
        self.audit: PublishAudit | None = None  # the audit trail, or None
        self.direct_reply = direct_reply
        self.refuses_persistent = refuses_persistent
        self.config = config  # flow_high / flow_high_bytes, read per publish (may change)
        #: rabbitmq_global_messages_* of origins that are not AMQP 0-9-1 channels (those
        #: count on the channel): ``origin.metrics_protocol`` (RabbitMQ's label: mqtt311,
        #: amqp10 ...) -> [received, unroutable_dropped, unroutable_returned]
        self.by_protocol: dict[str, list[int]] = {}

    @classmethod
    def bare(cls) -> Publishing:
        """The path of a vhost no broker owns (white-box tests): no hooks, no audit, no
        flow control, a store that never refuses."""
        from .direct_reply import DirectReply
        return cls(_NoFlow(), DirectReply(), lambda queues: False)

    def _flow(self, origin: PublishOrigin, q: Queue) -> None:
        """Flow control, for a queue with consumers and ready messages: over ``flow_high``
        messages or ``flow_high_bytes`` (read here, as they may change) the origin is asked
        to slow down."""
        config = self.config
        flow_high = config.flow_high
        if len(q.ready) > (flow_high or _INF) or (
                flow_high and config.flow_high_bytes
                and q.ready_bytes > config.flow_high_bytes):
            origin.queue_over_threshold(q)

    def publish(self, origin: PublishOrigin, message: Message, mandatory: bool = False,
                seq: int = 0, *, hooks: bool = True, answered: bool = False,
                tag: int | None = None, audited: bool = True,
                waits: list[Durability] | None = None,
                drop: Callable[[Queue], bool] | None = None, queues_report: bool = False,
                on_routed: Callable[[list[Queue]], None] | None = None) -> str:
        """Run ``message`` through the stages; returns the outcome (module constants).

        ``seq``: the AMQP confirm number (0: none); the path confirms it. ``answered``:
        the publisher hears the outcome otherwise (a QoS 1 PUBACK, an HTTP status), so the
        store-refusal stage applies as it does with ``seq``. ``tag``: the number the audit
        trail records (default ``seq``: MQTT's packet id). ``hooks=False``: a message a
        feature already took over and now routes (a transaction's commit).
        ``audited=False``: the broker's own status messages (MQTT ``$SYS``), which no user
        published, stay out of the audit trail. ``waits``: for a caller that answers
        without ``seq`` (a transaction's commit-ok, a receipt): on STORING, what must make
        the message durable first is appended (the store, and each queue durable on its
        own, such as a stream's log); ``when_all`` waits for them.

        Dead letters (``queues/dead_letter.py``) pass ``hooks=False``, ``drop`` (the routed
        queues left out: a dead-letter cycle, as RabbitMQ leaves it out) and
        ``queues_report=True``: no client published them, so the audit trail records no
        publish; each target queue reports its enqueue itself (after the source queue's
        ``dead_lettered``). ``on_routed(queues)``: a feature's own record of where the
        message goes, after routing and before any enqueue (the scheduler's firing, which
        the audit trail records as ``fired``, not ``published``)."""
        vhost = origin.vhost
        if vhost is None:  # a session's publish before its login: a bug of that session
            raise RuntimeError("publish from an origin without a vhost (not logged in)")
        audit = self.audit if audited and not queues_report else None
        protocol = origin.metrics_protocol
        counts = None
        if protocol is not None:
            counts = self.by_protocol.get(protocol)
            if counts is None:
                counts = self.by_protocol[protocol] = [0, 0, 0]
            counts[0] += 1
        if hooks:
            x = vhost.exchanges.get(message.exchange)
            # an Avro schema, by argument or policy (usually both empty: nothing to check)
            if x is not None and (x.arguments or x.effective_policy_definition):
                problem = avro_exchange.exchange_problem(x, message.body, message.properties)
                if problem is not None:
                    raise avro_exchange.publish_refused(vhost, message.exchange, problem)
            for hook in self.hooks:
                if hook(origin, message, mandatory, seq):
                    if audit is not None:
                        audit.published(origin, message, [], TAKEN, seq if tag is None else tag)
                    return TAKEN
        queues = vhost.route(message.exchange, message.routing_key, message)
        if drop is not None and queues:
            queues = [q for q in queues if not drop(q)]
        if on_routed is not None:
            on_routed(queues)
        if not queues:
            if counts is not None:
                counts[2 if mandatory else 1] += 1
            if seq:
                origin.confirm_decided(seq, True)
            if audit is not None:
                audit.published(origin, message, queues,
                                self.direct_reply.unrouted_outcome(message, mandatory),
                                seq if tag is None else tag)
            return UNROUTABLE
        if (seq or answered) and message.persistent and self.refuses_persistent(queues):
            # the store cannot write: refused before any queue (or consumer) sees it
            if seq:
                origin.confirm_decided(seq, False)
            if audit is not None:
                audit.published(origin, message, queues, NACKED, seq if tag is None else tag)
            return REFUSED
        accepted = True
        durable = False
        persistent = message.persistent
        own = None  # queues durable on their own (streams): the confirm waits for each
        for q in queues:
            if not q.enqueue(message, reported=not queues_report):  # else published() does
                accepted = False
            elif q.durability is not None:
                own = [q.durability] if own is None else [*own, q.durability]
            elif q.store is not None and (persistent or q.confirms_later):
                durable = True
            # a queue with consumers that keeps growing slows its publishers
            if len(q.ready) and q.consumers:
                self._flow(origin, q)
        if audit is not None:
            audit.published(origin, message, queues, ROUTED if accepted else NACKED,
                            seq if tag is None else tag)
        if not accepted:
            if seq:
                origin.confirm_decided(seq, False)
            return NACKED
        if not durable and own is None:
            if seq:
                origin.confirm_decided(seq, True)
            return ROUTED
        if seq:
            pending = own or []
            if durable:
                pending.append(vhost.store)
            when_all(pending, lambda: origin.confirm_decided(seq, True, external=True),
                     lambda: origin.confirm_decided(seq, False, external=True))
        elif waits is not None:
            if durable:
                waits.append(vhost.store)
            if own is not None:
                waits.extend(own)
        return STORING


    def appended(self, origin: PublishOrigin, queue: Queue,
                 messages: list[tuple[Message, int | None]],
                 outcome: str = ROUTED) -> None:
        """Messages a protocol wrote into a stream's log itself (the Stream protocol:
        opaque records, no exchange, no routing, no hooks), recorded by the audit trail as
        a publish the path routed to ``queue`` (``outcome`` ROUTED) or refused (NACKED:
        no queue got it). ``messages``: (message, tag) pairs, the message the record read
        back (``streams.record``: properties and body) and the protocol's publishing id.
        Callers build them only while ``audit`` is on."""
        audit = self.audit
        if audit is None:
            return
        queues = [queue] if outcome == ROUTED else []
        for message, tag in messages:
            audit.published(origin, message, queues, outcome, tag)


def when_all(waits: Sequence[Durability], callback: Callable[[], None],
             on_failure: Callable[[], None]) -> None:
    """``callback`` once every one of ``waits`` (stores, streams: ``when_durable``) has
    made the message durable; ``on_failure`` once, at the first that fails. The same
    store or log named twice is waited for once."""
    if len(waits) > 1:
        waits = list({id(w): w for w in waits}.values())
    if not waits:
        callback()
        return
    if len(waits) == 1:
        waits[0].when_durable(callback, on_failure=on_failure)
        return
    left = [len(waits)]

    def one_done() -> None:
        left[0] -= 1
        if left[0] == 0:
            callback()

    def one_failed() -> None:
        if left[0] > 0:
            left[0] = -1
            on_failure()
    for wait in waits:
        wait.when_durable(one_done, on_failure=one_failed)
