"""The writer task on the trio thread: commits batches (batch.py) in order, confirms what
they held, and handles an outage (in doubt, nacks, reconnect). Does not encode records."""
from __future__ import annotations

from typing import Any

import trio
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from .common import (
    _reason,
    log,
)
from .state import SQLStoreState, _Batch


class Committer(SQLStoreState):
    """The store's writer loop and what a commit's outcome does."""

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

    def _refused(self, batch: _Batch, callbacks: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
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
        keep: list[tuple[Any, ...]] = []
        nack: list[tuple[Any, ...]] = []
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

    def _fail(self, callbacks: list[tuple[Any, ...]]) -> None:
        """Nack what waited (on_failure) after taking its entries back from the queues
        (a nack means "not stored, not delivered from now on"); a callback without
        ``on_failure`` waits for the retry."""
        by_queue: dict[Any, list[Any]] = {}
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
    def _withdraw(by_queue: dict[Any, list[Any]]) -> None:
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
