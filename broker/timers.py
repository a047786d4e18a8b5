"""One timer heap for the whole broker; the trio runner lives at the edge (server).

Core code (queues, scheduler) calls ``call_at``/``call_later`` synchronously;
the runner sleeps until the earliest deadline, so thousands of pending timers
cost one task and O(log n) per operation, never a scan.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable


class TimerHandle:
    __slots__ = ("callback", "cancelled", "when")

    def __init__(self, when: float, callback: Callable[[], None]):
        self.when = when
        self.callback: Callable[[], None] | None = callback  # None once cancelled or run
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = None


class TimerQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.now = clock
        self._heap: list = []
        self._seq = itertools.count()
        self.on_earlier_deadline: Callable[[float], None] | None = None
        #: when (``now()``) the input being handled was read from its socket: set by a
        #: listener around the synchronous handling of one read, None outside it. A delay
        #: counted from it starts when the message arrived, not when its turn in a burst came.
        self.received_at: float | None = None

    def since_received(self) -> float:
        """Seconds since the input being handled was read (0.0 outside a listener's read)."""
        received = self.received_at
        return 0.0 if received is None else max(0.0, self.now() - received)

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle(when, callback)
        earliest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (when, next(self._seq), handle))
        if (earliest is None or when < earliest) and self.on_earlier_deadline is not None:
            self.on_earlier_deadline(when)
        return handle

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self.call_at(self.now() + delay, callback)

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def run_due(self, now: float | None = None, limit: int = 10000) -> int:
        """Run callbacks whose time has come (at most ``limit``); returns how many ran."""
        if now is None:
            now = self.now()
        heap = self._heap
        ran = 0
        while heap and heap[0][0] <= now and ran < limit:
            _, _, handle = heapq.heappop(heap)
            if handle.cancelled:
                continue
            callback = handle.callback
            handle.callback = None
            handle.cancelled = True
            callback()
            ran += 1
        return ran

    def __len__(self) -> int:
        return len(self._heap)
