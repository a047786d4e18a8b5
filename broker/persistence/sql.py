"""JDBC-style store on SQLAlchemy 2 (SQLite, PostgreSQL, MariaDB/MySQL).

The core calls the hooks synchronously on the trio thread; they only buffer.
``run`` hands the buffer to a worker thread (``trio.to_thread.run_sync``) which
writes it in ONE transaction (group commit) and, back on the trio thread, the
``when_durable`` callbacks of that batch run. A batch whose commit failed is in
doubt (it may be committed): its callbacks, and those that came while it was
being written, wait for the retry; only what comes once the failure is known
gets ``on_failure`` (nacked, taken back from its queues). See docs/sql-store.md.

flush="sync"  : a batch starts as soon as the previous one is committed; a
                publisher confirm is sent after the commit that holds it.
flush="async" : a batch is committed every ``async_interval`` (20 ms); confirms
                are sent at once. Loss window on a crash: the messages confirmed
                in the last interval plus the batch being written.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import secrets
import socket
import time
from array import array
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

import trio
from sqlalchemy import create_engine, delete, event, exists, func, insert, or_, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError, StatementError
from sqlalchemy.pool import NullPool

from ..config import SQLSettings
from ..message import set_message_id_floor
from ..queues.entry import QueueEntry
from ..queues.ops import Op
from ..queues.priority import PriorityReady
from ..queues.retry import restore_delivery_count
from . import sql_schema as S
from .base import DURABLE, PAGES_MESSAGES, Store, StoreUnavailable
from .records import (
    BindingDef,
    ExchangeDef,
    QueueDef,
    decode_arguments,
    decode_message,
    encode_arguments,
    encode_message,
)
from .recovery import encode_meta, restore, restore_meta
from .sql_names import db_name as N
from .sql_names import from_db as D
from .sql_paged import SQLPagedFifo

log = logging.getLogger("broker.store.sql")

CHUNK = 500          # ids per IN (...) list
NAN = float("nan")
DELIVERIES_MAX = 1_000_000  # stored delivery counts saturate here
_ENQUEUE, _DELIVER, _REQUEUE = Op.ENQUEUE, Op.DELIVER, Op.REQUEUE
PAGER_RETRY = 1.0    # seconds before reading a page again after the database failed
ORPHAN_GC_DELAY = 5.0  # seconds after start-up before orphaned messages are collected
ORPHAN_GC_RANGE = 50_000  # message ids per clean-up statement
IDLE_RECHECK = 20.0  # seconds idle after which the writer's connection is pinged before use


class StoreLocked(StoreUnavailable):
    """Another broker holds the lease."""


class StoreDeposed(StoreUnavailable):
    """Another broker took the lease over while this one ran: it must stop for good."""


def _abort_socket(conn) -> None:
    """Reset (RST, SO_LINGER 0) the socket of a connection a blocked thread still uses,
    so nothing it buffered (a COMMIT) reaches the server later; that thread then fails."""
    try:
        dbapi = conn.connection.dbapi_connection
        fd = None
        pg = getattr(dbapi, "pgconn", None)
        if pg is not None:
            fd = pg.socket
        elif getattr(dbapi, "_sock", None) is not None:
            fd = dbapi._sock.fileno()
        if fd is None or fd < 0:
            return
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
    except Exception:
        pass


def _safe_url(url) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return str(url)


def _reason(exc: BaseException) -> str:
    """The first line of the driver's message, without SQLAlchemy's boilerplate."""
    orig = getattr(exc, "orig", None) or exc
    msg = str(orig).strip().splitlines()
    line = msg[0] if msg else type(orig).__name__
    return line.strip()


def _refused_record(exc: BaseException) -> bool:
    """True if ``exc`` is the database (or the encoding on the way to it) refusing a value of
    one record -- a string too long, a character it cannot hold -- with the connection
    intact; False for what every write would meet (connection, lease, timeout)."""
    if isinstance(exc, (DataError, IntegrityError)):
        return not exc.connection_invalidated
    if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
        return True  # a parameter the driver could not encode
    return isinstance(exc, (ValueError, TypeError))  # our own encoding (UnicodeError, a table)


def _printable(name: str) -> str:
    """A name for a report: as is, or escaped if it holds NUL, bytes or control characters."""
    return name if name.isprintable() else ascii(name)[1:-1]


def _binding_key(b: BindingDef) -> str:
    h = hashlib.sha1()
    for part in (b.vhost, b.source, b.destination_kind, b.destination, b.routing_key):
        try:
            raw = part.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate that stands for no byte (not from AMQP)
            raw = part.encode("utf-8", "surrogatepass")
        h.update(raw + b"\0")
    h.update(encode_arguments(b.arguments))
    return h.hexdigest()


def _meta_key(kind: str, key: str) -> str:
    return hashlib.sha1(f"{kind}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()


def _chunks(seq, n=CHUNK):
    seq = list(seq)
    for i in range(0, len(seq), n):
        yield seq[i:i + n]


class _Batch:
    """What the core asked for since the last hand-off (only touched on the trio thread)."""
    __slots__ = ("callbacks", "defs", "dlv", "enq", "msgs", "nbytes", "rejected", "rejected_msgs",
                 "rm", "rm_msgs")
    # callbacks: (on_success, on_failure, held) — held: the (queue, entry) of the publish,
    # taken back from the queues when it is nacked

    def __init__(self):
        self.defs: list = []                 # ordered definition ops
        # msg id -> [Message, pending entry count]: the queues' own (immutable) message, so a
        # body waiting for the database is held once; encoded by the worker thread
        self.msgs: dict = {}
        self.nbytes = 0                      # body bytes of ``msgs``
        self.enq: dict = {}                  # qid -> {seq: [msg_id, expires_at, priority, delivered]}
        self.dlv: dict = {}                  # qid -> {seq: deliveries} of entries already handed off
        self.rm: dict = {}                   # qid -> set(seq) of entries already handed off
        self.rm_msgs: set = set()            # msg ids that may have lost their last entry
        self.callbacks: list = []            # (on_success, on_failure)
        # records the database refused for what they hold (``SQLStore._write_apart``): never
        # written, never tried again; the publishes of rejected messages are nacked
        self.rejected: list = []             # (definition op, reason)
        self.rejected_msgs: set = set()      # message ids

    def empty(self) -> bool:
        return not (self.defs or self.msgs or self.enq or self.dlv or self.rm or self.rm_msgs)


class _Lock:
    """ACTIVEMQ_LOCK as ActiveMQ's ``LeaseDatabaseLocker``: the row names its ``owner`` (unique
    per store start) and ``expires_at`` (wall clock); the holder renews it every ``renew``
    seconds with short statements (no transaction is ever held open), another broker takes
    it only once it expired, and the holder writes only while its own lease is valid by
    its monotonic clock (``valid()``), which always ends before the stored expiry.
    SQLite uses flock on a side file (one machine: the kernel releases it on death)."""

    def __init__(self, store: SQLStore):
        self.store = store
        self.fd: int | None = None
        self.owner = f"triomq {socket.gethostname()} pid {os.getpid()} {secrets.token_hex(4)}"
        self.valid_until = 0.0     # monotonic end of the lease as this process counts it
        self.taken = False         # the lease was ours at the last successful take/renew
        self.deposed = False       # another broker took the lease: never write again
        self.last_error = ""

    def acquire(self) -> None:
        st = self.store
        with st.engine.begin() as c:
            # plain read first: on InnoDB, INSERT IGNORE would wait for a holder's row lock
            if c.execute(select(S.lock.c.id).where(S.lock.c.id == 1)).first() is None:
                c.execute(st.insert_ignore(S.lock), [{"id": 1, "owner": None, "acquired_at": None,
                                                      "expires_at": None,
                                                      "schema_version": S.SCHEMA_VERSION}])
        if st.dialect == "sqlite":
            path = st.sqlite_path
            if path:
                fd = os.open(path + ".triomq-lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise StoreLocked(self._locked_message()) from None
                self.fd = fd
            with st.engine.begin() as c:
                c.execute(update(S.lock).where(S.lock.c.id == 1)
                          .values(owner=self.owner, acquired_at=time.time(), expires_at=None))
            self.taken = True
            return
        if not self.renew(first=True):
            dead = self._dead_owner()
            if dead is None or not self.renew(first=True, steal_from=dead):
                raise StoreLocked(self._locked_message())
            log.warning("store %s: lease of %s taken over at once (that process is gone)",
                        st.safe_url, dead)

    def _dead_owner(self) -> str | None:
        """The lease's owner if it is a process of THIS host that no longer exists (a
        ``kill -9`` then restart need not wait for the lease); else None."""
        with self.store.engine.connect() as c:
            owner = c.execute(select(S.lock.c.owner).where(S.lock.c.id == 1)).scalar()
        parts = (owner or "").split()
        if len(parts) < 4 or parts[0] != "triomq" or parts[2] != "pid" \
                or parts[1] != socket.gethostname() or not parts[3].isdigit():
            return None
        try:
            os.kill(int(parts[3]), 0)
        except ProcessLookupError:
            return owner
        except OSError:
            return None
        return None

    def renew(self, first: bool = False, steal_from: str | None = None) -> bool:
        """Take (``first``: if free, expired or ours) or extend (only if still ours) the lease
        in one autocommitted UPDATE, in a worker thread. True if it is ours; raises
        SQLAlchemyError if the database cannot be reached. Once another broker took it
        over, this store is ``deposed`` for good: its memory is no longer the truth."""
        st = self.store
        if st.dialect == "sqlite":
            return True
        if self.deposed:
            return False
        lease = st.settings.lease
        started = time.monotonic()
        now = time.time()
        L = S.lock
        values: dict[str, Any] = {"owner": self.owner, "expires_at": now + lease}
        if steal_from is not None:
            values["acquired_at"] = now
            cond = L.c.owner == steal_from
        elif first:
            values["acquired_at"] = now
            cond = or_(L.c.owner == self.owner, L.c.owner.is_(None), L.c.expires_at.is_(None),
                       L.c.expires_at < now)
        else:
            cond = L.c.owner == self.owner
        with st.lock_engine.begin() as c:
            n = c.execute(update(L).where(L.c.id == 1, cond).values(**values)).rowcount
        if n != 1:
            self.taken = False
            self.valid_until = 0.0
            if not first:
                self.deposed = True
                self.last_error = "the lease row names another owner"
            return False
        self.taken = True
        # counted from before the statement was sent: ends before the stored expiry
        self.valid_until = max(self.valid_until, started + lease)
        return True

    def valid(self) -> bool:
        if self.store.dialect == "sqlite":
            return self.fd is not None
        return time.monotonic() < self.valid_until

    def _locked_message(self) -> str:
        st = self.store
        who = "another broker"
        try:
            with st.engine.connect() as c:
                row = c.execute(select(S.lock.c.owner, S.lock.c.acquired_at, S.lock.c.expires_at)
                                .where(S.lock.c.id == 1)).first()
            if row is not None and row.owner:
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.acquired_at or 0))
                who = f"{row.owner} (since {since})"
                if row.expires_at:
                    who += f", lease valid {max(0.0, row.expires_at - time.time()):.1f} s more"
        except SQLAlchemyError:
            pass
        return f"store {st.safe_url} is locked by {who}; two brokers cannot share one database"

    def release(self) -> None:
        st = self.store
        if st.dialect != "sqlite" and self.taken and st.lock_engine is not None:
            try:
                with st.lock_engine.begin() as c:
                    c.execute(update(S.lock).where(S.lock.c.id == 1, S.lock.c.owner == self.owner)
                              .values(owner=None, expires_at=None))
            except SQLAlchemyError:
                pass  # the lease simply runs out
        self.taken = False
        self.valid_until = 0.0
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


class _QueueIndex:
    """The stored entries of one queue, as read at start-up (columns, seq order)."""
    __slots__ = ("blens", "exps", "flags", "mids", "prios", "seqs", "unsized")

    def __init__(self):
        self.seqs = array("q")
        self.mids = array("q")
        self.exps = array("d")
        self.blens = array("I")
        self.prios = array("B")
        self.flags = array("B")
        self.unsized: list[int] = []  # positions whose size column is NULL (older rows)

    def extend(self, cols: list, start: int, end: int) -> None:
        """Rows ``start:end`` of columns (qid, seq, message id, expiry, priority,
        delivered, body length, deliveries)."""
        self.seqs.extend(cols[1][start:end])
        self.mids.extend(cols[2][start:end])
        self.exps.extend([NAN if e is None else e for e in cols[3][start:end]])
        self.prios.extend([p if 0 <= p <= 255 else 0 for p in cols[4][start:end]])
        # the delivery count (255 = 255 or more); an older row has only the flag: one
        self.flags.extend([min(n, 255) if n else (1 if d else 0)
                           for d, n in zip(cols[5][start:end], cols[7][start:end], strict=True)])
        sizes = cols[6][start:end]
        if None in sizes:
            base = len(self.blens)
            self.unsized.extend(base + i for i, s in enumerate(sizes) if s is None)
            sizes = [0 if s is None else s for s in sizes]
        self.blens.extend(sizes)

    def entry(self, queue, i: int, messages: dict, wall_minus_mono: float) -> QueueEntry | None:
        message = messages.get(self.mids[i])
        if message is None:
            return None
        exp = self.exps[i]
        entry = QueueEntry(message, self.seqs[i], None if exp != exp else exp - wall_minus_mono,
                           self.prios[i])
        if self.flags[i]:
            restore_delivery_count(queue, entry, self.flags[i])
        return entry

    def extend_arrays(self, cols, start: int, end: int) -> None:
        """Rows ``start:end`` of numpy columns (seq, message id, expiry or NaN, priority,
        body length or -1 when NULL, delivery count) read by ``_pg_index_chunks``."""
        import numpy as np

        self.seqs.frombytes(cols[0][start:end].tobytes())
        self.mids.frombytes(cols[1][start:end].tobytes())
        self.exps.frombytes(cols[2][start:end].tobytes())
        p = cols[3][start:end]
        self.prios.frombytes(np.where((p >= 0) & (p <= 255), p, 0).astype(np.uint8).tobytes())
        sizes = cols[4][start:end]
        unsized = np.flatnonzero(sizes < 0)
        if len(unsized):
            self.unsized.extend((unsized + len(self.blens)).tolist())
            sizes = np.maximum(sizes, 0)
        self.blens.frombytes(sizes.astype(np.uint32).tobytes())
        self.flags.frombytes(cols[5][start:end].astype(np.uint8).tobytes())

    def columns(self, start: int) -> tuple:
        """(seqs, message ids, expiries, body lengths, delivery counts) from ``start``."""
        return (self.seqs[start:], self.mids[start:], self.exps[start:], self.blens[start:],
                self.flags[start:])


class SQLStore(Store):
    """Observes durable queues (``Store.queue_op``); keeps each queue's id in ``_qids``.

    Durable FIFO queues page (``PAGES_MESSAGES``): a backlog stays in the database and is
    read ahead in pages as consumers drain it (``sql_paged.SQLPagedFifo``, ``_pager``)."""

    capabilities: ClassVar[frozenset[str]] = frozenset({DURABLE, PAGES_MESSAGES})
    name_max: ClassVar[int | None] = S.NAME_MAX  # VARCHAR(255): a shortstr, escaped (sql_names)

    def __init__(self, url: str, flush: str = "sync", async_interval: float = 0.02,
                 settings: SQLSettings | None = None):
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
        self._held: list = []                # (queue, entry) enqueued since the last when_durable
        self._renewing = False
        self._lease_checked = trio.Event()   # set after each renewal attempt (_guard_lease)
        self._gen = 0                        # bumped when a stuck write is abandoned
        self._conn_used = 0.0
        self._qids: dict = {}                # (vhost, name) -> (Queue, qid)
        self._queue_of: dict = {}            # qid -> Queue (the same, reversed)
        self._wanted: deque = deque()        # SQLPagedFifo waiting for their next page
        self._page_wanted = trio.Event()
        self._next_qid = 1
        self._loaded: Any = None
        self._loaded_meta: list = []         # (kind, key, value JSON) read by open, in write order
        self._meta_seq = 0                   # triomq_meta.seq of the last save_meta
        self.broker: Any = None              # on_store_failure / _backlog / _recovered
        self.batches = 0                     # statistics
        self.rows_written = 0

    @classmethod
    def inspect(cls, url: str, out=None):
        """For ``python -m broker inspect --store URL`` (broker/persistence/tools.py):
        prints the module-level ``inspect(url)`` report to ``out`` and returns 0;
        without ``out`` returns the report text."""
        report = inspect(url)  # the module function below
        if out is None:
            return report
        print(report, file=out)
        return 0

    # ------------------------------------------------------------------ engine
    def _make_engines(self) -> None:
        connect_args: dict[str, Any] = {}
        kw: dict[str, Any] = {}
        st = self.settings
        timeout = max(1, int(st.timeout))
        if self.dialect == "postgresql" or self.dialect == "mysql":
            connect_args["connect_timeout"] = min(5, timeout)
        if self.dialect == "postgresql":
            # the server ends what a vanished broker left behind; keepalives find dead peers
            ms = int(st.timeout * 1000)
            connect_args.update(
                keepalives=1, keepalives_idle=st.keepalive_idle,
                keepalives_interval=st.keepalive_interval, keepalives_count=st.keepalive_count,
                tcp_user_timeout=ms,
                options=f"-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms} "
                        f"-c lock_timeout={ms}")
        elif self.dialect == "mysql":
            connect_args.update(read_timeout=timeout, write_timeout=timeout)
        elif self.dialect == "sqlite":
            connect_args["check_same_thread"] = False
            connect_args["timeout"] = 10
        if self.dialect != "sqlite":
            # the writer keeps one connection (no ping per batch); a failed batch drops it
            kw.update(pool_pre_ping=True, pool_size=2, max_overflow=2)
        self.engine = create_engine(self._u, connect_args=connect_args, **kw)
        if self.dialect != "sqlite":
            self.lock_engine = create_engine(self._u, connect_args=connect_args, poolclass=NullPool)
        if self.dialect == "mysql":
            for eng in (self.engine, self.lock_engine):
                event.listen(eng, "connect", self._mysql_session)
        if self.dialect == "sqlite":
            sync = "FULL" if self.flush == "sync" else "NORMAL"

            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn, _record):
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA synchronous={sync}")
                cur.execute("PRAGMA busy_timeout=10000")
                cur.close()

    def _mysql_session(self, dbapi_conn, _record) -> None:
        """MariaDB/MySQL session timeouts: lock waits, idle sessions and (MariaDB only)
        transactions left open by a broker that vanished."""
        timeout = max(1, int(self.settings.timeout))
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"SET SESSION innodb_lock_wait_timeout={timeout}, "
                        f"SESSION wait_timeout={max(60, 6 * timeout)}")
            try:
                cur.execute(f"SET SESSION idle_transaction_timeout={timeout}")
            except Exception:
                pass  # MySQL has no such variable
        finally:
            cur.close()

    def insert_ignore(self, table):
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            return pg_insert(table).on_conflict_do_nothing()
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as lite_insert
            return lite_insert(table).on_conflict_do_nothing()
        return insert(table).prefix_with("IGNORE")

    # ------------------------------------------------------------- life cycle
    async def open(self) -> None:
        waiting = False
        while True:
            try:
                await self._open_once()
                return
            except StoreLocked as exc:
                if not self.settings.standby:
                    raise
                if not waiting:
                    log.warning("%s; standby: waiting for the lease", exc)
                    waiting = True
                await trio.sleep(self.settings.renew)

    async def _open_once(self) -> None:
        try:
            await trio.to_thread.run_sync(self._open_sync)
        except StoreUnavailable:
            raise
        except (SQLAlchemyError, OSError) as exc:
            self._dispose()
            raise StoreUnavailable(f"cannot open store {self.safe_url}: {_reason(exc)}") from None
        except ModuleNotFoundError as exc:
            raise StoreUnavailable(
                f"cannot open store {self.safe_url}: driver missing ({exc.name})") from None

    def _open_sync(self) -> None:
        if self.dialect == "sqlite" and not self.sqlite_path:
            raise StoreUnavailable(f"cannot open store {self.safe_url}: an in-memory SQLite "
                                   f"database is not a store (use sqlite:///path/to/file.db)")
        if self.sqlite_path:
            d = os.path.dirname(self.sqlite_path)
            if d and not os.path.isdir(d):
                raise StoreUnavailable(f"cannot open store {self.safe_url}: directory {d} does not exist")
        self._make_engines()
        S.metadata.create_all(self.engine)
        with self.engine.begin() as c:
            S.migrate(c)
        self._lock = _Lock(self)
        try:
            self._lock.acquire()
            self._load()
            # loading a large backlog's index can take most of a lease: extend it now, so
            # the broker does not start serving with a lease about to run out
            if not self._lock.renew():
                raise StoreLocked(f"store {self.safe_url}: {self._lease_error()}")
        except BaseException:
            self._lock.release()
            self._dispose()
            raise

    def _load(self) -> None:
        """Definitions, every queue's entry index, and the messages of the first
        ``page_window`` entries of each queue (the rest is read in pages: sql_paged.py)."""
        with self.engine.begin() as c:
            xs = [ExchangeDef(D(r.vhost), D(r.name), r.type, True, r.auto_delete, r.internal,
                              decode_arguments(r.arguments))
                  for r in c.execute(select(S.exchanges))]
            qrows = list(c.execute(select(S.queues).order_by(S.queues.c.qid)))
            qs = [QueueDef(D(r.vhost), D(r.name), True, r.auto_delete, decode_arguments(r.arguments))
                  for r in qrows]
            by_qid = {r.qid: (D(r.vhost), D(r.name)) for r in qrows}
            bs = [BindingDef(D(r.vhost), D(r.source), r.destination_kind, D(r.destination),
                             D(r.routing_key), decode_arguments(r.arguments))
                  for r in c.execute(select(S.bindings))]
            index, orphans = self._load_index(c, by_qid)
            for qid in orphans:
                c.execute(delete(S.entries).where(S.entries.c.qid == qid))
            window = self.settings.page_window
            messages = self._read_messages(
                c, {mid for ix in index.values() for mid in ix.mids[:window]})
            max_id = c.execute(select(func.max(S.msgs.c.id))).scalar() or 0
            meta = [(r.kind, D(r.name), r.value, r.seq)
                    for r in c.execute(select(S.meta).order_by(S.meta.c.seq))]
        self._next_qid = max(by_qid, default=0) + 1
        self._meta_seq = max((m[3] for m in meta), default=0)
        self._loaded_meta = [m[:3] for m in meta]
        self._loaded = (xs, qs, bs, index, messages, by_qid, max_id)

    # in the primary key's order, without touching the messages
    _INDEX_SQL = ("SELECT qid, seq, message_id, expires_at, priority, delivered, size, "
                  "deliveries FROM triomq_entries ORDER BY qid, seq")

    def _load_index(self, c, by_qid: dict) -> tuple[dict, set]:
        """qid -> _QueueIndex of its entries in seq order, and the qids without a queue.
        Streamed through the driver's own cursor in chunks turned into columns at C
        speed: a million entries cost their arrays (~30 bytes each), not row objects."""
        index: dict[int, _QueueIndex] = {}
        orphans: set[int] = set()
        progress = self.progress
        phase = progress.phase("sql index", unit="entries") if progress is not None else None
        if self.dialect == "postgresql":
            self._load_index_pg(c, by_qid, index, orphans, phase)
        for rows in (() if self.dialect == "postgresql" else self._stream(c, self._INDEX_SQL)):
            if phase is not None:
                phase.advance(len(rows))
            cols = list(zip(*rows, strict=True))
            qids = cols[0]
            start = 0
            while start < len(qids):
                qid = qids[start]
                end = start + 1
                if qids[-1] == qid:
                    end = len(qids)
                else:
                    while qids[end] == qid:
                        end += 1
                if qid in by_qid:
                    ix = index.get(qid)
                    if ix is None:
                        ix = index[qid] = _QueueIndex()
                    ix.extend(cols, start, end)
                else:
                    orphans.add(qid)
                start = end
        for ix in index.values():
            if ix.unsized:  # rows an older version wrote: measured from their messages
                at = {ix.mids[i]: i for i in ix.unsized}
                for part in _chunks(list(at), 5000):
                    for mid, message in self._read_messages(c, part).items():
                        ix.blens[at[mid]] = len(message.body)
                ix.unsized = []
        if phase is not None:
            phase.finish()
        return index, orphans

    # PostgreSQL: the same columns as one binary COPY of fixed-width rows (no NULL: NaN
    # expiry, size -1 for an older row, the delivery count computed as ``extend`` does),
    # turned into columns by numpy -- no Python object per row, about 3x faster at 1M
    _INDEX_COPY = ("COPY (SELECT qid, seq, message_id, COALESCE(expires_at, 'NaN'::float8), "
                   "priority::int8, COALESCE(size, -1), (CASE WHEN deliveries > 0 THEN "
                   "LEAST(deliveries, 255) WHEN delivered THEN 1 ELSE 0 END)::int8 "
                   "FROM triomq_entries ORDER BY qid, seq) TO STDOUT (FORMAT BINARY)")
    _COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

    def _load_index_pg(self, c, by_qid: dict, index: dict, orphans: set, phase) -> None:
        from itertools import pairwise

        import numpy as np

        for qids, cols in self._pg_index_chunks(c):
            if phase is not None:
                phase.advance(len(qids))
            bounds = [0, *(np.flatnonzero(qids[1:] != qids[:-1]) + 1).tolist(), len(qids)]
            for start, end in pairwise(bounds):
                qid = int(qids[start])
                if qid in by_qid:
                    ix = index.get(qid)
                    if ix is None:
                        ix = index[qid] = _QueueIndex()
                    ix.extend_arrays(cols, start, end)
                else:
                    orphans.add(qid)

    def _pg_index_chunks(self, c, chunk_bytes: int = 8 << 20):
        """(qids, [seqs, mids, exps, prios, sizes, flags]) numpy columns of ``_INDEX_COPY``,
        a few MB of rows at a time."""
        import numpy as np

        fields = [("n", ">i2")]
        for name, code in (("qid", ">i8"), ("seq", ">i8"), ("mid", ">i8"), ("exp", ">f8"),
                           ("prio", ">i8"), ("size", ">i8"), ("flags", ">i8")):
            fields += [("len_" + name, ">i4"), (name, code)]
        row = np.dtype(fields)  # packed: 2 + 7 * 12 = 86 bytes

        def parse(buf: bytearray, at: int):
            k = (len(buf) - at) // row.itemsize
            rec = np.frombuffer(buf, row, count=k, offset=at)
            if k and (bool((rec["n"] != 7).any())
                      or any(bool((rec["len_" + f] != 8).any()) for f in ("qid", "seq", "mid",
                                                                          "exp", "prio", "size",
                                                                          "flags"))):
                raise ValueError("unexpected row in the entry index's binary COPY")
            out = (rec["qid"].astype(np.int64),
                   [rec["seq"].astype(np.int64), rec["mid"].astype(np.int64),
                    rec["exp"].astype(np.float64), rec["prio"].astype(np.int64),
                    rec["size"].astype(np.int64), rec["flags"].astype(np.int64)])
            del rec
            return out, at + k * row.itemsize

        cur = c.connection.dbapi_connection.cursor()
        buf = bytearray()
        at = -1  # where rows start once the header is read
        try:
            with cur.copy(self._INDEX_COPY) as copy:
                for data in copy:
                    buf += data
                    if at < 0 and len(buf) >= 19:
                        if bytes(buf[:11]) != self._COPY_SIGNATURE:
                            raise ValueError("not a binary COPY")
                        at = 19 + int.from_bytes(buf[15:19], "big")
                    if at >= 0 and len(buf) - at >= chunk_bytes:
                        out, used = parse(buf, at)
                        del buf[:used]
                        at = 0
                        yield out
            if at >= 0 and len(buf) - at > 2:
                out, used = parse(buf, at)
                if len(out[0]):
                    yield out
        finally:
            cur.close()

    def _stream(self, c, sql: str, size: int = 20_000):
        """Chunks of rows of ``sql`` from a server-side cursor (PostgreSQL, MariaDB) or
        SQLite's lazy one, within ``c``'s transaction."""
        raw = c.connection.dbapi_connection
        if self.dialect == "postgresql":
            cur = raw.cursor(name="triomq_index")
            cur.itersize = size
        elif self.dialect == "mysql":
            import pymysql.cursors
            cur = raw.cursor(pymysql.cursors.SSCursor)
        else:
            cur = raw.cursor()
        try:
            cur.execute(sql)
            while rows := cur.fetchmany(size):
                yield rows
        finally:
            cur.close()

    @staticmethod
    def _read_messages(c, mids) -> dict:
        """id -> Message for the ids ``mids`` (those still stored)."""
        messages = {}
        for part in _chunks(sorted(mids)):
            for mid, body in c.execute(select(S.msgs.c.id, S.msgs.c.body).where(S.msgs.c.id.in_(part))):
                messages[mid] = decode_message(bytes(body))
        return messages

    def recover(self, broker) -> None:
        self.broker = broker
        if self._loaded is None:
            return
        xs, qs, bs, index, messages, by_qid, max_id = self._loaded
        self._loaded = None
        restore_meta(broker, self._loaded_meta)
        self._loaded_meta = []
        restore(broker, xs, qs, bs, [], {})
        window = self.settings.page_window
        total = paged = 0
        for qid, (vname, qname) in by_qid.items():
            vhost = broker.vhosts.get(vname)
            q = vhost.queues.get(qname) if vhost is not None else None
            if q is None or not q.durable:
                continue
            self._qids[(vname, qname)] = (q, qid)
            self._queue_of[qid] = q
            ix = index.get(qid)
            if ix is None:
                continue
            n = len(ix.seqs)
            k = min(n, window) if q.restores_paged else n
            if k > window:  # a queue that cannot page (priority, a variant): all of it now
                # (before the listeners open: nothing else waits on the event loop yet)
                with self.engine.connect() as c:
                    messages.update(self._read_messages(c, ix.mids[window:]))
            wall_minus_mono = time.time() - vhost.timers.now()
            entries = [entry for i in range(k)
                       if (entry := ix.entry(q, i, messages, wall_minus_mono)) is not None]
            rest = ix.columns(k) if k < n else None
            total += q.restore(entries, paged=rest)
            paged += n - k
        set_message_id_floor(max_id)
        log.info("store %s: recovered %d messages (%d left in the database, read as consumers "
                 "drain)", self.safe_url, total, paged)

    async def run(self) -> None:
        """Writer, lease renewer and lease guard. Raises StoreDeposed once another broker
        took the lease over (the broker then stops: its memory is no longer the truth)."""
        async with trio.open_nursery() as nursery:
            if self.dialect != "sqlite":
                nursery.start_soon(self._renewer)
                nursery.start_soon(self._guard_lease)
            nursery.start_soon(self._pager)
            nursery.start_soon(self._collect_orphans)
            await self._writer()

    # ------------------------------------------------------------- paging
    def paged_ready(self, queue, entries):
        """The ready store of a durable queue (``PAGES_MESSAGES``): FIFO queues page; a
        priority queue keeps its messages in memory."""
        if queue.opts.max_priority:
            ready = PriorityReady(queue.opts.max_priority, queue.opts.two_level_priority)
            for entry in entries:
                ready.append(entry)
            return ready
        return SQLPagedFifo(self, queue, entries, page=self.settings.page_size,
                            window=self.settings.page_window)

    def _page_out(self, batch: _Batch) -> None:
        """After a commit: a queue holding a backlog behind its window may drop the
        messages it just got written from memory (``SQLPagedFifo.stored_up_to``)."""
        for qid, seqs in batch.enq.items():
            q = self._queue_of.get(qid)
            if q is not None and isinstance(q.ready, SQLPagedFifo):
                q.ready.stored_up_to(max(seqs))

    def want_page(self, ready) -> None:
        """``ready`` (an SQLPagedFifo) wants its next page read (once until it arrives)."""
        self._wanted.append(ready)
        self._page_wanted.set()

    def forget_unread(self, queue, seqs, mids) -> None:
        """A purge dropped entries still only in the database: delete them there."""
        qid = self._qid(queue)
        if qid is None:
            return
        b = self._batch
        s = b.rm.get(qid)
        if s is None:
            s = b.rm[qid] = set()
        s.update(seqs)
        b.rm_msgs.update(mids)
        self._poke()

    async def _pager(self) -> None:
        """Read pages of the backlogs left in the database, one at a time, in a worker
        thread; a failed read is retried (the queue waits, nothing is lost)."""
        while True:
            await self._page_wanted.wait()
            self._page_wanted = trio.Event()
            while self._wanted:
                ready = self._wanted.popleft()
                gen, queue, _seqs, mids = ready.next_page()
                if queue.deleted:
                    continue
                try:
                    messages = await trio.to_thread.run_sync(self._read_page, mids)
                except (SQLAlchemyError, OSError) as exc:
                    log.warning("store %s: cannot read queue %r's messages (%s); retrying",
                                self.safe_url, queue.name, _reason(exc))
                    self._wanted.append(ready)
                    await trio.sleep(PAGER_RETRY)
                    continue
                wall_minus_mono = time.time() - queue.vhost.timers.now()
                if ready.page_arrived(gen, messages, wall_minus_mono) and not queue.deleted:
                    queue.dispatch()

    async def _collect_orphans(self) -> None:
        """Once, after start-up: delete messages whose last entry went away without them
        (a queue delete chunks its message GC; one transaction per batch otherwise). Off the
        start-up path -- an anti-join over a million rows takes seconds -- and in id ranges,
        so no statement holds locks for long; an unreferenced row is only wasted space."""
        await trio.sleep(ORPHAN_GC_DELAY)
        try:
            removed = await trio.to_thread.run_sync(self._collect_orphans_sync)
        except (SQLAlchemyError, OSError) as exc:
            log.warning("store %s: orphaned message clean-up failed (%s); retried at the next "
                        "start", self.safe_url, _reason(exc))
            return
        if removed:
            log.info("store %s: removed %d orphaned messages", self.safe_url, removed)

    def _collect_orphans_sync(self) -> int:
        M, E = S.msgs, S.entries
        with self.engine.connect() as c:
            top = c.execute(select(func.max(M.c.id))).scalar() or 0
        removed = 0
        lo = 0
        while lo <= top:
            with self.engine.connect() as c:  # ranges of ORPHAN_GC_RANGE stored ids
                hi = c.execute(select(M.c.id).where(M.c.id >= lo).order_by(M.c.id)
                               .offset(ORPHAN_GC_RANGE).limit(1)).scalar() or top + 1
            with self.engine.begin() as c:
                removed += c.execute(delete(M).where(
                    M.c.id >= lo, M.c.id < hi,
                    ~exists().where(E.c.message_id == M.c.id))).rowcount or 0
            lo = hi
        return removed

    def _read_page(self, mids) -> dict:
        with self.engine.connect() as c:
            return self._read_messages(c, mids)

    async def _guard_lease(self) -> None:
        """Fence the broker (``broker.on_store_fenced``: it stops serving) the moment the
        lease runs out by this process's clock, which is before a standby can take it, and
        lift the fence when it is renewed (still ours: nobody served meanwhile)."""
        fenced = False
        while True:
            left = self._lock.valid_until - time.monotonic()
            if self._lock.deposed:
                raise StoreDeposed(f"store {self.safe_url}: {self._lease_error()}; this broker "
                                   f"stopped serving (restart it, e.g. with --sql-standby)")
            if (left <= 0) != fenced:
                fenced = left <= 0
                if fenced:
                    log.error("store %s: lease ran out (%s): not serving until it is renewed",
                              self.safe_url, self._lock.last_error or "not renewed in time")
                else:
                    log.warning("store %s: lease renewed: serving again", self.safe_url)
                if self.broker is not None:
                    self.broker.on_store_fenced(self, fenced)
            with trio.move_on_after(left if left > 0 else math.inf):
                await self._lease_checked.wait()
            self._lease_checked = trio.Event()

    # ------------------------------------------------------------------ lease
    async def _renewer(self) -> None:
        """Renews the lease every ``renew`` seconds on its own short connection, so a slow
        or silent write never delays it (and a silent database lets it run out)."""
        lost = False
        while True:
            await trio.sleep(self.settings.renew)
            if self._lock.deposed:
                self._lease_checked.set()
                return
            ok = await self._renew()
            self._lease_checked.set()
            if ok and lost:
                log.warning("store %s: lease renewed again", self.safe_url)
            elif not ok and not lost:
                log.error("store %s: lease not renewed (%s); writes stop when it runs out "
                          "in %.1f s", self.safe_url, self._lock.last_error,
                          max(0.0, self._lock.valid_until - time.monotonic()))
            lost = not ok

    async def _renew(self) -> bool:
        """One renewal in a worker thread, abandoned after ``timeout`` (at most one runs)."""
        if self._renewing:
            return self._lock.valid()
        self._renewing = True
        with trio.move_on_after(self.settings.timeout):
            return await trio.to_thread.run_sync(self._renew_sync, abandon_on_cancel=True)
        self._lock.last_error = f"no answer in {self.settings.timeout:g} s"
        return False

    def _renew_sync(self) -> bool:
        try:
            return self._lock.renew()
        except SQLAlchemyError as exc:
            self._lock.last_error = _reason(exc)
            return False
        finally:
            self._renewing = False

    # ----------------------------------------------------------------- writer
    async def _writer(self) -> None:
        backoff = 0.1
        while True:
            if self._down:
                # probe often at first (publishers wait), then every ``retry_max`` seconds
                await trio.sleep(backoff)
                backoff = min(self.settings.retry_max, backoff * 2)
                reconnected = await self._reconnect()
                self._lease_checked.set()  # it renewed the lease, or found it taken over
                if not reconnected:
                    # What waits in the batch came before the failure was known: enqueued,
                    # maybe delivered already, so in doubt -- never nacked; it waits for
                    # the retry (what comes while down is nacked at once: when_durable).
                    continue
                self._down = False
                backoff = 0.1
                log.warning("store %s: database reachable again, resuming writes", self.safe_url)
                if self.broker is not None:
                    self.broker.on_store_recovered(self)
            elif self.flush == "sync":
                with trio.move_on_after(self.settings.renew):
                    await self._wake.wait()
            else:
                await trio.sleep(self.async_interval)
            self._wake = trio.Event()
            if self._batch.empty() and not self._batch.callbacks and not self._retry:
                if not self._down and not self._lock.valid():
                    self._go_down(self._lease_error())
                continue
            await self._commit_once()

    def _lease_error(self) -> str:
        if self._lock.deposed:
            return f"lease taken over by another broker ({self._lock.last_error})"
        return f"store lease expired, not renewed in time ({self._lock.last_error})"

    async def _commit_once(self) -> bool:
        """Write the backlog (``_retry``), then the current batch, each in a transaction
        of its own; False once one fails (the rest waits for the next attempt)."""
        while self._retry:
            b = self._retry.pop(0)
            if not await self._commit(b):
                if not b.empty():
                    self._retry.insert(0, b)
                return False
        batch = self._batch
        self._batch = _Batch()
        self._held = []
        if await self._commit(batch):
            return True
        if not batch.empty():
            self._retry.append(batch)
        return False

    async def _commit(self, batch: _Batch) -> bool:
        callbacks, batch.callbacks = batch.callbacks, []
        self._inflight = True
        error: str | None = None
        try:
            if not self._lock.valid():
                error = self._lease_error()
            else:
                timeout = self.settings.timeout
                # shielded: a clean stop lets the write in flight finish (or time out), then
                # close() writes the rest; abandoning it would roll it back
                with trio.CancelScope(shield=True), trio.move_on_after(timeout) as scope:
                    error = await trio.to_thread.run_sync(self._write, batch, self._gen,
                                                          abandon_on_cancel=True)
                if scope.cancelled_caught:
                    error = f"no answer from the database in {timeout:g} s"
                    self._abandon_conn()
                elif error is None and not self._lock.valid():
                    # committed, but maybe after a standby took over: never confirmed
                    error = self._lease_error() + " during the write"
        finally:
            self._inflight = False
        if error is None:
            self.batches += 1
            self._unwritten -= batch.nbytes
            self._check_backlog()
            if batch.rejected or batch.rejected_msgs:
                callbacks = self._refused(batch, callbacks)
            self._page_out(batch)
            for ok, _fail, _held in callbacks:
                ok()
            return True
        # In doubt: no answer, a dropped connection or a lease that ran out during the
        # write can each hide a commit, so these publishes are neither confirmed nor
        # nacked (a standby may already be delivering them). The broker closes the
        # connections waiting for them; the batch is written again, idempotently, once
        # the database and the lease are back, and its callbacks run then.
        if not batch.empty():
            batch.callbacks = callbacks
        else:
            # only callbacks (their entries went in earlier batches, or were acked and
            # cancelled): as much in doubt, they wait ahead of the current batch's
            self._batch.callbacks[:0] = callbacks
        self._go_down(error)
        return False

    def _refused(self, batch: _Batch, callbacks: list) -> list:
        """After ``_write_apart``: log what the database refused, forget a refused queue's
        id (its next write tries the definition again), nack the publishes of refused
        messages (taken back from their queues). Returns the callbacks to confirm."""
        for op, reason in batch.rejected:
            what = {"x+": "exchange", "q+": "queue", "b+": "binding", "m+": "metadata"}.get(op[0])
            name = op[1].name if op[0] in ("x+", "q+") else op[2] if op[0] == "m+" else op[1]
            log.error("store %s: the database refused %s %r (%s): it is NOT stored and will not "
                      "survive a restart", self.safe_url, what or op[0], name, reason)
            if op[0] == "q+":
                qd, qid = op[1], op[2]
                have = self._qids.get((qd.vhost, qd.name))
                if have is not None and have[1] == qid:
                    del self._qids[(qd.vhost, qd.name)]
                    self._queue_of.pop(qid, None)
        if not batch.rejected_msgs:
            return callbacks
        log.error("store %s: the database refused %d messages: their publishes are nacked",
                  self.safe_url, len(batch.rejected_msgs))
        keep: list = []
        nack: list = []
        for cb in callbacks:
            refused = any(e.message.id in batch.rejected_msgs for _q, e in cb[2])
            (nack if refused and cb[1] is not None else keep).append(cb)
        self._fail(nack)
        return keep

    def _go_down(self, error: str) -> None:
        if not self._down:
            log.error("store %s: database lost (%s); publishes in flight are in doubt (their "
                      "connections are closed), new ones are nacked and never stored until "
                      "it is back", self.safe_url, error)
        self._down = True
        if self.broker is not None:
            self.broker.on_store_failure(self, error)

    def _fail(self, callbacks: list) -> None:
        """Nack what waited (on_failure) after taking its entries back from the queues
        (a nack means "not stored, not delivered from now on"); a callback without
        ``on_failure`` waits for the retry."""
        by_queue: dict = {}
        nacks = []
        for ok, fail, held in callbacks:
            if fail is None:
                self._batch.callbacks.append((ok, None, ()))
                continue
            for q, e in held:
                by_queue.setdefault(q, []).append(e)
            nacks.append(fail)
        self._withdraw(by_queue)
        for fail in nacks:
            fail()

    @staticmethod
    def _withdraw(by_queue: dict) -> None:
        for q, entries in by_queue.items():
            if not q.deleted:
                q.withdraw(entries)

    async def _reconnect(self) -> bool:
        with trio.move_on_after(self.settings.timeout):
            return await trio.to_thread.run_sync(self._reconnect_sync, abandon_on_cancel=True)
        return False

    def _reconnect_sync(self) -> bool:
        """The database answers and the lease is (still, or again) ours."""
        if self._lock.deposed:
            return False
        try:
            with self.engine.connect() as c:
                c.execute(text("SELECT 1"))
            if self.dialect == "sqlite":
                return True
            if self._lock.renew():
                return True
        except SQLAlchemyError as exc:
            self._lock.last_error = _reason(exc)
            return False
        log.error("%s; this broker no longer writes and must be restarted",
                  self._lock._locked_message())
        return False

    async def close(self) -> None:
        if self.engine is None:
            return
        try:
            if not self._down and (not self._batch.empty() or self._batch.callbacks or self._retry):
                await self._commit_once()
        finally:
            await trio.to_thread.run_sync(self._close_sync)

    def _close_sync(self) -> None:
        self._drop_conn()
        log.info("store %s closed: %d batches committed, %d rows written", self.safe_url,
                 self.batches, self.rows_written)
        if self._lock is not None:
            self._lock.release()
        self._dispose()

    def _dispose(self) -> None:
        for eng in (self.engine, self.lock_engine):
            if eng is not None:
                try:
                    eng.dispose()
                except Exception:
                    pass
        self.engine = self.lock_engine = None

    # ------------------------------------------------------ worker (thread)
    def _write(self, batch: _Batch, gen: int):
        """One transaction for ``batch``; returns None or the error text. ``gen`` changes
        when the trio side gave up on this call: its connection is then dropped here."""
        if batch.empty():
            return None
        c = self._conn
        try:
            if c is not None and time.monotonic() - self._conn_used > IDLE_RECHECK:
                self._conn = None  # may have been closed by the server: take a pinged one
                c.close()
                c = None
            if c is None:
                c = self.engine.connect()
                if gen == self._gen:
                    self._conn = c
            try:
                with c.begin():
                    self._write_batch(c, batch)
            except (SQLAlchemyError, ValueError, TypeError) as exc:
                if not _refused_record(exc):
                    raise
                log.warning("store %s: the database refused a record (%s): writing the batch "
                            "record by record", self.safe_url, _reason(exc))
                self._drop(c)
                c = None
                self._write_apart(batch)
            self._conn_used = time.monotonic()
            # a big statement leaves the driver's buffers that big for the connection's life
            if c is not None and (gen != self._gen or batch.nbytes >= self.settings.batch_bytes // 2):
                self._drop(c)
            return None
        except (SQLAlchemyError, ValueError, TypeError) as exc:
            self._drop(c)
            return _reason(exc)

    def _write_apart(self, b: _Batch) -> None:
        """``b`` failed for a value of one of its records: write its definitions, then its
        messages (each with its entries), in halves that are halved again while they fail
        (about 2·log2(n) transactions for one bad record among n, in order), then the
        rest, so only what the database refuses is left out (``b.rejected``,
        ``b.rejected_msgs``; the trio side nacks those publishes). Idempotent, as a retry
        is; a failure that is not a refused record is raised (an outage, as any other)."""
        def attempt(part: _Batch) -> str | None:
            try:
                with self.engine.begin() as c:
                    self._write_batch(c, part)
                return None
            except (SQLAlchemyError, ValueError, TypeError) as exc:
                if not _refused_record(exc):
                    raise
                return _reason(exc)

        def halves(items: list, make, refused: list) -> None:
            if not items:
                return
            reason = attempt(make(items))
            if reason is None:
                return
            if len(items) == 1:
                refused.append((items[0], reason))
                return
            half = len(items) // 2
            halves(items[:half], make, refused)
            halves(items[half:], make, refused)

        def defs_part(ops: list) -> _Batch:
            part = _Batch()
            part.defs = ops
            return part

        # snapshots: the trio side may cancel entries of a batch waiting for a retry
        defs = list(b.defs)
        refused_defs: list = []
        halves(defs, defs_part, refused_defs)
        b.rejected.extend(refused_defs)
        tried = {id(op) for op in defs}
        b.defs = [op for op in b.defs if id(op) not in tried]  # written or refused: never again
        # a refused queue has no row: its entries would be orphans, so their messages are out
        lost = {op[2] for op, _ in refused_defs if op[0] == "q+"}
        enq = {qid: dict(seqs) for qid, seqs in list(b.enq.items())}
        msgs = dict(b.msgs)
        by_mid: dict = {}  # message id -> {qid: {seq: row}}
        for qid, seqs in enq.items():
            for seq, r in seqs.items():
                by_mid.setdefault(r[0], {}).setdefault(qid, {})[seq] = r
        doomed = {mid for mid, qs in by_mid.items() if lost.intersection(qs)}
        b.rejected_msgs.update(doomed)

        def msgs_part(mids: list) -> _Batch:
            part = _Batch()
            for mid in mids:
                part.msgs[mid] = msgs[mid]
                for qid, seqs in by_mid.get(mid, {}).items():
                    part.enq.setdefault(qid, {}).update(seqs)
            return part

        refused_msgs: list = []
        halves([mid for mid in msgs if mid not in doomed], msgs_part, refused_msgs)
        b.rejected_msgs.update(mid for mid, _ in refused_msgs)
        rest = _Batch()  # entries of messages an earlier batch wrote, deliveries, removals
        for mid, qs in by_mid.items():
            if mid not in msgs and mid not in doomed:
                for qid, seqs in qs.items():
                    rest.enq.setdefault(qid, {}).update(seqs)
        rest.dlv, rest.rm, rest.rm_msgs = b.dlv, b.rm, b.rm_msgs
        for mid in msgs:
            b.msgs.pop(mid, None)
        for qs in by_mid.values():
            for qid, seqs in qs.items():
                left = b.enq.get(qid)
                if left is not None:
                    for seq in seqs:
                        left.pop(seq, None)
                    if not left:
                        b.enq.pop(qid, None)
        # ids and numbers only, nothing to refuse: a failure here is an outage (raised)
        with self.engine.begin() as c:
            self._write_batch(c, rest)
        b.dlv, b.rm, b.rm_msgs = {}, {}, set()

    def _drop(self, c) -> None:
        if c is None:
            return
        try:
            c.invalidate()
            c.close()
        except Exception:
            pass
        if self._conn is c:
            self._conn = None

    def _drop_conn(self) -> None:
        self._drop(self._conn)

    def _abandon_conn(self) -> None:
        """The writer thread is stuck (silent database): reset its socket, forget it."""
        self._gen += 1
        c, self._conn = self._conn, None
        if c is not None:
            _abort_socket(c)

    def _write_batch(self, c, b: _Batch) -> None:
        E = S.entries
        rows = 0
        for op in b.defs:
            rows += self._write_def(c, op)
        if b.msgs:
            params = [(mid, encode_message(v[0])) for mid, v in b.msgs.items()]
            self._bulk_insert(c, "msgs", params)
            rows += len(params)
        if b.enq:
            erows = [(qid, seq, r[0], r[1], r[2], r[3], r[4], r[5])
                     for qid, seqs in b.enq.items() for seq, r in seqs.items()]
            if erows:
                self._bulk_insert(c, "entries", erows)
                rows += len(erows)
        pg = self.dialect == "postgresql"
        for qid, counts in b.dlv.items():
            by_count: dict[int, list[int]] = {}  # nearly always one group: first deliveries
            for seq, n in counts.items():
                by_count.setdefault(n, []).append(seq)
            for n, seqs in by_count.items():
                if pg:
                    c.exec_driver_sql("UPDATE triomq_entries SET delivered = true, deliveries = %s "
                                      "WHERE qid = %s AND seq = ANY(%s)", (n, qid, seqs))
                    continue
                for part in _chunks(seqs):
                    c.execute(update(E).where(E.c.qid == qid, E.c.seq.in_(part))
                              .values(delivered=True, deliveries=n))
        for qid, seqs in b.rm.items():
            rows += len(seqs)
            if pg:
                c.exec_driver_sql("DELETE FROM triomq_entries WHERE qid = %s AND seq = ANY(%s)",
                                  (qid, list(seqs)))
                continue
            for part in _chunks(seqs):
                c.execute(delete(E).where(E.c.qid == qid, E.c.seq.in_(part)))
        if b.rm_msgs:
            self._gc_messages(c, b.rm_msgs)
        self.rows_written += rows

    # Vendor "adapters" for the two hot inserts, as ActiveMQ has per-database JDBC adapters:
    # PostgreSQL inserts a whole batch as arrays (unnest), MariaDB/MySQL get one multi-row
    # INSERT IGNORE from pymysql's executemany, SQLite uses sqlite3's executemany.
    _INSERTS: ClassVar[dict[tuple[str, str], str]] = {
        ("postgresql", "msgs"):
            "INSERT INTO triomq_msgs (id, body) SELECT * FROM unnest(%s::bigint[], %s::bytea[]) "
            "ON CONFLICT DO NOTHING",
        ("postgresql", "entries"):
            "INSERT INTO triomq_entries (qid, seq, message_id, expires_at, priority, delivered, "
            "size, deliveries) SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], "
            "%s::double precision[], %s::smallint[], %s::boolean[], %s::bigint[], %s::integer[]) "
            "ON CONFLICT DO NOTHING",
        ("mysql", "msgs"): "INSERT IGNORE INTO triomq_msgs (id, body) VALUES (%s, %s)",
        ("mysql", "entries"):
            "INSERT IGNORE INTO triomq_entries (qid, seq, message_id, expires_at, priority, "
            "delivered, size, deliveries) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
        ("sqlite", "msgs"): "INSERT OR IGNORE INTO triomq_msgs (id, body) VALUES (?, ?)",
        ("sqlite", "entries"):
            "INSERT OR IGNORE INTO triomq_entries (qid, seq, message_id, expires_at, priority, "
            "delivered, size, deliveries) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    }

    def _bulk_insert(self, c, what: str, rows: list) -> None:
        sql = self._INSERTS.get((self.dialect, what))
        if sql is None:  # another SQLAlchemy dialect: portable Core executemany
            table = S.msgs if what == "msgs" else S.entries
            names = [col.name for col in table.columns]
            c.execute(self.insert_ignore(table), [dict(zip(names, r, strict=True)) for r in rows])
            return
        if self.dialect == "postgresql":
            for part in _chunks(rows, 5000):
                c.exec_driver_sql(sql, tuple(list(col) for col in zip(*part, strict=True)))
        else:
            c.exec_driver_sql(sql, rows)

    def _gc_messages(self, c, ids) -> None:
        M = S.msgs
        for part in _chunks(ids):
            c.execute(delete(M).where(M.c.id.in_(part),
                                      ~exists().where(S.entries.c.message_id == M.c.id)))

    def _write_def(self, c, op) -> int:
        kind = op[0]
        if kind == "x+":
            xd = op[1]
            vhost, name = N(xd.vhost), N(xd.name)
            c.execute(delete(S.exchanges).where(S.exchanges.c.vhost == vhost,
                                                S.exchanges.c.name == name))
            c.execute(insert(S.exchanges).values(vhost=vhost, name=name, type=xd.type,
                                                 auto_delete=xd.auto_delete, internal=xd.internal,
                                                 arguments=encode_arguments(xd.arguments)))
        elif kind == "x-":
            vhost, name = N(op[1]), N(op[2])
            B = S.bindings
            c.execute(delete(S.exchanges).where(S.exchanges.c.vhost == vhost, S.exchanges.c.name == name))
            c.execute(delete(B).where(B.c.vhost == vhost, B.c.source == name))
            c.execute(delete(B).where(B.c.vhost == vhost, B.c.destination_kind == "exchange",
                                      B.c.destination == name))
        elif kind == "q+":
            qd, qid = op[1], op[2]
            vhost, name = N(qd.vhost), N(qd.name)
            Q = S.queues
            c.execute(delete(Q).where(Q.c.vhost == vhost, Q.c.name == name))
            c.execute(insert(Q).values(qid=qid, vhost=vhost, name=name,
                                       auto_delete=qd.auto_delete,
                                       arguments=encode_arguments(qd.arguments)))
        elif kind == "q-":
            vhost, name, qid = N(op[1]), N(op[2]), op[3]
            E, Q, B = S.entries, S.queues, S.bindings
            ids = [r[0] for r in c.execute(select(E.c.message_id).where(E.c.qid == qid).distinct())]
            c.execute(delete(E).where(E.c.qid == qid))
            c.execute(delete(Q).where(Q.c.qid == qid))
            c.execute(delete(B).where(B.c.vhost == vhost, B.c.destination_kind == "queue",
                                      B.c.destination == name))
            self._gc_messages(c, ids)
        elif kind == "b+":
            bd = op[1]
            key = _binding_key(bd)
            c.execute(delete(S.bindings).where(S.bindings.c.bkey == key))
            c.execute(insert(S.bindings).values(bkey=key, vhost=N(bd.vhost), source=N(bd.source),
                                                destination_kind=bd.destination_kind,
                                                destination=N(bd.destination),
                                                routing_key=N(bd.routing_key),
                                                arguments=encode_arguments(bd.arguments)))
        elif kind == "b-":
            c.execute(delete(S.bindings).where(S.bindings.c.bkey == _binding_key(op[1])))
        elif kind == "m+":
            mkey = _meta_key(op[1], op[2])
            c.execute(delete(S.meta).where(S.meta.c.mkey == mkey))
            c.execute(insert(S.meta).values(mkey=mkey, kind=op[1], name=N(op[2]), value=op[3],
                                            seq=op[4]))
        elif kind == "m-":
            c.execute(delete(S.meta).where(S.meta.c.mkey == _meta_key(op[1], op[2])))
        return 1

    # ------------------------------------------- core hooks (trio thread, buffer only)
    def _poke(self) -> None:
        if self.flush == "sync":
            self._wake.set()

    def save_exchange(self, vhost, exchange) -> None:
        from .records import exchange_def
        self._batch.defs.append(("x+", exchange_def(vhost, exchange)))
        self._poke()

    def delete_exchange(self, vhost, exchange) -> None:
        self._batch.defs.append(("x-", vhost.name, exchange.name))
        self._poke()

    def save_queue(self, vhost, queue) -> None:
        from .records import queue_def
        key = (vhost.name, queue.name)
        have = self._qids.get(key)
        if have is not None and have[0] is queue:
            qid = have[1]
        else:
            qid = self._next_qid
            self._next_qid += 1
            self._qids[key] = (queue, qid)
            self._queue_of[qid] = queue
        self._batch.defs.append(("q+", queue_def(vhost, queue), qid))
        self._poke()

    def delete_queue(self, vhost, queue) -> None:
        key = (vhost.name, queue.name)
        have = self._qids.get(key)
        if have is None or have[0] is not queue:
            return
        del self._qids[key]
        qid = have[1]
        self._queue_of.pop(qid, None)
        b = self._batch
        pending = b.enq.pop(qid, None)
        if pending:
            for r in pending.values():
                self._unref(b, r[0])
        b.dlv.pop(qid, None)
        b.rm.pop(qid, None)
        b.defs.append(("q-", vhost.name, queue.name, qid))
        self._poke()

    def save_binding(self, vhost, binding) -> None:
        from .records import binding_def
        self._batch.defs.append(("b+", binding_def(vhost, binding)))
        self._poke()

    def delete_binding(self, vhost, binding) -> None:
        from .records import binding_def
        self._batch.defs.append(("b-", binding_def(vhost, binding)))
        self._poke()

    def save_meta(self, kind: str, key: str, value: dict) -> None:
        self._meta_seq += 1
        self._batch.defs.append(("m+", kind, key, encode_meta(value), self._meta_seq))
        self._poke()

    def delete_meta(self, kind: str, key: str) -> None:
        self._batch.defs.append(("m-", kind, key))
        self._poke()

    def _qid(self, queue):
        have = self._qids.get((queue.vhost.name, queue.name))
        if have is None or have[0] is not queue:
            return None
        return have[1]

    def enqueue(self, queue, entry) -> None:
        qid = self._qid(queue)
        if qid is None:
            if queue.durable and queue.vhost.queues.get(queue.name) is queue:
                self.save_queue(queue.vhost, queue)
                qid = self._qid(queue)
            else:
                return
        b = self._batch
        message = entry.message
        m = b.msgs.get(message.id)
        if m is None:
            b.msgs[message.id] = [message, 1]
            size = len(message.body)
            b.nbytes += size
            self._unwritten += size
            if b.nbytes >= self.settings.batch_bytes:
                self._seal()
        else:
            m[1] += 1
        expires = None
        if entry.expires_at is not None:
            expires = time.time() + (entry.expires_at - queue.vhost.timers.now())
        seqs = b.enq.get(qid)
        if seqs is None:
            seqs = b.enq[qid] = {}
        seqs[entry.seq] = [message.id, expires, entry.priority, entry.delivery_count > 0,
                           len(message.body), min(entry.delivery_count, DELIVERIES_MAX) or None]
        if not queue.internal:
            self._held.append((queue, entry))  # taken back if the publish is nacked
        self._poke()

    def queue_op(self, queue, op, entry) -> None:
        """As ``Store.queue_op``, but every delivery is written, not only the first: the
        count survives a restart (delivery limits, retry levels), as on the journal."""
        if not entry.message.persistent:
            return
        if op is _ENQUEUE:
            self.enqueue(queue, entry)
        elif op is _DELIVER:
            self.delivered(queue, entry)
        elif op is not _REQUEUE:
            self.remove(queue, entry)

    def delivered(self, queue, entry) -> None:
        qid = self._qid(queue)
        if qid is None:
            return
        b = self._batch
        count = min(entry.delivery_count, DELIVERIES_MAX) or 1
        seqs = b.enq.get(qid)
        if seqs is not None:
            r = seqs.get(entry.seq)
            if r is not None:
                r[3] = True
                r[5] = count
                return
        s = b.dlv.get(qid)
        if s is None:
            s = b.dlv[qid] = {}
        s[entry.seq] = count
        self._poke()

    def remove(self, queue, entry) -> None:
        qid = self._qid(queue)
        if qid is None:
            return
        b = self._batch
        if self._cancel(b, qid, entry.seq):
            return  # never handed to the database: nothing to write at all
        for rb in self._retry:
            # a failed batch (database down) need not keep it; its commit outcome may be
            # unknown, so the delete below is written as well
            self._cancel(rb, qid, entry.seq)
        d = b.dlv.get(qid)
        if d is not None:
            d.pop(entry.seq, None)
        s = b.rm.get(qid)
        if s is None:
            s = b.rm[qid] = set()
        s.add(entry.seq)
        b.rm_msgs.add(entry.message.id)
        self._poke()

    def _cancel(self, b: _Batch, qid: int, seq: int) -> bool:
        seqs = b.enq.get(qid)
        if seqs is None:
            return False
        r = seqs.pop(seq, None)
        if r is None:
            return False
        if not seqs:
            del b.enq[qid]
        self._unref(b, r[0])
        return True

    def _unref(self, b: _Batch, msg_id: int) -> None:
        m = b.msgs.get(msg_id)
        if m is None:
            b.rm_msgs.add(msg_id)  # written by an earlier batch (rare: re-enqueued message)
            return
        m[1] -= 1
        if m[1] <= 0:
            del b.msgs[msg_id]
            size = len(m[0].body)
            b.nbytes -= size
            self._unwritten -= size
            self._check_backlog()

    def _seal(self) -> None:
        """Close a batch that reached ``batch_bytes``: it waits (in ``_retry``) to be written
        in a transaction of its own, so no write, and no encoding buffer, grows past that."""
        self._retry.append(self._batch)
        self._batch = _Batch()
        self._check_backlog()
        self._poke()

    def _check_backlog(self) -> None:
        """Block publishers (a resource alarm, through the broker) while more than
        ``max_unwritten`` body bytes wait for the database; unblock below half of it."""
        limit = self.settings.max_unwritten
        if not self._backlog_full and self._unwritten > limit:
            self._backlog_full = True
            log.warning("store %s: %d MB wait for the database (limit %d MB): publishers are "
                        "blocked", self.safe_url, self._unwritten >> 20, limit >> 20)
        elif self._backlog_full and self._unwritten <= limit // 2:
            self._backlog_full = False
        else:
            return
        if self.broker is not None:
            self.broker.on_store_backlog(self, self._backlog_full)

    def when_durable(self, callback: Callable[[], None],
                     on_failure: Callable[[], None] | None = None) -> None:
        # the entries enqueued since the last call are this publish's (the publish path
        # enqueues, then calls this at once): a nack takes them back from their queues
        held, self._held = self._held, []
        if self._down:
            if on_failure is not None:
                self._fail([(callback, on_failure, held)])
            else:
                self._batch.callbacks.append((callback, None, ()))
            return
        if self.flush == "async":
            callback()
            return
        if not self._inflight and not self._retry and self._batch.empty() \
                and not self._batch.callbacks:
            callback()
            return
        self._batch.callbacks.append((callback, on_failure, held if on_failure else ()))
        self._wake.set()


# ---------------------------------------------------------------- inspection
def inspect(url: str) -> str:
    """Row counts per table and live messages per queue (does not take the lock)."""
    safe = _safe_url(url)
    connect_args = {"connect_timeout": 5} if not url.startswith("sqlite") else {}
    if url.startswith("sqlite"):
        db = make_url(url).database or ""
        if db not in ("", ":memory:") and not os.path.exists(db):
            raise StoreUnavailable(f"cannot open store {safe}: no such file {db}")
    try:
        engine = create_engine(url, connect_args=connect_args, poolclass=NullPool)
        with engine.connect() as c:
            lines = [f"store {safe}"]
            present = set(c.dialect.get_table_names(c))
            for t in S.ALL_TABLES:
                if t.name in present:
                    n = c.execute(select(func.count()).select_from(t)).scalar_one()
                    lines.append(f"  {t.name:<18} {n:>10} rows")
                else:
                    lines.append(f"  {t.name:<18}    (missing)")
            if S.lock.name in present:
                row = c.execute(select(S.lock.c.owner, S.lock.c.acquired_at)
                                .where(S.lock.c.id == 1)).first()
                if row is not None and row.owner:
                    when = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row.acquired_at or 0))
                    lines.append(f"  last lock owner: {row.owner} at {when}")
            if {S.queues.name, S.entries.name, S.msgs.name} <= present:
                Q, E, M = S.queues, S.entries, S.msgs
                stmt = (select(Q.c.vhost, Q.c.name, func.count(E.c.seq),
                               func.coalesce(func.sum(func.length(M.c.body)), 0))
                        .select_from(Q.outerjoin(E, E.c.qid == Q.c.qid)
                                     .outerjoin(M, M.c.id == E.c.message_id))
                        .group_by(Q.c.vhost, Q.c.name).order_by(Q.c.vhost, Q.c.name))
                rows = list(c.execute(stmt))
                lines.append(f"  durable queues: {len(rows)}")
                for vhost, name, n, size in rows:
                    vhost, name = _printable(D(vhost)), _printable(D(name))
                    lines.append(f"    {vhost!s:<8} {name:<40} {n:>8} messages {int(size):>12} bytes")
        engine.dispose()
        return "\n".join(lines)
    except (SQLAlchemyError, OSError) as exc:
        raise StoreUnavailable(f"cannot open store {safe}: {_reason(exc)}") from None
