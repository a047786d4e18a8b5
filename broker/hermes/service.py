"""Hermes topics and subscriptions on the broker's routing core.

A topic ``group.topic`` is a durable topic exchange of that name; a subscription is the
durable queue ``{topic}.{name}`` bound to it with ``#``, dead-lettering (after its in-flight
TTL or a refused 4xx) to ``{topic}.{name}.dead`` through the default exchange (or to its own
``deadLetterExchange``), plus a ``PushSubscriber`` inside the broker. AMQP clients publish
to the exchange and consume from the queues as from any others; HTTP publishes are routed
exactly like an AMQP publish to the exchange.

Definitions are metadata records (``store.save_meta``: kinds ``hermes_topic`` and
``hermes_subscription``), handed back at recovery before the exchanges and queues (which
the store recreates as usual); the push subscribers start when the broker's nursery runs
(``run``, a ``broker.background_tasks`` entry).

Retention (``retentionTime``) is the message TTL of the topic's storage: every subscription
queue and its dead-letter queue run with a message TTL of that length (set on the queue's
own options, not as an ``x-message-ttl`` argument, so that a topic update changes it and
AMQP redeclarations stay equivalent). A message unread for that long is dead-lettered
(``x-death`` reason ``expired``) and a dead letter is kept that long too.

Every method runs on the broker's loop thread. Management methods raise ``HermesError``
(4xx) and change nothing then.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import trio

from .. import errors
from ..amqp.fields import encode_properties
from ..message import Message
from ..persistence import DURABLE
from ..publishing import NACKED, REFUSED, STORING, TAKEN, Source
from ..queues.args import with_policy
from ..schemas import ValidationFailed, compiled
from . import bodies, model
from .model import HermesError, SubscriptionDef, TopicDef
from .push import PushSubscriber

if TYPE_CHECKING:
    from ..queues.queue import Queue
    from ..services import HermesServices

log = logging.getLogger("broker.hermes")

TOPIC_KIND = "hermes_topic"
SUBSCRIPTION_KIND = "hermes_subscription"
VHOST = "/"
# HTTP publishes waiting for the store at once; above it new ones get 429 (back-pressure)
MAX_PENDING_PUBLISHES = 10_000
DURABLE_WAIT = 5.0  # s an ack=ALL publish waits for the store before it answers 202
JSON_TYPES = ("application/json", "text/json")
# s a clean stop waits for push requests in flight (each is bounded by its requestTimeout)
DRAIN_LIMIT = 30.0
AVRO_TYPES = ("avro/binary", "application/avro")


def retention_ms(topic: TopicDef) -> int:
    r = topic.retentionTime
    ms = int(r.get("duration", 1)) * model.RETENTION_SECONDS[r.get("retentionUnit", "DAYS")] * 1000
    return min(ms, model.MAX_RETENTION_MS)  # definitions stored before the limit was checked


def retain(q: Queue, ttl_ms: int) -> None:
    """Run queue ``q`` with a message TTL of ``ttl_ms`` on top of its arguments and policy
    (which may still lower it, as with any x-message-ttl). Messages already in the queue keep
    the deadline they were enqueued with; new ones get the TTL."""
    base = q._base_opts
    if base.message_ttl == ttl_ms or q.deleted:
        return
    q._base_opts = dataclasses.replace(base, message_ttl=ttl_ms)
    q.reconfigure(with_policy(q._base_opts, q.arguments, q.effective_policy_definition))


def queue_name(topic: str, sub: str) -> str:
    return f"{topic}.{sub}"


def dead_queue_name(topic: str, sub: str) -> str:
    return f"{topic}.{sub}.dead"


class PublishResult:
    __slots__ = ("message_id", "status")

    def __init__(self, status: int, message_id: str):
        self.status = status
        self.message_id = message_id


class Hermes:
    def __init__(self, services: HermesServices) -> None:
        self.services = services  # the composition root's, never the whole broker
        self.topics: dict[str, TopicDef] = {}
        self.subscriptions: dict[str, dict[str, SubscriptionDef]] = {}  # topic -> name -> def
        self.subscribers: dict[str, PushSubscriber] = {}  # qualified name -> running
        self.avro_topics: dict[str, Any] = {}  # AVRO topic name -> compiled schema (AMQP hook)
        self.nursery: trio.Nursery | None = None
        self.frontend: Any = None  # frontend.Frontend when --hermes-port is set
        self.pending_publishes = 0

    @property
    def vhost(self):
        return self.services.vhosts[VHOST]

    # ---- stored definitions ----
    def _save(self, kind: str, key: str, value: dict) -> None:
        self.services.store.save_meta(kind, key, value)

    def _forget(self, kind: str, key: str) -> None:
        self.services.store.delete_meta(kind, key)

    def restore_topic(self, key: str, value: dict) -> None:
        topic = model.topic_from_record(value)
        self.topics[topic.name] = topic
        self.subscriptions.setdefault(topic.name, {})
        self._index(topic)

    def restore_subscription(self, key: str, value: dict) -> None:
        sub = model.subscription_from_record(value)
        self.subscriptions.setdefault(sub.topicName, {})[sub.name] = sub

    def _index(self, topic: TopicDef) -> None:
        if topic.contentType == "AVRO" and topic.schema:
            self.avro_topics[topic.name] = compiled(topic.schema)
        else:
            self.avro_topics.pop(topic.name, None)

    # ---- topics ----
    def get_topic(self, name: str) -> TopicDef:
        topic = self.topics.get(name)
        if topic is None:
            raise HermesError(404, f"Topic {name} not found", "TOPIC_NOT_FOUND")
        return topic

    def create_topic(self, data: Any) -> TopicDef:
        topic = model.parse_topic(data, max_size=self.services.config.max_message_size)
        if topic.name in self.topics:
            raise HermesError(409, f"Topic {topic.name} already exists", "TOPIC_ALREADY_EXISTS")
        try:
            self.vhost.declare_exchange(topic.name, "topic", durable=True)
        except errors.AMQPError as exc:
            raise HermesError(409, f"Topic {topic.name} conflicts with an exchange: {exc.text}",
                              "TOPIC_ALREADY_EXISTS") from None
        self.topics[topic.name] = topic
        self.subscriptions.setdefault(topic.name, {})
        self._index(topic)
        self._save(TOPIC_KIND, topic.name, topic.to_json())
        return topic

    def update_topic(self, name: str, data: Any) -> TopicDef:
        current = self.get_topic(name)
        topic = model.parse_topic(data, current, max_size=self.services.config.max_message_size)
        self._replace_topic(topic)
        return topic

    def set_schema(self, name: str, schema: Any) -> TopicDef:
        current = self.get_topic(name)
        if current.contentType != "AVRO":
            raise model.invalid("schema", f"topic {name} has content type {current.contentType}")
        topic = dataclasses.replace(current)
        model.set_schema(topic, schema, current.schema)
        self._replace_topic(topic)
        return topic

    def _replace_topic(self, topic: TopicDef) -> None:
        old = self.topics[topic.name]
        self.topics[topic.name] = topic
        self._index(topic)
        self._save(TOPIC_KIND, topic.name, topic.to_json())
        if old.retentionTime != topic.retentionTime:
            for sub in self.subscriptions.get(topic.name, {}).values():
                self._retain(sub)
        if old.schema != topic.schema:
            for sub in self.subscriptions.get(topic.name, {}).values():
                self._restart(sub)  # pushers convert with the new schema

    def delete_topic(self, name: str) -> None:
        self.get_topic(name)
        if self.subscriptions.get(name):
            raise HermesError(403, f"Topic {name} has subscriptions: delete them first",
                              "TOPIC_NOT_EMPTY")
        del self.topics[name]
        self.subscriptions.pop(name, None)
        self.avro_topics.pop(name, None)
        self.vhost.delete_exchange(name)
        self._forget(TOPIC_KIND, name)

    # ---- subscriptions ----
    def get_subscription(self, topic: str, name: str) -> SubscriptionDef:
        self.get_topic(topic)
        sub = self.subscriptions.get(topic, {}).get(name)
        if sub is None:
            raise HermesError(404, f"Subscription {topic}${name} not found",
                              "SUBSCRIPTION_NOT_FOUND")
        return sub

    def create_subscription(self, topic_name: str, data: Any) -> SubscriptionDef:
        self.get_topic(topic_name)
        sub = model.parse_subscription(topic_name, data)
        subs = self.subscriptions.setdefault(topic_name, {})
        if sub.name in subs:
            raise HermesError(409, f"Subscription {sub.qualified} already exists",
                              "SUBSCRIPTION_ALREADY_EXISTS")
        vhost = self.vhost
        qname = queue_name(topic_name, sub.name)
        if vhost.queues.get(qname) is not None:
            raise HermesError(409, f"Subscription {sub.qualified} conflicts with the queue {qname}",
                              "SUBSCRIPTION_ALREADY_EXISTS")
        self._declare_queue(sub)
        subs[sub.name] = sub
        self._save(SUBSCRIPTION_KIND, sub.qualified, sub.to_json())
        self._start(sub)
        return sub

    def _declare_queue(self, sub: SubscriptionDef):
        vhost = self.vhost
        if sub.deadLetterExchange is None:
            dead = dead_queue_name(sub.topicName, sub.name)
            vhost.ensure_queue(dead, durable=True, arguments={})
            args = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
        else:
            args = {"x-dead-letter-exchange": sub.deadLetterExchange}
        q = vhost.ensure_queue(queue_name(sub.topicName, sub.name), durable=True, arguments=args)
        if sub.topicName in vhost.exchanges:
            vhost.bind(sub.topicName, q, "#", {})
        self._retain(sub)
        return q

    def _retain(self, sub: SubscriptionDef) -> None:
        topic = self.topics.get(sub.topicName)
        if topic is None:
            return
        ttl = retention_ms(topic)
        for name in (queue_name(sub.topicName, sub.name), dead_queue_name(sub.topicName, sub.name)):
            q = self.vhost.queues.get(name)
            if q is not None:
                retain(q, ttl)

    def update_subscription(self, topic: str, name: str, data: Any) -> SubscriptionDef:
        current = self.get_subscription(topic, name)
        sub = model.parse_subscription(topic, data, current)
        if sub.deadLetterExchange != current.deadLetterExchange:
            raise model.invalid("deadLetterExchange", "cannot be changed")
        self.subscriptions[topic][name] = sub
        self._save(SUBSCRIPTION_KIND, sub.qualified, sub.to_json())
        self._restart(sub)
        return sub

    def set_state(self, topic: str, name: str, state: Any) -> SubscriptionDef:
        return self.update_subscription(topic, name, {"state": state})

    def delete_subscription(self, topic: str, name: str) -> None:
        sub = self.get_subscription(topic, name)
        self._stop(sub)
        del self.subscriptions[topic][name]
        q = self.vhost.queues.get(queue_name(topic, name))
        if q is not None:
            self.vhost.delete_queue(q, reason="hermes subscription deleted")
        self._forget(SUBSCRIPTION_KIND, sub.qualified)

    # ---- push subscribers ----
    def _start(self, sub: SubscriptionDef) -> None:
        if self.nursery is None or sub.state != "ACTIVE" or sub.qualified in self.subscribers:
            return
        q = self.vhost.queues.get(queue_name(sub.topicName, sub.name))
        if q is None:
            log.warning("queue of subscription %s was deleted; declaring it again", sub.qualified)
            q = self._declare_queue(sub)
        topic = self.topics.get(sub.topicName)
        pusher = PushSubscriber(self, sub, topic.schema if topic else None, q)
        self.subscribers[sub.qualified] = pusher
        self.nursery.start_soon(self._run_pusher, pusher)

    async def _run_pusher(self, pusher: PushSubscriber) -> None:
        try:
            await pusher.run()
        except Exception:  # a failing subscription must not take the broker's nursery down
            log.exception("push subscription %s stopped", pusher.sub.qualified)
        finally:
            if self.subscribers.get(pusher.sub.qualified) is pusher:
                del self.subscribers[pusher.sub.qualified]

    def _stop(self, sub: SubscriptionDef) -> None:
        """The pusher drains in the background (its requests in flight are answered and
        settled, the rest is requeued); a new one may already consume meanwhile."""
        pusher = self.subscribers.pop(sub.qualified, None)
        if pusher is not None:
            pusher.drain()

    def _restart(self, sub: SubscriptionDef) -> None:
        self._stop(sub)
        self._start(sub)

    async def run(self) -> None:
        """Background task: the nursery every push subscriber runs in."""
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            try:
                for subs in self.subscriptions.values():
                    for sub in subs.values():
                        self._retain(sub)  # queues were recovered after the definitions
                        self._start(sub)
                await trio.sleep_forever()
            finally:
                self.nursery = None

    async def drain(self) -> None:
        """Clean stop (a ``broker.drain_hooks`` entry, awaited before the store closes):
        every pusher stops taking messages and settles the requests it has in flight, so
        none that the endpoint answered 2xx is delivered again after the restart. Bounded:
        after DRAIN_LIMIT seconds the rest are cancelled and requeued."""
        pushers = list(self.subscribers.values())
        self.subscribers.clear()
        self.nursery = None  # nothing new starts while the broker stops
        for pusher in pushers:
            pusher.drain()
        limit = min(DRAIN_LIMIT, 1.0 + max(
            (p.sub.subscriptionPolicy.requestTimeout / 1000.0 for p in pushers), default=0.0))
        with trio.move_on_after(limit):
            for pusher in pushers:
                await pusher.finished.wait()
        for pusher in pushers:
            if not pusher.finished.is_set():
                log.warning("push subscription %s: requests still in flight at shutdown are "
                            "abandoned (their messages are requeued)", pusher.sub.qualified)
                pusher.stop()
        with trio.move_on_after(1.0):
            for pusher in pushers:
                await pusher.finished.wait()

    # ---- publishing ----
    def admit(self, topic: TopicDef, body: bytes, content_type: str | None) -> tuple[bytes, str]:
        """The body as stored and its content type; HermesError 400/413/429/503 otherwise."""
        if len(body) > topic.maxMessageSize:
            raise HermesError(413, f"Message size {len(body)} exceeds the topic's maximum "
                                   f"{topic.maxMessageSize} bytes", "MESSAGE_TOO_LARGE")
        if self.services.alarms:
            raise HermesError(503, "Broker is blocking publishers: "
                                   + ", ".join(sorted(self.services.alarms)),
                              "SERVICE_UNAVAILABLE", {"Retry-After": "1"})
        if self.pending_publishes >= MAX_PENDING_PUBLISHES:
            raise HermesError(429, "Too many publishes waiting to be stored", "TOO_MANY_REQUESTS",
                              {"Retry-After": "1"})
        ctype = (content_type or "").split(";")[0].strip().lower()
        if topic.contentType == "AVRO":
            schema = self.avro_topics[topic.name]
            try:
                if ctype in AVRO_TYPES:
                    schema.check_binary(body)
                    return body, "avro/binary"
                stored = schema.from_json(body)
            except ValidationFailed as exc:
                raise HermesError(400, f"Invalid message: {exc}", "VALIDATION_ERROR") from None
            unknown = bodies.unknown_field(schema.text, body)
            if unknown is not None:  # the Avro encoding would drop it without a word
                raise HermesError(400, f"Invalid message: Failed to convert JSON to Avro: "
                                       f"Field {unknown} is unknown"[:400], "VALIDATION_ERROR")
            return stored, "avro/binary"
        problem = bodies.json_problem(body)
        if problem is not None:
            raise HermesError(400, f"Invalid message: {problem}", "VALIDATION_ERROR")
        return body, ctype or "application/json"

    def publish_now(self, topic: TopicDef, body: bytes, content_type: str,
                    headers: dict | None = None, user: str | None = None,
                    peer: str | None = None) -> tuple[str, bool, bool]:
        """Route one message into the topic: ``(message id, accepted, durable pending)``;
        ``user`` and ``peer`` (the HTTP client) go to the audit trail's published event."""
        mid = str(uuid.uuid4())
        props: dict = {"content_type": content_type, "delivery_mode": 2, "message_id": mid,
                       "timestamp": int(time.time())}
        if headers:
            props["headers"] = headers
        if topic.contentType == "AVRO":
            props.setdefault("headers", {})["schema-version"] = topic.schemaVersion
        message = Message(topic.name, topic.name, encode_properties(props), props, body)
        if topic.name not in self.vhost.exchanges:
            self._heal(topic)
        audit = self.services.audit
        if audit is not None:
            audit.clock_start()
        try:
            # the one publish path: hooks (scheduler, cluster, Avro), route, enqueue, audit
            outcome = self.services.publishing.publish(
                Source(self.vhost, user, peer or "http"), message, answered=True)
        except errors.AMQPError as exc:  # a publish hook refused it
            raise HermesError(400, f"Invalid message: {exc.explanation}", "VALIDATION_ERROR") from None
        finally:
            if audit is not None:
                audit.clock_stop()
        if outcome is REFUSED:
            # the store cannot write: refused before any subscription could deliver it
            raise HermesError(500, "The store could not write the message", "INTERNAL_ERROR")
        accepted = outcome is not NACKED
        durable = outcome is STORING or outcome is TAKEN  # a taken one: the hook's store write
        return mid, accepted, durable

    async def publish(self, name: str, body: bytes, content_type: str | None,
                      headers: dict | None = None, user: str | None = None,
                      peer: str | None = None) -> PublishResult:
        topic = self.get_topic(name)
        stored, ctype = self.admit(topic, body, content_type)
        mid, accepted, durable = self.publish_now(topic, stored, ctype, headers, user, peer)
        if not accepted:
            raise HermesError(503, "A subscription queue refused the message (full)",
                              "SERVICE_UNAVAILABLE", {"Retry-After": "1"})
        store = self.services.store
        if not durable or DURABLE not in store.capabilities:
            return PublishResult(202 if topic.ack == "LEADER" else 201, mid)
        if topic.ack == "LEADER":
            return PublishResult(202, mid)  # durable soon: the store's next group commit
        done = trio.Event()
        outcome: list[bool] = []

        def ok() -> None:
            outcome.append(True)
            done.set()

        def failed() -> None:
            outcome.append(False)
            done.set()

        self.pending_publishes += 1
        try:
            store.when_durable(ok, on_failure=failed)
            with trio.move_on_after(DURABLE_WAIT):
                await done.wait()
        finally:
            self.pending_publishes -= 1
        if not outcome:
            return PublishResult(202, mid)  # routed, still being written
        if not outcome[0]:
            raise HermesError(500, "The store could not write the message", "INTERNAL_ERROR")
        return PublishResult(201, mid)

    def _heal(self, topic: TopicDef) -> None:
        """An AMQP client deleted the topic's exchange: the topic owns it, so it comes back
        with its subscriptions' bindings before the publish is routed."""
        log.warning("exchange of Hermes topic %s was deleted; declaring it again", topic.name)
        vhost = self.vhost
        vhost.declare_exchange(topic.name, "topic", durable=True)
        for sub in self.subscriptions.get(topic.name, {}).values():
            q = vhost.queues.get(queue_name(topic.name, sub.name))
            if q is not None:
                vhost.bind(topic.name, q, "#", {})

    # ---- AMQP publishes to an AVRO topic's exchange ----
    def publish_hook(self, channel, message, mandatory: bool, seq: int) -> bool:
        schema = self.avro_topics.get(message.exchange)
        if schema is None or channel.vhost.name != VHOST:
            return False
        ctype = (message.properties.get("content_type") or "").split(";")[0].strip().lower()
        try:
            if ctype in JSON_TYPES:
                schema.from_json(message.body)
            else:
                schema.check_binary(message.body)
        except ValidationFailed as exc:
            if seq:
                channel.confirm_decided(seq, False)
                return True
            raise errors.precondition_failed(
                "message rejected by the Avro schema of %s: %s",
                channel.vhost.exchange_resource(message.exchange), exc) from None
        return False
