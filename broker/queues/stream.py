"""The stream queue type over AMQP 0-9-1: a replayable log (``broker/streams/log.py``)
that any number of consumers read without removing anything.

What RabbitMQ 3.10-3.13 does, and this class does too:

* a publish appends a record to the log (batched into one chunk per commit); its
  confirm waits for the log's group commit (``when_durable``), not the classic store;
* each consumer has its own cursor: ``x-stream-offset`` (first, last, next (the
  default), an offset, a timestamp, an interval such as ``1h``) says where it starts;
  deliveries carry the header ``x-stream-offset``; a consumer needs a prefetch, and its
  acks only return credit; no auto-ack, no basic.get, no nack/reject, no purge (540);
* ``x-stream-filter`` / ``x-stream-match-unfiltered`` (3.13): chunks whose Bloom filter
  cannot match are skipped unread, and inside a chunk only records whose
  ``x-stream-filter-value`` header is one of the values (or, with match-unfiltered,
  records without one) are delivered: exact, server side;
* retention (``x-max-age``, ``x-max-length-bytes``, and the policy keys ``max-age``,
  ``max-length-bytes``, ``stream-max-segment-size-bytes``) drops whole segments.

Memory: a consumer holds its cursor and the records of the one chunk it is reading;
the queue holds nothing per stored message. The queue's ready list stays empty (the
publish path's flow control reads it: a stream never throttles its publishers).
"""
from __future__ import annotations

import logging
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import errors
from ..amqp.fields import Long, encode_properties
from ..message import Message
from ..streams import record as records
from ..streams.log import DEFAULT_MAX_SEGMENT_SIZE, Reader, bloom_accepts
from .entry import QueueEntry
from .queue import Consumer, Queue
from .stream_args import OffsetSpecError, age_seconds, offset_spec, stream_filter
from .types import NODE_NAME

if TYPE_CHECKING:
    from ..vhost import VirtualHost
    from .args import QueueOptions
    from .consumer import AdmittedChannel

logger = logging.getLogger("triomq.streams")


CHUNKS_PER_DISPATCH = 16  # chunks one consumer reads per dispatch at most (then: the timer)


class _Cursor:
    __slots__ = ("accept", "filter", "pending", "reader", "start")

    def __init__(self, reader: Reader, start: int, flt: tuple[frozenset[str], bool] | None) -> None:
        self.reader = reader
        self.start = start  # records before it (in the first chunk) are skipped
        self.filter = flt  # (values, match_unfiltered) or None
        # chunks whose Bloom filter cannot match are skipped unread
        self.accept = None if flt is None else (
            lambda bloom: bloom_accepts(bloom, flt[0], flt[1]))
        self.pending: deque[tuple[int, bytes]] = deque()  # (offset, record) of the chunk being read


def refuse_consumer(resource: errors.Resource, channel: AdmittedChannel, no_ack: bool,
                    arguments: dict[str, Any] | None) -> None:
    """What a stream refuses of a basic.consume, with RabbitMQ's codes (a stream's reader
    on any node: this queue, or a cluster node's copy)."""
    if no_ack:
        raise errors.not_implemented(
            "automatic acknowledgement not supported by stream queues %s", resource)
    if not channel.prefetch:
        raise errors.precondition_failed("consumer prefetch count is not set for '%s'",
                                         resource)
    try:
        offset_spec((arguments or {}).get("x-stream-offset"))
    except OffsetSpecError:
        # RabbitMQ's channel process crashes on an offset it cannot read
        err = errors.internal_error("")
        err.text = "INTERNAL_ERROR"
        raise err from None


class StreamQueue(Queue):
    def __init__(self, vhost: VirtualHost, name: str, durable: bool = True,
                 exclusive_owner: object | None = None, auto_delete: bool = False,
                 arguments: dict[str, Any] | None = None, opts: QueueOptions | None = None,
                 fresh: bool = False) -> None:
        super().__init__(vhost, name, durable=durable, exclusive_owner=exclusive_owner,
                         auto_delete=auto_delete, arguments=arguments, opts=opts)
        streams = vhost.streams
        if streams is None:
            raise errors.internal_error("streams have no storage in vhost '%s'", vhost.name)
        started = time.perf_counter()
        self.log = streams.open(vhost.name, name, **self._log_settings())
        if not fresh:
            logger.info("stream %r in vhost %r: %d messages in %d segment(s), opened in "
                        "%.1f ms", name, vhost.name, self.log.message_count,
                        self.log.segment_count, (time.perf_counter() - started) * 1000)
        if fresh and self.log.next_offset:
            # a new queue: files left by an earlier stream of that name are not its own
            streams.forget(self.log)
            self.log.delete()
            self.log = streams.open(vhost.name, name, **self._log_settings())
        self.log.listeners.append(self._committed)
        self._streams = streams
        self._cursors: dict[Consumer, _Cursor] = {}
        self._last_appended = -1
        self._first_told = self.log.first_offset  # below it: told to observers as truncated
        self._resume_pending = False
        self.durability = self  # confirms wait for the log
        # A new queue's definition is written by the store's group commit, not the log's:
        # until the store has made it durable, a confirm waits for both (a confirmed
        # message of a stream whose definition a crash lost would be gone at the restart).
        self._definition_unstored = fresh

    def _log_settings(self) -> dict[str, Any]:
        arguments, policy = self.arguments, self.effective_policy_definition
        segment = arguments.get("x-stream-max-segment-size-bytes",
                                policy.get("stream-max-segment-size-bytes"))
        age = arguments.get("x-max-age", policy.get("max-age"))
        if isinstance(age, bytes):
            age = age.decode()
        return {"max_segment_size": segment or DEFAULT_MAX_SEGMENT_SIZE,
                "max_bytes": self.opts.max_length_bytes,
                "max_age": age_seconds(age) if isinstance(age, str) else None}

    # ---- info ----
    @property
    def message_count(self) -> int:
        return self.log.message_count

    def type_info(self) -> dict[str, Any]:
        log = self.log
        return {"segments": log.segment_count, "first_offset": log.first_offset,
                "committed_offset": log.committed_offset, "stream_bytes": log.size_bytes,
                "readers": {NODE_NAME: len(self.consumers)}}

    def attach_store(self, store: Any) -> None:
        # the store keeps the definition only: messages are the log's, not its
        self.store = store

    # ---- publishing ----
    def enqueue(self, message: Message, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        try:
            self._last_appended = self.log.append_record(records.encode(message),
                                                         records.filter_value(message))
        except OSError:
            logger.exception("stream %r: append failed; the publish is refused", self.name)
            return False  # nacked, as a queue refusing a publish
        self.stats_published += 1
        told = self.observers.told
        if told:  # the audit trail: which record the message is
            for observer in told:
                observer.stream_appended(self, ((message.id, self._last_appended),))
        return True

    def when_durable(self, callback: Callable[[], None],
                     on_failure: Callable[[], None] | None = None) -> None:
        """Call ``callback`` once everything published to this stream so far is durable,
        and the queue's definition too (``on_failure``: the store could not write it)."""
        offset = self._last_appended
        store = self.store
        if not self._definition_unstored or store is None:
            self.log.when_durable(offset, callback)
            return

        def stored() -> None:
            self._definition_unstored = False
            self.log.when_durable(offset, callback)
        store.when_durable(stored, on_failure=on_failure)

    def _committed(self) -> None:
        if self.log.first_offset != self._first_told:
            self._tell_truncated("retention")
        if self.consumers:
            self.dispatch()

    def _tell_truncated(self, reason: str, upto: int | None = None) -> None:
        first, self._first_told = self._first_told, upto or self.log.first_offset
        for observer in self.observers.told:
            observer.stream_truncated(self, first, self._first_told - first, reason)

    # ---- consumers ----
    def admit_consumer(self, channel: AdmittedChannel, no_ack: bool = False,
                       arguments: dict[str, Any] | None = None) -> None:
        refuse_consumer(self.vhost.queue_resource(self.name), channel, no_ack, arguments)
        super().admit_consumer(channel)

    def add_consumer(self, consumer: Consumer) -> None:
        spec = offset_spec(consumer.arguments.get("x-stream-offset"))
        reader = self.log.reader(spec)
        start = spec if isinstance(spec, int) else reader.next_offset
        self._cursors[consumer] = _Cursor(reader, start, stream_filter(consumer.arguments))
        self.consumers.append(consumer)
        self._had_consumer = True
        self.touch()
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        cursor = self._cursors.pop(consumer, None)
        if cursor is not None:
            cursor.reader.close()

    def dispatch(self) -> None:
        for consumer in list(self.consumers):
            cursor = self._cursors.get(consumer)
            if cursor is not None:
                self._feed(consumer, cursor)

    def _feed(self, consumer: Consumer, cursor: _Cursor) -> None:
        # a bounded amount of reading per call: a filtered consumer far behind skips many
        # chunks, and the rest waits for the timer heap's next round (_resume), so the loop
        # serves everyone else in between
        chunks = CHUNKS_PER_DISPATCH
        while consumer.can_take():
            if not cursor.pending:
                if chunks == 0 or not self._next_chunk(cursor):
                    if cursor.reader.more:
                        self._continue_later()
                    return
                chunks -= 1
            offset, raw = cursor.pending.popleft()
            message = self._message(offset, raw, cursor.filter)
            if message is None:
                continue
            entry = QueueEntry(message, offset)
            consumer.unacked += 1
            self.unacked_count += 1
            self.stats_delivered += 1
            consumer.channel.deliver(consumer, self, entry)
            protocol = consumer.channel.metrics_protocol
            if protocol is not None and protocol != "amqp091":  # (amqp091: the rest)
                self.vhost.churn.delivered(protocol, self, consumer.no_ack, False)

    def _next_chunk(self, cursor: _Cursor) -> bool:
        """The next chunk's records (from the cursor's start) into ``cursor.pending``;
        False when there is none now (or the skipping budget ran out: ``reader.more``)."""
        chunk = cursor.reader.next_chunk(cursor.accept)
        if chunk is None:
            return False
        start = cursor.start
        cursor.pending.extend(r for r in chunk.records() if r[0] >= start)
        return True

    def _continue_later(self) -> None:
        if not self._resume_pending and not self.deleted:
            self._resume_pending = True
            self.vhost.timers.call_later(0, self._resume)

    def _resume(self) -> None:
        self._resume_pending = False
        if not self.deleted and self.consumers:
            self.dispatch()

    @staticmethod
    def _message(offset: int, raw: bytes, flt: tuple[frozenset[str], bool] | None) -> Message | None:
        try:
            exchange, routing_key, _raw, properties, body = records.decode(raw)
        except (ValueError, IndexError, RecursionError, struct.error):
            return None  # not a message this broker can read: skipped
        headers = properties.get("headers")
        headers = dict(headers) if isinstance(headers, dict) else {}
        if flt is not None:
            value = headers.get("x-stream-filter-value")
            if isinstance(value, bytes):
                value = value.decode("utf-8", "surrogateescape")
            if not (value in flt[0] if value is not None else flt[1]):
                return None
        headers["x-stream-offset"] = Long(offset)
        properties = {**properties, "headers": headers}
        # a record read back is named by its offset (the audit trail's deliveries of it)
        return Message(exchange, routing_key, encode_properties(properties), properties, body,
                       msg_id=offset)

    # ---- settlement: acks return credit, nothing leaves the stream ----
    def ack(self, entry: QueueEntry, consumer: Consumer | None, reported: bool = False) -> None:
        self.stats_acked += 1
        self._unacked_done(consumer)
        if consumer is not None:
            protocol = consumer.channel.metrics_protocol
            if protocol is not None and protocol != "amqp091":
                self.vhost.churn.acked(protocol, self)

    def refuse_negative(self) -> None:
        """basic.nack / basic.reject of a delivery from this queue (RabbitMQ: 540)."""
        raise errors.not_implemented("basic.nack and basic.reject not supported by stream "
                                     "queues %s", self.vhost.queue_resource(self.name))

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        self._unacked_done(consumer)

    def requeue(self, entries: list[tuple[QueueEntry, Consumer | None]]) -> None:
        # a closed channel's deliveries: only their credit comes back
        for _entry, consumer in entries:
            self._unacked_done(consumer)

    def _unacked_done(self, consumer: Consumer | None) -> None:
        if consumer is not None:
            consumer.unacked -= 1
        if self.unacked_count:
            self.unacked_count -= 1

    def credit_changed(self, consumer: Consumer) -> None:
        pass  # dispatch() after the ack feeds every consumer with credit

    def get(self) -> QueueEntry | None:
        raise errors.not_implemented("basic.get not supported by stream queues %s",
                                     self.vhost.queue_resource(self.name))

    def purge(self) -> int:
        raise errors.not_implemented("queue.purge not supported by stream queues %s",
                                     self.vhost.queue_resource(self.name))

    # ---- policies, deletion ----
    def apply_policy(self, policy: str | None, operator_policy: str | None,
                     definition: dict[str, Any]) -> None:
        super().apply_policy(policy, operator_policy, definition)
        settings = self._log_settings()
        log = self.log
        log.max_segment_size = settings["max_segment_size"]
        log.max_bytes = settings["max_bytes"]
        log.max_age = settings["max_age"]
        log.apply_retention()
        if log.first_offset != self._first_told:
            self._tell_truncated("retention")

    def reconfigure(self, opts: QueueOptions) -> None:
        self.opts = opts  # no TTL, length limit or expiry of classic queues applies

    def on_deleted(self) -> list[Consumer]:
        self.deleted = True
        consumers = list(self.consumers)
        self.consumers.clear()
        for cursor in self._cursors.values():
            cursor.reader.close()
        self._cursors.clear()
        self._tell_truncated("deleted", self.log.next_offset)
        self._streams.forget(self.log)
        self.log.delete()
        return consumers
