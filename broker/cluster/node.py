"""One node's membership in the cluster: its lease, its queue masterships, fencing.

What lives in etcd under the cluster's prefix (docs/cluster.md):

``secret``               salt and HMAC of the cluster secret (never the secret itself)
``members/NAME``         every node that ever joined (no lease): name, advertised address
``nodes/NAME``           the live node (attached to its lease, gone TTL after it stops renewing)
``homes/VHOST/QUEUE``    the node a durable queue lives on (no lease: kept while that node
                         is down, as RabbitMQ keeps a durable queue's home node)
``masters/VHOST/QUEUE``  the queue's master node, attached to that node's lease; its
                         ``create_revision`` is the queue's **epoch** (a new master, a new epoch)
``isr/VHOST/QUEUE``      the queue's mirrors and in-sync set, written only by the master
                         holding the epoch (``fenced_put``)
``defs/...``             cluster-wide definitions (``store.ClusterStore``)

Fencing: the node counts its lease on its own monotonic clock from *before* each renewal
was sent, so its view ends before etcd's. The moment that view runs out without a renewal
the node is **fenced** (``on_fenced`` callbacks with True): it stops confirming and
delivering at once, before etcd can hand its queues to anyone else. A renewal that
succeeds (the lease was still alive) unfences it; a lease that etcd expired meanwhile
means its masterships are gone: it joins again with a new lease and claims its queues
again under new epochs, and a queue another node took meanwhile stays unavailable here
(``conflicts``).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote

import trio

from .etcd import CoordinationError, CoordinationUnavailable, Coordinator
from .settings import ClusterSettings

log = logging.getLogger("broker.cluster")


class ClusterJoinError(RuntimeError):
    """This node may not join (wrong secret, name in use): one line for the operator."""


@dataclass(frozen=True)
class Mastership:
    node: str
    epoch: int  # create_revision of the masters/ key: grows with every new master


def queue_key(vhost: str, queue: str) -> str:
    return f"{quote(vhost, safe='')}/{quote(queue, safe='')}"


def split_queue_key(key: str) -> tuple[str, str]:
    vhost, _, queue = key.partition("/")
    return unquote(vhost), unquote(queue)


def _verifier(secret: bytes, salt: bytes) -> str:
    return hmac.new(secret, b"triomq-cluster\0" + salt, hashlib.sha256).hexdigest()


class ClusterNode:
    """This broker's membership. ``join()`` once (raises ClusterJoinError or
    CoordinationUnavailable with one line), then ``run()`` in the broker's nursery until
    cancelled, ``leave()`` at a clean stop (revokes the lease: its masterships end at once).
    """

    def __init__(self, coord: Coordinator, settings: ClusterSettings):
        self.coord = coord
        self.settings = settings
        self.name = settings.node_name
        self.prefix = settings.prefix
        self.ttl = settings.ttl
        self.lease = 0
        self.valid_until = 0.0  # trio clock: our lease is certainly alive before this
        self.fenced = True  # until joined
        self.instance = f"{socket.gethostname()} pid {os.getpid()} {secrets.token_hex(4)}"
        #: callables(fenced: bool, reason: str) when the node stops / resumes serving
        self.on_fenced: list[Callable[[bool, str], None]] = []
        #: (vhost, queue) -> Mastership this node holds
        self.masters: dict[tuple[str, str], Mastership] = {}
        #: (vhost, queue) -> node that holds a queue this node hosts too (split brain avoided:
        #: the queue stays unavailable here)
        self.conflicts: dict[tuple[str, str], str] = {}
        self._lost: list[tuple[str, str]] = []  # masterships to claim again after a lost lease

    # ---- keys ----
    def key(self, *parts: str) -> str:
        return self.prefix + "/".join(parts)

    def master_key(self, vhost: str, queue: str) -> str:
        return self.key("masters", queue_key(vhost, queue))

    def home_key(self, vhost: str, queue: str) -> str:
        return self.key("homes", queue_key(vhost, queue))

    def isr_key(self, vhost: str, queue: str) -> str:
        return self.key("isr", queue_key(vhost, queue))

    # ---- joining ----
    async def join(self, wait: float | None = None) -> None:
        """Check the secret, take a lease and register this node. A previous instance of
        the same name (killed, its lease not yet expired) is waited for at most ``wait``
        seconds (default: the TTL plus one); a live node of that name is refused."""
        await self._check_secret()
        await self._register(self.ttl + 1.0 if wait is None else wait)
        member = {"name": self.name, "advertise": self.settings.advertise}
        await self.coord.put(self.key("members", self.name), json.dumps(member).encode())
        log.info("joined cluster %s at %s as node %r (lease %x, TTL %.0f s)", self.prefix.strip("/"),
                 self.coord.describe(), self.name, self.lease, self.ttl)

    async def _check_secret(self) -> None:
        secret = self.settings.secret
        key = self.key("secret")
        if secret is not None:
            salt = secrets.token_bytes(16)
            record = {"salt": salt.hex(), "hmac": _verifier(secret, salt)}
            created, kv = await self.coord.create(key, json.dumps(record).encode())
            if created:
                return
        else:
            kv = await self.coord.get(key)
            if kv is None:
                return
            raise ClusterJoinError(f"cluster {self.prefix.strip('/')} requires a cluster secret "
                                   f"(--cluster-secret-file); node {self.name!r} has none")
        if kv is None:
            raise ClusterJoinError("the cluster secret record vanished while joining; retry")
        stored = kv.json()
        if not hmac.compare_digest(stored.get("hmac", ""),
                                   _verifier(secret, bytes.fromhex(stored.get("salt", "")))):
            raise ClusterJoinError(f"wrong cluster secret: node {self.name!r} refused by cluster "
                                   f"{self.prefix.strip('/')} (check --cluster-secret-file)")

    async def _register(self, wait: float, unfence: bool = True) -> None:
        t0 = trio.current_time()
        self.lease, granted = await self.coord.grant(self.ttl)
        record = json.dumps({"name": self.name, "advertise": self.settings.advertise,
                             "instance": self.instance, "since": time.time(),
                             "ttl": granted}).encode()
        while True:
            created, kv = await self.coord.create(self.key("nodes", self.name), record, self.lease)
            if created:
                self.valid_until = t0 + granted
                if unfence:
                    self._set_fenced(False, "joined")
                return
            holder = kv.json().get("instance", "?") if kv is not None else "?"
            if trio.current_time() - t0 > wait:
                await self.coord.revoke(self.lease)
                raise ClusterJoinError(f"node name {self.name!r} is in use by a running node "
                                       f"({holder}); pick another --node-name")
            await trio.sleep(0.25)

    # ---- running ----
    async def run(self) -> None:
        """Renew the lease every TTL/3 until cancelled; fence and rejoin as the module says.
        A thread of its own renews (``_Renewer``, through ``keepalive_blocking``) and this
        task only reads its answers: a busy event loop (a new leader syncing 50,000
        messages to a follower, in short steps) delayed each renewal's wake-up, request and
        answer until etcd expired a 2 s lease that nothing else was wrong with."""
        await self._run_renewer(self.coord.keepalive_blocking)

    async def _run_renewer(self, blocking: Callable[[int], float]) -> None:
        interval = self.ttl / 3
        renewer = _Renewer(self, blocking, interval, trio.lowlevel.current_trio_token())
        thread = threading.Thread(target=renewer.loop, name="triomq-lease", daemon=True)
        thread.start()
        warned = False
        try:
            while True:
                renewer.alive = time.perf_counter()
                renewer.event = trio.Event()
                answer, renewer.answer = renewer.answer, None
                if answer is not None and answer[0] == self.lease:
                    _lease, t0, remaining, error = answer
                    if error is not None:
                        if not warned:
                            log.warning("cannot renew the cluster lease: %s", error)
                            warned = True
                    elif remaining <= 0:
                        warned = False
                        self._set_fenced(True, "cluster lease expired in etcd")
                        try:
                            await self._rejoin()
                        except (CoordinationUnavailable, CoordinationError,
                                ClusterJoinError) as exc:
                            log.warning("rejoining the cluster failed: %s", exc)
                            await trio.sleep(min(0.5, interval))
                        continue
                    else:
                        warned = False
                        # the thread's clock is trio's without its offset
                        until = t0 + remaining + trio.current_time() - time.perf_counter()
                        self.valid_until = max(self.valid_until, until)
                        if self._lost:  # a rejoin that failed halfway: its claims first
                            try:
                                await self._reclaim()
                            except (CoordinationUnavailable, CoordinationError) as exc:
                                log.warning("claiming queues again failed: %s", exc)
                                await trio.sleep(min(0.5, interval))
                                continue
                        elif self.fenced:
                            self._set_fenced(False, "cluster lease renewed")
                now = trio.current_time()
                if now >= self.valid_until and not self.fenced:
                    self._set_fenced(True, "cluster lease not renewed in time (etcd unreachable)")
                # the next answer, or the end of our view of the lease, or a sign of life
                wake = now + interval if self.fenced else min(now + interval, self.valid_until)
                with trio.move_on_at(wake):
                    await renewer.event.wait()
        finally:
            renewer.stopped.set()

    async def _rejoin(self) -> None:
        """After the lease expired: a new lease, the node key, and every queue claimed
        again (new epochs); queues another node took meanwhile become conflicts."""
        # kept until every claim went through (a failure halfway retries the rest)
        self._lost = list(dict.fromkeys([*self._lost, *self.masters]))
        self.masters.clear()
        await self._register(self.ttl + 1.0, unfence=False)
        await self._reclaim()

    async def _reclaim(self) -> None:
        """Claim the queues of a lost lease again, then serve again: only once every queue
        is claimed (or known to be another node's)."""
        while self._lost:
            vhost, queue = self._lost[0]
            await self.claim_master(vhost, queue, rejoin=True)
            self._lost.pop(0)
        log.warning("rejoined the cluster with a new lease; %d queues claimed again, %d taken "
                    "by other nodes", len(self.masters), len(self.conflicts))
        self._set_fenced(False, "rejoined the cluster")

    def _set_fenced(self, fenced: bool, reason: str) -> None:
        if fenced == self.fenced:
            return
        self.fenced = fenced
        if fenced:
            log.error("node %r fenced: %s; it stops confirming and delivering until it is sure "
                      "it still holds its queues", self.name, reason)
        else:
            log.info("node %r serves (%s)", self.name, reason)
        for callback in list(self.on_fenced):
            try:
                callback(fenced, reason)
            except Exception:  # pragma: no cover
                log.exception("cluster fence callback failed")

    @property
    def serving(self) -> bool:
        """True while this node is certainly still a member (its lease is valid)."""
        return not self.fenced and trio.current_time() < self.valid_until

    async def leave(self) -> None:
        """Clean stop: revoke the lease (node key and masterships go at once)."""
        if self.lease:
            with trio.move_on_after(self.settings.etcd_timeout) as scope:
                scope.shield = True
                try:
                    await self.coord.revoke(self.lease)
                except (CoordinationUnavailable, CoordinationError) as exc:
                    log.warning("could not revoke the cluster lease: %s", exc)
            self.lease = 0
            self.masters.clear()

    # ---- queue masters ----
    async def claim_master(self, vhost: str, queue: str, rejoin: bool = False) -> Mastership:
        """Make this node the queue's master if nobody is; returns who is. A queue held by
        another node is recorded in ``conflicts``. Raises CoordinationUnavailable."""
        value = json.dumps({"node": self.name, "advertise": self.settings.advertise}).encode()
        created, kv = await self.coord.create(self.master_key(vhost, queue), value, self.lease)
        if kv is None:  # vanished in between: try once more
            created, kv = await self.coord.create(self.master_key(vhost, queue), value, self.lease)
        if kv is None:
            raise CoordinationUnavailable(f"could not claim queue {queue!r}: its record keeps changing")
        holder = kv.json().get("node", "?")
        m = Mastership(holder, kv.create_revision)
        if holder == self.name and (created or kv.lease == self.lease):
            self.masters[(vhost, queue)] = m
            self.conflicts.pop((vhost, queue), None)
            await self.coord.put(self.home_key(vhost, queue), json.dumps({"node": self.name}).encode())
        elif rejoin:  # a mirror was promoted meanwhile: the store drops the stale copy here
            self.conflicts[(vhost, queue)] = holder
            log.warning("queue %r in vhost %r was taken over by node %r while this node was "
                        "away", queue, vhost, holder)
        else:
            self.conflicts[(vhost, queue)] = holder
            log.error("queue %r in vhost %r is mastered by node %r as well as declared here (declared "
                      "on both at once, or taken while this node was away): two copies exist; "
                      "delete one", queue, vhost, holder)
        return m

    async def claim_if_free(self, vhost: str, queue: str) -> Mastership | None:
        """Become the queue's master only if nobody is (a mirror's promotion): the
        mastership, or None when another node has it (no conflict: it is the master)."""
        value = json.dumps({"node": self.name, "advertise": self.settings.advertise}).encode()
        created, kv = await self.coord.create(self.master_key(vhost, queue), value, self.lease)
        if not created or kv is None:
            return None
        m = Mastership(self.name, kv.create_revision)
        self.masters[(vhost, queue)] = m
        self.conflicts.pop((vhost, queue), None)
        await self.coord.put(self.home_key(vhost, queue), json.dumps({"node": self.name}).encode())
        return m

    async def release_master(self, vhost: str, queue: str) -> None:
        """The queue was deleted here: drop its records if this node still masters it."""
        m = self.masters.pop((vhost, queue), None)
        self.conflicts.pop((vhost, queue), None)
        if m is None:
            return
        kv = await self.coord.get(self.master_key(vhost, queue))
        if kv is not None and kv.create_revision == m.epoch:
            await self.coord.delete_if(self.master_key(vhost, queue), kv.mod_revision)
            await self.coord.delete(self.isr_key(vhost, queue))
            home = await self.coord.get(self.home_key(vhost, queue))
            if home is not None and home.json().get("node") == self.name:
                await self.coord.delete_if(home.key, home.mod_revision)

    def mastership(self, vhost: str, queue: str) -> Mastership | None:
        """This node's mastership of the queue, None if it has none or is fenced."""
        if not self.serving:
            return None
        return self.masters.get((vhost, queue))

    async def set_in_sync(self, vhost: str, queue: str, mirrors: list[str],
                          in_sync: list[str], progress: dict | None = None,
                          sync: dict | None = None, shutdown: bool = False,
                          members: list[str] | None = None) -> bool:
        """Record the queue's mirrors and in-sync set, fenced by this node's epoch: False
        (nothing written) when this node is no longer the master of that epoch.
        ``progress``: each other mirror's state; ``sync``: messages synced / total per
        syncing mirror; ``shutdown``: the master is stopping cleanly; ``members``: a
        quorum queue's member group (the master among them)."""
        m = self.masters.get((vhost, queue))
        if m is None:
            return False
        record = {"master": self.name, "epoch": m.epoch, "mirrors": mirrors,
                  "in_sync": in_sync, "progress": progress or {}, "sync": sync or {}}
        if shutdown:
            record["shutdown"] = True
        if members is not None:
            record["members"] = members
        return await self.coord.fenced_put(self.isr_key(vhost, queue), json.dumps(record).encode(),
                                           self.master_key(vhost, queue), m.epoch)


class _Renewer:
    """The lease renewed from a thread, every TTL/3 (sooner after a failure), each answer
    handed to the node's task with the time its request was sent (``answer``: lease, sent
    at on ``time.perf_counter``, remaining TTL or None, error). It stops renewing when
    the event loop showed no sign of life for ``STALL`` seconds (``alive``): a wedged
    node must lose its lease so that its queues move."""

    STALL = 10.0

    def __init__(self, node: ClusterNode, blocking: Callable[[int], float], interval: float,
                 token: trio.lowlevel.TrioToken):
        self.node = node
        self.blocking = blocking
        self.interval = interval
        self.token = token
        self.alive = time.perf_counter()
        self.answer: tuple[int, float, float, Exception | None] | None = None
        self.event = trio.Event()
        self.stopped = threading.Event()

    def _wake(self) -> None:
        self.event.set()

    def loop(self) -> None:
        while not self.stopped.is_set():
            if time.perf_counter() - self.alive > max(self.STALL, 3 * self.node.ttl):
                self.stopped.wait(self.interval)
                continue
            lease = self.node.lease
            sent = time.perf_counter()
            error: Exception | None = None
            remaining = 0.0
            try:
                remaining = self.blocking(lease)
            except (CoordinationUnavailable, CoordinationError) as exc:
                error = exc
            except Exception as exc:  # a bug must not end the renewals silently
                error = CoordinationError(f"{type(exc).__name__}: {exc}")
            self.answer = (lease, sent, remaining, error)
            try:
                self.token.run_sync_soon(self._wake)
            except trio.RunFinishedError:
                return
            self.stopped.wait(self.interval if error is None else min(0.25, self.interval))


async def cluster_view(coord: Coordinator, prefix: str) -> dict:
    """Nodes, their health and each queue's master and mirrors, as ``cluster status``
    shows them. Raises CoordinationUnavailable."""
    kvs, revision = await coord.get_prefix(prefix)
    members: dict[str, dict] = {}
    live: dict[str, dict] = {}
    masters: dict[tuple[str, str], dict] = {}
    homes: dict[tuple[str, str], str] = {}
    isr: dict[tuple[str, str], dict] = {}
    definitions = 0
    for kv in kvs:
        rest = kv.key[len(prefix):]
        section, _, name = rest.partition("/")
        if section == "members":
            members[name] = kv.json()
        elif section == "nodes":
            live[name] = dict(kv.json(), lease=kv.lease)
        elif section == "masters":
            masters[split_queue_key(name)] = dict(kv.json(), epoch=kv.create_revision)
        elif section == "homes":
            homes[split_queue_key(name)] = kv.json().get("node", "?")
        elif section == "isr":
            isr[split_queue_key(name)] = kv.json()
        elif section == "defs":
            definitions += 1
    nodes = []
    for name in sorted(set(members) | set(live)):
        info = live.get(name) or members.get(name) or {}
        nodes.append({"name": name, "advertise": info.get("advertise", "?"),
                      "health": "up" if name in live else "down",
                      "instance": live.get(name, {}).get("instance")})
    queues = []
    for vhost, queue in sorted(set(masters) | set(homes)):
        # a queue whose home node is down has no master: unavailable until it comes back
        m = masters.get((vhost, queue)) or {"node": None, "epoch": None}
        r = isr.get((vhost, queue), {})
        current = m["epoch"] is not None and r.get("epoch") == m["epoch"]
        queues.append({"vhost": vhost, "name": queue, "master": m["node"], "epoch": m["epoch"],
                       "home": homes.get((vhost, queue)),
                       "mirrors": r.get("mirrors", []) if current else [],
                       "in_sync": r.get("in_sync", []) if current else [],
                       # a quorum queue's member group (kept across leaders)
                       "members": r.get("members", []),
                       "progress": r.get("progress", {}) if current else {},
                       "sync": r.get("sync", {}) if current else {},
                       "stopped_cleanly": bool(r.get("shutdown")) if current else False})
    return {"revision": revision, "nodes": nodes, "queues": queues, "definitions": definitions}
