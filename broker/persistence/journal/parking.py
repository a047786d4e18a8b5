"""The journal store's ``park`` / ``unpark``: a delivered-unsettled stored entry handed over
as a row of ``parked.Parked`` and rebuilt from it when it is settled (its message's id,
exchange and routing key read from the record's header on first use). Does not decide when
to park (the channel does)."""
from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from ...message import Message
from ...queues.entry import QueueEntry
from .. import journal_format as jf
from ..records import _MSG_HEAD
from .shared import JournalStoreState

if TYPE_CHECKING:
    from .shared import ParkedRow

_BODY = jf.HDR_SIZE + jf.ENQ.size  # where a T_ENQ record's message blob starts


class Parking(JournalStoreState):
    """The store's ``park`` / ``unpark`` (see ``base.Store``)."""

    def park(self, queue: Any, entry: QueueEntry) -> int:
        if type(entry) is not QueueEntry or not entry.loc:
            return -1
        if self._out.get(entry, None) is not queue or queue is None:
            return -1  # not a stored delivery of this queue (held while writes fail, ...)
        qid = self._qids.get(queue)
        m = entry.message
        if qid is None or not (type(m) is Message or type(m) is self._stored):
            return -1
        del self._out[entry]
        if self._fresh_out.pop(entry, 0) is None or self._aging_out.pop(entry, 0) is None:
            self._paged_freed += len(m.body)  # its body leaves the heap now
        blen = m._blen if type(m) is self._stored else len(m.body)
        # its expiry stays on the broker's clock (as an entry's), made wall-clock time only
        # when written (_parked_rows): a clock step while parked moves it no more than theirs
        slot = self._parked.add(qid, entry, blen, entry.expires_at)
        self._parked_since += 1
        if self._parked_since >= 64 and (not self._out or (
                self._parked_since >= 1024 and self._parked_since > 2 * len(self._out))):
            # a dict keeps its table when emptied by pops (48 B a slot at its peak): new ones
            self._parked_since = 0
            self._out = dict(self._out)
            self._fresh_out = dict(self._fresh_out)
            self._aging_out = dict(self._aging_out)
        return slot

    def unpark(self, queue: Any, slot: int) -> QueueEntry:
        seq, loc, blen, qid, count, redelivered, prio, expires_at = self._parked.take(slot)
        msg = self._stored.make(blen, loc)  # id, exchange and routing key: on first use
        if qid not in self._queues:  # its queue is gone: read them now, while they are there
            try:
                msg.set_names(*self._names_at(loc))
            except (OSError, ValueError):
                msg.set_names(0, "", "")
        entry = QueueEntry(msg, seq, expires_at, prio)
        entry.loc = loc
        entry.delivery_count = count
        entry.redelivered = redelivered
        if self._qids.get(queue) == qid:
            self._out[entry] = queue  # settled through the queue as any stored delivery
        return entry

    def _names_at(self, loc: int) -> tuple[int, str, str]:
        """The message id, exchange and routing key of the T_ENQ record at ``loc``."""
        buf, off = self._buffer_at(loc)
        start = off + _BODY
        msg_id, names_len, _props_len = _MSG_HEAD.unpack_from(buf, start)
        start += _MSG_HEAD.size
        names = bytes(buf[start:start + names_len])
        n = names[0]
        return (msg_id, names[1:1 + n].decode("utf-8", "surrogateescape"),
                names[2 + n:].decode("utf-8", "surrogateescape"))

    def _parked_rows(self, qids: Collection[int] | None = None) -> Iterator[ParkedRow]:
        """``(slot, qid, seq, loc, exp_wall, prio, blen, count)`` of the live rows whose
        queue is still stored (``qids``: only those)."""
        p = self._parked
        known = self._queues
        exps = p.exps
        broker = self.broker
        delta = time.time() - (broker.timers.now() if broker is not None else time.monotonic())
        for slot in p.slots():
            qid = p.qids[slot]
            if qid not in known or (qids is not None and qid not in qids):
                continue
            exp = exps.get(slot)
            yield (slot, qid, p.seqs[slot], p.locs[slot], None if exp is None else exp + delta,
                   p.prios[slot], p.blens[slot], max(p.counts[slot], 1))
