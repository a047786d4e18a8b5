"""The broker root: vhosts, users, timers, store and the live sessions."""
from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from . import audit, errors, hermes, management, policies, scheduler, security, transactions
from .churn import Churn
from .config import Config
from .consumer_timeout import ConsumerTimeouts
from .direct_reply import DirectReply
from .listeners import amqp10 as amqp10_listener
from .listeners import mqtt_configured, stomp_configured
from .listeners import stream as stream_listener
from .malloc import give_back
from .persistence import DURABLE, MemoryStore, Store
from .persistence.base import BLOCKS_ON_FAILURE
from .publishing import Publishing
from .recovery_progress import RecoveryProgress
from .services import Services
from .streams.log import StreamStore
from .timers import TimerQueue
from .vhost import VirtualHost

if TYPE_CHECKING:
    import trio

    from .audit.recorder import AuditTrail
    from .hermes import Hermes
    from .listeners.amqp_session import Session
    from .listeners.mqtt import MQTTListener
    from .listeners.session_base import ProtocolSession
    from .listeners.stomp import StompListener
    from .management.http import HttpServer
    from .management.stats import MessageTotals, Sampler
    from .queues.queue import Queue
    from .scheduler import Scheduler
    from .security import AccessControl
    from .transactions import Transactions

log = logging.getLogger("broker")

# Octets of partial message bodies received between two checks of the memory alarm at most
# (besides the monitor's, once a second): fast large bodies cannot outrun the alarm by more.
MEMORY_CHECK_STEP = 16 * 1024 * 1024


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def process_rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class Broker:
    """The composition root: ``__init__`` builds every service, hands the features
    (access control, scheduler, half messages, policies, management, Hermes, the audit
    trail) the typed ``Services`` they use
    (never the broker itself) and each feature's ``install`` the broker to wire its hooks
    and tasks into. A service is a typed attribute, never looked up with ``getattr``; the
    ones an ``install`` sets are declared here."""

    access: AccessControl  # security.install: users, vhosts, permissions, limits
    http_server: HttpServer  # management.install: the HTTP listener (API, /metrics, Hermes)
    amqp_listening: trio.Event  # management.install: set once AMQP listens
    on_amqp_listening: Callable[[int], None]  # management.install; called by Server.serve
    message_totals: MessageTotals  # management.install: counters outliving channels
    stats_sampler: Sampler  # management.install: message rates

    def __init__(self, config: Config | None = None, store: Store | None = None):
        self.config = config or Config()
        self.timers = TimerQueue()
        # what recovery is still reading back (API overview, /metrics, the log)
        self.recovery = RecoveryProgress()
        self.store = store or MemoryStore()
        backing = self.store if DURABLE in self.store.capabilities else None
        # amq.rabbitmq.reply-to consumers (a cluster names the node in their reply names)
        self.direct_reply = DirectReply()
        self.vhosts: dict[str, VirtualHost] = {"/": VirtualHost("/", self.timers, backing)}
        self.churn = Churn()  # opened/created/deleted counters (Prometheus)
        # the logs of stream queues, under the data dir whatever the store (their group
        # commit is a background task)
        self.streams = StreamStore(self.config.data_dir)
        for vhost in self.vhosts.values():
            vhost.streams = self.streams
            vhost.churn = self.churn
            vhost.direct_reply = self.direct_reply
            vhost.on_queue_deleted.append(self._queue_deleted)
        self.sessions: set[Any] = set()
        # the one publish path (publishing.py); its hooks, (origin, message, mandatory, seq)
        # -> bool, True = taken over (e.g. delayed), are appended by the features' install
        self.publishing = Publishing(self.config, self.direct_reply, self.refuses_persistent)
        self.publish_hooks = self.publishing.hooks
        for vhost in self.vhosts.values():
            vhost.publishing = self.publishing
        # unacknowledged deliveries held too long close their channel (consumer_timeout)
        self.consumer_timeouts = ConsumerTimeouts(self.timers, self.config.consumer_timeout,
                                                  self.config.consumer_timeout_interval)
        self.memory_limit = (self.config.memory_limit_bytes
                             or int(_total_memory() * self.config.memory_high_watermark))
        self.alarms: set[str] = set()
        self._unchecked_bodies = 0  # see bodies_grew
        # called whenever an alarm is set or cleared (the edges stop reading publishers, or
        # read them again)
        self.alarms_changed: list[Callable[[], None]] = []
        self.fenced = False  # the store's lease ran out: serve nobody (on_store_fenced)
        # Async callables run for the broker's lifetime in the server's nursery.
        self.background_tasks: list = [self.streams.run]
        # Async callables started before the store is read back (the HTTP API, which
        # reports recovery progress); they must not need the recovered state.
        self.early_tasks: list = []
        # Called after the store has recreated durable state, before listeners open.
        self.recovery_hooks: list = []
        # kind -> callable(key, value): the feature owning a kind of stored metadata
        # (Store.save_meta) takes its records back at recovery (restore_meta).
        self.meta_restorers: dict = {}
        self.unclaimed_meta: dict = {}  # (kind, key) -> value no feature registered for
        self._failing_stores: set = set()  # stores whose writes fail (on_store_failure)
        # starlette Route/Mount objects served on the HTTP port; features append at install
        self.http_routes: list = []
        # awaited by the server's shutdown before the store closes (Hermes' push
        # subscribers, the cluster's hand-over)
        self.drain_hooks: list[Callable[[], Awaitable[None]]] = []
        # definitions export/import sections of features (management/definitions.py)
        self.definition_sections: list = []
        self.audit: AuditTrail | None = None  # set below, once the features it follows exist
        # what the features are handed instead of the broker (services.py)
        self.services = Services(
            config=self.config, timers=self.timers, vhosts=self.vhosts, store=self.store,
            publishing=self.publishing, recovery=self.recovery, alarms=self.alarms,
            set_alarm=self.set_alarm, sessions=self.sessions, churn=self.churn,
            create_vhost=self.create_vhost, streams=self.streams)
        # broker.access: users, vhosts, permissions, limits
        self.services.access = security.install(self, self.services)
        # delayed/scheduled delivery and its control socket
        self.scheduler: Scheduler = scheduler.install(self, self.services)
        # half messages: prepare, commit/rollback, check-back
        self.transactions: Transactions = transactions.install(self, self.services)
        # policies and operator policies per vhost
        self.policies = policies.install(self, self.services)
        management.install(self, self.services)  # HTTP API, /metrics, console (its listener, if configured)
        # Hermes-style HTTP publishing and push subscriptions
        self.hermes: Hermes = hermes.install(self, self.services)
        # the audit trail (--audit-dir), or None; set on the services it follows
        self.audit = audit.install(self, self.services)
        self.services.audit = self.publishing.audit = self.audit
        # MQTT and STOMP listeners (--mqtt-port, --stomp-port), or None: their modules are
        # imported only when one of their ports is set (the start does not pay for them)
        self.mqtt: MQTTListener | None = None
        if mqtt_configured(self.config):
            from .listeners import mqtt as mqtt_listener
            self.mqtt = mqtt_listener.install(self)
        self.stomp: StompListener | None = None
        if stomp_configured(self.config):
            from .listeners import stomp as stomp_listener
            self.stomp = stomp_listener.install(self)
        self.stream = stream_listener.install(self)  # Stream protocol (--stream-port), or None
        # AMQP 1.0: on the AMQP port by protocol header, and --amqp10-port; or None
        self.amqp10 = amqp10_listener.install(self)

    def recover(self) -> None:
        """Recreate durable state from the store, then let features (scheduler) adopt it."""
        self.store.recover(self)
        for hook in self.recovery_hooks:
            hook()

    def restore_meta(self, kind: str, key: str, value: dict) -> None:
        """One stored metadata record at recovery, before exchanges and queues come
        back: handed to ``meta_restorers[kind]``; a kind nobody registered is kept in
        ``unclaimed_meta`` (it stays in the store)."""
        restorer = self.meta_restorers.get(kind)
        if restorer is None:
            self.unclaimed_meta[(kind, key)] = value
            return
        restorer(key, value)

    def create_vhost(self, name: str) -> VirtualHost:
        """The live vhost ``name``, created (empty, in ``vhosts``) if missing."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            backing = self.store if DURABLE in self.store.capabilities else None
            vhost = self.vhosts[name] = VirtualHost(name, self.timers, backing)
            vhost.churn = self.churn
            vhost.streams = self.streams
            vhost.direct_reply = self.direct_reply
            vhost.publishing = self.publishing
            vhost.on_queue_deleted.append(self._queue_deleted)
        return vhost

    @property
    def blocked(self) -> bool:
        return bool(self.alarms)

    @property
    def stops_publishers(self) -> bool:
        """An alarm holds (memory, disk, a store's backlog, a ``BLOCKS_ON_FAILURE`` store's
        failing writes): publishers are not read at all, as RabbitMQ; heartbeats are not
        counted meanwhile. Reading a failing store's publishers slowly to nack them let
        bytes in at every interval while nothing could be stored: a publisher waiting for
        a confirm is closed by ``on_store_failure`` instead, and the next one's first
        publish is nacked before it is blocked."""
        return bool(self.alarms)

    def session_opened(self, session: Session | ProtocolSession) -> None:
        self.sessions.add(session)
        self.churn.connections_opened += 1

    def notify_blocked(self, session: Session | ProtocolSession) -> None:
        """As RabbitMQ: a connection is told it is blocked once it publishes during an alarm."""
        if self.alarms and not session.blocked_sent:
            session.blocked_sent = True
            if session.conn.send_blocked(self._alarm_reason()):
                session.wake()

    def session_closed(self, session: Session | ProtocolSession) -> None:
        if session in self.sessions:
            self.sessions.discard(session)
            self.message_totals.retire_connection(session)

    # ---- store failures (persistence.base.Store contract) ----
    def on_store_failure(self, store: Store, reason: str) -> None:
        """``store`` could not write (``reason``: one line, e.g. "no space left on device").

        Called by the store before anything else. The publishes waiting for that write
        are in doubt (it may have reached the disk or database, or not), so neither a
        confirm nor a nack would be true: every connection waiting for confirms is
        closed with 541, as RabbitMQ closes channels whose queue died, and its
        publisher must treat what it did not get confirmed as in doubt. Other
        connections stay open (consumers keep draining); until ``on_store_recovered``
        a persistent publish to its queues is nacked before it is enqueued
        (``refuses_persistent``). A store declaring ``BLOCKS_ON_FAILURE`` (the journal:
        its disk is full or failing) also raises a resource alarm named after it, which
        blocks publishers. Never raises.
        """
        self._failing_stores.add(store)
        blocks = BLOCKS_ON_FAILURE in store.capabilities
        if blocks:
            self.set_alarm(store.name, True)
        for session in list(self.sessions):
            # only publishers waiting for confirms: consumers go on draining (and acking),
            # which is what frees the space
            if any(ch.awaiting_confirms for ch in session.channels.values()):
                try:
                    session.force_close(errors.internal_error("%s write failed: %s", store.name, reason))
                except Exception:  # pragma: no cover
                    log.exception("could not close a session after a store failure")

    def refuses_persistent(self, queues) -> bool:
        """A persistent publish to ``queues`` is nacked at once: one of them is kept by a
        store whose writes fail (it could neither be stored nor ever be delivered)."""
        failing = self._failing_stores
        return bool(failing) and any(q.store in failing for q in queues)

    def on_store_fenced(self, store: Store, fenced: bool, reason: str | None = None) -> None:
        """``store``'s lease on a shared database ran out (``fenced``) or was renewed.

        While fenced a standby may take the store over at any moment, so this broker
        serves nobody: every connection is closed with 320 CONNECTION_FORCED and new
        ones are refused (``Broker.fenced``) until the lease is renewed. Never raises.
        ``reason`` names another lease (the cluster's) in the close text.
        """
        self.fenced = fenced
        if not fenced:
            return
        for session in list(self.sessions):
            try:
                session.force_close(errors.connection_forced(
                    "%s: this broker does not serve until it renews it",
                    reason or "store lease expired"))
            except Exception:  # pragma: no cover
                log.exception("could not close a session of a fenced broker")

    def on_store_backlog(self, store: Store, full: bool) -> None:
        """``store`` holds more unwritten message bytes than its bound (``full``), or is
        back under it: a resource alarm, as RabbitMQ's memory alarm, blocks publishers
        (connection.blocked, their sockets no longer read) while it is full. Never raises.
        """
        self.set_alarm(f"memory ({store.name} backlog)", full)

    def on_store_recovered(self, store: Store) -> None:
        """``store`` writes again after ``on_store_failure``: clear its alarm."""
        if store not in self._failing_stores:
            return
        self._failing_stores.discard(store)
        if BLOCKS_ON_FAILURE in store.capabilities:
            self.set_alarm(store.name, False)

    def _queue_deleted(self, queue: Queue, consumers) -> None:
        for consumer in consumers:
            consumer.channel.consumer_cancelled_by_broker(consumer)

    # ---- resource alarms (memory, disk): block publishers as RabbitMQ does ----
    def _alarm_reason(self) -> str:
        return " & ".join(f"low on {a}" for a in sorted(self.alarms))

    def set_alarm(self, name: str, on: bool) -> None:
        before = bool(self.alarms)
        if on:
            if name in self.alarms:
                return
            self.alarms.add(name)
            log.warning("resource alarm set: %s; publishers are blocked", name)
        else:
            if name not in self.alarms:
                return
            self.alarms.discard(name)
            log.warning("resource alarm cleared: %s", name)
        after = bool(self.alarms)
        for session in list(self.sessions):
            if after and session.is_publisher:
                self.notify_blocked(session)
            elif before and not after and session.blocked_sent:
                session.conn.send_unblocked()
                session.blocked_sent = False
                session.wake()
        for changed in self.alarms_changed:
            changed()

    def bodies_grew(self, octets: int) -> None:
        """Partial message bodies (contents still being received) grew by ``octets``: past
        ``MEMORY_CHECK_STEP`` since the last time, the memory alarm is checked at once."""
        self._unchecked_bodies += octets
        if self._unchecked_bodies >= MEMORY_CHECK_STEP:
            self._unchecked_bodies = 0
            self.set_alarm("memory", process_rss() > self.memory_limit)

    def check_resources(self) -> None:
        freed = give_back(self.config.free_heap_kept)
        if freed:
            log.debug("gave %d MB of free heap back to the system", freed >> 20)
        self.set_alarm("memory", process_rss() > self.memory_limit)
        try:
            st = os.statvfs(self.config.data_dir)
            free = st.f_bavail * st.f_frsize
        except OSError:
            return
        self.set_alarm("disk", free < self.config.disk_free_limit)
