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
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from .. import errors
from ..cluster.link import LINK_USER
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
from ..streams import super as super_streams
from ..streams.log import REPLICA_REFERENCE
from .session_base import NO_QUEUES
from .stream_consuming import StreamConsuming
from .stream_core import StreamService
from .stream_publishing import MAX_REFERENCE, StreamPublishing

__all__ = ["StreamService", "StreamSession"]

# what compressed sub-entries may inflate in one turn of the event loop (a few ms)
STEP_BYTES = 4 << 20
# as flow_queues while a frame's inflating waits for its turn: the edge reads at most every
# 0.1 s meanwhile, and the management API shows the connection in flow
INFLATING: frozenset = frozenset({"inflating"})

log = logging.getLogger("broker.stream")

# Create's arguments as RabbitMQ maps them onto queue arguments
_CREATE_ARGS = {"max-length-bytes": "x-max-length-bytes", "max-age": "x-max-age",
                "stream-max-segment-size-bytes": "x-stream-max-segment-size-bytes",
                "queue-leader-locator": "x-queue-leader-locator",
                "initial-cluster-size": "x-initial-cluster-size"}














class StreamSession(StreamPublishing, StreamConsuming):
    """One connection (and an entry of ``broker.sessions``)."""

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
        self.vhost = None
        self.audit_ctx: tuple | None = None  # (vhost, user, peer, channel) of its events
        self.user = None
        self.authz = None
        self.username = None
        self.publishers = {}
        self.subscriptions = {}
        self.delivery_stalled = False
        self.is_publisher = False
        self.blocked_sent = False
        self.flow_queues: frozenset = NO_QUEUES
        self.flow_resumed: Callable[[], None] = lambda: None  # (the edge's, when it sets one)
        # the events received and not yet handled, and the Publish whose inflating waits
        # for its next turn (None: none)
        self._events: deque = deque()
        self._steps: Iterator[None] | None = None
        self._step_budget = STEP_BYTES
        self.finished = False
        self.ended = False
        self._corr = 0
        # a received batch's sub-entries by log ([entries, records, bytes]) and the
        # confirms waiting for them: written and registered at the batch's end
        self._runs = {}
        self._confirms = []
        self.messages_published = 0
        self.chunks_delivered = 0
        self.audit = broker.audit  # (the login wait's clock)
        # (token, SaslAuthenticate) while the edge introspects an opaque OAuth 2 token;
        # None: no login waiting
        self.login_wait = None

    # ---- input ----
    def login_resumed(self, request: AuthenticateRequested) -> None:
        """The edge introspected ``login_wait``'s token: SaslAuthenticate is decided now."""
        self._authenticate(request)

    def input_handled(self) -> None:
        if self.conn.state is State.CLOSED:
            self._finish()

    def data_received(self, data) -> None:
        # what the compressed sub-entries of one read may inflate to (eight 128 MiB gzip
        # bombs fit one 1 MiB frame); while a frame's inflating waits for its next turn,
        # what is read meanwhile shares the budget left
        if not self._events:
            self._inflate_budget = self.broker.config.max_message_size
        self._events.extend(self.conn.receive_data(data))
        if self._steps is None:
            self._handle_input()

    def _handle_input(self) -> None:
        audit = self.audit
        if audit is None:
            self._handle_events()
            return
        audit.clock_start()  # the batch's events share one time
        try:
            self._handle_events()
        finally:
            audit.clock_stop()

    def _handle_events(self) -> None:
        """The events received, in order, until they are done or a frame's inflating used
        this turn's budget (``STEP_BYTES``): the rest then waits for a later turn of the
        event loop (the broker's timers), and the edge reads less meanwhile (``flow``)."""
        self._step_budget = STEP_BYTES
        events = self._events
        while not self.ended:
            try:
                steps = self._steps
                if steps is not None:
                    try:
                        next(steps)
                    except StopIteration:
                        self._steps = None
                        continue
                    self.flow_queues = INFLATING
                    self.vhost.timers.call_later(0, self._go_on)
                    self.wake()
                    return
                if not events:
                    break
                ev = events.popleft()
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
                self._steps = None
                log.exception("stream connection %s: internal error", self.peer)
                self.conn.close(codec.INTERNAL_ERROR, "internal error")
        events.clear()
        if self._runs or self._confirms:
            self._flush_publishes()
        if self.conn.state is State.CLOSED:
            self._finish()
        if self.flow_queues is INFLATING:
            self.flow_queues = NO_QUEUES
            self.flow_resumed()
        self.wake()

    def _go_on(self) -> None:
        if self.ended:
            self._steps = None
            self._events.clear()
            return
        self._handle_input()

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
        steps = handler(self, cmd)
        if steps is not None:  # a Publish: run by _handle_events, a turn's budget at a time
            self._steps = steps

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
            q = self._declare_stream(name, cmd.arguments)
        except errors.AMQPError as exc:
            log.info("stream connection %s: create %r refused: %s", self.peer, name, exc.text)
            self._respond(cmd, codec.PRECONDITION_FAILED)
            return
        self._respond_when_durable(cmd, q.store)

    def _respond_when_durable(self, cmd: Any, store: Any) -> None:
        """OK once ``store`` (None: nothing stored) has made the new definitions durable: a
        crash after the answer must not lose the stream."""
        if store is None:
            self._respond(cmd, codec.OK)
            return

        def durable() -> None:
            if not self.ended:
                self._respond(cmd, codec.OK)
                self.wake()
        store.when_durable(durable)

    def _declare_stream(self, name: str, create_args: dict) -> StreamQueue:
        arguments: dict[str, Any] = {"x-queue-type": "stream", **_arguments(create_args)}
        return self.vhost.declare_queue(  # type: ignore[return-value]
            name, None, durable=True, arguments=arguments)

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
        self._respond_when_durable(cmd, vhost.queues[parts[-1]].store)

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
        replicas = self.broker.streams.replicas
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
        if not self._usable(q, cmd, "read"):
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
        if not self._usable(q, cmd, "read", 0):
            return
        offset = q.log.query_offset(cmd.reference) if cmd.reference else None
        if offset is None:
            self._respond(cmd, codec.NO_OFFSET, 0)
        else:
            self._respond(cmd, codec.OK, offset)

    # ---- ending ----
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
