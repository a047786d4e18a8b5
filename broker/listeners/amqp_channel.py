"""Broker-side channel: turns AMQP methods into vhost/queue operations.

Synchronous (no trio): deliveries and replies are written into the owning
session's sans-IO connection; the session's edge task writes them out.
"""
from __future__ import annotations

import base64
import os
from collections import deque
from typing import TYPE_CHECKING, Any

from .. import errors
from ..amqp import spec
from ..amqp.fields import encode_properties
from ..direct_reply import REPLY_QUEUE, ReplyConsumer
from ..message import Message
from ..publishing import UNROUTABLE
from ..queues.queue import Consumer, Queue
from ..queues.ttl import ExpirationError, parse_expiration
from ..schemas import exchange as avro
from .amqp_confirm_tx import ConfirmTxMethods
from .amqp_entities import EntityMethods
from .amqp_unacked import Unacked, UnackedDeliveries

if TYPE_CHECKING:
    from .amqp_session import Session


def _selector(value):
    """The compiled ``x-filter`` consumer argument (None without one); 406 if invalid."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        raise errors.precondition_failed("invalid arg 'x-filter' for consumer: must be a string")
    # imported at the first selector (its parser, lark, is not needed to start the broker)
    from ..queues.selector import SelectorError, compile_selector
    try:
        return compile_selector(value)
    except SelectorError as exc:
        raise errors.precondition_failed("invalid arg 'x-filter' for consumer: %s", exc) from None


def _random_tag(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Channel(EntityMethods, ConfirmTxMethods):
    metrics_protocol = None  # its own counters (stats_*) are the amqp091 ones

    def __init__(self, session: Session, number: int):
        self.session = session
        self.conn = session.conn
        vhost = session.vhost
        assert vhost is not None, "a channel before connection.open"  # (the sans-IO's order)
        self.vhost = vhost
        # the user's cached permission checks in this vhost (security.authz; None: no login)
        self.authz = session.authz
        self.number = number
        self.flow_active = True
        self.consumers: dict[str, Consumer] = {}
        # tag -> Unacked, the older ones compacted (amqp_unacked.py)
        self.unacked = UnackedDeliveries()
        self.next_tag = 1
        self.prefetch = 0  # for consumers created from now on (global=false)
        self.global_prefetch = 0  # shared by the channel (global=true)
        self.confirm = False
        self.next_publish_seq = 1
        self._unconfirmed: deque = deque()
        self._decided: dict[int, bool] = {}
        self.tx: list | None = None
        # while a commit is applied: what its commit-ok waits for (the store and mirrors,
        # a stream's log), filled by the publish path
        self.tx_waits: list | None = None
        self.tx_acks: list = []
        self.last_queue: str | None = None
        self.closed = False  # no more deliveries or replies on this channel
        self.released = False  # unacked messages handed back, consumers gone
        self._deferred_cancels: list | None = None
        # while a reply waits for the store (reply_when_durable): the channel's replies from
        # it on, in request order, as [method] (None until that reply may go)
        self._held_replies: deque[list] | None = None
        self.reply_consumer: ReplyConsumer | None = None  # of amq.rabbitmq.reply-to
        self.timeouts = session.broker.consumer_timeouts
        self.timeouts.watch(self)
        self.audit = session.broker.audit  # the audit trail, or None
        self.publishing = session.broker.publishing  # the one publish path
        # message counters read by management's sampler (rates) and /metrics
        self.stats_publish = self.stats_deliver = self.stats_get = self.stats_ack = 0
        # (deliver and get count ack-mode ones; the no_ack ones have their own, as RabbitMQ)
        self.stats_deliver_no_ack = self.stats_get_no_ack = self.stats_get_empty = 0
        self.stats_redeliver = self.stats_confirm = 0
        self.stats_return_unroutable = self.stats_drop_unroutable = 0

    # ---- state used by queues ----
    @property
    def can_deliver(self) -> bool:
        return self.flow_active and not self.closed and not self.session.output_full

    @property
    def unacked_count(self) -> int:
        return len(self.unacked)

    def deliver(self, consumer: Consumer, queue: Queue, entry) -> None:
        tag = self.next_tag
        self.next_tag = tag + 1
        message = entry.message
        self.conn.deliver(self.number, consumer.tag_raw, tag, entry.redelivered, message.exchange,
                          message.routing_key, message.props_raw, message.body)
        item = None
        if consumer.no_ack:
            self.stats_deliver_no_ack += 1
        else:
            self.stats_deliver += 1
            item = self.unacked[tag] = Unacked(tag, entry, queue, consumer, self.timeouts.period)
        if entry.redelivered:
            self.stats_redeliver += 1
        if self.audit is not None:
            pos = self.audit.delivered(self, consumer.tag, tag, queue, entry)
            if item is not None:
                item.audit_pos = pos
        self.session.wake()

    # ---- dispatch of methods ----
    def handle(self, method: spec.Method) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise errors.command_invalid(f"unexpected {method.amqp_name}")
        handler(self, method)

    def reply(self, method: spec.Method) -> None:
        if self._held_replies is not None:
            self._held_replies.append([method])
            return
        self.conn.send_method(self.number, method)

    def reply_when_durable(self, store: Any, method: spec.Method) -> None:
        """``method`` once ``store`` has made durable what it holds now (a declare-ok after
        its definition's group commit); the channel's later replies wait behind it."""
        if self._held_replies is None:
            self._held_replies = deque()
        slot: list = [None]
        self._held_replies.append(slot)

        def durable() -> None:
            slot[0] = method
            held = self._held_replies
            if self.closed or held is None:
                return
            while held and held[0][0] is not None:
                self.conn.send_method(self.number, held.popleft()[0])
            if not held:
                self._held_replies = None
            self.session.wake()
        store.when_durable(durable)

    # ---- channel class ----
    def on_flow(self, m) -> None:
        # RabbitMQ 3.x refuses client-initiated flow stop; we keep its wire contract.
        if not m.active:
            raise errors.not_implemented("active=false")
        self.reply(spec.Channel.FlowOk(True))

    # ---- basic class ----
    def on_basic_qos(self, m) -> None:
        if m.prefetch_size != 0:
            raise errors.not_implemented(f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_prefetch = m.prefetch_count
        else:
            # RabbitMQ fixes a consumer's limit at basic.consume; we also apply a later qos to
            # the channel's running consumers. kombu (Celery) sends global=false to any broker
            # not named RabbitMQ and raises it while holding ETA tasks: a frozen limit starves
            # the worker. Consumers created after the qos behave exactly as on RabbitMQ.
            self.prefetch = m.prefetch_count
            for consumer in self.consumers.values():
                consumer.prefetch = m.prefetch_count
                consumer.queue.credit_changed(consumer)
        self.reply(spec.Basic.QosOk())
        self._kick_consumers()

    def on_basic_consume(self, m) -> None:
        if self._queue_name(m.queue) == REPLY_QUEUE:
            self._consume_replies(m)
            return
        if self.authz is not None:
            self.authz.check("queue", self._queue_name(m.queue), "read")
        q = self.vhost.get_queue(self._queue_name(m.queue), self.session)
        # the queue's type may refuse: a channel's global QoS, no_ack, arguments (streams)
        q.admit_consumer(self, m.no_ack, m.arguments or {})
        tag = m.consumer_tag or _random_tag("amq.ctag-")
        if tag in self.consumers:
            raise errors.not_allowed(f"attempt to reuse consumer tag '{tag}'")
        if q.consumers and (m.exclusive or q.exclusive_consumer):
            raise errors.access_refused("%s in exclusive use", self.vhost.queue_resource(q.name))
        args = m.arguments or {}
        priority = args.get("x-priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise errors.precondition_failed("invalid arg 'x-priority' for consumer: must be an integer")
        consumer = Consumer(tag, self, q, m.no_ack, m.exclusive, priority, self.prefetch, args,
                            _selector(args.get("x-filter")))
        self.consumers[tag] = consumer
        if not m.nowait:
            self.reply(spec.Basic.ConsumeOk(tag))
        q.add_consumer(consumer)

    def _consume_replies(self, m) -> None:
        """basic.consume of amq.rabbitmq.reply-to: the channel's reply consumer (no queue)."""
        if m.consumer_tag in self.consumers:
            raise errors.not_allowed(f"attempt to reuse consumer tag '{m.consumer_tag}'")
        if not m.no_ack:
            raise errors.precondition_failed("reply consumer cannot acknowledge")
        if self.reply_consumer is not None:
            raise errors.precondition_failed("reply consumer already set")
        tag = m.consumer_tag or _random_tag("amq.ctag-")
        self.reply_consumer = self.session.broker.direct_reply.register(self, tag)
        if not m.nowait:
            self.reply(spec.Basic.ConsumeOk(tag))

    def _cancel_replies(self) -> None:
        rc, self.reply_consumer = self.reply_consumer, None
        if rc is not None:
            self.session.broker.direct_reply.unregister(rc)

    def on_basic_cancel(self, m) -> None:
        rc = self.reply_consumer
        if rc is not None and rc.tag == m.consumer_tag:
            self._cancel_replies()
            if not m.nowait:
                self.reply(spec.Basic.CancelOk(m.consumer_tag))
            return
        consumer = self.consumers.pop(m.consumer_tag, None)
        if not m.nowait:
            self.reply(spec.Basic.CancelOk(m.consumer_tag))
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away: tell the client if it understands basic.cancel."""
        if self.consumers.pop(consumer.tag, None) is None or self.closed:
            return
        if self.session.conn.client_capabilities.get("consumer_cancel_notify"):
            if self._deferred_cancels is not None:
                self._deferred_cancels.append(consumer.tag)
                return
            self.reply(spec.Basic.Cancel(consumer.tag, True))
            self.session.wake()

    def on_basic_get(self, m) -> None:
        if self.authz is not None:
            self.authz.check("queue", self._queue_name(m.queue), "read")
        q = self.vhost.get_queue(self._queue_name(m.queue), self.session)
        entry = q.get()
        if entry is None:
            self.stats_get_empty += 1
            q.stats_get_empty += 1
            self.reply(spec.Basic.GetEmpty(""))
            return
        tag = self.next_tag
        self.next_tag += 1
        message = entry.message
        self.conn.get_ok(self.number, tag, entry.redelivered, message.exchange, message.routing_key,
                         q.message_count, message.props_raw, message.body)
        if entry.redelivered:
            self.stats_redeliver += 1
        if self.audit is not None:
            self.audit.delivered(self, None, tag, q, entry)
        if m.no_ack:
            self.stats_get_no_ack += 1
            q.stats_get_no_ack += 1
            q.settled(entry)
        else:
            self.stats_get += 1
            q.stats_get += 1
            q.unacked_count += 1
            q.unacked_bytes += len(entry.message.body)
            self.unacked[tag] = Unacked(tag, entry, q, None, self.timeouts.period)

    def _take_unacked(self, tag: int, multiple: bool, m) -> list:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                return unacked.take_upto(0)
            if unacked.aged.live:
                if not unacked.has(tag):
                    raise errors.precondition_failed("unknown delivery tag %d", tag)
                return unacked.take_upto(tag)
            if tag not in unacked:
                raise errors.precondition_failed("unknown delivery tag %d", tag)
            upto = []
            for first in unacked:  # in tag order
                if first > tag:
                    break
                upto.append(first)
            return [unacked.pop(first) for first in upto]
        item = unacked.pop(tag, None)
        if item is None:
            item = unacked.aged.pop(tag) if unacked.aged.live else None
            if item is None:
                raise errors.precondition_failed("unknown delivery tag %d", tag)
        return [item]

    def on_basic_ack(self, m) -> None:
        taken = self._take_unacked(m.delivery_tag, m.multiple, m)
        if self.tx is not None:
            self.tx.append(("ack", taken))
            return
        self._settle(taken, ack=True)

    def on_basic_nack(self, m) -> None:
        taken = self._take_unacked(m.delivery_tag, m.multiple, m)
        self._refuse_negative(taken)
        if self.audit is not None:
            self.audit.rejected(self, taken, m.requeue, "nacked")
        if self.tx is not None:
            self.tx.append(("requeue" if m.requeue else "reject", taken))
            return
        self._settle(taken, ack=False, requeue=m.requeue)

    def on_basic_reject(self, m) -> None:
        taken = self._take_unacked(m.delivery_tag, False, m)
        self._refuse_negative(taken)
        if self.audit is not None:
            self.audit.rejected(self, taken, m.requeue, "rejected")
        if self.tx is not None:
            self.tx.append(("requeue" if m.requeue else "reject", taken))
            return
        self._settle(taken, ack=False, requeue=m.requeue)

    @staticmethod
    def _refuse_negative(taken: list[Unacked]) -> None:
        """A queue type without nack/reject (streams) refuses them (RabbitMQ: 540)."""
        for item in taken:
            item.queue.refuse_negative()

    def _settle(self, taken: list[Unacked], ack: bool, requeue: bool = False) -> None:
        queues: dict[Queue, None] = {}  # the queues touched, in order
        if ack:
            self.stats_ack += len(taken)
            audit = self.audit
            for item in taken:
                if audit is not None:
                    audit.acked(self, item)  # the queue's SETTLE, as the client's ack
                item.queue.ack(item.entry, item.consumer, reported=True)
                queues[item.queue] = None
        elif requeue:
            by_queue: dict = {}
            for item in taken:
                by_queue.setdefault(item.queue, []).append((item.entry, item.consumer))
            for q, items in by_queue.items():
                items.sort(key=lambda pair: -pair[0].seq)
                q.requeue(items)
        else:
            for item in taken:
                item.queue.reject(item.entry, item.consumer)
                queues[item.queue] = None
        if self.global_prefetch:  # the channel's credit returned: to all its consumers' queues
            queues.update(dict.fromkeys(c.queue for c in self.consumers.values()))
        for q in queues:
            if q.consumers:
                q.dispatch()

    def on_basic_recover(self, m) -> None:
        if not m.requeue:
            raise errors.not_implemented("requeue=false")
        self.requeue_all()
        if isinstance(m, spec.Basic.Recover):
            self.reply(spec.Basic.RecoverOk())

    def requeue_all(self) -> None:
        taken = self.unacked.take_upto(0)
        if taken:
            self._settle(taken, ack=False, requeue=True)

    # ---- publishing ----
    def on_publish(self, ev) -> None:
        self.stats_publish += 1
        properties = ev.properties
        seq = 0
        if self.confirm:
            seq = self.next_publish_seq
            self.next_publish_seq = seq + 1
            self._unconfirmed.append(seq)
        vhost = self.vhost
        authz = self.authz
        if authz is not None and ev.exchange not in authz.write_ok:
            authz.check("exchange", ev.exchange, "write")
        x = vhost.exchanges.get(ev.exchange)
        if x is None:
            # destinations created on first use (virtual topics, composite destinations)
            x = vhost.resolve_exchange(ev.exchange)
            if x is None:
                raise errors.not_found(vhost.exchange_resource(ev.exchange))
        if x.internal:
            raise errors.access_refused("cannot publish to internal %s",
                                        vhost.exchange_resource(ev.exchange))
        if authz is not None and authz.topics and x.type_name == "topic":
            authz.check_topic(x.name, ev.routing_key, "write")
        if x.arguments or x.effective_policy_definition:  # an Avro schema, by argument or policy
            problem = avro.exchange_problem(x, ev.body, properties)
            if problem is not None:
                if seq:  # confirm mode: a nack, the channel stays open
                    self.confirm_decided(seq, False)
                    return
                raise avro.publish_refused(vhost, ev.exchange, problem)
        if ev.immediate:
            raise errors.not_implemented("immediate=true")
        props_raw = ev.props_raw
        if properties.get("reply_to") == REPLY_QUEUE:  # a direct reply-to request
            rc = self.reply_consumer
            if rc is None:
                raise errors.precondition_failed("fast reply consumer does not exist")
            properties = dict(properties, reply_to=rc.name)
            props_raw = encode_properties(properties)
        user_id = properties.get("user_id")
        if user_id is not None and user_id != self.session.conn.username \
                and not (authz is not None and authz.impersonator):
            raise errors.precondition_failed(
                "user_id property set to '%s' but authenticated user was '%s'", user_id,
                self.session.conn.username)
        if "expiration" in properties:
            try:
                parse_expiration(properties["expiration"])
            except ExpirationError as exc:
                raise errors.precondition_failed(str(exc)) from None
        message = Message(ev.exchange, ev.routing_key, props_raw, properties, ev.body)
        if self.tx is not None:
            self.tx.append(("publish", (message, ev.mandatory)))
            return
        self.publish(message, ev.mandatory, seq)

    def publish(self, message: Message, mandatory: bool, seq: int = 0,
                hooks: bool = True) -> None:
        """Through the broker's one publish path (``publishing.py``: hooks, route, enqueue,
        flow, audit, confirm); this channel answers a mandatory miss and a transaction's
        commit. ``hooks=False``: a message a hook took over earlier (a half message's
        commit)."""
        outcome = self.publishing.publish(self, message, mandatory, seq, hooks=hooks,
                                          waits=self.tx_waits)
        if outcome is UNROUTABLE:
            # a direct reply went straight to its requester in route(); a mandatory one is
            # returned all the same, as on RabbitMQ
            if mandatory:
                self.stats_return_unroutable += 1
                self.send_return(message, spec.NO_ROUTE, "NO_ROUTE")
            else:
                self.stats_drop_unroutable += 1

    def queue_over_threshold(self, queue: Queue) -> None:
        """Flow control: the connection decides (``Session.queue_over_threshold``)."""
        self.session.queue_over_threshold(queue)

    def send_return(self, message: Message, code: int, text: str) -> None:
        self.conn.basic_return(self.number, code, text, message.exchange, message.routing_key,
                               message.props_raw, message.body)
        # Returns also come from timers (scheduled messages), outside any receive batch.
        self.session.wake()

    # ---- teardown ----
    def _kick_consumers(self) -> None:
        for consumer in list(self.consumers.values()):
            consumer.queue.dispatch()

    def stop_deliveries(self) -> None:
        """No more deliveries or replies on this channel; ``close`` still releases it."""
        self.closed = True

    def close(self) -> None:
        """Channel gone (either side): requeue what was unacked, then cancel consumers.

        Every way a channel or its connection ends comes here, once. The channel stops taking
        deliveries first, so a requeued message cannot be dispatched back to a consumer of
        this channel (or, via ``Session``, of a sibling channel of the same dying connection)
        and vanish with it. Requeueing before the consumers go means a queue's next consumer
        (single active consumer hand-over) gets the returned messages first, in queue order.
        """
        if self.released:
            return
        self.released = True
        self.session.broker.message_totals.retire(self)  # its counters outlive it
        self.timeouts.forget(self)
        self.stop_deliveries()
        if self.tx:
            for kind, data in self.tx:
                if kind != "publish":
                    for item in data:
                        self.unacked[item.tag] = item
            self.tx = None
        self.requeue_all()
        self._cancel_replies()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)

    # ---- seam for broker.on_store_failure (persistence/seams) ----
    @property
    def awaiting_confirms(self) -> bool:
        """True if the channel is in confirm mode and owes publisher confirms."""
        return self.confirm and bool(self._unconfirmed)
    # ---- end of seam ----


_HANDLERS = {
    spec.Channel.Flow: Channel.on_flow,
    spec.Exchange.Declare: Channel.on_exchange_declare,
    spec.Exchange.Delete: Channel.on_exchange_delete,
    spec.Exchange.Bind: Channel.on_exchange_bind,
    spec.Exchange.Unbind: Channel.on_exchange_unbind,
    spec.Queue.Declare: Channel.on_queue_declare,
    spec.Queue.Bind: Channel.on_queue_bind,
    spec.Queue.Unbind: Channel.on_queue_unbind,
    spec.Queue.Purge: Channel.on_queue_purge,
    spec.Queue.Delete: Channel.on_queue_delete,
    spec.Basic.Qos: Channel.on_basic_qos,
    spec.Basic.Consume: Channel.on_basic_consume,
    spec.Basic.Cancel: Channel.on_basic_cancel,
    spec.Basic.Get: Channel.on_basic_get,
    spec.Basic.Ack: Channel.on_basic_ack,
    spec.Basic.Nack: Channel.on_basic_nack,
    spec.Basic.Reject: Channel.on_basic_reject,
    spec.Basic.Recover: Channel.on_basic_recover,
    spec.Basic.RecoverAsync: Channel.on_basic_recover,
    spec.Confirm.Select: Channel.on_confirm_select,
    spec.Tx.Select: Channel.on_tx_select,
    spec.Tx.Commit: Channel.on_tx_commit,
    spec.Tx.Rollback: Channel.on_tx_rollback,
}
