"""The cluster's definitions in etcd (``defs/``) and what this node tracks of the others:
this node's definition changes written in coalesced transactions, other nodes' changes
applied live through the owning features' APIs (their echo suppressed), and the queue
masters, homes, members and live nodes read from etcd. Not the store interface, links or
messages (``store.ClusterStore``)."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import trio

from ..persistence.records import decode_arguments, encode_arguments
from .defsync import DefinitionSync
from .etcd import MAX_TXN_OPS, CoordinationError, CoordinationUnavailable, Coordinator, WatchEvent
from .forward import ProxyQueue
from .link import Link

if TYPE_CHECKING:
    from ..exchanges.base import Binding, Exchange
    from ..queues.queue import Queue
    from ..vhost import VirtualHost
    from .mirror import Mirrors
    from .node import ClusterNode
    from .transient import TransientQueues

log = logging.getLogger("broker.cluster.defs")

# meta kinds applied live through the owning feature's API (others: broker.restore_meta)
_ACCESS_KINDS = ("user", "vhost", "permission", "topic_permission")
_POLICY_KINDS = ("policy", "operator_policy")
# metadata that belongs to one node and stays out of etcd: MQTT retained messages (node-local
# in RabbitMQ too, and message bodies have no place in etcd) and Hermes subscriptions (push
# consumers of a durable queue, which lives on its home node; Hermes topics are exchanges)
LOCAL_KINDS = frozenset({"mqtt_retained", "hermes_topic", "hermes_subscription"})


def _q(text: str) -> str:
    return quote(text, safe="")


def _args_out(arguments: dict) -> str:
    return base64.b64encode(encode_arguments(arguments)).decode("ascii")


def _args_in(text: str) -> dict:
    return decode_arguments(base64.b64decode(text)) if text else {}



class ClusterDefinitions:
    """The definitions' side of ``store.ClusterStore`` (see the module docstring)."""

    mirrors: Mirrors
    transients: TransientQueues

    def __init__(self, coord: Coordinator, node: ClusterNode):
        self.coord = coord
        self.node = node
        self.broker: Any = None
        self._pending: dict[str, bytes | None] = {}  # etcd key -> value (None: delete)
        self._claims: dict[tuple[str, str], bool] = {}  # (vhost, queue) -> claim / release
        self._wake = trio.Event()
        self._snapshot: list = []  # defs/ key-values read at open()
        self._revision = 0
        self._known: dict[str, dict] = {}  # defs/ key -> last value seen (for deletes)
        self._applying = False  # applying another node's change: no echo to etcd
        self._homes: dict[tuple[str, str], str] = {}  # durable queue -> its home node
        self._live: set[str] = set()  # nodes up (their lease-bound node key exists)
        self._members: set[str] = {node.name}  # every node that joined (members/)
        self.applied = 0  # other nodes' changes applied live (tests, status)
        self._addresses: dict[str, str] = {}  # live node -> advertised AMQP address
        self._links: dict[tuple[str, str], Link] = {}  # (node, vhost) -> link
        self._masters: dict[tuple[str, str], str] = {}  # queue -> its master node (etcd)
        # answers wait until every live node applied the definition (defsync.py)
        self.defsync = DefinitionSync(node.name, lambda: self._live,
                                      2 * node.settings.ttl + node.settings.etcd_timeout)

    def _add_proxy(self, vhost: VirtualHost, name: str, master: str, auto_delete: bool,
                   arguments: dict) -> ProxyQueue:
        """This node's proxy of a queue mastered on ``master`` (the store's: it links)."""
        raise NotImplementedError

    # ---- keys ----
    def _defs(self, *parts: str) -> str:
        """The etcd key of a definition; ``_defs("")`` is the prefix of them all."""
        return self.node.key("defs", *parts)

    def _queue_write(self, key: str, value: dict | None) -> None:
        if self._applying:
            return
        self.defsync.wrote()
        if value is None:
            self._known.pop(key, None)
            self._pending[key] = None
        else:
            self._known[key] = value
            self._pending[key] = json.dumps({"node": self.node.name, "d": value},
                                            separators=(",", ":")).encode()
        self._wake.set()

    def _meta_values(self, kind: str) -> list[dict]:
        head = self._defs("meta", _q(kind), "")
        return [v for k, v in self._known.items() if k.startswith(head)]

    def _drop_local_only(self) -> None:
        """etcd is the truth once the cluster has state: what this node still has from its
        own store but etcd no longer lists was deleted while it was away (users,
        permissions, policies, durable exchanges; a vhost is only reported, never dropped
        with its queues here)."""
        broker = self.broker
        access = broker.access
        policies = broker.policies
        dropped: list[str] = []
        self._applying = True
        try:
            if access is not None:
                users = {v.get("name") for v in self._meta_values("user")}
                for name in [u for u in access.users if u not in users]:
                    access.delete_user(name)
                    dropped.append(f"user {name}")
                perms = {(v["user"], v["vhost"]) for v in self._meta_values("permission")}
                for user, vhost in [k for k in access.perms if k not in perms]:
                    access.clear_permissions(user, vhost)
                    dropped.append(f"permission {user}@{vhost}")
                topics = {(v["user"], v["vhost"], v["exchange"])
                          for v in self._meta_values("topic_permission")}
                for (user, vhost), table in list(access.topic_perms.items()):
                    for exchange in [x for x in table if (user, vhost, x) not in topics]:
                        access.clear_topic_permissions(user, vhost, exchange)
                        dropped.append(f"topic permission {user}@{vhost}/{exchange}")
                vhosts = set(self._meta_values_keys("vhost"))
                for name in [n for n in broker.vhosts if n not in vhosts]:
                    log.warning("vhost %r is not in the cluster's definitions (deleted while this "
                                "node was away?): kept, delete it again if it should go", name)
            if policies is not None:
                for kind, listing, clear in (
                        ("policy", policies.list_policies, policies.clear_policy),
                        ("operator_policy", policies.list_operator_policies,
                         policies.clear_operator_policy)):
                    known = {(v["vhost"], v["name"]) for v in self._meta_values(kind)}
                    for p in listing():
                        if (p["vhost"], p["name"]) not in known:
                            clear(p["vhost"], p["name"])
                            dropped.append(f"{kind} {p['name']}")
            head = self._defs("exchange", "")
            exchanges = {(v["vhost"], v["name"]) for k, v in self._known.items()
                         if k.startswith(head)}
            for vhost in list(broker.vhosts.values()):
                for x in list(vhost.exchanges.values()):
                    if x.durable and x.name and not x.name.startswith("amq.") \
                            and (vhost.name, x.name) not in exchanges:
                        vhost.delete_exchange(x.name)
                        dropped.append(f"exchange {x.name}")
        finally:
            self._applying = False
        if dropped:
            log.info("dropped what the cluster deleted while this node was away: %s",
                     ", ".join(dropped))

    def _meta_values_keys(self, kind: str) -> list[str]:
        head = self._defs("meta", _q(kind), "")
        return [unquote(k[len(head):]) for k in self._known if k.startswith(head)]

    def _publish_local_meta(self) -> None:
        """The first node of a new cluster: its users, vhosts, permissions and policies
        become the cluster's (written to etcd; the local store has them already)."""
        broker = self.broker
        access = broker.access
        policies = broker.policies
        if access is not None:
            for user in access.users.values():
                self._queue_write(self._defs("meta", "user", _q(user.name)), user.stored())
            for name, info in access.vhost_info.items():
                self._queue_write(self._defs("meta", "vhost", _q(name)), dict(info))
            for (user, vhost), perm in access.perms.items():
                self._queue_write(self._defs("meta", "permission",
                                             _q(json.dumps([user, vhost], ensure_ascii=False))),
                                  perm.record(user, vhost))
            for (user, vhost), table in access.topic_perms.items():
                for exchange, tp in table.items():
                    key = json.dumps([user, vhost, exchange], ensure_ascii=False)
                    self._queue_write(self._defs("meta", "topic_permission", _q(key)),
                                      tp.record(user, vhost))
            self._queue_write(self._defs("meta", "access", "initialized"), {})
        if policies is not None:
            for kind, listing in (("policy", policies.list_policies),
                                  ("operator_policy", policies.list_operator_policies)):
                for p in listing():
                    key = json.dumps([p["vhost"], p["name"]], ensure_ascii=False)
                    self._queue_write(self._defs("meta", kind, _q(key)), p)

    def _queue_key(self, vhost: VirtualHost, name: str) -> str:
        return self._defs("queue", _q(vhost.name), _q(name))

    def _queue_def(self, vhost: VirtualHost, q: Queue) -> dict:
        return {"vhost": vhost.name, "name": q.name, "master": self.node.name,
                "auto_delete": q.auto_delete, "arguments": _args_out(q.arguments)}

    # ---- writing to etcd ----
    async def _writer(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self._flush()
            except (CoordinationUnavailable, CoordinationError) as exc:
                log.warning("cluster definitions not written yet (%s); retrying", exc)
                await trio.sleep(0.5)
                self._wake.set()

    async def _flush(self) -> None:
        revision = 0
        while self._pending:
            batch = list(self._pending.items())[:MAX_TXN_OPS]
            puts = [(k, v) for k, v in batch if v is not None]
            deletes = [k for k, v in batch if v is None]
            revision = await self.coord.write_batch(puts, deletes)
            for k, v in batch:
                if self._pending.get(k) is v:
                    del self._pending[k]
        if revision:
            self.defsync.flushed(self.defsync.gen, revision)
        while self._claims:
            (vhost, queue), claim = next(iter(self._claims.items()))
            if claim:
                await self.node.claim_master(vhost, queue)
            else:
                await self.node.release_master(vhost, queue)
            if self._claims.get((vhost, queue)) is claim:
                del self._claims[(vhost, queue)]

    # ---- applying other nodes' changes ----
    def _track(self, key: str, value: bytes | None) -> None:
        """Keep the queue homes and live nodes this node needs to refuse a queue that
        lives elsewhere (``check_placement``); None: the key was deleted."""
        from .node import split_queue_key
        rest = key[len(self.node.prefix):]
        section, _, name = rest.partition("/")
        if section == "syncreq":
            if value is not None:
                try:
                    action = json.loads(value).get("action", "")
                except ValueError:
                    action = ""
                self.mirrors.sync_request(*split_queue_key(name), action)
        elif section == "masters":
            vq = split_queue_key(name)
            if value is None:
                self._masters.pop(vq, None)
                self.mirrors.wake()  # a mirror may be promoted
            else:
                try:
                    self._masters[vq] = json.loads(value).get("node", "?")
                except ValueError:
                    pass
        elif section == "homes":
            vq = split_queue_key(name)
            if value is None:
                self._homes.pop(vq, None)
            else:
                try:
                    self._homes[vq] = json.loads(value).get("node", "?")
                except ValueError:
                    pass
        elif section == "applied":
            if value is not None and name != self.node.name:
                try:
                    self.defsync.peer_applied(name, int(json.loads(value).get("revision", 0)))
                except (ValueError, AttributeError, TypeError):
                    pass
        elif section == "members":
            if value is None:
                self._members.discard(name)
            else:
                self._members.add(name)
        elif section == "nodes":
            self.mirrors.wake()  # mirrors to add or drop
            if value is None:
                self._live.discard(name)
                self._addresses.pop(name, None)
                self.defsync.check()  # not waited for any more
            else:
                self._live.add(name)
                try:
                    address = json.loads(value).get("advertise", "")
                except ValueError:
                    address = ""
                self._addresses[name] = address
                for (node, _vhost), link in self._links.items():
                    if node == name:
                        link.address = address

    async def _watcher(self) -> None:
        while True:
            try:
                await self.coord.watch(self.node.prefix, self._revision + 1, self._on_events)
            except CoordinationUnavailable:
                await trio.sleep(0.5)
            except CoordinationError as exc:  # compacted: read everything again
                log.warning("cluster definitions watch restarts: %s", exc)
                await trio.sleep(0.5)
                try:
                    kvs, self._revision = await self.coord.get_prefix(self.node.prefix)
                except (CoordinationUnavailable, CoordinationError):
                    continue
                self._homes.clear()
                self._live.clear()
                for kv in kvs:
                    await self._on_events([WatchEvent("put", kv)], self._revision)

    async def _on_events(self, events: list[WatchEvent], revision: int) -> None:
        defs = self._defs("")
        theirs = False  # other nodes' definitions: this node says it applied them
        for event in events:
            key = event.kv.key
            if not key.startswith(defs):
                self._track(key, None if event.kind == "delete" else event.kv.value)
                continue
            if event.kind == "delete":
                value = self._known.pop(key, None)  # (this node's own: popped already)
                theirs = theirs or value is not None
                if value is not None and key not in self._pending:
                    self._apply(self._apply_delete, key, value)
                continue
            try:
                payload = json.loads(event.kv.value)
            except ValueError:
                continue
            if payload.get("node") == self.node.name:
                continue  # our own write coming back
            theirs = True
            self._known[key] = payload.get("d", {})
            self._apply(self._apply_put, key, payload.get("d", {}))
        self._revision = max(self._revision, revision)
        if theirs:
            self._pending[self.node.key("applied", self.node.name)] = json.dumps(
                {"revision": self._revision}).encode()
            self._wake.set()

    def _apply(self, fn, key: str, value: dict) -> None:
        self._applying = True
        try:
            fn(key, value)
            self.applied += 1
        except Exception as exc:
            log.warning("could not apply cluster definition %s: %s", key, exc)
        finally:
            self._applying = False

    def _section(self, key: str) -> str:
        return key[len(self._defs("")):].split("/", 1)[0]

    def _apply_put(self, key: str, value: dict, recovering: bool = False) -> None:
        broker = self.broker
        section = self._section(key)
        if section == "meta":
            kind, mkey = (unquote(p) for p in key[len(self._defs("meta", "")):].split("/", 1))
            if recovering or not self._apply_meta_live(kind, mkey, value):
                broker.restore_meta(kind, mkey, value)
        elif section == "exchange":
            vhost = broker.vhosts.get(value["vhost"])
            if vhost is None or value["name"] in vhost.exchanges:
                return
            vhost.declare_exchange(
                value["name"], value["type"], durable=True,
                auto_delete=value.get("auto_delete", False), internal=value.get("internal", False),
                arguments=_args_in(value.get("arguments", "")), persist=False)
        elif section == "queue":
            vhost = broker.vhosts.get(value["vhost"])
            master = str(value.get("master", ""))
            # --store memory: no durable queues here, so no proxies of other nodes' either
            if vhost is None or vhost.store is None or master == self.node.name:
                return
            existing = vhost.queues.get(value["name"])
            if isinstance(existing, ProxyQueue):
                existing.retarget(master)
            elif existing is None:
                self._add_proxy(vhost, value["name"], master, value.get("auto_delete", False),
                                _args_in(value.get("arguments", "")))
        elif section == "tqueue":  # another node's transient queue (transient.py)
            self.transients.put(value)
        elif section == "binding":
            vhost = broker.vhosts.get(value["vhost"])
            if vhost is None or value["source"] not in vhost.exchanges:
                return
            dest = (vhost.queues if value["destination_kind"] == "queue"
                    else vhost.exchanges).get(value["destination"])
            if dest is not None:
                vhost.bind(value["source"], dest, value["routing_key"],
                           _args_in(value.get("arguments", "")), persist=False)

    def _apply_meta_live(self, kind: str, key: str, v: dict) -> bool:
        """Apply another node's metadata change through its owner's API; False if the
        kind has none (then ``restore_meta`` takes it)."""
        access = self.broker.access
        policies = self.broker.policies
        if kind == "access":
            # another node's marker that its defaults exist (nodes booting together on a
            # fresh cluster each write one): restored, it would wipe this running node's
            # users and permissions, which it has already
            return True
        if kind in _ACCESS_KINDS and access is not None:
            if kind == "user":
                access.put_user(v["name"], password_hash=v.get("password_hash") or None,
                                hashing_algorithm=v.get("hashing_algorithm"),
                                tags=v.get("tags", []), limits=v.get("limits", {}))
            elif kind == "vhost":
                access.add_vhost(key, v.get("description", ""), v.get("tags"),
                                 v.get("default_queue_type"))
            elif kind == "permission":
                access.set_permissions(v["user"], v["vhost"], v["configure"], v["write"], v["read"])
            else:
                access.set_topic_permissions(v["user"], v["vhost"], v["exchange"], v["write"],
                                             v["read"])
            return True
        if kind in _POLICY_KINDS and policies is not None:
            body = {k: v.get(k) for k in ("pattern", "definition", "priority", "apply-to")}
            if kind == "policy":
                policies.put_policy(v["vhost"], v["name"], body)
            else:
                policies.put_operator_policy(v["vhost"], v["name"], body)
            return True
        return False

    def _apply_delete(self, key: str, value: dict) -> None:
        broker = self.broker
        section = self._section(key)
        if section == "meta":
            kind, mkey = (unquote(p) for p in key[len(self._defs("meta", "")):].split("/", 1))
            access = broker.access
            policies = broker.policies
            if kind == "user" and access is not None and mkey in access.users:
                access.delete_user(mkey)
            elif kind == "vhost" and access is not None and mkey in broker.vhosts:
                access.delete_vhost(mkey)
            elif kind == "permission" and access is not None:
                access.clear_permissions(value["user"], value["vhost"])
            elif kind == "topic_permission" and access is not None:
                access.clear_topic_permissions(value["user"], value["vhost"], value["exchange"])
            elif kind == "policy" and policies is not None:
                policies.clear_policy(value["vhost"], value["name"])
            elif kind == "operator_policy" and policies is not None:
                policies.clear_operator_policy(value["vhost"], value["name"])
        elif section == "exchange":
            vhost = broker.vhosts.get(value["vhost"])
            if vhost is not None and value["name"] in vhost.exchanges:
                vhost.delete_exchange(value["name"])
        elif section == "queue":
            vhost = broker.vhosts.get(value["vhost"])
            q = vhost.queues.get(value["name"]) if vhost is not None else None
            self.mirrors.drop_copy(value["vhost"], value["name"])
            if isinstance(q, ProxyQueue):
                q.forwarding = False  # deleted on its master: nothing to send back
                vhost.delete_queue(q, reason="deleted on its master")
        elif section == "tqueue":
            self.transients.delete(value)
        elif section == "binding":
            vhost = broker.vhosts.get(value["vhost"])
            if vhost is None:
                return
            dest = (vhost.queues if value["destination_kind"] == "queue"
                    else vhost.exchanges).get(value["destination"])
            # an exclusive queue's binding goes with its owner's unbind (made on its node)
            owner = dest.exclusive_owner if value["destination_kind"] == "queue" \
                and dest is not None else None
            vhost.unbind(value["source"], dest, value["routing_key"],
                         _args_in(value.get("arguments", "")), owner=owner)

    # ---- definitions (the vhost) ----
    def _exchange_key(self, vhost: VirtualHost, x: Exchange) -> str:
        return self._defs("exchange", _q(vhost.name), _q(x.name))

    def _binding_key(self, vhost: VirtualHost, b: Binding) -> str:
        ident = json.dumps([b.source, b.destination.kind, b.destination.name, b.routing_key,
                            _args_out(b.arguments)])
        return self._defs("binding", _q(vhost.name), hashlib.sha1(ident.encode()).hexdigest())
