"""Parsing and validation of scheduling headers, and the occurrence arithmetic.

Two wire contracts end up in one ``Schedule``:

* ``x-delay`` (ms) on an ``x-delayed-message`` exchange (RabbitMQ's plugin);
* ActiveMQ's ``AMQ_SCHEDULED_DELAY`` / ``_PERIOD`` / ``_REPEAT`` / ``_CRON`` on any publish.

All times here are wall-clock seconds (``time.time()``) so they survive restarts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

X_DELAY = "x-delay"
AMQ_DELAY = "AMQ_SCHEDULED_DELAY"
AMQ_PERIOD = "AMQ_SCHEDULED_PERIOD"
AMQ_REPEAT = "AMQ_SCHEDULED_REPEAT"
AMQ_CRON = "AMQ_SCHEDULED_CRON"
AMQ_HEADERS = (AMQ_DELAY, AMQ_PERIOD, AMQ_REPEAT, AMQ_CRON)

# ActiveMQ accepts delays up to Long.MAX; we cap at ~100 years so wall-clock math stays sane.
MAX_MS = 100 * 365 * 24 * 3600 * 1000

_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")


class ScheduleError(ValueError):
    """Bad scheduling header: ``header`` is named in the 406 text."""

    def __init__(self, header: str, detail: str):
        super().__init__(f"invalid header '{header}': {detail}")
        self.header = header
        self.detail = detail


def _text(value) -> str | None:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def int_header(name: str, value) -> int:
    """A non-negative integer header; ints, integral floats and digit strings are accepted."""
    if isinstance(value, bool):
        raise ScheduleError(name, f"expected a non-negative integer, got {value!r}")
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        n = int(value)
    else:
        text = _text(value)
        if text is None or not _INT_RE.match(text):
            raise ScheduleError(name, f"expected a non-negative integer, got {_shown(value)}")
        n = int(text)
    if n < 0:
        raise ScheduleError(name, f"negative value {n}")
    if n > MAX_MS:
        raise ScheduleError(name, f"value {n} too large (max {MAX_MS})")
    return n


def _shown(value) -> str:
    text = _text(value)
    return repr(text) if text is not None else repr(value)


def cron_valid(expr: str) -> bool:
    from croniter import croniter  # type: ignore[import-untyped]  # at first use: a faster start
    try:
        return bool(croniter.is_valid(expr))
    except Exception:
        return False


def cron_next(expr: str, after: float) -> float:
    """Next trigger strictly after ``after`` (wall seconds), evaluated in local time."""
    from croniter import croniter  # type: ignore[import-untyped]
    base = datetime.fromtimestamp(after).astimezone()
    return float(croniter(expr, base).get_next(float))


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: str  # "delay" (x-delayed-message) or "amq"
    delay: int = 0  # ms
    period: int = 0  # ms
    repeat: int = 0  # extra occurrences after the first, per run
    cron: str | None = None

    def first(self, now: float) -> tuple[float, int, float]:
        """(due, occurrences left in the run including this one, run base)."""
        if self.cron:
            run = cron_next(self.cron, now)
        else:
            run = now
        return run + self.delay / 1000.0, self.repeat + 1, run

    def following(self, due: float, left: int, run: float, now: float):
        """The occurrence after the one at ``due`` fired; None when the schedule is done.

        Inside a run: ``period`` apart while repeats are left. Then (cron only) the next
        run starts at the next cron time after both the fired occurrence and ``now`` --
        runs missed while the broker was down collapse into one, as with ActiveMQ.
        """
        if left > 1:
            return due + self.period / 1000.0, left - 1, run
        if not self.cron:
            return None
        nxt = cron_next(self.cron, max(due, now, run))
        return nxt + self.delay / 1000.0, self.repeat + 1, nxt


def parse_delayed(headers: dict) -> Schedule | None:
    """x-delay on an x-delayed-message exchange; None (route now) when absent or 0."""
    if X_DELAY not in headers:
        return None
    value = headers[X_DELAY]
    if isinstance(value, bool) or value is None:
        raise ScheduleError(X_DELAY, f"expected an integer number of milliseconds, got {value!r}")
    if isinstance(value, int) and value < 0:
        raise ScheduleError(X_DELAY, f"negative value {value}")
    delay = int_header(X_DELAY, value)
    if delay == 0:
        return None
    return Schedule("delay", delay=delay)


def parse_amq(headers: dict) -> Schedule | None:
    """ActiveMQ scheduling headers; None when there are none (or only a zero delay)."""
    present = [h for h in AMQ_HEADERS if h in headers]
    if not present:
        return None
    delay = int_header(AMQ_DELAY, headers[AMQ_DELAY]) if AMQ_DELAY in headers else 0
    period = int_header(AMQ_PERIOD, headers[AMQ_PERIOD]) if AMQ_PERIOD in headers else 0
    repeat = int_header(AMQ_REPEAT, headers[AMQ_REPEAT]) if AMQ_REPEAT in headers else 0
    cron = None
    if AMQ_CRON in headers:
        cron = _text(headers[AMQ_CRON])
        if cron is None or not cron.strip():
            raise ScheduleError(AMQ_CRON,
                                f"expected a cron expression string, got {_shown(headers[AMQ_CRON])}")
        cron = cron.strip()
        if not cron_valid(cron):
            raise ScheduleError(AMQ_CRON, f"invalid cron expression {cron!r}")
    if AMQ_PERIOD in headers and period > 0 and repeat == 0:
        raise ScheduleError(AMQ_PERIOD, "a period needs AMQ_SCHEDULED_REPEAT > 0")
    if repeat > 0 and period == 0:
        raise ScheduleError(AMQ_REPEAT, "repeats need AMQ_SCHEDULED_PERIOD > 0")
    if repeat > 1_000_000_000:
        raise ScheduleError(AMQ_REPEAT, f"value {repeat} too large")
    if cron is None and delay == 0 and repeat == 0:
        return None
    return Schedule("amq", delay=delay, period=period, repeat=repeat, cron=cron)
