"""The SQL store's class: construction, engines, open/close and its tasks; its behaviour is in
the mixins of this package (lease, index, loader, paging, batch, commit, hooks). JDBC-style store
on SQLAlchemy 2 (SQLite, PostgreSQL, MariaDB/MySQL).

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

import os
import threading
from typing import Any

import trio
from sqlalchemy import Table, create_engine, event, insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from .. import sql_schema as S
from .. import sql_totals as T
from ..base import StoreUnavailable
from .batch import BatchWriter
from .commit import Committer
from .common import (
    StoreLocked,
    _reason,
    log,
)
from .hooks import CoreHooks
from .index import IndexReader
from .lease import LeaseTasks, _Lock
from .loader import Loader
from .paging import Paging
from .report import inspect


class SQLStore(CoreHooks, Committer, BatchWriter, Paging, Loader, IndexReader, LeaseTasks):
    """Observes durable queues (``Store.queue_op``); keeps each queue's id in ``_qids``.

    Durable FIFO queues page (``PAGES_MESSAGES``): a backlog stays in the database and is
    read ahead in pages as consumers drain it (``sql_paged.SQLPagedFifo``, ``_pager``)."""

    # open_early's thread and what it raised, until open joins it
    _early: tuple[threading.Thread, list[BaseException]] | None = None

    @classmethod
    def inspect(cls, url: str, out: Any = None) -> int | str:
        """For ``python -m broker inspect --store URL`` (broker/persistence/tools.py):
        prints the module-level ``inspect(url)`` report to ``out`` and returns 0;
        without ``out`` returns the report text."""
        report = inspect(url)  # the module function below
        if out is None:
            return report
        print(report, file=out)
        return 0

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
            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA synchronous={sync}")
                cur.execute("PRAGMA busy_timeout=10000")
                cur.close()

    def _mysql_session(self, dbapi_conn: Any, _record: Any) -> None:
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

    def insert_ignore(self, table: Table) -> Any:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            return pg_insert(table).on_conflict_do_nothing()
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as lite_insert
            return lite_insert(table).on_conflict_do_nothing()
        return insert(table).prefix_with("IGNORE")

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

    def open_early(self) -> None:
        """The engine, the schema check and the lease, in a thread started now (not for a
        standby, which waits for the lease in ``open``): ``_open_once`` joins it."""
        if self.settings.standby or self._early is not None:
            return
        failed: list[BaseException] = []

        def connect() -> None:
            try:
                self._connect_sync()
            except BaseException as exc:  # re-raised by the open that joins it
                failed.append(exc)

        thread = threading.Thread(target=connect, name="sql store open", daemon=True)
        self._early = (thread, failed)
        thread.start()

    def _join_early(self) -> bool:
        """Wait for ``open_early``'s thread: True if it connected, its failure raised, False
        if there was none."""
        early, self._early = self._early, None
        if early is None:
            return False
        thread, failed = early
        thread.join()
        if failed:
            raise failed[0]
        return True

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
        if not self._join_early():
            self._connect_sync()
        try:
            self._load()
            # loading a large backlog's index can take most of a lease: extend it now, so
            # the broker does not start serving with a lease about to run out
            if not self._lock.renew():
                raise StoreLocked(f"store {self.safe_url}: {self._lease_error()}")
        except BaseException:
            self._lock.release()
            self._dispose()
            raise

    def _connect_sync(self) -> None:
        """The engine, the schema (created or migrated) and the lease."""
        if self.dialect == "sqlite" and not self.sqlite_path:
            raise StoreUnavailable(f"cannot open store {self.safe_url}: an in-memory SQLite "
                                   f"database is not a store (use sqlite:///path/to/file.db)")
        if self.sqlite_path:
            d = os.path.dirname(self.sqlite_path)
            if d and not os.path.isdir(d):
                raise StoreUnavailable(f"cannot open store {self.safe_url}: directory {d} does not exist")
        self._make_engines()
        with self.engine.begin() as c:
            if not S.up_to_date(c):
                S.metadata.create_all(c)
                S.migrate(c)
            if T.kept(self.dialect) and not T.installed(c, self.dialect):
                T.install(c, self.dialect)
        self._lock = _Lock(self)
        try:
            self._lock.acquire()
        except BaseException:
            self._lock.release()
            self._dispose()
            raise

    async def run(self) -> None:
        """Writer, lease renewer and lease guard. Raises StoreDeposed once another broker
        took the lease over (the broker then stops: its memory is no longer the truth)."""
        async with trio.open_nursery() as nursery:
            if self.dialect != "sqlite":
                nursery.start_soon(self._renewer)
                nursery.start_soon(self._guard_lease)
            nursery.start_soon(self._pager)
            nursery.start_soon(self._load_rest)
            nursery.start_soon(self._collect_orphans)
            await self._writer()

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
