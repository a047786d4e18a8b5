"""The broker side of one Stream-protocol connection: logins through ``broker.access``,
streams as the vhost's stream queues (``queues/stream.py``) and their logs
(``streams/log.py``).

* **Publishing.** A publisher is declared on a stream (write permission). Each message
  of a Publish frame goes into the stream queue's log with the operation the AMQP 0-9-1
  path's ``StreamQueue.enqueue`` uses (``StreamLog.append_record``: batched into one chunk
  per group commit); the record is the client's AMQP 1.0 message as it came. A sub-entry
  batch is checked (a compression this broker can open, sizes that add up, decompressed
  within ``max_message_size``) and written as one entry, compressed as received
  (``append_encoded``), so a Stream consumer gets it back untouched. PublishConfirm
  follows the log's commit (``when_durable``) for the ids of one frame at once.
* **Deduplication.** A publisher with a reference skips publishing ids at or below the
  last one it published on that stream (confirmed, not written), as RabbitMQ does. The
  last id is kept in the log's named-offsets table under ``PUBLISHER_KEY + reference``,
  persisted by the same commit as the messages; QueryPublisherSequence reads it.
* **Consuming.** A subscription is a log reader; each Deliver sends one committed chunk
  as the log holds it (header and entries, never decoded) and costs one credit. A chunk
  larger than the client's negotiated frame_max goes as several chunks cut between
  entries (``Chunk.pieces``), a credit each, so no Deliver frame exceeds it. The log's
  commit listener feeds subscriptions waiting for more; a connection whose output is
  above ``output_high_water`` stops being fed until its writer drains it. Filters
  (``filter.N`` properties, ``match-unfiltered``) skip chunks whose Bloom filter cannot
  match; the client filters inside a chunk, as with RabbitMQ. Single active consumer
  (``single-active-consumer`` + ``name``): one consumer of a group on a stream is fed,
  the others wait; the active one is told with ConsumerUpdate and answers with where to
  start. With ``super-stream`` (a partition's group) the active one is the
  ``index % members``-th member, ``index`` the partition's, so a group's consumers share
  the partitions as RabbitMQ spreads them; when a join or leave moves a partition, its
  active consumer is told to step down (ConsumerUpdate inactive) and the next one is
  activated once it answered (it may store its offset first). Super streams themselves:
  ``streams/super.py``.
* **Offsets.** StoreOffset/QueryOffset use the log's named offsets (persisted with the
  next commit).
"""
from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .. import errors
from ..amqp import spec
from ..cluster.link import LINK_USER
from ..message import Message
from ..publishing import NACKED
from ..queues.stream import StreamQueue
from ..streamproto import codec
from ..streamproto.codec import Command
from ..streamproto.connection import (
    AuthenticateRequested,
    ClosedByPeer,
    CommandReceived,
    ConnectionClosed,
    OpenRequested,
    ServerConnection,
    State,
)
from ..streams import record as records
from ..streams import super as super_streams
from ..streams.log import REPLICA_PROPERTY, REPLICA_REFERENCE, Timestamp

log = logging.getLogger("broker.stream")

# the log's named-offsets table holds publishers' sequences under this prefix (a name no
# consumer reference is expected to start with)
PUBLISHER_KEY = "\x00publisher:"
MAX_REFERENCE = 256
MAX_CHUNK_ENTRIES = 0xFFFF  # a chunk's entry count is a u16
RUN_BYTES = 1 << 20  # sub-entries joined into one chunk up to this size
# Create's arguments as RabbitMQ maps them onto queue arguments
_CREATE_ARGS = {"max-length-bytes": "x-max-length-bytes", "max-age": "x-max-age",
                "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
                "queue-leader-locator": "x-queue-leader-locator",
                "initial-cluster-size": "x-initial-cluster-size"}


class StreamService:
    """The listener's broker-wide state: sessions and single-active-consumer groups."""

    def __init__(self, broker):
        self.broker = broker
        self.stopping = False
        self.bytes_received = 0  # counted by the edge
        self.sessions: set[StreamSession] = set()
        # (vhost, stream, name) -> the group's (session, subscription), the active first
        self.sac_groups: dict[tuple, list[tuple[StreamSession, Subscription]]] = {}

    def sac_rebalance(self, group: tuple) -> None:
        """Make the member that should be active the active one: step the current one
        down first and wait for its answer (``_consumer_update_response`` calls again)."""
        members = self.sac_groups.get(group)
        if not members:
            self.sac_groups.pop(group, None)
            return
        if any(s.stepping for _, s in members):
            return
        index = members[0][1].partition
        want_session, want = members[index % len(members)] if index is not None \
            else members[0]
        for session, sub in members:
            if sub.active and sub is not want:
                sub.active = False
                sub.stepping = True
                session._detach(sub)
                session._consumer_update(sub, False)
                return
        if not want.active:
            want.active = True
            want_session._consumer_update(want, True)

    def queue_deleted(self, queue, _consumers) -> None:
        """A vhost's ``on_queue_deleted`` (a stream deleted over AMQP or the HTTP API)."""
        if isinstance(queue, StreamQueue):
            self.stream_deleted(queue.vhost.name, queue.name)

    def watch_vhosts(self) -> None:
        """Follow the deletions of the vhosts there are (a vhost made later is followed
        lazily: a subscription notices its stream is gone when it is next fed)."""
        for vhost in self.broker.vhosts.values():
            if self.queue_deleted not in vhost.on_queue_deleted:
                vhost.on_queue_deleted.append(self.queue_deleted)

    def stream_deleted(self, vhost: str, name: str) -> None:
        """Every publisher and subscription on it is told (MetadataUpdate) and dropped."""
        for session in list(self.sessions):
            session.stream_gone(vhost, name)


class Publisher:
    __slots__ = ("id", "queue", "reference", "sequence", "stream")

    def __init__(self, pub_id: int, stream: str, queue: StreamQueue, reference: str | None,
                 sequence: int):
        self.id = pub_id
        self.stream = stream
        self.queue = queue
        self.reference = reference
        self.sequence = sequence  # the last publishing id written (dedup), -1: none


class Subscription:
    __slots__ = ("active", "credit", "filter", "group", "id", "listener", "partition", "queue",
                 "reader", "replica", "stepping", "stream", "update_id")

    def __init__(self, sub_id: int, stream: str, queue: StreamQueue, credit: int, flt):
        self.id = sub_id
        self.stream = stream
        self.queue = queue
        self.credit = credit
        self.filter = flt  # (values, match_unfiltered) or None
        self.reader: Any = None  # the log's Reader (None while waiting to be active)
        self.active = True
        self.group: tuple | None = None  # single active consumer group
        self.update_id = 0  # correlation id of the ConsumerUpdate awaiting its answer
        self.partition: int | None = None  # index in its super stream (partitioned group)
        self.replica = False  # another cluster node copying the log: chunks as stored
        self.stepping = False  # told to step down, its answer awaited
        self.listener: Any = None


def _offset_start(offset_spec: tuple[int, int]):
    kind, value = offset_spec
    return {codec.OFFSET_FIRST: "first", codec.OFFSET_LAST: "last",
            codec.OFFSET_NEXT: "next"}.get(kind) or (
        value if kind == codec.OFFSET_OFFSET else Timestamp(value))


class StreamSession:
    """One connection (and an entry of ``broker.sessions``)."""

    channels: Mapping = MappingProxyType({})
    metrics_protocol = "stream"  # its publishes count in messages_published, not the path's
    global_prefetch = 0

    def __init__(self, service: StreamService, peer: str, peer_host: str | None,
                 local_host: str, local_port: int, tls: bool = False):
        self.service = service
        self.broker = broker = service.broker
        config = broker.config
        self.peer = peer
        self.peer_host = peer_host
        self.local_host = local_host
        self.local_port = local_port
        self.tls = tls
        self.conn = ServerConnection(
            frame_max=config.stream_frame_max, heartbeat=config.stream_heartbeat,
            server_properties={"product": "TrioMQ", "version": _version(),
                               "platform": "Python", "cluster_name": socket.gethostname()})
        self.output_high_water = config.output_high_water
        self._inflate_budget = config.max_message_size  # reset by every read
        self.wake = lambda: None
        self.output_delay = 0.0
        self.vhost: Any = None
        self.audit_ctx: tuple | None = None  # (vhost, user, peer, channel) of its events
        self.user: Any = None
        self.authz: Any = None
        self.username: str | None = None
        self.publishers: dict[int, Publisher] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.delivery_stalled = False
        self.is_publisher = False
        self.blocked_sent = False
        self.flow_queues: frozenset = frozenset()
        self.finished = False
        self.ended = False
        self._corr = 0
        # a received batch's sub-entries by log ([entries, records, bytes]) and the
        # confirms waiting for them: written and registered at the batch's end
        self._runs: dict[Any, list] = {}
        self._confirms: list[tuple[Any, int, list[int]]] = []
        self.messages_published = 0
        self.chunks_delivered = 0
        # (token, SaslAuthenticate) while the edge introspects an opaque OAuth 2 token;
        # None: no login waiting
        self.login_wait: tuple[str, AuthenticateRequested] | None = None

    # ---- input ----
    def resume_login(self) -> None:
        """The edge introspected ``login_wait``'s token: SaslAuthenticate is decided now."""
        wait = self.login_wait
        self.login_wait = None
        if wait is None or self.ended:
            return
        self._authenticate(wait[1])
        if self.conn.state is State.CLOSED:
            self._finish()
        self.wake()

    def data_received(self, data) -> None:
        audit = self.broker.publishing.audit
        if audit is None:
            self._received(data)
            return
        audit.clock_start()  # the batch's events share one time
        try:
            self._received(data)
        finally:
            audit.clock_stop()

    def _received(self, data) -> None:
        # what the compressed sub-entries of one read may inflate to: the check runs on the
        # event loop, and eight 128 MiB gzip bombs fit one 1 MiB frame (8-13 s of loop)
        self._inflate_budget = self.broker.config.max_message_size
        for ev in self.conn.receive_data(data):
            if self.ended:
                break
            try:
                if isinstance(ev, CommandReceived):
                    self._command(ev.command)
                elif isinstance(ev, AuthenticateRequested):
                    self._authenticate(ev)
                elif isinstance(ev, OpenRequested):
                    self._open(ev)
                elif isinstance(ev, ClosedByPeer):
                    self.conn.accept_close(ev.correlation_id)
                    self._finish()
                elif isinstance(ev, ConnectionClosed):
                    if ev.code != codec.OK:
                        log.warning("stream connection %s: closed: %s", self.peer, ev.reason)
                    self._finish()
            except Exception:
                log.exception("stream connection %s: internal error", self.peer)
                self.conn.close(codec.INTERNAL_ERROR, "internal error")
        if self._runs or self._confirms:
            self._flush_publishes()
        if self.conn.state is State.CLOSED:
            self._finish()
        self.wake()

    def _authenticate(self, ev: AuthenticateRequested) -> None:
        broker = self.broker
        if broker.fenced or self.service.stopping:
            self.conn.refuse_login(ev.correlation_id, codec.AUTHENTICATION_FAILURE)
            return
        access = broker.access
        if access.needs_introspection(ev.username, ev.password):
            self.login_wait = (ev.password, ev)  # an opaque OAuth 2 token
            return
        user = access.authenticate(ev.username, ev.password, self.peer_host, "stream")
        if user is None:
            self.output_delay = access.failure_delay
            log.warning("stream connection %s: login refused for user %r", self.peer,
                        ev.username)
            code = codec.AUTHENTICATION_FAILURE
            self.conn.refuse_login(ev.correlation_id, code)
            return
        self.user = user
        self.username = ev.username
        self.conn.authenticated(ev.correlation_id, ev.username)

    def _open(self, ev: OpenRequested) -> None:
        broker = self.broker
        access = broker.access
        name = ev.virtual_host
        vhost = broker.vhosts.get(name)
        try:
            if vhost is None:
                raise errors.access_refused("vhost not found")
            access.check_vhost(self.user, name)
            access.check_connection_limits(self.user, name, broker.sessions)
        except errors.AMQPError as exc:
            log.warning("stream connection %s: vhost %r refused: %s", self.peer, name, exc)
            self.conn.refuse_open(ev.correlation_id, codec.VIRTUAL_HOST_ACCESS_FAILURE)
            return
        self.vhost = vhost
        self.audit_ctx = (name, self.username, self.peer, None)
        self.authz = access.authz(self.user, name)
        self.conn.open_ok(ev.correlation_id, name, {
            "advertised_host": self.local_host, "advertised_port": str(self.local_port)})
        broker.session_opened(self)
        self.service.sessions.add(self)
        log.info("stream connection %s: user %r vhost %r", self.peer, self.username, name)

    # ---- commands ----
    def _command(self, cmd: Command) -> None:
        if self.vhost is None:  # pipelined behind a refused Open
            return
        handler = _HANDLERS.get(type(cmd))
        if handler is None:
            self.conn.close(codec.UNKNOWN_FRAME, "unknown frame")
            return
        handler(self, cmd)

    def _respond(self, cmd, code: int, *extra) -> None:
        self.conn.send(codec.encode_response(cmd.KEY, cmd.correlation_id, code, *extra))

    def _stream(self, name: str) -> StreamQueue | None:
        q = self.vhost.queues.get(name)
        if isinstance(q, StreamQueue) and not q.deleted:
            return q
        return None

    def _readable(self, name: str) -> Any:
        """The stream to read from: this node's stream queue or, in a cluster, this
        node's replica of a stream led by another node (``cluster/stream_replicas.py``:
        subscribe, metadata and stats read it; publishing needs the leader)."""
        q = self._stream(name)
        if q is not None:
            return q
        replicas = getattr(self.broker.store, "stream_replicas", None)
        lg = replicas.local_log(self.vhost.name, name) if replicas is not None else None
        return _Replica(name, lg) if lg is not None else None

    def _allowed(self, name: str, perm: str) -> bool:
        try:
            self.authz.check("queue", name, perm)
        except errors.AMQPError:
            return False
        return True

    # -- streams --
    def _create(self, cmd: codec.Create) -> None:
        name = cmd.stream
        if not self._allowed(name, "configure"):
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        if name in self.vhost.queues:
            self._respond(cmd, codec.STREAM_ALREADY_EXISTS)
            return
        if not _valid_name(name):
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        try:
            self._declare_stream(name, cmd.arguments)
        except errors.AMQPError as exc:
            log.info("stream connection %s: create %r refused: %s", self.peer, name, exc.text)
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        self._respond(cmd, codec.OK)

    def _declare_stream(self, name: str, create_args: dict) -> StreamQueue:
        arguments: dict[str, Any] = {"x-queue-type": "stream", **_arguments(create_args)}
        m = spec.Queue.Declare(queue=name, durable=True, auto_delete=False, exclusive=False,
                               arguments=arguments)
        return self.vhost.declare_queue(m, None)  # type: ignore[return-value]

    def _create_super_stream(self, cmd: codec.CreateSuperStream) -> None:
        """A direct exchange named after the super stream, a stream per partition, bound
        with its binding key and ``x-stream-partition-order`` (``streams/super.py``)."""
        name, parts, keys = cmd.name, cmd.partitions, cmd.binding_keys
        if not parts or len(parts) != len(keys) or len(set(parts)) != len(parts) \
                or not all(_valid_name(n) for n in [name, *parts]) or None in keys:
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        try:
            self.authz.check("exchange", name, "configure")
            for part in parts:
                self.authz.check("queue", part, "configure")
        except errors.AMQPError:
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        vhost = self.vhost
        if name in vhost.exchanges or any(part in vhost.queues for part in parts):
            self._respond(cmd, codec.STREAM_ALREADY_EXISTS)
            return
        try:
            super_streams.declare(vhost, name, list(parts), list(keys), _arguments(cmd.arguments))
        except errors.AMQPError as exc:
            log.info("stream connection %s: super stream %r refused: %s", self.peer, name,
                     exc.text)
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        self._respond(cmd, codec.OK)

    def _delete_super_stream(self, cmd: codec.DeleteSuperStream) -> None:
        name = cmd.name
        parts = super_streams.partitions_of(self.vhost, name)
        if parts is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        try:
            self.authz.check("exchange", name, "configure")
            for part, _k, _o in parts:
                self.authz.check("queue", part, "configure")
        except errors.AMQPError:
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        self._respond(cmd, codec.OK)
        for part in super_streams.delete(self.vhost, name):
            self.service.stream_deleted(self.vhost.name, part)

    def _delete(self, cmd: codec.Delete) -> None:
        name = cmd.stream
        if not self._allowed(name, "configure"):
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        q = self._stream(name)
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        self._respond(cmd, codec.OK)
        self.vhost.delete_queue(q)
        self.service.stream_deleted(self.vhost.name, name)  # (told once: dropped on the first)

    def _metadata(self, cmd: codec.Metadata) -> None:
        streams: list[tuple[str, int, int, list[int]]] = []
        refs: dict[tuple[str, int], int] = {}

        def ref(address: tuple[str, int]) -> int:
            return refs.setdefault(address, len(refs))
        replicas = getattr(self.broker.store, "stream_replicas", None)
        for name in cmd.streams:
            if self._readable(name) is None:
                streams.append((name, codec.STREAM_DOES_NOT_EXIST, 0xFFFF, []))
                continue
            # in a cluster: the leader's listener (where a publisher must go) and the
            # replicas', as RabbitMQ answers; else this node alone
            where = replicas.placement(self.vhost.name, name, (self.local_host,
                                                                self.local_port)) \
                if replicas is not None else None
            if where is None:
                streams.append((name, codec.OK, ref((self.local_host, self.local_port)), []))
            else:
                streams.append((name, codec.OK, ref(where[0]), [ref(a) for a in where[1]]))
        brokers = [(r, host, port) for (host, port), r in refs.items()]
        self.conn.send(codec.encode_metadata(cmd.correlation_id, brokers, streams))

    def _stream_stats(self, cmd: codec.StreamStats) -> None:
        q = self._readable(cmd.stream)
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        if not self._allowed(cmd.stream, "read"):
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        lg = q.log
        committed = lg.committed_chunk_id
        self._respond(cmd, codec.OK, {
            "first_chunk_id": lg.first_offset if committed >= 0 else -1,
            "committed_chunk_id": committed})

    # -- super streams: a direct exchange whose bindings name the partitions --
    def _partitions_of(self, super_stream: str) -> list[tuple[str, str, int]] | None:
        return super_streams.partitions_of(self.vhost, super_stream)

    def _route(self, cmd: codec.Route) -> None:
        parts = self._partitions_of(cmd.super_stream)
        if parts is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        names = [name for name, key, _ in parts if key == cmd.routing_key]
        self._respond(cmd, codec.OK if names else codec.STREAM_DOES_NOT_EXIST, names)

    def _partitions(self, cmd: codec.Partitions) -> None:
        parts = self._partitions_of(cmd.super_stream)
        if parts is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        self._respond(cmd, codec.OK, [name for name, _k, _o in parts])

    # -- publishing --
    def _declare_publisher(self, cmd: codec.DeclarePublisher) -> None:
        q = self._stream(cmd.stream)
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        if not self._allowed(cmd.stream, "write"):
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        ref = cmd.reference or None
        if cmd.publisher_id in self.publishers or (ref is not None and len(ref) > MAX_REFERENCE):
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        sequence = -1
        if ref is not None:
            stored = q.log.query_offset(PUBLISHER_KEY + ref)
            sequence = -1 if stored is None else stored
        self.publishers[cmd.publisher_id] = Publisher(cmd.publisher_id, cmd.stream, q, ref,
                                                      sequence)
        self.is_publisher = True
        self._respond(cmd, codec.OK)

    def _delete_publisher(self, cmd: codec.DeletePublisher) -> None:
        if self.publishers.pop(cmd.publisher_id, None) is None:
            self._respond(cmd, codec.PUBLISHER_DOES_NOT_EXIST)
        else:
            self._respond(cmd, codec.OK)

    def _query_publisher_sequence(self, cmd: codec.QueryPublisherSequence) -> None:
        q = self._stream(cmd.stream)
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST, 0)
            return
        if not self._allowed(cmd.stream, "read"):
            self._respond(cmd, codec.ACCESS_REFUSED, 0)
            return
        seq = None
        if cmd.reference:
            for pub in self.publishers.values():  # ahead of the log's table until commit
                if pub.reference == cmd.reference and pub.queue is q:
                    seq = pub.sequence
            if seq is None:
                seq = q.log.query_offset(PUBLISHER_KEY + cmd.reference)
        self._respond(cmd, codec.OK, max(seq or 0, 0))

    def _publish(self, cmd: codec.Publish) -> None:
        pub = self.publishers.get(cmd.publisher_id)
        if pub is None or pub.queue.deleted:
            code = codec.PUBLISHER_DOES_NOT_EXIST if pub is None else codec.STREAM_DOES_NOT_EXIST
            self.conn.send(codec.encode_publish_error(
                cmd.publisher_id, [(m.publishing_id, code) for m in cmd.messages]))
            return
        lg = pub.queue.log
        confirms: list[int] = []
        # registered now: a failed write at the batch's end takes its ids out again
        self._confirms.append((lg, pub.id, confirms))
        refused: list[tuple[int, int]] = []
        limit = self.broker.config.max_message_size
        dedup = pub.reference is not None
        sequence = pub.sequence
        written = 0
        # the audit trail's records of this frame, built only while it is on
        audited: list | None = [] if self.broker.publishing.audit is not None else None
        for m in cmd.messages:
            pid = m.publishing_id
            if dedup and pid <= sequence:
                confirms.append(pid)  # a duplicate: confirmed, not written again
                continue
            data = m.data
            if isinstance(data, codec.SubEntry):
                if data.compression != codec.COMPRESSION_NONE:
                    if data.uncompressed_size > self._inflate_budget:
                        log.info("stream connection %s: compressed sub-entries of one read "
                                 "past %d bytes refused", self.peer, limit)
                        refused.append((pid, codec.PRECONDITION_FAILED))
                        continue
                    self._inflate_budget -= data.uncompressed_size
                try:
                    codec.check_subentry(data, limit)
                except codec.CompressionError as exc:
                    log.info("stream connection %s: sub-entry batch refused: %s", self.peer,
                             exc.reason)
                    refused.append((pid, exc.code))
                    continue
                self._add_subentry(lg, codec.subentry_entry(data), data.count, pub.id, pid)
                written += data.count
                if audited is not None:
                    audited += ((_audit_message(r, pub.stream), pid)
                                for r in codec.subentry_records(data, limit))
            else:
                if len(data) > limit:
                    refused.append((pid, codec.PRECONDITION_FAILED))
                    if audited is not None:
                        self.broker.publishing.appended(
                            self, pub.queue, [(_audit_message(data, pub.stream), pid)],
                            NACKED)
                    continue
                if lg in self._runs:
                    self._flush_run(lg)  # in the order published
                try:
                    lg.append_record(bytes(data), m.filter_value)
                except OSError as exc:  # the disk is full or failing: this one is refused
                    log.warning("stream %r: write failed (%s); publish refused", pub.stream,
                                exc)
                    refused.append((pid, codec.INTERNAL_ERROR))
                    continue
                written += 1
                if audited is not None:
                    audited.append((_audit_message(data, pub.stream), pid))
            if pid > sequence:
                sequence = pid
            confirms.append(pid)
        if refused and dedup:
            # a refused id may come again: the sequence stays below it
            sequence = min(sequence, min(pid for pid, _code in refused) - 1)
        if dedup and sequence != pub.sequence:
            pub.sequence = sequence
            lg.store_offset(PUBLISHER_KEY + pub.reference, sequence)  # type: ignore[operator]
        q = pub.queue
        q.stats_published += written
        self.messages_published += written
        if audited:
            self.broker.publishing.appended(self, q, audited)
        if refused:
            self.conn.send(codec.encode_publish_error(pub.id, refused))

    def _add_subentry(self, lg, entry: bytes, records: int, pub_id: int, pid: int) -> None:
        """Sub-entries wait for the end of the received batch to be one chunk (as osiris
        writes what its mailbox holds at once): a client that sends one Publish frame per
        sub-entry (rstream) does not make a chunk, a Deliver and a credit of each."""
        run = self._runs.get(lg)
        if run is not None and (len(run[0]) == MAX_CHUNK_ENTRIES
                                or run[2] + len(entry) > RUN_BYTES):
            self._flush_run(lg)
            run = None
        if run is None:
            run = self._runs[lg] = [[], 0, 0, []]
        run[0].append(entry)
        run[1] += records
        run[2] += len(entry)
        run[3].append((pub_id, pid))

    def _flush_run(self, lg) -> None:
        run = self._runs.pop(lg, None)
        if run is None or lg.closed:
            return
        try:
            lg.append_encoded(b"".join(run[0]), len(run[0]), run[1])
        except OSError as exc:  # nothing of it was written: its publishes are refused
            log.warning("stream log %s: write failed (%s); %d publishes refused",
                        lg.directory, exc, len(run[3]))
            self._refuse_written(lg, run[3])

    def _refuse_written(self, lg, ids: list[tuple[int, int]]) -> None:
        by_pub: dict[int, set[int]] = {}
        for pub_id, pid in ids:
            by_pub.setdefault(pub_id, set()).add(pid)
        for lg_, pub_id, confirms in self._confirms:
            if lg_ is lg and pub_id in by_pub:
                confirms[:] = [pid for pid in confirms if pid not in by_pub[pub_id]]
        for pub_id, pids in by_pub.items():
            self.conn.send(codec.encode_publish_error(
                pub_id, [(pid, codec.INTERNAL_ERROR) for pid in sorted(pids)]))
            pub = self.publishers.get(pub_id)
            if pub is not None and pub.reference is not None and pub.queue.log is lg:
                pub.sequence = min(pub.sequence, min(pids) - 1)
                lg.store_offset(PUBLISHER_KEY + pub.reference, pub.sequence)

    def _flush_publishes(self) -> None:
        """The end of a received batch: its sub-entries written, its confirms registered
        with the log (each once everything it appended is durable)."""
        for lg in list(self._runs):
            self._flush_run(lg)
        confirms, self._confirms = self._confirms, []
        for lg, pub_id, ids in confirms:
            if ids and not lg.closed:
                lg.when_durable(lg.next_offset - 1,
                                lambda pub_id=pub_id, ids=ids: self._confirm(pub_id, ids))

    def _confirm(self, pub_id: int, ids: list[int]) -> None:
        if self.ended:
            return
        self.conn.send(codec.encode_publish_confirm(pub_id, ids))
        self.wake()

    # -- offsets --
    def _store_offset(self, cmd: codec.StoreOffset) -> None:
        q = self._stream(cmd.stream)
        if q is None or not self._allowed(cmd.stream, "read") or not cmd.reference \
                or len(cmd.reference) > MAX_REFERENCE:
            return  # no answer to StoreOffset, as RabbitMQ
        if cmd.reference.startswith(REPLICA_REFERENCE) and self.username == LINK_USER:
            # a replica's report of what it has committed: counts towards confirms
            q.log.replica_acked(cmd.reference[len(REPLICA_REFERENCE):], cmd.offset)
            return
        q.log.store_offset(cmd.reference, cmd.offset)

    def _query_offset(self, cmd: codec.QueryOffset) -> None:
        q = self._stream(cmd.stream)
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST, 0)
            return
        if not self._allowed(cmd.stream, "read"):
            self._respond(cmd, codec.ACCESS_REFUSED, 0)
            return
        offset = q.log.query_offset(cmd.reference) if cmd.reference else None
        if offset is None:
            self._respond(cmd, codec.NO_OFFSET, 0)
        else:
            self._respond(cmd, codec.OK, offset)

    # -- consuming --
    def _subscribe(self, cmd: codec.Subscribe) -> None:
        q = self._readable(cmd.stream)
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST)
            return
        if not self._allowed(cmd.stream, "read"):
            self._respond(cmd, codec.ACCESS_REFUSED)
            return
        if cmd.subscription_id in self.subscriptions:
            self._respond(cmd, codec.SUBSCRIPTION_ID_ALREADY_EXISTS)
            return
        props = cmd.properties
        values = [v for k, v in props.items() if k.startswith("filter.") and v is not None]
        flt = (values, props.get("match-unfiltered") == "true") if values else None
        sub = Subscription(cmd.subscription_id, cmd.stream, q, cmd.credit, flt)
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

    # ---- as a connection in broker.sessions ----
    @property
    def closed(self) -> bool:
        return self.ended

    @property
    def session(self) -> StreamSession:
        return self

    @property
    def protocol(self) -> str:
        return "RabbitMQ Stream"

    def connection_info(self) -> dict:
        return {"protocol": self.protocol, "auth_mechanism": "PLAIN", "channel_max": 0,
                "frame_max": self.conn.frame_max, "timeout": self.conn.heartbeat,
                "port": self.local_port, "ssl": self.tls,
                "client_properties": dict(self.conn.client_properties)}

    def force_close(self, error: errors.AMQPError) -> None:
        self.close(error.text)

    def close(self, reason: str) -> None:
        """The server ends the connection (heartbeats missed, shutdown, management)."""
        if self.ended:
            return
        log.info("stream connection %s: closing: %s", self.peer, reason)
        if self.conn.state is State.OPEN:
            self.conn.close(codec.OK, reason[:200])
        self.finished = True
        self.connection_lost()
        self.wake()

    def _finish(self) -> None:
        self.finished = True
        self.connection_lost()

    def connection_lost(self) -> None:
        """Every way a connection ends comes here once."""
        if self.ended:
            return
        self.ended = True
        subs = list(self.subscriptions.values())
        self.subscriptions.clear()
        for sub in subs:
            self._drop_subscription(sub)
        self.publishers.clear()
        self.service.sessions.discard(self)
        if self.vhost is not None:
            self.broker.session_closed(self)


class _Replica:
    """A replica's log read as a stream (subscriptions only read ``log`` and ``deleted``):
    gone once its copy stops (the leader changed or the stream was deleted)."""

    __slots__ = ("log", "name")

    def __init__(self, name: str, lg):
        self.name, self.log = name, lg

    @property
    def deleted(self) -> bool:
        return self.log.closed


def _audit_message(record, stream: str) -> Message:
    """A record as the audit trail reads a publish: its properties and body (a record
    this broker cannot read: its bytes as the body), to the stream's name as routing key,
    as a publish through the default exchange names its queue; persistent, as every
    record of a stream's log is."""
    record = bytes(record)
    try:
        exchange, _key, raw, properties, body = records.decode(record)
    except (ValueError, IndexError, RecursionError, struct.error):
        exchange, raw, properties, body = "", b"", {}, record
    message = Message(exchange, stream, raw, properties, body)
    message.persistent = True
    return message


def _arguments(create_args: dict) -> dict[str, Any]:
    """Create's arguments as queue arguments: digits as numbers (str.isdigit takes '²',
    which int refuses, and any length: precondition failed past a signed 64-bit)."""
    arguments: dict[str, Any] = {}
    for key, value in create_args.items():
        if key in _CREATE_ARGS and value is not None:
            if value.isascii() and value.isdigit() and key != "max-age":
                if len(value) > 19 or int(value) >= 1 << 63:
                    raise errors.precondition_failed("stream argument '%s' out of range: %s",
                                                     key, value[:40])
                arguments[_CREATE_ARGS[key]] = int(value)
            else:
                arguments[_CREATE_ARGS[key]] = value
    return arguments


def _valid_name(name: str) -> bool:
    return bool(name) and len(name.encode()) <= 255 and not name.startswith("amq.")


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("triomq")
    except Exception:
        return "0"


_HANDLERS: dict[type, Any] = {
    codec.Create: StreamSession._create,
    codec.Delete: StreamSession._delete,
    codec.Metadata: StreamSession._metadata,
    codec.StreamStats: StreamSession._stream_stats,
    codec.Route: StreamSession._route,
    codec.Partitions: StreamSession._partitions,
    codec.CreateSuperStream: StreamSession._create_super_stream,
    codec.DeleteSuperStream: StreamSession._delete_super_stream,
    codec.DeclarePublisher: StreamSession._declare_publisher,
    codec.DeletePublisher: StreamSession._delete_publisher,
    codec.QueryPublisherSequence: StreamSession._query_publisher_sequence,
    codec.Publish: StreamSession._publish,
    codec.StoreOffset: StreamSession._store_offset,
    codec.QueryOffset: StreamSession._query_offset,
    codec.Subscribe: StreamSession._subscribe,
    codec.Credit: StreamSession._credit,
    codec.Unsubscribe: StreamSession._unsubscribe,
    codec.ConsumerUpdateResponse: StreamSession._consumer_update_response,
}
