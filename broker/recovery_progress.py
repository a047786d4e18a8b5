"""Recovery progress: what the broker is still reading back after a restart.

One ``RecoveryProgress`` lives on the broker (``Broker.recovery``). Recovery code
(stores, queues paging their index in, the scheduler's timer index) opens a phase
per piece of work and advances it in batches; the management API (``/api/overview``,
key ``recovery``), ``/metrics`` and the log read it. Phases are kept after they
finish so an operator can see what the last restart read and how long it took.

It has no trio and no I/O besides logging: recovery code may run synchronously
(before the listener opens) or in tasks (queues paged in after it opened).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("broker.recovery")

# A long recovery logs its progress at least this often (seconds).
LOG_INTERVAL = 1.0


@dataclass
class Phase:
    """One piece of recovery work: ``done`` of ``total`` units (records, messages,
    queues; ``total`` is None when not known in advance)."""

    name: str
    total: int | None
    unit: str
    progress: RecoveryProgress
    done: int = 0
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    started_wall: float = field(default_factory=time.time)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; logs the broker's progress when a second has passed."""
        self.done += n
        progress = self.progress
        now = time.monotonic()
        if now >= progress.next_log:
            progress.log_now(now)

    def finish(self) -> None:
        if self.finished is None:
            self.finished = time.monotonic()
            if self.total is not None and self.done < self.total:
                self.done = self.total
            self.progress.phase_finished(self)

    @property
    def running(self) -> bool:
        return self.finished is None

    def elapsed(self) -> float:
        return (self.finished if self.finished is not None else time.monotonic()) - self.started

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "done": self.done, "total": self.total,
                "running": self.running, "started": self.started_wall,
                "elapsed": round(self.elapsed(), 3)}

    def describe(self) -> str:
        if self.total is None:
            return f"{self.name}: {self.done} {self.unit}"
        pct = 100.0 * self.done / self.total if self.total else 100.0
        return f"{self.name}: {self.done}/{self.total} {self.unit} ({pct:.0f}%)"


class RecoveryProgress:
    """The phases of this broker's recovery (``Broker.recovery``)."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []
        self.next_log = time.monotonic() + LOG_INTERVAL
        self.started = time.monotonic()
        # when the broker started serving (None while recovering)
        self.listening_at: float | None = None

    def listening(self) -> None:
        """Recovery is over: the broker serves (connections waiting are let in)."""
        self.listening_at = time.monotonic()

    @property
    def ready(self) -> bool:
        return self.listening_at is not None

    def phase(self, name: str, total: int | None = None, unit: str = "records") -> Phase:
        """A new running phase (the caller advances and finishes it)."""
        phase = Phase(name, total, unit, self)
        if not self.running_phases():
            # a quiet broker starting new work: the first log line comes a second later
            self.next_log = phase.started + LOG_INTERVAL
        self.phases.append(phase)
        return phase

    def running_phases(self) -> list[Phase]:
        return [p for p in self.phases if p.finished is None]

    @property
    def active(self) -> bool:
        """Some recovery work is still running."""
        return any(p.finished is None for p in self.phases)

    def log_now(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.next_log = now + LOG_INTERVAL
        running = self.running_phases()
        if running:
            log.info("recovering: %s", "; ".join(p.describe() for p in running))

    def tick(self) -> None:
        """Log if a second has passed (called by a timer while phases run)."""
        if self.active and time.monotonic() >= self.next_log:
            self.log_now()

    def phase_finished(self, phase: Phase) -> None:
        if phase.elapsed() >= LOG_INTERVAL:
            log.info("recovered %s in %.1f s", phase.describe(), phase.elapsed())

    def as_dict(self) -> dict[str, Any]:
        """The ``recovery`` key of ``/api/overview``."""
        return {"active": self.active or not self.ready,
                "ready": self.ready,
                "phases": [p.as_dict() for p in self.phases]}

    def gauges(self) -> tuple[int, int, int]:
        """(running phases, units done, units known in total) over running phases."""
        running = self.running_phases()
        return (len(running), sum(p.done for p in running),
                sum(p.total or 0 for p in running))
