"""Flow control of the publish path on a queue's side: which publishing sessions a queue
holds in flow and when it lets them go; not the sessions' reading (the listener edge) nor
the thresholds' policy (the publish path)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue import Queue
    from .ready import ReadyStore


class FlowWaiter(Protocol):
    """A publishing session held in flow by a queue (``Queue.flow_wait``)."""

    def flow_released(self, queue: Queue) -> None: ...


class FlowQueue:
    """Mixed into ``Queue``: what these methods use of it."""
    flow_waiters: set[FlowWaiter] | None
    _flow_low: int
    _flow_low_bytes: float
    ready: ReadyStore
    ready_bytes: int
    consumers: list[Consumer]
    deleted: bool

    # ---- flow control (amqp_session.py "in flow", docs/architecture.md "Back-pressure") ----
    def flow_wait(self, session: FlowWaiter, low: int, low_bytes: float = math.inf) -> None:
        """``session`` published into this queue while it grew past its flow threshold:
        call ``session.flow_released(self)`` once the ready list is at most ``low`` messages
        and ``low_bytes`` of bodies, the queue has no consumers left, or it is deleted. No
        task, no timer: checked where the ready list shrinks (dispatch, purge) and where
        consumers leave."""
        if self.flow_waiters is None:
            self.flow_waiters = set()
        self.flow_waiters.add(session)
        self._flow_low = low
        self._flow_low_bytes = low_bytes

    def flow_forget(self, session: FlowWaiter) -> None:
        if self.flow_waiters:
            self.flow_waiters.discard(session)

    def flow_check(self) -> None:
        waiters = self.flow_waiters
        if waiters and ((len(self.ready) <= self._flow_low
                         and self.ready_bytes <= self._flow_low_bytes)
                        or not self.consumers or self.deleted):
            self.flow_waiters = None
            queue = cast("Queue", self)
            for session in waiters:
                session.flow_released(queue)
