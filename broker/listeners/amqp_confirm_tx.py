"""The AMQP 0-9-1 channel's publisher confirms and transactions (confirm.select, tx.*);
not the publish itself or settlement (amqp_channel.py)."""
from __future__ import annotations

from collections import deque
from typing import Any

from .. import errors
from ..amqp import spec
from ..publishing import when_all


class ConfirmTxMethods:
    """Mixed into ``Channel``: what these methods use of it."""
    session: Any
    conn: Any
    vhost: Any
    number: int
    closed: bool
    confirm: bool
    tx: list | None
    tx_waits: list | None
    unacked: Any
    stats_confirm: int
    _unconfirmed: deque
    _decided: dict[int, bool]

    def reply(self, method: spec.Method) -> None:
        raise NotImplementedError

    def publish(self, message: Any, mandatory: bool, seq: int = 0, hooks: bool = True) -> None:
        raise NotImplementedError

    def _settle(self, taken: list, ack: bool, requeue: bool = False) -> None:
        raise NotImplementedError

    # ---- confirms ----
    def on_confirm_select(self, m) -> None:
        if self.tx is not None:
            raise errors.precondition_failed("cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self.reply(spec.Confirm.SelectOk())

    def confirm_decided(self, seq: int, ok: bool, external: bool = False) -> None:
        if self.closed:
            return
        self._decided[seq] = ok
        self.session.confirms_pending(self)
        if external:
            self.session.flush_confirms()

    def flush_confirms(self) -> None:
        unconfirmed = self._unconfirmed
        decided = self._decided
        conn = self.conn
        run_end = 0
        run_len = 0
        confirmed = 0
        while unconfirmed and unconfirmed[0] in decided:
            seq = unconfirmed.popleft()
            if decided.pop(seq):
                run_end = seq
                run_len += 1
                continue
            if run_len:
                conn.confirm(self.number, run_end, run_len > 1)
                confirmed += run_len
                run_len = 0
            conn.confirm(self.number, seq, False, ok=False)
        if run_len:
            conn.confirm(self.number, run_end, run_len > 1)
            confirmed += run_len
        self.stats_confirm += confirmed  # basic.acks sent, per message (nacks not counted)

    # ---- transactions ----
    def on_tx_select(self, m) -> None:
        if self.confirm:
            raise errors.precondition_failed("cannot switch from confirm to tx mode")
        if self.tx is None:
            self.tx = []
        self.reply(spec.Tx.SelectOk())

    def on_tx_commit(self, m) -> None:
        if self.tx is None:
            raise errors.precondition_failed("channel is not transactional")
        actions, self.tx = self.tx, []
        self.tx_waits = waits = []
        settled_later = False  # settled messages of a queue whose mirrors must apply that
        try:
            for kind, data in actions:
                if kind == "publish":
                    message, mandatory = data
                    self.publish(message, mandatory)
                    continue
                if kind == "ack":
                    self._settle(data, ack=True)
                elif kind == "reject":
                    self._settle(data, ack=False)
                else:
                    self._settle(data, ack=False, requeue=True)
                settled_later = settled_later or any(item.queue.confirms_later for item in data)
        finally:
            self.tx_waits = None
        store = self.vhost.store
        if settled_later and store is not None:  # commit-ok once the mirrors have it too
            store.settle_barrier(self)
            waits.append(store)
        if not waits:
            self.reply(spec.Tx.CommitOk())
            return
        # as a confirm would: commit-ok once the store has the persistent messages and every
        # in-sync mirror (or forwarding master) has the commit's messages, and each stream
        # its log
        when_all(waits, self._commit_ok, self._commit_failed)

    def _commit_ok(self) -> None:
        if not self.closed:
            self.reply(spec.Tx.CommitOk())
            self.session.wake()

    def _commit_failed(self) -> None:
        if not self.closed:  # neither commit-ok nor a rollback would be true
            self.session.force_close(errors.internal_error(
                "tx.commit: the transaction's messages could not be made durable"))

    def on_tx_rollback(self, m) -> None:
        if self.tx is None:
            raise errors.precondition_failed("channel is not transactional")
        actions, self.tx = self.tx, []
        restored = {}
        for kind, data in actions:
            if kind != "publish":
                for item in data:
                    restored[item.tag] = item
        if restored:  # back in tag order (the older ones of them back in the columns)
            unacked = self.unacked
            merged = dict(dict.items(unacked))
            merged.update(restored)
            dict.clear(unacked)
            aged = unacked.aged
            for tag, item in sorted(merged.items()):
                if aged.live and tag < aged.last_tag:
                    aged.add(item)
                else:
                    dict.__setitem__(unacked, tag, item)
        self.reply(spec.Tx.RollbackOk())
