"""Streams replicated across cluster nodes: the leader writes chunks to its log, each
follower copies the log chunk by chunk into its own log on its own disk, and a publish is
confirmed once a majority of the stream's replica group has the chunk committed.

* **Group.** A durable stream declared in a cluster lives on its master node (placement,
  forwarding and the master key are the queues' own: ``store.py``, ``forward.py``,
  ``node.py``). That node, the **leader**, records the stream's replica group in etcd
  (``streams/VHOST/QUEUE``: ``{"members": [...], "leader": NAME}``): itself and the next
  live nodes in name order, ``x-initial-cluster-size`` of them (RabbitMQ's argument;
  default min(3, live nodes)). The record outlives the nodes' restarts; the leader deletes
  it when the stream is deleted.
* **Copy.** A follower pulls: it connects to the leader's Stream-protocol listener (the
  address each node publishes under ``streamaddr/NAME`` on its lease) as the cluster's link
  user, subscribes to the stream from its own log's tail (``REPLICA_PROPERTY``: chunks come
  as the leader's log holds them, Bloom filter included, never split) and appends each
  chunk verbatim (``StreamLog.append_replica_chunk``: same offsets, chunk ids, timestamps).
  Its own group commit fsyncs them; after each commit it reports its committed offset to
  the leader (StoreOffset under ``REPLICA_REFERENCE`` + its name), which counts it
  (``StreamLog.replica_acked``). A follower that restarts reads its log back and
  subscribes from its last chunk: only what it lacks is sent.
* **Confirms.** The leader's log leads its group (``StreamLog.set_replicas``): AMQP
  confirms (``StreamQueue.when_durable``) and Stream-protocol PublishConfirms wait for a
  majority of the group, the leader's own commit included. A log opened before the group
  is known waits for one replica (``StreamStore.replicas``) rather than confirming alone.
* **Failover.** When the leader's lease ends (kill -9, a partition from etcd), its master
  key goes; each live member posts its committed tail and, once a majority of the group
  has, the longest log (ties: by name; the copy of the latest leader first:
  ``stream_divergence.py``) claims the master key (``_elect``) and its copy
  becomes the stream queue (``_promote``): the home moves to it, the other members follow
  it, and every other node's proxy follows the new master. A deposed leader that comes
  back finds its stream mastered elsewhere: its stream queue becomes a proxy, but its
  log stays (``stream_stepdown.keeping_copy``): cut back to what the new leader kept (it
  may hold chunks never confirmed: ``stream_divergence.py``), it copies only what it lacks.
* **Leader removed.** ``delete_replica`` of the leader: it steps down once its log is
  confirmed, and the others elect a leader (``stream_stepdown.step_down``).
* **Reads.** Stream-protocol consumers on a follower's node read its replica (Subscribe,
  Metadata and StreamStats find it: ``StreamSession._readable``); so do AMQP 0-9-1
  consumers (``stream_reads.StreamProxyQueue``; through the leader where there is no copy).
* **Metadata** names the leader's listener and the other members' (``placement``), as
  RabbitMQ answers, so a Stream-protocol publisher connected to any node goes on to the
  leader (rstream does).
* **Diverged.** A copy holding chunks of an old leader past what later leaders kept is
  cut back before it copies (``_Follower._agree``, ``stream_divergence.py``).
* **Behind retention.** A copy whose tail is behind the leader's first chunk (retention
  removed what it lacks) starts again from that chunk (``append_from_leader``), as osiris.
"""
from __future__ import annotations

import json
import logging
import struct
from typing import TYPE_CHECKING

import trio

from ..queues.stream import StreamQueue
from ..streamproto import codec
from ..streams.log import REPLICA_PROPERTY, REPLICA_REFERENCE, ReplicaGap, StreamLog
from ..streams.store import stream_dir
from .etcd import CoordinationError, CoordinationUnavailable
from .link import LINK_USER
from .node import queue_key, split_queue_key
from .stream_divergence import (
    leader_start,
    read_label,
    truncate_log_files,
    truncation_point,
    write_label,
)
from .stream_stepdown import bindings_of, rebind, restore_kept, step_down

if TYPE_CHECKING:
    from ..broker import Broker
    from ..services import StreamReplicaServices
    from .store import ClusterStore

log = logging.getLogger("broker.cluster.streams")

ROUND_S = 1.0  # how often the groups and follower tasks are reconciled with etcd
CREDIT = 32  # chunks a follower lets the leader send ahead of its appends
HEARTBEAT_S = 20.0  # what a follower sends while idle (the leader's heartbeat is 60 s)


def initial_cluster_size(q: StreamQueue, live: int) -> int:
    value = q.arguments.get("x-initial-cluster-size")
    if isinstance(value, (str, bytes)) and value.strip().isdigit():
        value = int(value)  # the Stream protocol's Create passes its arguments as strings
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return min(value, live)
    return min(3, live)


def place(leader: str, live: list[str], size: int) -> list[str]:
    """The leader and the next live nodes after it in name order, ``size`` in all."""
    others = sorted(n for n in live if n != leader)
    after = [n for n in others if n > leader] + [n for n in others if n < leader]
    return [leader, *after[:max(0, size - 1)]]


class StreamReplicas:
    """This node's part: the groups of the streams it leads, a follower task per stream
    it replicates. ``run`` is a task of the broker (``background_tasks``)."""

    def __init__(self, store: ClusterStore):
        self.store = store
        self.groups: dict[tuple[str, str], dict] = {}  # (vhost, stream) -> record
        self.addresses: dict[str, tuple[str, int]] = {}  # node -> its Stream listener
        self._followers: dict[tuple[str, str], trio.CancelScope] = {}
        self._following: dict[tuple[str, str], _Follower] = {}
        self._published: tuple[int, int] | None = None  # (lease, port) of streamaddr/
        self._nursery: trio.Nursery | None = None

    def install(self, broker: Broker) -> None:
        # logs opened before their group is known wait for a replica (set_replicas); the
        # Stream protocol's readers and Metadata find this node's copies through it
        broker.streams.replicas = self
        broker.background_tasks.append(self.run)

    def _key(self, *parts: str) -> str:
        return self.store.node.key(*parts)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                try:
                    await self._round()
                except (CoordinationUnavailable, CoordinationError) as exc:
                    log.debug("stream replicas: etcd: %s", exc)
                except Exception:  # a round that fails is retried; the node keeps serving
                    log.exception("stream replicas: round failed")
                await trio.sleep(ROUND_S)

    async def _round(self) -> None:
        store, node = self.store, self.store.node
        broker = store.broker
        if broker is None or not node.serving:
            return
        coord = store.coord
        port = broker.stream.ports.get("stream") if broker.stream is not None else None
        if port and self._published != (node.lease, port):
            await coord.put(self._key("streamaddr", node.name),
                            json.dumps({"port": port}).encode(), node.lease)
            self._published = (node.lease, port)
        kvs, _rev = await coord.get_prefix(self._key("streamaddr", ""))
        addresses = {}
        for kv in kvs:
            name = kv.key.rsplit("/", 1)[-1]
            host = store._addresses.get(name) or ("127.0.0.1:0" if name == node.name else "")
            try:
                p = int(kv.json()["port"])
            except (ValueError, KeyError, TypeError):
                continue
            if host:
                addresses[name] = (host.rsplit(":", 1)[0] or "127.0.0.1", p)
        self.addresses = addresses
        kvs, _rev = await coord.get_prefix(self._key("streams", ""))
        groups: dict[tuple[str, str], dict] = {}
        prefix = self._key("streams", "")
        for kv in kvs:
            try:
                groups[split_queue_key(kv.key[len(prefix):])] = kv.json()
            except (ValueError, KeyError):
                continue
        await self._lead(broker, groups)
        self.groups = groups
        self._follow(broker, groups)
        await self._elect(broker, groups)

    async def _lead(self, broker: Broker, groups: dict) -> None:
        """Record the group of each stream led here; drop the records of those deleted."""
        store, node = self.store, self.store.node
        live = sorted(store.live_nodes())
        for vhost in list(broker.vhosts.values()):
            for q in list(vhost.queues.values()):
                if not isinstance(q, StreamQueue) or q.deleted or not q.durable:
                    continue
                key = (vhost.name, q.name)
                group = groups.get(key)
                if group is None:
                    members = place(node.name, live, initial_cluster_size(q, len(live)))
                    group = {"members": members, "leader": node.name}
                    await store.coord.put(self._key("streams", queue_key(*key)),
                                          json.dumps(group).encode())
                    groups[key] = group
                    log.info("stream %r in vhost %r: replicas on %s", q.name, vhost.name,
                             ", ".join(members))
                if node.name not in group.get("members", ()):  # delete_replica of it
                    await step_down(self, vhost, q, group)
                    continue
                followers = [m for m in group["members"] if m != node.name]
                lg = q.log
                current = lg.replica_offsets
                if current is None or set(current) != set(followers) \
                        or lg.group_size != len(group["members"]):
                    lg.set_replicas(followers, len(group["members"]))
        for key, group in list(groups.items()):
            held = broker.vhosts.get(key[0])
            if group.get("leader") == node.name and (
                    held is None or key[1] not in held.queues):
                await store.coord.delete(self._key("streams", queue_key(*key)))
                del groups[key]
                log.info("stream %r in vhost %r deleted: its replica group too", key[1],
                         key[0])

    def _follow(self, broker: Broker, groups: dict) -> None:
        store, node = self.store, self.store.node
        wanted = {}
        for key, group in groups.items():
            leader = store.master_of(*key)
            if leader is None and key in self._following:
                # no leader now: the copy stays open, for the election (``_elect``)
                wanted[key] = self._following[key].leader
            elif node.name in group.get("members", ()) and leader not in (None, node.name) \
                    and key[0] in broker.vhosts:
                wanted[key] = leader
            elif leader is None and node.name in group.get("members", ()) \
                    and group.get("leader") not in (None, node.name) and key[0] in broker.vhosts:
                # no leader, and this node restarted: its copy is opened for the election
                # (the recorded leader's, whose pulls fail until a leader is there)
                wanted[key] = group["leader"]
        replaced: dict[tuple[str, str], _Follower] = {}
        for key in list(self._followers):
            follower = self._following[key]
            if wanted.get(key) != follower.leader:
                self._followers.pop(key).cancel()
                del self._following[key]
                replaced[key] = follower
                # the stream was deleted, or this node removed from its group
                # (delete_replica): so is this copy
                if node.name not in groups.get(key, {}).get("members", ()):
                    follower.drop = True
                else:  # another leader: the next follower copies on into the open log
                    follower.passing = key in wanted
        for key, leader in wanted.items():
            if key not in self._followers and self._nursery is not None:
                follower = _Follower(self, broker.services, key[0], key[1], leader)
                # the log is the previous follower's until its task is done with it
                follower.previous = replaced.get(key)
                scope = trio.CancelScope()
                self._followers[key] = scope
                self._following[key] = follower
                self._nursery.start_soon(follower.run, scope)

    async def _elect(self, broker: Broker, groups: dict) -> None:
        """Streams whose leader is gone (its lease expired: the master key is deleted):
        each live member posts its committed tail (``streamtails/``, on its lease); once
        a majority of the group posted, the one with the longest log (ties: by name)
        claims the master key and becomes the leader. Every confirmed chunk is on a
        majority of the group, so on at least one of any majority: the longest log of a
        majority has all of them."""
        store, node = self.store, self.store.node
        coord = store.coord
        live = store.live_nodes()
        for key, group in list(groups.items()):
            follower = self._following.get(key)
            if follower is None or follower.log is None or store.master_of(*key) is not None:
                continue
            members = group.get("members", [])
            leader = group.get("leader")
            if leader in live and leader != node.name and leader in members:
                continue  # its leader is up (its master key comes back with its claims)
            qk = queue_key(*key)
            await coord.put(self._key("streamtails", qk, node.name),
                            json.dumps({"tail": follower.log.committed_offset,
                                        "epoch": follower.label}).encode(),
                            node.lease)
            kvs, _rev = await coord.get_prefix(self._key("streamtails", qk, ""))
            tails: dict[str, tuple[int, int]] = {}  # node -> (label, tail)
            for kv in kvs:
                name = kv.key.rsplit("/", 1)[-1]
                if name in members and name in live:
                    try:
                        post = kv.json()
                        label = post.get("epoch")
                        tails[name] = (-1 if label is None else int(label), int(post["tail"]))
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue
            if len(tails) < len(members) // 2 + 1:
                continue  # no majority of the group: a confirmed chunk may be missing
            # the latest leader's copy first (stream_divergence.py), then the longest
            best = min(tails, key=lambda n: (-tails[n][0], -tails[n][1], n))
            if best != node.name:
                continue
            m = await node.claim_if_free(*key)
            if m is None:
                continue
            await self._promote(broker, key, follower, group, m.epoch)

    async def _promote(self, broker: Broker, key: tuple[str, str], follower: _Follower,
                       group: dict, epoch: int) -> None:
        """This node's copy becomes the stream (the log stays open: the queue takes it)."""
        from ..queues.args import parse_queue_arguments
        from .forward import ProxyQueue
        store, node = self.store, self.store.node
        vhost = broker.vhosts.get(key[0])
        proxy = vhost.queues.get(key[1]) if vhost is not None else None
        if vhost is None or not isinstance(proxy, ProxyQueue):
            return
        follower.handover = True
        start = follower.log.next_offset if follower.log is not None else 0
        self._followers.pop(key).cancel()
        del self._following[key]
        arguments = dict(proxy.arguments)
        q = StreamQueue(vhost, key[1], durable=True, auto_delete=False, arguments=arguments,
                        opts=parse_queue_arguments(arguments))
        vstore = vhost.store
        vstore.save_queue(vhost, q)
        q.attach_store(vstore.message_store)
        consumers = list(proxy.consumers)
        for consumer in consumers:
            proxy.remove_consumer(consumer)
        proxy.forwarding = False
        bindings = bindings_of(vhost, proxy)
        vhost.delete_queue(proxy, reason="stream leader promoted here")
        vhost.add_queue(q, persist=False)  # stored above
        rebind(vhost, q, bindings, persist=True)
        for consumer in consumers:
            # its offset spec would start it again from where it began: it subscribes anew
            if not consumer.channel.closed:
                consumer.channel.consumer_cancelled_by_broker(consumer)
        # its own chunks start at its tail: a copy that holds others past it cuts them
        group = {"members": group.get("members", []), "leader": node.name, "epoch": epoch,
                 "history": [*group.get("history", []), [epoch, start]]}
        self.groups[key] = group
        await store.coord.put(node.home_key(*key),
                              json.dumps({"node": node.name}).encode())
        await store.coord.put(self._key("streams", queue_key(*key)), json.dumps(group).encode())
        followers = [n for n in group["members"] if n != node.name]
        q.log.set_replicas(followers, len(group["members"]))
        # deposed later, this log is cut back from here (stream_stepdown.keeping_copy)
        await trio.to_thread.run_sync(write_label, q.log.directory, epoch)
        log.warning("stream %r in vhost %r: leader on this node now (epoch %d, log up to "
                    "offset %d, old leader %r)", key[1], key[0], epoch,
                    q.log.committed_offset, follower.leader)

    def placement(self, vhost: str, name: str, here: tuple[str, int]
                  ) -> tuple[tuple[str, int], list[tuple[str, int]]] | None:
        """The Stream-protocol addresses of a stream's leader and of its other members
        that have one (``here``: this node's, as the client reached it), for Metadata;
        None when the group or its leader's address is not known."""
        key = (vhost, name)
        group = self.groups.get(key)
        leader = self.store.master_of(*key)
        if group is None or leader is None:
            return None
        me = self.store.node.name

        def address(node: str) -> tuple[str, int] | None:
            return here if node == me else self.addresses.get(node)
        lead = address(leader)
        if lead is None:
            return None
        others = [a for n in group.get("members", []) if n != leader
                  and (a := address(n)) is not None]
        return lead, others

    def local_log(self, vhost: str, name: str) -> StreamLog | None:
        """This node's copy of a stream led elsewhere, while it is being kept (Stream
        protocol readers on this node read it)."""
        follower = self._following.get((vhost, name))
        lg = follower.log if follower is not None else None
        return lg if lg is not None and not lg.closed else None

    def status(self) -> dict:
        return {f"{v}/{q}": {"leader": f.leader, "offset": f.committed}
                for (v, q), f in self._following.items()}


class _Follower:
    """One stream this node replicates from ``leader``."""

    def __init__(self, owner: StreamReplicas, services: StreamReplicaServices, vhost: str,
                 name: str, leader: str):
        self.owner, self.services = owner, services
        self.vhost, self.name, self.leader = vhost, name, leader
        self.committed = -1
        self.drop = False
        self.handover = False  # promoted: the stream queue takes the log as it is
        self.log: StreamLog | None = None
        self.previous: _Follower | None = None  # the stream's follower before this one
        # replaced by a follower of another leader: the log stays open for it (its
        # readers on this node, Stream protocol and AMQP, read on undisturbed)
        self.passing = False
        self.label: int | None = None  # stream_divergence.py: whose log this copy holds
        self._relabel: tuple[int, int] | None = None  # (epoch, start): once committed there
        self.finished = trio.Event()
        self._warned = ""

    async def run(self, scope: trio.CancelScope) -> None:
        try:
            with scope:
                if self.previous is not None:
                    await self.previous.finished.wait()
                await self._follow()
        finally:
            self.finished.set()

    async def _follow(self) -> None:
        previous, self.previous = self.previous, None
        if previous is not None and previous.passing and previous.log is not None \
                and not previous.log.closed:
            lg = self.log = previous.log  # handed on open
        else:
            streams = self.services.streams
            restore_kept(stream_dir(streams.data_dir, self.vhost, self.name))
            lg = self.log = streams.open(self.vhost, self.name)
            lg.set_replicas(None)  # a copy leads nothing: its readers read what it committed
            self._opened(lg)
        self.label = read_label(lg.directory)
        try:
            while True:
                try:
                    await self._pull(self.log)
                except Exception as exc:  # a copy's failure never stops the node
                    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1 \
                            and isinstance(exc.exceptions[0], Exception):
                        exc = exc.exceptions[0]
                    text = f"{type(exc).__name__}: {exc}"
                    if text != self._warned:
                        log.warning("stream %r in vhost %r: replica of node %r: %s",
                                    self.name, self.vhost, self.leader, text)
                        self._warned = text
                await trio.sleep(1.0)
        finally:
            lg = self.log
            if not self.handover and not self.passing:
                self._closing(lg, reopening=not self.drop)
                self.services.streams.forget(lg)
                if self.drop:
                    lg.delete()
                else:
                    lg.close()
                _readers_told(lg)

    async def _pull(self, lg: StreamLog) -> None:
        address = self.owner.addresses.get(self.leader)
        if address is None:
            raise ConnectionError("no Stream-protocol address of the leader yet")
        sock = await trio.open_tcp_stream(*address)
        async with sock:
            stream = _Locked(sock)
            reader = codec.FrameReader(0)
            frames: list = []

            async def next_frame(key: int):
                while True:
                    while frames:
                        frame = frames.pop(0)
                        if frame[0] == key:
                            return frame
                    data = await stream.receive_some(1 << 20)
                    if not data:
                        raise ConnectionError("closed by the leader")
                    frames.extend(reader.feed(data))

            store = self.owner.store
            await stream.send_all(b"".join(codec.encode(c) for c in (
                codec.PeerProperties(1, {"product": "TrioMQ replica"}),
                codec.SaslHandshake(2),
                codec.SaslAuthenticate(3, "PLAIN", b"\0" + LINK_USER.encode() + b"\0"
                                       + store.link_password.encode()))))
            _k, _v, p = await next_frame(0x8000 | codec.SASL_AUTHENTICATE)
            if struct.unpack_from(">H", p, 4)[0] != codec.OK:
                raise ConnectionError("the leader refused the link user")
            await next_frame(codec.TUNE)
            await stream.send_all(codec.encode(codec.Tune(0, 0)) + codec.encode(
                codec.Open(4, self.vhost)))
            _k, _v, p = await next_frame(0x8000 | codec.OPEN)
            if struct.unpack_from(">H", p, 4)[0] != codec.OK:
                raise ConnectionError(f"the leader refused vhost {self.vhost!r}")
            lg = self._agree(lg)
            start = lg.next_offset
            await stream.send_all(codec.encode(codec.Subscribe(
                5, 1, self.name, (codec.OFFSET_OFFSET, start), CREDIT,
                {REPLICA_PROPERTY: store.node.name})))
            _k, _v, p = await next_frame(0x8000 | codec.SUBSCRIBE)
            code = struct.unpack_from(">H", p, 4)[0]
            if code != codec.OK:
                raise ConnectionError(f"subscribe refused by the leader (code {code})")
            log.info("stream %r in vhost %r: replicating from node %r, from offset %d",
                     self.name, self.vhost, self.leader, start)
            self._warned = ""
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._report, stream, lg)
                nursery.start_soon(self._heartbeats, stream)
                while True:
                    _k, version, payload = await next_frame(codec.DELIVER)
                    chunk = memoryview(payload)[1 if version == 1 else 9:]
                    append_from_leader(lg, chunk)
                    await stream.send_all(codec.encode(codec.Credit(1, 1)))

    async def _report(self, stream, lg: StreamLog) -> None:
        """What this copy has committed, to the leader, after each commit."""
        reference = REPLICA_REFERENCE + self.owner.store.node.name
        reported = -1
        while not lg.closed:
            if self._relabel is not None and lg.committed_offset + 1 >= self._relabel[1]:
                # a prefix of the current leader's log now, up to its own chunks
                self.label = self._relabel[0]
                await trio.to_thread.run_sync(write_label, lg.directory, self.label)
                self._relabel = None
            if lg.committed_offset > reported:
                reported = self.committed = lg.committed_offset
                await stream.send_all(codec.encode(codec.StoreOffset(
                    reference, self.name, reported)))
            await lg.wait_committed(reported + 1)

    def _agree(self, lg: StreamLog) -> StreamLog:
        """Before copying from the leader: its group record must name it (its history
        entry written: the leader of an epoch whose start is unknown is not copied yet);
        this copy's chunks past what every leader since its label kept are cut
        (stream_divergence.py). The log returned is the one to copy into."""
        group = self.owner.groups.get((self.vhost, self.name)) or {}
        history = group.get("history", [])
        epoch = int(group.get("epoch", 0))
        start = leader_start(history, epoch)
        if group.get("leader") != self.leader or start is None:
            raise ConnectionError("the leader's group record does not name it yet")
        cut = truncation_point(lg.next_offset, self.label, history)
        if cut < lg.next_offset:
            log.warning("stream %r in vhost %r: copy holds chunks up to offset %d that "
                        "leaders since epoch %s may not have: cut back to offset %d",
                        self.name, self.vhost, lg.next_offset - 1, self.label, cut)
            streams = self.services.streams
            self._closing(lg)
            streams.forget(lg)
            lg.close()
            _readers_told(lg)
            empty = truncate_log_files(lg.directory, cut)
            lg = self.log = streams.open(self.vhost, self.name)
            lg.set_replicas(None)
            self._opened(lg)
            if empty and cut > lg.next_offset:
                lg.restart_at(cut)
        self._relabel = (epoch, start) if epoch != self.label else None
        return lg

    def _proxy(self):
        from .stream_reads import StreamProxyQueue
        vhost = self.services.vhosts.get(self.vhost)
        proxy = vhost.queues.get(self.name) if vhost is not None else None
        return proxy if isinstance(proxy, StreamProxyQueue) else None

    def _closing(self, lg: StreamLog, reopening: bool = True) -> None:
        """AMQP consumers of this node reading the copy (stream_reads.py) wait for it to
        open again, or are cancelled."""
        proxy = self._proxy()
        if proxy is not None:
            proxy.copy_closing(lg, reopening)

    def _opened(self, lg: StreamLog) -> None:
        proxy = self._proxy()
        if proxy is not None:
            proxy.copy_opened(lg)

    async def _heartbeats(self, stream) -> None:
        while True:
            await trio.sleep(HEARTBEAT_S)
            await stream.send_all(codec.encode_heartbeat())


def _readers_told(lg: StreamLog) -> None:
    """A copy closed (cut back, dropped, stopped): its Stream-protocol readers on this node
    see it (their listener finds the log closed) and get a MetadataUpdate, as
    rabbit_stream_reader tells them when their member goes down; the client subscribes
    again, to the copy as it is now."""
    for listener in list(lg.listeners):
        listener()


class _Locked:
    """A socket stream whose writers (appends' credits, reports, heartbeats) take turns."""

    def __init__(self, stream):
        self._stream = stream
        self._lock = trio.Lock()

    async def send_all(self, data: bytes) -> None:
        async with self._lock:
            await self._stream.send_all(data)

    async def receive_some(self, n: int) -> bytes:
        return await self._stream.receive_some(n)


def append_from_leader(lg: StreamLog, chunk) -> None:
    """A chunk the leader delivered, at this copy's tail; a first chunk past the tail (the
    leader's retention removed what this copy lacks: its reader starts at its first
    chunk) makes the copy start again from it, as osiris does."""
    try:
        lg.append_replica_chunk(chunk)
    except ReplicaGap as gap:
        if gap.first < gap.expected:
            raise
        log.warning("stream %s: copy's tail at %d is behind the leader's first chunk %d: "
                    "starting again from it", lg.directory, gap.expected, gap.first)
        lg.restart_at(gap.first)
        lg.append_replica_chunk(chunk)
