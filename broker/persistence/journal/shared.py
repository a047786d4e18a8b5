"""The attributes of ``JournalStore`` that its parts (the mixins of this package) share, set
up from its settings. No behaviour of its own."""
from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from ...config import JournalSettings
from ...message import Message
from ..base import (
    BLOCKS_ON_FAILURE,
    DURABLE,
    PAGES_MESSAGES,
    READS_BACK,
    FlushStats,
    Store,
)
from .parked import Parked
from .state import JournalState
from .stored import StoredMessage, _malloc_trim

if TYPE_CHECKING:
    from mmap import mmap
    from typing import TypeAlias

    from ...broker import Broker
    from ...queues.entry import QueueEntry
    from ...queues.queue import Queue
    from ..records import BindingDef, ExchangeDef, QueueDef

    # (slot, qid, seq, loc, expiry on the wall clock, priority, body length, delivery count)
    ParkedRow: TypeAlias = tuple[int, int, int, int, float | None, int, int, int]


class JournalStoreState(Store):
    """The journal store's state (its mixins' shared attributes)."""

    name = "journal"
    capabilities: ClassVar[frozenset[str]] = frozenset(
        {DURABLE, PAGES_MESSAGES, READS_BACK, BLOCKS_ON_FAILURE})

    def __init__(self, data_dir: str, flush: str = "sync", segment_size: int | None = None,
                 settings: JournalSettings | None = None, jdir: str | None = None) -> None:
        settings = settings or JournalSettings()
        if segment_size is None:
            segment_size = settings.segment_size
        self.settings = settings
        self.flush_stats: FlushStats = FlushStats()  # /metrics: fsync latency, group-commit size, errors
        self.data_dir = data_dir
        self.jdir = jdir or os.path.join(data_dir, "journal")
        self.flush = flush
        self.segment_size = segment_size
        self.broker: Broker | None = None
        self._state: JournalState | None = None
        self._lock_fd: int | None = None
        # writing
        self._seg = 1
        self._off = 0
        self._pending: list[list[Any]] = []   # [seg, start offset, bytearray]
        self._inflight: list[list[Any]] = []
        # (callback, on_failure) waiting for the next write
        self._callbacks: list[tuple[Callable[[], object], Callable[[], object] | None]] = []
        self._dirty: trio.Event | None = None
        self._fds: dict[int, int] = {}       # used only by the writer thread
        self._maps: dict[int, mmap] = {}      # seg -> mmap for reading bodies
        self._last_msg: Message | None = None
        self._last_msg_loc = 0
        self._stored = StoredMessage.for_store(self)  # paged-out unacked deliveries' messages
        self._seg_live: dict[int, int] = {}  # seg -> live entries stored there
        self._seg_bytes: dict[int, int] = {}  # seg -> their bytes, a lower bound (ENQ_MIN + body each)
        self.compact_written = 0  # bytes compaction wrote (moved messages)
        self.compact_freed = 0    # bytes of the segment files it emptied, once deleted
        self._compacted: set[int] = set()  # segments compaction emptied, not yet deleted
        self._prev_seg_bytes: dict[int, int] = {}  # _seg_bytes at the previous compaction pass
        self._max_msg_id = 0
        self._bytes_since_ckpt = 0
        self._records_since_ckpt = 0
        self._ckpt_wanted = False
        self._unwritten = 0        # bytes in _pending and _inflight
        self._backlog_full = False  # over settings.max_unwritten: publishers are blocked
        self._failed: OSError | None = None
        # entries enqueued while writes fail, not yet recorded -> queue: a nacked publish
        # takes them back from their queues and is never written (when_durable)
        self._held: dict[QueueEntry, Queue] = {}
        # stored deliveries not yet settled, by age: their messages are paged out once
        # they are UNACKED_PAGE_AFTER old (_page_unacked)
        # (dicts as ordered sets: a settled entry leaves them at once, never kept alive)
        self._fresh_out: dict[QueueEntry, None] = {}
        self._aging_out: dict[QueueEntry, None] = {}
        self._paged_freed = 0  # body bytes paged out since the last trim (TRIM_AFTER)
        self._trim = _malloc_trim()
        self._trim_next = 0.0  # monotonic time before which no trim starts (TRIM_SPACING)
        # definitions (for checkpoints)
        self._exchanges: dict[tuple[str, str], ExchangeDef] = {}
        self._queues: dict[int, QueueDef] = {}    # qid -> QueueDef
        self._qids: dict[Queue, int] = {}      # Queue -> qid (this store's id of a live queue)
        self._out: dict[QueueEntry, Queue] = {}       # stored QueueEntry delivered, not yet settled -> Queue
        # the same, parked by a channel that held them past a sweep: rows, not objects
        self._parked = Parked()
        self._parked_since = 0  # entries parked since _out's table was last rebuilt
        self._bindings: dict[tuple[str, str, str, str, str, bytes], BindingDef] = {}
        # (kind, key) -> value JSON text (for checkpoints)
        self._meta: dict[tuple[str, str], str | None] = {}
        self._next_qid = 1
        self._ckpt_seg = 0

    if TYPE_CHECKING:  # what the parts call of each other (each defined in one mixin of JournalStore)
        def _append(self, rtype: int, payload: bytes) -> int: ...     # writer.py
        def _stored_body_len(self, loc: int) -> int: ...             # reader.py
        def read_message(self, loc: int) -> Message: ...
        def _buffer_at(self, loc: int) -> tuple[bytearray | mmap, int]: ...
        def _parked_rows(self, qids: Collection[int] | None = None
                         ) -> Iterator[ParkedRow]: ...    # parking.py
        def _names_at(self, loc: int) -> tuple[int, str, str]: ...
        async def checkpoint(self) -> None: ...                      # checkpoint.py
        def _compact(self) -> int: ...                               # compaction.py
        async def _flush_once(self) -> None: ...                     # writer.py
