"""An MQTT session's subscriptions as bindings and shared-queue consumers; no deliveries."""
from __future__ import annotations

import logging
from typing import Any

from .. import errors
from ..exchanges.topic import MQTT_SUBSCRIPTION_ARG
from ..mqtt import codec
from ..mqtt import properties as P
from ..mqtt.encoding import topic_field
from ..mqtt.topics import matches, to_mqtt_topic, to_routing_key
from ..queues.queue import Consumer, Queue
from .mqtt_mapping import (
    MAX_KEY,
    NEVER_EXPIRES,
    NO_DICT,
    NO_LOCAL,
    OPTIONS_ARG,
    QOS_ARG,
    RETAIN_AS_PUBLISHED,
    SHARED_ARG,
    SUBSCRIPTION_ID_ARG,
    encode_v5_props,
    queue_names,
    shared_queue_name,
    split_shared,
)
from .mqtt_state import MQTTSessionState

log = logging.getLogger("broker.mqtt")


class MQTTSubscriptions(MQTTSessionState):
    """SUBSCRIBE / UNSUBSCRIBE as bindings of the session's queue, shared subscriptions as
    consumers of a group's queue."""

    __slots__ = ()

    def _restore_filters(self, q: Queue) -> None:
        """The subscriptions of a stored session, from its queue's bindings."""
        exchanges = self.vhost.exchanges
        for source, bkey in list(q.bindings):
            x = exchanges.get(source)
            binding = x.bindings.get(bkey) if x is not None else None
            if binding is None or source != self.service.exchange:
                continue
            args = binding.arguments
            topic_filter = args.get(MQTT_SUBSCRIPTION_ARG)
            if not isinstance(topic_filter, str):
                topic_filter = to_mqtt_topic(binding.routing_key.replace("*", "+"))
            qos = args.get(QOS_ARG, 1)
            if self.filters is NO_DICT:
                self.filters = {}
            self.filters[topic_filter] = qos if qos in (0, 1, 2) else 1
            bits, sub_id = args.get(OPTIONS_ARG, 0), args.get(SUBSCRIPTION_ID_ARG, 0)
            if isinstance(bits, int) and isinstance(sub_id, int):
                self._set_options(topic_filter, bits, sub_id)
        self._filters_changed()

    def _adopt_legacy_queue(self, q0: Queue, q1: Queue | None) -> Queue | None:
        """A session stored by a version with a separate QoS 0 queue: its subscriptions
        become QoS 0 bindings of the subscription queue, and the queue goes (with what
        it held: transient QoS 0 messages, which at most once allows to lose)."""
        exchanges = self.vhost.exchanges
        filters = []
        for source, bkey in list(q0.bindings):
            x = exchanges.get(source)
            binding = x.bindings.get(bkey) if x is not None else None
            if binding is not None and source == self.service.exchange:
                f = binding.arguments.get(MQTT_SUBSCRIPTION_ARG)
                if not isinstance(f, str):
                    f = to_mqtt_topic(binding.routing_key.replace("*", "+"))
                filters.append((f, binding.routing_key))
        self.vhost.delete_queue(q0, reason="MQTT session upgraded to one queue")
        if not filters:
            return q1
        if q1 is None:
            q1 = self._declare_queue()
        for f, key in filters:
            self.vhost.bind(self.service.exchange, q1, key, self._binding_args(f, 0))
        return q1

    def _on_subscribe(self, packet_id: int, topics: list[tuple[str, int]],
                      properties: dict | None = None) -> None:
        sub_id = properties.get(P.SUBSCRIPTION_IDENTIFIER, 0) if properties else 0
        codes = []
        vhost = self.vhost
        exchange = self.service.exchange
        granted = []
        durable = False  # a durable queue or binding was declared: the SUBACK waits for it
        v5 = self.expiry is not None
        for topic_filter, options in topics:
            qos = options & 0x03
            send_retained = True
            bits = 0
            if topic_filter.startswith("$share/"):  # section 4.8.2 (Mosquitto: in 3.1.1 too)
                codes.append(self._subscribe_shared(topic_filter, qos, sub_id))
                continue
            if v5:
                bits = options & (NO_LOCAL | RETAIN_AS_PUBLISHED)
                handling = (options >> 4) & 0x03  # section 3.8.3.1: Retain Handling
                send_retained = handling == 0 or (handling == 1
                                                  and topic_filter not in self.filters)
            key = to_routing_key(topic_filter)
            try:
                if len(key.encode()) > MAX_KEY:
                    raise errors.precondition_failed("topic filter longer than %d bytes", MAX_KEY)
                q = self._subscription_queue()
                self._check("queue", q.name, "write")
                self._check("exchange", exchange, "read")
                self._check_topic(key, "read")
                args = self._binding_args(topic_filter, qos, bits, sub_id)
                olds = self._old_binding_args(topic_filter, args)
                vhost.bind(exchange, q, key, args)
                # the same filter subscribed before with other options, or as bound by
                # earlier versions (no QoS; no filter before the '$' rule existed)
                for old in olds:
                    vhost.unbind(exchange, q, key, old)
                if self.filters is NO_DICT:
                    self.filters = {}
                self.filters[topic_filter] = qos
                self._set_options(topic_filter, bits, sub_id)
            except errors.AMQPError as exc:
                log.warning("mqtt client %r: subscription to %r refused: %s", self.client_id,
                            topic_filter, exc.text)
                codes.append(P.NOT_AUTHORIZED if exc.code == 403
                             else codec.SUBACK_FAILURE)
                continue
            codes.append(qos)
            durable = durable or q.durable
            if send_retained:
                granted.append((topic_filter, qos))
        self._filters_changed()
        if self.ended:
            # what the client sent before its connection ended takes effect (the session's
            # last reads, ``connection_lost``): nobody to answer, and no SUBACK before the
            # subscription is durable
            return
        self._acks_first()

        def answer() -> None:
            self.conn.suback(packet_id, codes)
            self._send_retained(granted, sub_id)
        if durable:
            # a persistent session's queue and bindings are durable definitions: answered
            # once the store has made them durable, as a queue.declare-ok (a kill -9 right
            # after the SUBACK keeps the subscription); the read's end registers it, behind
            # the store waits of the packets before it
            self._suback_waits = answer
        else:
            answer()

    def _send_retained(self, granted: list[tuple[str, int]], sub_id: int) -> None:
        """The retained messages matching the new subscriptions' filters, after their
        SUBACK (section 3.3.1.3), at the lower of the granted QoS and their own."""
        vhost = self.vhost
        v5 = self.expiry is not None
        retained = self.service.retained
        for topic_filter, qos in granted:
            for topic, payload, rqos in retained.matching(vhost.name, topic_filter):
                extra = None
                if retained.extra:
                    extra = retained.properties(vhost.name, topic)
                    if extra is None and retained.get(vhost.name, topic) is None:
                        continue  # its Message Expiry Interval has passed: dropped
                props = b""
                if v5:  # its properties, the expiry left, the subscription's identifier
                    v5props: dict[int, Any] = {}
                    if extra is not None:
                        v5props.update(extra[0])
                        if extra[1] is not None:
                            v5props[P.MESSAGE_EXPIRY_INTERVAL] = extra[1]
                    if sub_id:
                        v5props[P.SUBSCRIPTION_IDENTIFIER] = [sub_id]
                    props = encode_v5_props(v5props)
                self.conn.publish(topic_field(topic), payload, min(qos, rqos), None, retain=True,
                                  props=props)

    def _subscribe_shared(self, full: str, qos: int, sub_id: int) -> int:
        """A shared subscription: this session becomes a consumer of the group's queue
        (bound once per group and filter); no retained messages (section 4.8.2). The
        reason code for the SUBACK."""
        parsed = split_shared(full)
        if parsed is None:
            return P.TOPIC_FILTER_INVALID
        group, topic_filter = parsed
        name = shared_queue_name(group, topic_filter)
        key = to_routing_key(topic_filter)
        if len(name.encode()) > MAX_KEY or len(key.encode()) > MAX_KEY:
            return P.TOPIC_FILTER_INVALID
        exchange = self.service.exchange
        vhost = self.vhost
        try:
            self._check("queue", name, "configure")
            self._check("queue", name, "read")
            self._check("queue", name, "write")
            self._check("exchange", exchange, "read")
            self._check_topic(key, "read")
            q = vhost.find_queue(name)
            if q is None:
                # lives while it has members: the last one leaving deletes it
                q = vhost.declare_queue(name, None, durable=False, auto_delete=True)
            vhost.bind(exchange, q, key, {MQTT_SUBSCRIPTION_ARG: topic_filter, SHARED_ARG: group})
        except errors.AMQPError as exc:
            log.warning("mqtt client %r: shared subscription %r refused: %s", self.client_id,
                        full, exc.text)
            return P.NOT_AUTHORIZED if exc.code == 403 else codec.SUBACK_FAILURE
        args = {QOS_ARG: qos}
        if sub_id:
            args[SUBSCRIPTION_ID_ARG] = sub_id
        old = self.consumers.pop(name, None)
        if old is not None:  # subscribed again: the new QoS and identifier
            old.arguments = args
            old.no_ack = qos == 0
            self.consumers[name] = old
            return qos
        prefetch = min(self.service.prefetch, self.receive_max)
        consumer = Consumer(f"mqtt-{self.client_id}-{name}", self.as_channel(), q, qos == 0, False,
                            0, prefetch, args)
        self.consumers[name] = consumer
        q.add_consumer(consumer)
        return qos

    def _unsubscribe_shared(self, full: str) -> int:
        parsed = split_shared(full)
        consumer = None
        if parsed is not None:
            consumer = self.consumers.pop(shared_queue_name(*parsed), None)
        if consumer is None:
            return P.NO_SUBSCRIPTION_EXISTED
        consumer.queue.remove_consumer(consumer)  # the last member: the queue goes
        return P.SUCCESS

    @staticmethod
    def _binding_args(topic_filter: str, qos: int, bits: int = 0, sub_id: int = 0) -> dict:
        args: dict[str, Any] = {MQTT_SUBSCRIPTION_ARG: topic_filter, QOS_ARG: qos}
        if bits:
            args[OPTIONS_ARG] = bits
        if sub_id:
            args[SUBSCRIPTION_ID_ARG] = sub_id
        return args

    def _old_binding_args(self, topic_filter: str, new: dict | None = None) -> list[dict]:
        olds: list[dict] = [{}, {MQTT_SUBSCRIPTION_ARG: topic_filter}]
        prev = self.filters.get(topic_filter)
        if prev is not None:
            bits, sub_id = self.sub_opts.get(topic_filter, (0, 0))
            old = self._binding_args(topic_filter, prev, bits, sub_id)
            if old != new:
                olds.append(old)
        return olds

    def _set_options(self, topic_filter: str, bits: int, sub_id: int) -> None:
        if bits or sub_id:
            if self.sub_opts is NO_DICT:
                self.sub_opts = {}
            self.sub_opts[topic_filter] = (bits, sub_id)
        elif topic_filter in self.sub_opts:
            del self.sub_opts[topic_filter]

    def _filters_changed(self) -> None:
        values = set(self.filters.values())
        self._one_qos = values.pop() if len(values) == 1 else None
        self._filter_qos = None
        consumer = self.consumers.get(1)
        if consumer is not None:
            # only QoS 0 subscriptions: deliveries are settled as the queue hands them out
            # (no ack per message); deliveries in flight before a change settle as they were
            consumer.no_ack = self._one_qos == 0

    def _subscription_qos(self, routing_key: str) -> int:
        """The highest QoS of the filters matching ``routing_key`` (1 if none does any
        more: the message was queued before an UNSUBSCRIBE, or bound over AMQP)."""
        cache = self._filter_qos
        if cache is None:
            cache = self._filter_qos = {}
        qos = cache.get(routing_key)
        if qos is None:
            if len(cache) >= 256:  # bounded, as the topic cache
                cache.clear()
            topic = to_mqtt_topic(routing_key)
            found = [q for f, q in self.filters.items() if matches(f, topic)]
            qos = cache[routing_key] = max(found) if found else 1
        return qos

    def _subscription_queue(self):
        consumer = self.consumers.get(1)
        if consumer is not None:
            return consumer.queue
        q = self._declare_queue()
        self._consume(q)
        return q

    def _declare_queue(self):
        name = queue_names(self.client_id)[1]
        self._check("queue", name, "configure")
        self._check("queue", name, "read")
        # Durable unless clean. A clean session lasts as long as its connection (MQTT 3.1.1
        # section 3.1.2.4; a restart ends it), so its messages need no disk (RabbitMQ's 3.x
        # plugin declares it durable and auto-delete: a difference).
        args = {}
        if self.expiry and self.expiry != NEVER_EXPIRES:
            # an MQTT 5 session expires that long after its last connection ends: the queue's
            # x-expires (unused that long: no consumer) is exactly that (section 3.1.2.11.2)
            args["x-expires"] = self.expiry * 1000
        return self.vhost.declare_queue(name, None, durable=not self.clean,
                                        auto_delete=self.clean, arguments=args)

    def _consume(self, q: Queue) -> None:
        tag = f"mqtt-{self.client_id}-qos1"
        # a v5 client's Receive Maximum bounds the QoS 1/2 deliveries in flight (3.3.4)
        prefetch = min(self.service.prefetch, self.receive_max)
        consumer = Consumer(tag, self.as_channel(), q, self._one_qos == 0, False, 0, prefetch, {})
        self.consumers[1] = consumer
        q.add_consumer(consumer)

    def _on_unsubscribe(self, packet_id: int, topics: list[str]) -> None:
        exchange = self.service.exchange
        codes = [P.SUCCESS if f in self.filters else P.NO_SUBSCRIPTION_EXISTED for f in topics]
        for i, topic_filter in enumerate(topics):
            if topic_filter.startswith("$share/"):
                codes[i] = self._unsubscribe_shared(topic_filter)
                continue
            key = to_routing_key(topic_filter)
            main = self.consumers.get(1)
            for consumer in (main,) if main is not None else ():
                try:
                    for args in self._old_binding_args(topic_filter):
                        self.vhost.unbind(exchange, consumer.queue, key, args)
                except errors.AMQPError as exc:  # pragma: no cover - not our exclusive queue
                    log.warning("mqtt client %r: unsubscribe %r: %s", self.client_id,
                                topic_filter, exc.text)
            self.filters.pop(topic_filter, None)
            if topic_filter in self.sub_opts:
                del self.sub_opts[topic_filter]
        self._filters_changed()
        self._acks_first()
        self.conn.unsuback(packet_id, codes)

    def _acks_first(self) -> None:
        """The PUBACKs decided in this read (of PUBLISHes before the packet answered now)
        go before its answer."""
        if self._ack_now:
            self.conn.pubacks(self._ack_now)
            self._ack_now = []
