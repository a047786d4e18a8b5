"""What a Stream-protocol session's parts share (service, look-ups); not command handling.

What the parts of a Stream-protocol session share: the listener's broker-wide state
(``StreamService``: sessions, single-active-consumer groups) and the session's state and
look-ups (a stream, a readable replica, a permission, a response), as a member of
``broker.sessions``. Not a command's handling (``stream_session``, ``stream_publishing``,
``stream_consuming``).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeGuard

from .. import errors
from ..queues.stream import StreamQueue
from ..streamproto import codec
from ..streamproto.connection import ServerConnection
from .session_base import ProtocolSession

if TYPE_CHECKING:
    from ..broker import Broker
    from ..queues.queue import Queue
    from .stream_consuming import StreamConsuming, Subscription
    from .stream_publishing import Publisher
    from .stream_session import StreamSession

log = logging.getLogger("broker.stream")


class StreamService:
    """The listener's broker-wide state: sessions and single-active-consumer groups."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.stopping = False
        self.bytes_received = 0  # counted by the edge
        self.sessions: set[StreamSession] = set()
        # (vhost, stream, name) -> the group's (session, subscription), the active first
        self.sac_groups: dict[tuple, list[tuple[StreamConsuming, Subscription]]] = {}

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

    def queue_deleted(self, queue: Queue, _consumers) -> None:
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


class StreamSessionCore(ProtocolSession):
    """A Stream-protocol connection's state and look-ups (``StreamSession`` sets them)."""

    metrics_protocol = "stream"  # its publishes count in messages_published, not the path's

    service: StreamService
    conn: ServerConnection
    peer: str
    vhost: Any
    user: Any
    authz: Any
    username: str | None
    publishers: dict[int, Publisher]
    subscriptions: dict[int, Subscription]
    output_high_water: int
    delivery_stalled: bool
    is_publisher: bool
    messages_published: int
    chunks_delivered: int
    _inflate_budget: int
    _step_budget: int  # what compressed sub-entries may inflate in this turn of the loop
    _corr: int
    _runs: dict[Any, list]
    _confirms: list[tuple[Any, int, list[int]]]

    @property
    def protocol(self) -> str:
        return "RabbitMQ Stream"

    def client_properties(self) -> dict:
        return dict(self.conn.client_properties)

    def heartbeat_timeout(self) -> int:
        return self.conn.heartbeat

    def negotiated_frame_max(self) -> int:
        return self.conn.frame_max

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
        replicas = self.broker.streams.replicas
        lg = replicas.local_log(self.vhost.name, name) if replicas is not None else None
        return _Replica(name, lg, self.vhost.queues.get(name)) if lg is not None else None

    def _usable(self, q: Any, cmd, perm: str, *extra) -> TypeGuard[StreamQueue]:
        """The command's stream ``q`` exists and may be used for ``perm``; if not, the
        command is answered (with ``extra``, the fields an error answer carries too)."""
        if q is None:
            self._respond(cmd, codec.STREAM_DOES_NOT_EXIST, *extra)
            return False
        if not self._allowed(cmd.stream, perm):
            self._respond(cmd, codec.ACCESS_REFUSED, *extra)
            return False
        return True

    def _allowed(self, name: str, perm: str) -> bool:
        try:
            self.authz.check("queue", name, perm)
        except errors.AMQPError:
            return False
        return True


class _Replica:
    """A replica's log read as a stream (subscriptions only read ``log`` and ``deleted``):
    gone once its copy stops (the leader changed or the stream was deleted)."""

    __slots__ = ("log", "name", "proxy")

    def __init__(self, name: str, lg, proxy: Any):
        self.name, self.log = name, lg
        self.proxy = proxy  # the stream's queue on this node (its leader's proxy), or None

    @property
    def audit_ctx(self) -> tuple | None:
        """This node's trail records the chunks read from its copy when it follows the
        stream (by offset, as the leader's trail records its own readers')."""
        return self.proxy.audit_ctx if self.proxy is not None else None

    @property
    def deleted(self) -> bool:
        return self.log.closed
