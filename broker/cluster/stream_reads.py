"""AMQP 0-9-1 consumers of a stream on a node that holds a copy of it read that copy, as
RabbitMQ reads a stream locally on its replicas, instead of through the leader.

A stream led on another node is a proxy here (``forward.ProxyQueue``); ``StreamProxyQueue``
is that proxy for a stream. A consumer it takes is fed from this node's copy
(``StreamReplicas.local_log``) when there is one and the consume is one a stream accepts
(manual acks, a prefetch, an ``x-stream-offset`` it can read: what the stream queue
refuses is refused here with RabbitMQ's codes); without a copy here it goes through the
leader as before. A local consumer reads what the copy has committed, chunk by chunk as the
stream queue does (``StreamQueue``'s cursor and decoding, ``x-stream-offset`` on each
delivery, ``x-stream-filter`` by Bloom filter); its acks return credit only.

When the copy is closed to be opened again (a new leader to copy from, a copy cut back)
its local consumers wait and go on from the offset each was to read next; when it is
deleted (the node removed from the group, the stream deleted) they are cancelled
(basic.cancel); when this node becomes the leader they are cancelled as the promoted
node's consumers are (they consume again from the offset they want).

This node's audit trail follows the proxy as the leader's follows the stream: a delivery,
read here or forwarded by the leader, names its record by offset (the message's id).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..message import Message
from ..queues.entry import QueueEntry
from ..queues.stream import StreamQueue, _Cursor, refuse_consumer
from ..queues.stream_args import OffsetSpecError, offset_spec, stream_filter
from ..queues.types import queue_type_of
from .forward import ProxyQueue

if TYPE_CHECKING:
    from ..queues.queue import Consumer
    from ..streams.log import StreamLog

log = logging.getLogger("broker.cluster.streams")

CHUNKS_PER_DISPATCH = 16  # chunks read for one consumer per dispatch (the loop serves others)


def proxy_class(arguments: dict) -> type[ProxyQueue]:
    """The proxy of a queue with these arguments: a stream's reads its local copy."""
    return StreamProxyQueue if queue_type_of(arguments).name == "stream" else ProxyQueue


class StreamProxyQueue(ProxyQueue):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._local: dict[Consumer, _Cursor | None] = {}  # None: waits for the copy
        self._parked: dict[Consumer, tuple[int, Any]] = {}  # (next offset, filter)
        self._local_log: StreamLog | None = None
        self._resume_pending = False

    def _copy(self) -> StreamLog | None:
        replicas = self.store.stream_replicas
        return replicas.local_log(self.vhost.name, self.name) if replicas is not None else None

    def admit_consumer(self, channel: Any, no_ack: bool = False,
                       arguments: dict[str, Any] | None = None) -> None:
        """What the stream queue refuses, refused here too, whether the consumer reads
        here or on the leader."""
        refuse_consumer(self.vhost.queue_resource(self.name), channel, no_ack, arguments)
        super().admit_consumer(channel, no_ack, arguments)

    def enqueue(self, message, *, entry: QueueEntry | None = None,
                reported: bool = False) -> bool:
        if not super().enqueue(message, entry=entry, reported=reported):
            return False
        # the record is the leader's: its trail names it (appended, by offset); this node's
        # trail lists no copy of it in the publish's queues, as for a queue that refused it
        self.refused_id = message.id
        return True

    def delivered_message(self, exchange: str, routing_key: str, props_raw: bytes,
                          body: bytes) -> Message:
        """A record the leader delivered over the link is named by its offset, as one read
        from a copy (the audit trail's deliveries and acks of it)."""
        message = super().delivered_message(exchange, routing_key, props_raw, body)
        headers = message.properties.get("headers")
        offset = headers.get("x-stream-offset") if isinstance(headers, dict) else None
        if isinstance(offset, int) and not isinstance(offset, bool):
            message.id = offset
        return message

    def add_consumer(self, consumer: Consumer) -> None:
        lg = self._copy()
        if lg is None or consumer.no_ack or not consumer.prefetch or self._parked \
                or (self._local_log is not None and lg is not self._local_log):
            super().add_consumer(consumer)
            return
        try:
            spec = offset_spec(consumer.arguments.get("x-stream-offset"))
        except OffsetSpecError:
            super().add_consumer(consumer)  # the leader answers RabbitMQ's error
            return
        if self._local_log is None:
            self._local_log = lg
            lg.listeners.append(self.dispatch)
        reader = lg.reader(spec)
        start = spec if isinstance(spec, int) else reader.next_offset
        self._local[consumer] = _Cursor(reader, start, stream_filter(consumer.arguments))
        self.consumers.append(consumer)
        log.debug("consumer %r of stream %r reads this node's copy from offset %d",
                  consumer.tag, self.name, start)
        self._feed(consumer, self._local[consumer])  # type: ignore[arg-type]

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer not in self._local:
            super().remove_consumer(consumer)
            return
        cursor = self._local.pop(consumer)
        self._parked.pop(consumer, None)
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if cursor is not None:
            cursor.reader.close()
        if not self._local:
            self._unlisten()

    def _unlisten(self) -> None:
        lg, self._local_log = self._local_log, None
        if lg is not None and self.dispatch in lg.listeners:
            lg.listeners.remove(self.dispatch)

    def copy_closing(self, lg: StreamLog, reopening: bool) -> None:
        """This node's copy ``lg`` is about to close. ``reopening`` (a new leader to copy
        from, the copy cut back): its readers wait for it (``copy_opened``) at the offset
        each was to read next; otherwise (the copy is deleted) they are cancelled."""
        if lg is not self._local_log:
            return
        self._unlisten()
        for consumer, cursor in list(self._local.items()):
            if cursor is None:
                continue
            if not reopening:
                self.remove_consumer(consumer)
                if not consumer.channel.closed:
                    consumer.channel.consumer_cancelled_by_broker(consumer)
                continue
            following = cursor.pending[0][0] if cursor.pending \
                else max(cursor.start, cursor.reader.next_offset)
            cursor.reader.close()
            self._local[consumer] = None
            self._parked[consumer] = (following, cursor.filter)

    def copy_opened(self, lg: StreamLog) -> None:
        """This node's copy is open again: the readers that waited for it go on."""
        if not self._parked:
            return
        self._local_log = lg
        lg.listeners.append(self.dispatch)
        parked, self._parked = self._parked, {}
        for consumer, (following, flt) in parked.items():
            reader = lg.reader(min(following, lg.next_offset))
            self._local[consumer] = _Cursor(reader, following, flt)
        self.dispatch()

    def dispatch(self) -> None:
        super().dispatch()
        for consumer, cursor in list(self._local.items()):
            if cursor is not None:
                self._feed(consumer, cursor)

    def _feed(self, consumer: Consumer, cursor: _Cursor) -> None:
        chunks = CHUNKS_PER_DISPATCH
        while consumer.can_take():
            if not cursor.pending:
                chunk = cursor.reader.next_chunk(cursor.accept) if chunks else None
                if chunk is None:
                    if (cursor.reader.more or not chunks) and not self._resume_pending:
                        self._resume_pending = True
                        self.vhost.timers.call_later(0, self._resume)
                    return
                chunks -= 1
                cursor.pending.extend(r for r in chunk.records() if r[0] >= cursor.start)
                continue
            offset, raw = cursor.pending.popleft()
            message = StreamQueue._message(offset, raw, cursor.filter)
            if message is None:
                continue
            consumer.unacked += 1
            self.unacked_count += 1
            self.stats_delivered += 1
            consumer.channel.deliver(consumer, self, QueueEntry(message, offset))

    def _resume(self) -> None:
        self._resume_pending = False
        if not self.deleted:
            self.dispatch()

    # ---- settlement of local deliveries: credit only, as the stream queue ----
    def _settled(self, consumer: Consumer | None) -> bool:
        if consumer is None or consumer not in self._local:
            return False
        consumer.unacked -= 1
        if self.unacked_count:
            self.unacked_count -= 1
        return True

    def ack(self, entry: QueueEntry, consumer: Consumer | None, reported: bool = False) -> None:
        if self._settled(consumer):
            self.stats_acked += 1
        else:
            super().ack(entry, consumer, reported)

    def reject(self, entry: QueueEntry, consumer: Consumer | None) -> None:
        if not self._settled(consumer):
            super().reject(entry, consumer)

    def requeue(self, entries: list) -> None:
        forwarded = [(e, c) for e, c in entries if not self._settled(c)]
        if forwarded:
            super().requeue(forwarded)
