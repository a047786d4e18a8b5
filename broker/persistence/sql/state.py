"""What every part of the SQL store shares: the batch being buffered (``_Batch``) and the
store's attributes (``SQLStoreState``), set up from its settings. No behaviour of its own."""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import trio
from sqlalchemy.engine import make_url

from ...config import SQLSettings
from .. import sql_schema as S
from ..base import DURABLE, PAGES_MESSAGES, Store, StoreUnavailable
from .common import _safe_url

if TYPE_CHECKING:
    from sqlalchemy import Table
    from sqlalchemy.engine import Connection

    from ...message import Message
    from ...queues.entry import QueueEntry
    from ...queues.queue import Queue
    from ..sql_paged import SQLPagedFifo


class _Batch:
    """What the core asked for since the last hand-off (only touched on the trio thread)."""
    __slots__ = ("callbacks", "defs", "dlv", "enq", "msgs", "nbytes", "rejected", "rejected_msgs",
                 "rm", "rm_msgs")

    # callbacks: (on_success, on_failure, held) — held: the (queue, entry) of the publish,
    # taken back from the queues when it is nacked

    def __init__(self) -> None:
        self.defs: list[Any] = []                 # ordered definition ops
        # msg id -> [Message, pending entry count]: the queues' own (immutable) message, so a
        # body waiting for the database is held once; encoded by the worker thread
        self.msgs: dict[int, list[Any]] = {}
        self.nbytes = 0                      # body bytes of ``msgs``
        # qid -> {seq: [msg_id, expires_at, priority, delivered]}
        self.enq: dict[int, dict[int, list[Any]]] = {}
        self.dlv: dict[int, dict[int, int]] = {}  # qid -> {seq: deliveries} of entries already handed off
        self.rm: dict[int, set[int]] = {}  # qid -> set(seq) of entries already handed off
        self.rm_msgs: set[int] = set()            # msg ids that may have lost their last entry
        self.callbacks: list[tuple[Any, ...]] = []            # (on_success, on_failure)
        # records the database refused for what they hold (``SQLStore._write_apart``): never
        # written, never tried again; the publishes of rejected messages are nacked
        self.rejected: list[tuple[Any, str]] = []             # (definition op, reason)
        self.rejected_msgs: set[int] = set()      # message ids

    def empty(self) -> bool:
        return not (self.defs or self.msgs or self.enq or self.dlv or self.rm or self.rm_msgs)


class SQLStoreState(Store):
    """The attributes of ``SQLStore`` (its mixins' shared state)."""

    capabilities: ClassVar[frozenset[str]] = frozenset({DURABLE, PAGES_MESSAGES})
    name_max: ClassVar[int | None] = S.NAME_MAX  # VARCHAR(255): a shortstr, escaped (sql_names)

    def __init__(self, url: str, flush: str = "sync", async_interval: float = 0.02,
                 settings: SQLSettings | None = None) -> None:
        if flush not in ("sync", "async"):
            raise StoreUnavailable(f"unknown flush policy {flush!r} (sync, async)")
        self.url = url
        self.flush = flush
        self.async_interval = async_interval
        self.settings = settings or SQLSettings()
        self.standby = self.settings.standby
        if not 0 < self.settings.renew < self.settings.lease:
            raise StoreUnavailable(f"SQL lease renew interval ({self.settings.renew} s) must be "
                                   f"shorter than the lease ({self.settings.lease} s)")
        try:
            u = make_url(url)
        except Exception as exc:
            raise StoreUnavailable(f"invalid store URL {url!r}: {exc}") from None
        self.safe_url = _safe_url(url)
        backend = u.get_backend_name()
        self.dialect = "mysql" if backend in ("mysql", "mariadb") else backend
        self.name = f"sql ({backend}, flush={flush})"
        db = u.database or ""
        self.sqlite_path = (os.path.abspath(db) if self.dialect == "sqlite"
                            and db not in ("", ":memory:") else None)
        self._u = u
        self.engine: Any = None
        self.lock_engine: Any = None
        self._conn: Any = None                   # the writer's connection (worker thread only)
        self._lock: Any = None
        self._batch = _Batch()
        # written in order, one transaction each, before the current batch: what an outage
        # left unwritten (in doubt, or not tried) and batches sealed at ``batch_bytes``
        self._retry: list[_Batch] = []
        self._unwritten = 0                  # body bytes in batches not yet committed
        self._backlog_full = False
        self._inflight = False
        self._down = False
        self._wake = trio.Event()
        # (queue, entry) enqueued since the last when_durable
        self._held: list[tuple[Queue, QueueEntry]] = []
        self._renewing = False
        self._lease_checked = trio.Event()   # set after each renewal attempt (_guard_lease)
        self._gen = 0                        # bumped when a stuck write is abandoned
        self._conn_used = 0.0
        # (vhost, name) -> (Queue, qid)
        self._qids: dict[tuple[str, str], tuple[Queue, int]] = {}
        self._queue_of: dict[int, Queue] = {}            # qid -> Queue (the same, reversed)
        self._wanted: deque[SQLPagedFifo] = deque()        # SQLPagedFifo waiting for their next page
        self._page_wanted = trio.Event()
        self._next_qid = 1
        self._loaded: Any = None
        # (qid, queue, its SQLPagedFifo, last seq read, top seq, entries left): the index past
        # each queue's first window, read once the broker serves (Loader._load_rest)
        self._unloaded: list[tuple[Any, ...]] = []
        # (kind, key, value JSON) read by open, in write order
        self._loaded_meta: list[tuple[str, str, str]] = []
        self._meta_seq = 0                   # triomq_meta.seq of the last save_meta
        self.broker: Any = None              # on_store_failure / _backlog / _recovered
        self.batches = 0                     # statistics
        self.rows_written = 0

    if TYPE_CHECKING:  # what the parts call of each other (each defined in one mixin of SQLStore)
        def insert_ignore(self, table: Table) -> Any: ...                     # store.py
        def _qid(self, queue: Queue) -> int | None: ...                       # hooks.py
        def _poke(self) -> None: ...
        def _check_backlog(self) -> None: ...
        def _fail(self, callbacks: list[tuple[Any, ...]]) -> None: ...                  # commit.py
        def _lease_error(self) -> str: ...                             # lease.py
        def _write(self, batch: _Batch, gen: int) -> str | None: ...   # batch.py
        def _abandon_conn(self) -> None: ...
        def _page_out(self, batch: _Batch) -> None: ...                # paging.py
        # index.py
        @staticmethod
        def _read_messages(c: Connection, mids: Iterable[int]) -> dict[int, Message]: ...
