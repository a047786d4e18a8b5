"""Stream-protocol consuming (subscriptions, credit, filters, SAC, Deliver); not publishing.

Consuming over the Stream protocol: subscriptions as log readers, credit, filters, single
active consumer groups, chunks into Deliver frames. Not publishing (``stream_publishing``)
or the connection (``stream_session``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..cluster.link import LINK_USER
from ..streamproto import codec
from ..streams import super as super_streams
from ..streams.log import REPLICA_PROPERTY, Timestamp
from .stream_core import StreamSessionCore


@dataclass(slots=True, eq=False)
class Subscription:
    id: int
    stream: str
    queue: Any  # its StreamQueue, or a replica's log read as one
    credit: int
    filter: Any  # (values, match_unfiltered) or None
    reader: Any = None  # the log's Reader (None while waiting to be active)
    active: bool = True
    group: tuple | None = None  # single active consumer group
    update_id: int = 0  # correlation id of the ConsumerUpdate awaiting its answer
    partition: int | None = None  # index in its super stream (partitioned group)
    replica: bool = False  # another cluster node copying the log: chunks as stored
    stepping: bool = False  # told to step down, its answer awaited
    listener: Any = None
    start: int = 0  # the first offset asked for (a chunk's records before it: not its own)
    name: str | None = None  # its consumer name, if any (the audit trail's detail)


def _offset_start(offset_spec: tuple[int, int]):
    kind, value = offset_spec
    return {codec.OFFSET_FIRST: "first", codec.OFFSET_LAST: "last",
            codec.OFFSET_NEXT: "next"}.get(kind) or (
        value if kind == codec.OFFSET_OFFSET else Timestamp(value))


class StreamConsuming(StreamSessionCore):
    """The consuming commands of a ``StreamSession``."""

    def _subscribe(self, cmd: codec.Subscribe) -> None:
        q = self._readable(cmd.stream)
        if not self._usable(q, cmd, "read"):
            return
        if cmd.subscription_id in self.subscriptions:
            self._respond(cmd, codec.SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        props = cmd.properties
        values = [v for k, v in props.items() if k.startswith("filter.") and v is not None]
        flt = (values, props.get("match-unfiltered") == "true") if values else None
        sub = Subscription(cmd.subscription_id, cmd.stream, q, cmd.credit, flt,
                           name=props.get("name"))
        # a replica of another node (cluster/stream_replicas.py), only as the link user
        sub.replica = REPLICA_PROPERTY in props and self.username == LINK_USER
        sac = props.get("single-active-consumer") == "true"
        if sac and not props.get("name"):
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        self.subscriptions[sub.id] = sub
        self._respond(cmd, codec.OK)
        if sac:
            group = (self.vhost.name, cmd.stream, props["name"])
            sub.group = group
            if props.get("super-stream"):
                sub.partition = super_streams.partition_index(
                    self.vhost, props["super-stream"], cmd.stream)
            sub.active = False
            self.service.sac_groups.setdefault(group, []).append((self, sub))
            self.service.sac_rebalance(group)
            return
        self._attach(sub, _offset_start(cmd.offset_spec))

    def _attach(self, sub: Subscription, start) -> None:
        lg = sub.queue.log
        sub.reader = lg.reader(start, replica=sub.replica)
        sub.start = sub.reader.next_offset
        sub.listener = lambda: self._feed(sub)
        lg.listeners.append(sub.listener)
        self._feed(sub)

    def _detach(self, sub: Subscription) -> None:
        if sub.listener is not None:
            try:
                sub.queue.log.listeners.remove(sub.listener)
            except ValueError:
                pass
            sub.listener = None
        if sub.reader is not None:
            sub.reader.close()
            sub.reader = None

    def _consumer_update(self, sub: Subscription, active: bool) -> None:
        self._corr += 1
        sub.update_id = self._corr
        self.conn.send(codec.encode_consumer_update(self._corr, sub.id, active))
        self.wake()

    def _consumer_update_response(self, cmd: codec.ConsumerUpdateResponse) -> None:
        for sub in self.subscriptions.values():
            if sub.update_id == cmd.correlation_id:
                sub.update_id = 0
                if sub.stepping:  # stepped down: the next one may start now
                    sub.stepping = False
                    self.service.sac_rebalance(sub.group)  # type: ignore[arg-type]
                    return
                if sub.active and sub.reader is None:
                    spec_ = cmd.offset_spec if cmd.code == codec.OK else (codec.OFFSET_NEXT, 0)
                    self._attach(sub, _offset_start(spec_))
                return

    def _leave_group(self, sub: Subscription) -> None:
        members = self.service.sac_groups.get(sub.group)  # type: ignore[arg-type]
        if not members:
            return
        members[:] = [m for m in members if m[1] is not sub]
        self.service.sac_rebalance(sub.group)  # type: ignore[arg-type]

    def _credit(self, cmd: codec.Credit) -> None:
        sub = self.subscriptions.get(cmd.subscription_id)
        if sub is None:
            self.conn.send(codec.encode_credit_error(codec.SUBSCRIPTION_ID_DOES_NOT_EXIST,
                                                     cmd.subscription_id))
            return
        sub.credit = min(sub.credit + cmd.credit, 0xFFFF * 16)
        self._feed(sub)

    def _unsubscribe(self, cmd: codec.Unsubscribe) -> None:
        sub = self.subscriptions.pop(cmd.subscription_id, None)
        if sub is None:
            self._respond(cmd, codec.SUBSCRIPTION_ID_DOES_NOT_EXIST)
            return
        self._drop_subscription(sub)
        self._respond(cmd, codec.OK)

    def _drop_subscription(self, sub: Subscription) -> None:
        self._detach(sub)
        if sub.group is not None:
            self._leave_group(sub)

    def _feed(self, sub: Subscription) -> None:
        """Deliver committed chunks while the subscription has credit and the connection's
        output is under its high-water mark."""
        if self.ended or sub.reader is None or not sub.active:
            return
        if sub.queue.deleted:
            self.stream_gone(self.vhost.name, sub.stream)
            return
        conn = self.conn
        high = self.output_high_water
        flt = sub.filter
        version = conn.deliver_version
        audit = self.audit if sub.queue.audit_ctx is not None else None
        # the chunk's room in a Deliver frame: frame_max less the frame's own fields (its
        # size, key, version, subscription id and, in version 2, the committed chunk id)
        limit = conn.frame_max and conn.frame_max - (9 + (8 if version == 2 else 0))
        sent = False
        while sub.credit > 0:
            if conn.pending_output > high:
                self.delivery_stalled = True
                break
            chunk = sub.reader.next_chunk()
            if chunk is None:
                break
            if flt is not None and not chunk.may_contain(flt[0], flt[1]):
                continue
            committed = sub.queue.log.committed_chunk_id
            if sub.replica:
                # a replica appends the chunk as the log holds it (filter included), whole
                raw = chunk.raw()
                conn.send_buffers([codec.encode_deliver_header(
                    sub.id, sum(len(b) for b in raw), version, committed), *raw])
                sub.credit -= 1
                sent = True
                continue
            if limit and len(chunk.header) + len(chunk.data) > limit:
                # no Deliver frame may exceed the client's frame_max: the chunk goes as
                # several smaller chunks (one credit each, as the client counts them)
                pieces = chunk.pieces(limit)
            else:
                pieces = [(chunk.header, chunk.data)]
            for header, data in pieces:
                conn.send_buffers([codec.encode_deliver_header(
                    sub.id, len(header) + len(data), version, committed), header, data])
            sub.credit = max(0, sub.credit - len(pieces))
            self.chunks_delivered += len(pieces)
            sent = True
            if audit is not None:  # the chunk's records, from the offset asked for on
                start = max(chunk.first_offset, sub.start)
                audit.stream_delivered(self, sub.queue, str(sub.id), start,
                                       chunk.first_offset + chunk.num_records - start,
                                       sub.name)
        if sent:
            self.wake()

    def output_drained(self) -> None:
        if self.delivery_stalled and self.conn.pending_output <= self.output_high_water:
            self.delivery_stalled = False
            for sub in list(self.subscriptions.values()):
                self._feed(sub)

    def stream_gone(self, vhost: str, name: str) -> None:
        if self.vhost is None or self.vhost.name != vhost or self.ended:
            return
        told = False
        for sub_id, sub in list(self.subscriptions.items()):
            if sub.stream == name:
                del self.subscriptions[sub_id]
                self._drop_subscription(sub)
                told = True
        for pub_id, pub in list(self.publishers.items()):
            if pub.stream == name:
                del self.publishers[pub_id]
                told = True
        if told:
            self.conn.send(codec.encode_metadata_update(codec.STREAM_NOT_AVAILABLE, name))
            self.wake()
