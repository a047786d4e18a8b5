"""The SQL store's lease (ACTIVEMQ_LOCK): taking, renewing and releasing it, and the tasks
that renew it and fence the broker when it runs out. Does not write messages or definitions."""
from __future__ import annotations

import fcntl
import math
import os
import secrets
import socket
import time
from typing import Any

import trio
from sqlalchemy import or_, select, update
from sqlalchemy.exc import SQLAlchemyError

from .. import sql_schema as S
from .common import (
    StoreDeposed,
    StoreLocked,
    _reason,
    log,
)
from .state import SQLStoreState


class _Lock:
    """ACTIVEMQ_LOCK as ActiveMQ's ``LeaseDatabaseLocker``: the row names its ``owner`` (unique
    per store start) and ``expires_at`` (wall clock); the holder renews it every ``renew``
    seconds with short statements (no transaction is ever held open), another broker takes
    it only once it expired, and the holder writes only while its own lease is valid by
    its monotonic clock (``valid()``), which always ends before the stored expiry.
    SQLite uses flock on a side file (one machine: the kernel releases it on death)."""

    def __init__(self, store: SQLStoreState):
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
            owner: str | None = c.execute(select(S.lock.c.owner).where(S.lock.c.id == 1)).scalar()
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


class LeaseTasks(SQLStoreState):
    """The store's lease tasks (``SQLStore.run``): renewer and guard."""

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
            valid: bool = self._lock.valid()
            return valid
        self._renewing = True
        with trio.move_on_after(self.settings.timeout):
            return await trio.to_thread.run_sync(self._renew_sync, abandon_on_cancel=True)
        self._lock.last_error = f"no answer in {self.settings.timeout:g} s"
        return False

    def _renew_sync(self) -> bool:
        try:
            renewed: bool = self._lock.renew()
            return renewed
        except SQLAlchemyError as exc:
            self._lock.last_error = _reason(exc)
            return False
        finally:
            self._renewing = False

    def _lease_error(self) -> str:
        if self._lock.deposed:
            return f"lease taken over by another broker ({self._lock.last_error})"
        return f"store lease expired, not renewed in time ({self._lock.last_error})"
