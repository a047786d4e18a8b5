"""The one interface every storage backend implements, and the registry of backends.

The core calls a store synchronously from the event loop; a backend buffers and
does its I/O in its own task (``run``), started in the broker's nursery. A
store learns about messages only by observing queues (``queue_op``, the
operation stream of ``queues/ops.py``); definitions come from the vhost
(``save_*`` / ``delete_*``); metadata of features (users, vhosts, permissions,
policies, ...) comes through ``save_meta`` / ``delete_meta``. A confirm for a persistent message waits on
``when_durable``: the callback runs once everything enqueued before it is on
disk (group commit).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from ..config import JournalSettings, SQLSettings
from ..queues.ops import PAGES_MESSAGES as PAGES_MESSAGES  # re-exported
from ..queues.ops import Op
from .records import unstorable

if TYPE_CHECKING:
    from ..exchanges.base import Binding, Exchange
    from ..queues.entry import QueueEntry
    from ..queues.queue import Queue
    from ..recovery_progress import RecoveryProgress
    from ..vhost import VirtualHost

# ---- optional capabilities a store declares in ``Store.capabilities`` ----
#: State survives a restart (every store but ``memory``). The vhost only hands
#: durable definitions and queues to a store declaring it.
DURABLE = "durable"
#: ``PAGES_MESSAGES`` (defined in ``queues/ops.py``, where the queue asks it):
#: ``paged_ready(queue, entries) -> ReadyStore``, durable FIFO queues keep only an
#: index of their messages in memory beyond a budget (``paged.PagedFifo``).
#: ``read_message(loc) -> Message``: a stored message can be read back by the
#: location the store put in ``entry.loc``.
READS_BACK = "reads_back"
#: A failed write is a resource alarm (the journal's disk): the broker blocks
#: publishers until writes succeed (``Broker.on_store_failure``). Without it (SQL:
#: the database is down) connections stay open and new publishes are nacked.
BLOCKS_ON_FAILURE = "blocks_on_failure"

_ENQUEUE, _DELIVER, _REQUEUE = Op.ENQUEUE, Op.DELIVER, Op.REQUEUE


class FlushStats:
    """Cheap counters of a store's group commits, read by /metrics: durations of each
    write+sync (a fixed-bucket histogram), how many confirms each one released, failures."""

    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self) -> None:
        self.counts = [0] * (len(self.BUCKETS) + 1)
        self.seconds = 0.0
        self.commits = 0
        self.committed = 0  # confirms released by commits (group-commit size = committed/commits)
        self.errors = 0

    def observe(self, seconds: float, batch: int) -> None:
        i = 0
        for i, bound in enumerate(self.BUCKETS):  # noqa: B007 - i is the bucket found
            if seconds <= bound:
                break
        else:
            i = len(self.BUCKETS)
        self.counts[i] += 1
        self.seconds += seconds
        self.commits += 1
        self.committed += batch


class Store:
    """Base class and contract of a storage backend.

    Threading: every method but the async life-cycle ones runs on the event
    loop's thread and returns without blocking (buffer only).

    Failure: when a write fails (disk full, database gone) the store
    (1) calls ``broker.on_store_failure(self, reason)`` once per failed write,
    before anything else: the publishes waiting for that write are in doubt (part
    of it may be stored), so they are neither confirmed nor nacked and the broker
    closes the connections waiting for their confirms (541) -- no other
    connection: consumers keep draining; (2) never confirms what it did not
    write; (3) keeps the unwritten data and retries, and (4) calls
    ``broker.on_store_recovered(self)`` once writes succeed again.

    A nacked publish is never delivered, by any store, now or after a restart.
    Between (1) and (4) the broker nacks a persistent publish to the store's
    queues before it is enqueued (``Broker.refuses_persistent``), so no consumer
    can get it first; and a ``when_durable`` with an ``on_failure`` (other
    publishers: transactions, MQTT, HTTP) gets it only after the store took the
    entries enqueued since the previous ``when_durable`` back from their queues
    (``Queue.withdraw``) and will never write them. A ``BLOCKS_ON_FAILURE`` store
    also blocks publishers. A store that buffers writes bounds what it holds: it
    calls ``broker.on_store_backlog(self, True)`` when the bound is passed (the
    broker blocks publishers) and ``(self, False)`` once it is back under it. A
    store never touches sessions or channels: what happens to connections is the
    broker's decision. tests/persistence/test_full_disk.py (journal, SQLite: a real
    full disk) and test_store_failure_contract.py (PostgreSQL, MariaDB: an outage)
    check this contract with a consumer draining throughout.
    """

    name: str = "abstract"
    #: Optional capabilities (``DURABLE``, ``PAGES_MESSAGES``, ``READS_BACK``).
    capabilities: ClassVar[frozenset[str]] = frozenset()
    #: Longest queue or exchange name (UTF-8 bytes) it stores; None = any. A durable
    #: declare past it is refused before ok (``records.unstorable``).
    name_max: ClassVar[int | None] = None
    #: The broker's recovery progress, set before ``open``: long reads advance its phases.
    progress: RecoveryProgress | None = None
    #: /metrics: group-commit latency, size and errors, for a store that measures them.
    flush_stats: FlushStats | None = None
    #: A standby: ``open`` waits until this broker holds the store's lease. The server
    #: opens it before listening, as a slave of ActiveMQ's master/slave does: a client
    #: with several hosts must find the standby closed, not accepted and kept waiting.
    standby: bool = False
    #: ``--flush``: "sync" confirms after the fsync, "async" at once (a periodic fsync);
    #: a store without a group commit of its own is "sync".
    flush: str = "sync"

    @classmethod
    def inspect(cls, target: str, out: Any) -> int | str:
        """``python -m broker inspect``: print a report of what is stored at ``target`` (the
        journal's directory or the store's URL) to the text stream ``out``; 0 when done."""
        raise StoreUnavailable(f"the {cls.name} store has no inspect support")

    async def prepare(self) -> None:
        """What must succeed before the broker listens (a cluster node's join); a failure
        here stops the broker with its one line before any listener opens."""

    def open_early(self) -> None:
        """Optionally start connecting now, in a thread, while the process still imports and
        builds the broker (its waits on a database overlap that start); ``open`` then takes
        the connection over, or reports its failure. Reads nothing the broker recovers."""

    # ---- life cycle (edge, async) ----
    async def open(self) -> None:
        """Connect / open files and load what is stored.

        Raises StoreUnavailable with one clear line on failure; owns nothing then.
        """

    async def run(self) -> None:
        """Background work (group commit, GC, checkpoints) until cancelled.

        Returns at once for a store without background work. Write errors are
        reported as described in the class docstring, never raised.
        """

    async def close(self) -> None:
        """Flush what is buffered and release files, connections and locks."""

    def recover(self, broker: Any) -> None:
        """Recreate durable exchanges, queues, bindings and persistent messages.

        Called once after ``open``, before listeners open. Every metadata record
        goes back first, through ``broker.restore_meta(kind, key, value)`` (see
        ``recovery.restore_meta``), so a vhost exists before its queues come back.
        Queues are rebuilt through ``Queue.restore`` (never by assigning their fields).
        """

    def sidecar_path(self, name: str) -> str | None:
        """A path for a file named ``name`` that a feature keeps beside this store's own
        data (the scheduler's timer index), moving and vanishing with it; None when the
        store has no local directory. The store never reads or trusts such a file."""
        return None

    # ---- definitions (from the vhost) ----
    def save_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None: ...
    def delete_exchange(self, vhost: VirtualHost, exchange: Exchange) -> None: ...
    def save_queue(self, vhost: VirtualHost, queue: Queue) -> None: ...
    def delete_queue(self, vhost: VirtualHost, queue: Queue) -> None: ...
    def save_binding(self, vhost: VirtualHost, binding: Binding) -> None: ...
    def delete_binding(self, vhost: VirtualHost, binding: Binding) -> None: ...

    # ---- metadata (features: users, vhosts, permissions, policies, ...) ----
    def save_meta(self, kind: str, key: str, value: dict[str, Any]) -> None:
        """Store the record ``(kind, key)``, replacing an earlier one with the same pair.

        ``kind`` names the owner's record type ("user", "vhost", "permission",
        "policy", ...; distinct per feature), ``key`` identifies the record within it
        (any string, never used as a path), ``value`` is a JSON-able dict, encoded at
        the call (later changes to the dict are not stored). Raises TypeError /
        ValueError at once if ``value`` is not JSON-able. Ordered with the other writes:
        durable once a later ``when_durable`` callback runs. At ``recover`` the newest
        value of every record comes back through ``broker.restore_meta``. A store
        without ``DURABLE`` forgets it (no-op).
        """

    def delete_meta(self, kind: str, key: str) -> None:
        """Forget the record ``(kind, key)`` (no error if there is none)."""

    # ---- messages: the queue operation stream (QueueObserver) ----
    def queue_op(self, queue: Queue, op: Op, entry: QueueEntry) -> None:
        """Observe ``queue`` (see ``queues/ops.QueueObserver``): only persistent
        messages are stored; the first delivery is recorded (a crash brings the
        message back redelivered=true); every way of leaving removes it."""
        if not entry.message.persistent:
            return
        if op is _ENQUEUE:
            self.enqueue(queue, entry)
        elif op is _DELIVER:
            if entry.delivery_count == 1:
                self.delivered(queue, entry)
        elif op is not _REQUEUE:
            self.remove(queue, entry)

    def enqueue(self, queue: Queue, entry: QueueEntry) -> None:
        """A persistent message entered a durable queue (may set ``entry.loc``)."""

    def delivered(self, queue: Queue, entry: QueueEntry) -> None:
        """First delivery of a stored message: after a crash it comes back redelivered=true."""

    def remove(self, queue: Queue, entry: QueueEntry) -> None:
        """The message left the queue for good (acked, dropped, expired, dead-lettered)."""

    def park(self, queue: Queue, entry: QueueEntry) -> int:
        """``entry``, delivered from ``queue`` and not settled, has been held for a while
        (a channel's consumer-timeout sweep): the store may keep it as a compact row of its
        own instead of the object. Returns the row's slot, which the holder keeps in place
        of the entry and gives to ``unpark`` to settle it; -1: not parked, keep the entry."""
        return -1

    def unpark(self, queue: Queue, slot: int) -> QueueEntry:
        """The entry parked at ``slot`` (``park``), rebuilt; the slot is free again."""
        raise KeyError(slot)

    def when_durable(self, callback: Callable[[], None],
                     on_failure: Callable[[], None] | None = None) -> None:
        """Call ``callback`` once all writes issued so far are durable, or ``on_failure``
        (the publish is nacked) if the backend could not write them. Either runs
        exactly once, on the event loop's thread, possibly before this returns."""
        callback()

    # ---- what a wrapping store (the cluster's) does; every store answers ----
    @property
    def message_store(self) -> Store:
        """The store queues attach as their observer (``VirtualHost.add_queue``): this
        one; a wrapping store's inner one, so messages never pass through the wrapper."""
        return self

    def check_placement(self, vhost: Any, name: str, m: Any = None) -> Queue | None:
        """A client declares the new durable queue ``name`` (``m``: its queue.declare):
        None to create it here; a cluster's store may return the proxy of a master it
        placed on another node."""
        return None

    def settle_barrier(self, channel: Any) -> None:
        """``channel``'s tx.commit settled messages of a queue whose confirms wait
        (``Queue.confirms_later``): the next ``when_durable`` waits until that is
        applied elsewhere too (a cluster's mirrors). Nothing to wait for here."""

    def unstorable(self, name: str, arguments: dict[str, Any] | None,
                   key: bool = False) -> str | None:
        """Why a durable definition named ``name`` with ``arguments`` could not be stored
        here (``records.unstorable``: names past ``name_max``; ``key``, a binding's
        routing key, has no such bound), or None: the vhost refuses it before ok."""
        return unstorable(name, arguments, None if key else self.name_max)

    def known_members(self) -> set[str] | None:
        """The cluster's member node names; None: no cluster (any names are taken)."""
        return None


class StoreUnavailable(RuntimeError):
    """The backend cannot be opened (unreachable database, unreadable data dir)."""


class MemoryStore(Store):
    """Nothing survives a restart; used by tests and ``--store memory``."""
    name = "memory"
    capabilities: ClassVar[frozenset[str]] = frozenset()


# ---------------------------------------------------------------- registry
# scheme -> (factory(url, data_dir, flush, journal settings, sql settings) -> Store,
#            loader() -> store class)
_Factory = Callable[[str, str, str, JournalSettings, SQLSettings], Store]
_BACKENDS: dict[str, tuple[_Factory, Callable[[], type]]] = {}


def register_store(schemes: tuple[str, ...], factory: _Factory,
                   cls: Callable[[], type]) -> None:
    """Make ``--store SCHEME:...`` open a backend. ``factory(url, data_dir, flush,
    journal_settings, sql_settings)`` builds the store (it may raise StoreUnavailable); ``cls()`` returns
    its class (for ``inspect``) and may import the backend lazily."""
    for scheme in schemes:
        _BACKENDS[scheme] = (factory, cls)


def store_scheme(url: str | None) -> str:
    """The registry key of a store URL: ``journal`` for none or a directory path."""
    if url in (None, "", "journal"):
        return "journal"
    assert url is not None
    if url.startswith(("/", ".")):
        return "journal"
    head = url.split(":", 1)[0] if ":" in url else url
    return head.split("+", 1)[0].lower()


def _lookup(url: str | None) -> tuple[_Factory, Callable[[], type]]:
    backend = _BACKENDS.get(store_scheme(url))
    if backend is None:
        raise StoreUnavailable(f"unsupported store URL {url!r} (journal, memory, sqlite:///..., "
                               f"postgresql+psycopg://..., mysql+pymysql://...)")
    return backend


def open_store(url: str | None, data_dir: str, flush: str = "sync",
               journal: JournalSettings | None = None, sql: SQLSettings | None = None) -> Store:
    """The store for ``--store URL``: ``journal`` / ``journal:DIR`` / a directory
    (default: the journal in ``data_dir``), ``memory``, or a SQLAlchemy URL
    (``sqlite:///file``, ``postgresql+psycopg://...``, ``mysql+pymysql://...``).
    Raises StoreUnavailable for an unknown URL."""
    return _lookup(url)[0](url or "journal", data_dir, flush, journal or JournalSettings(),
                           sql or SQLSettings())


def store_class(url: str | None) -> type:
    """The backend class of a store URL (raises StoreUnavailable if unknown)."""
    return _lookup(url)[1]()


def journal_dir(url: str | None, data_dir: str) -> str:
    """The data directory a journal URL names (``journal:DIR``, ``DIR``), else ``data_dir``."""
    if not url or url == "journal":
        return data_dir
    if url.startswith("journal:"):
        return url[len("journal:"):] or data_dir
    return url


def _journal(url: str, data_dir: str, flush: str, settings: JournalSettings,
             _sql_settings: SQLSettings) -> Store:
    from .journal import JournalStore
    return JournalStore(journal_dir(url, data_dir), flush=flush, settings=settings)


def _journal_cls() -> type:
    from .journal import JournalStore
    return JournalStore


def _sql(url: str, data_dir: str, flush: str, _journal_settings: JournalSettings,
         settings: SQLSettings) -> Store:
    from .sql import SQLStore
    return SQLStore(url, flush=flush, settings=settings)


def _sql_cls() -> type:
    from .sql import SQLStore
    return SQLStore


register_store(("journal",), _journal, _journal_cls)
register_store(("memory",), lambda url, data_dir, flush, journal, sql: MemoryStore(), lambda: MemoryStore)
register_store(("sqlite", "postgresql", "postgres", "mysql", "mariadb"), _sql, _sql_cls)
