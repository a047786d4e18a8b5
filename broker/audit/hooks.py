"""The audit trail's hot hooks: what sessions call per publish, delivery and ack.

``PyHooks`` is the reference; ``_hooks.c`` is the same class in C (a publish's hook costs half
as much, and its records marshal faster), used when it was built and agrees with
``events.py`` on the record layout.
``CHooks`` is the C class when it is built and current, else ``PyHooks``; a trail takes
``chosen()`` when it is made (``recorder.install``): ``TRIOMQ_AUDIT_PYTHON=1`` in the
environment then picks the Python one. Both append to the flat buffer ``buf``
(``events.WIDTH`` slots per event) and call ``self._full()`` past ``limit`` and
``self._channel_ctx(channel)`` for a channel's first event; both read and write only these
attributes: ``buf``, ``base``, ``limit``, ``now``, ``_scope_all``, ``_vhosts_on``,
``dropped_total``.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .events import ACKC, DACK, DELC, PUBC, TRAIL_PROPS, WIDTH

if TYPE_CHECKING:
    from ..queues.entry import QueueEntry
    from ..queues.queue import Queue

log = logging.getLogger("broker.audit")
_time = time.time


class PyHooks:
    buf: list
    base: int
    limit: int
    now: float
    _scope_all: bool
    _vhosts_on: dict
    dropped_total: int
    _full: Callable[[], None]  # the buffer passed ``limit``
    _channel_ctx: Callable[[Any], tuple]  # a channel's first event: its audit_ctx

    # ---- the clock ----
    def clock_start(self) -> None:
        """A session starts handling a receive batch: its events share this time."""
        self.now = _time()

    def clock_stop(self) -> None:
        """The batch is handled: events from timers and other tasks read the clock."""
        self.now = 0.0

    # ---- hooks: channel ----
    def published(self, channel, message, queues: list, outcome: str, seq: int) -> None:
        """``message`` was routed to ``queues`` (enqueued with ``reported=True``, so the
        queues do not report those enqueues) or taken over by a publish hook.

        The event's ``queues`` are the audited queues that enqueued it (a queue may refuse:
        overflow, deduplication; it then notes the message's id). Callers outside a receive
        batch run between ``clock_start`` and ``clock_stop``, so the message's deliveries do
        not precede its publish in time."""
        into: Any = None
        if queues:
            mid = message.id
            if len(queues) == 1:
                q = queues[0]
                if q.audit_ctx is not None and q.refused_id != mid:
                    into = q.name
            else:
                into = [q.name for q in queues
                        if q.audit_ctx is not None and q.refused_id != mid] or None
        try:
            ctx = channel.audit_ctx
        except AttributeError:
            ctx = self._channel_ctx(channel)
        if not self._scope_all and not self._vhosts_on.get(ctx[0]):
            return
        props = message.properties
        if not props or TRAIL_PROPS.isdisjoint(props):
            props = None  # nothing the trail keeps (the dict would outlive its message)
        buf = self.buf
        buf += (PUBC, self.now or _time(), ctx, message.exchange, message.routing_key, message.id,
                props, len(message.body), message.persistent, seq, into, outcome)
        if len(buf) > self.limit:
            self._full()

    def delivered(self, channel, ctag, tag: int, queue: Queue, entry: QueueEntry) -> int:
        """Returns where the record is (for ``acked``: ``Unacked.audit_pos``), -1 if none."""
        try:
            qctx = queue.audit_ctx  # set while this trail follows the queue
        except AttributeError:
            return -1
        if qctx is None:
            return -1
        try:
            ctx = channel.audit_ctx
        except AttributeError:
            ctx = self._channel_ctx(channel)
        buf = self.buf
        at = self.base + len(buf)
        buf += (DELC, self.now or _time(), qctx, entry.message.id, ctag, tag, entry.redelivered,
                entry.delivery_count, ctx, None, None, None)
        if len(buf) > self.limit:
            dropped = self.dropped_total
            self._full()
            if self.dropped_total != dropped:  # this very record (the drop policy)
                return -1
        return at

    def acked(self, channel, item) -> None:
        # Still in the buffer (not serialised), the delivery's record takes the ack too:
        # one record instead of two (``events.DACK``).
        at = item.audit_pos - self.base
        if at >= 0:
            buf = self.buf
            if at < len(buf) and buf[at] == DELC:
                buf[at] = DACK
                buf[at + 9] = self.now or _time()
                return
        try:
            qctx = item.queue.audit_ctx
        except AttributeError:
            return
        if qctx is None:
            return
        entry = item.entry
        consumer = item.consumer
        try:
            ctx = channel.audit_ctx
        except AttributeError:
            ctx = self._channel_ctx(channel)
        buf = self.buf
        buf += (ACKC, self.now or _time(), qctx, entry.message.id,
                consumer.tag if consumer is not None else None, item.tag, ctx, None, None, None,
                None, None)
        if len(buf) > self.limit:
            self._full()


def _c_hooks() -> type:
    try:
        from ._hooks import LAYOUT
        from ._hooks import Hooks as CHooks
    except ImportError:
        log.info("audit: the C hooks are not built; using the Python ones")
        return PyHooks
    if LAYOUT != (PUBC, DELC, ACKC, DACK, WIDTH):
        log.warning("audit: the C hooks were built for another record layout (%s); using "
                    "the Python ones (rebuild: pip install -e .)", LAYOUT)
        return PyHooks
    return CHooks


CHooks: Any = _c_hooks()


def chosen() -> type:
    """The hooks a trail made now uses: read at each start, so one process (the tests) can
    run brokers on either."""
    return PyHooks if os.environ.get("TRIOMQ_AUDIT_PYTHON") else CHooks


Hooks: Any = chosen()
