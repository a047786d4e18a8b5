"""What a history means: every confirmed id must be consumed at least once."""
from __future__ import annotations

import bisect
import datetime
import time

from .workload import History


def check(h: History, windows: list[tuple[float, str]] | None = None) -> dict:
    """The verdict over the whole history; with ``windows`` (each round's start time and
    nemesis, in order) also per nemesis, each id counted in the round it was sent in."""
    with h.lock:
        confirmed = set(h.confirmed)
        nacked = set(h.nacked)
        doubted = set(h.doubted)
        consumed = set(h.consumed)
        duplicated = {i for i, n in h.consumed.items() if n > 1}
        sent_at = dict(h.sent)
        nacked_at = dict(h.nacked)
        sent = len(h.sent)
        errors = dict(h.errors.most_common(8))
    lost = sorted(confirmed - consumed)
    unconfirmed_delivered = consumed - confirmed
    by_nemesis: dict[str, dict[str, int]] = {}
    if windows:
        starts = [t for t, _ in windows]
        for ident, t in sent_at.items():
            k = bisect.bisect_right(starts, t) - 1
            kind = windows[k][1] if k >= 0 else "before the first fault"
            c = by_nemesis.setdefault(kind, dict.fromkeys(
                ("sent", "confirmed", "nacked", "lost", "duplicated",
                 "unconfirmed_delivered"), 0))
            c["sent"] += 1
            c["confirmed"] += ident in confirmed
            c["nacked"] += ident in nacked
            c["lost"] += ident in confirmed and ident not in consumed
            c["duplicated"] += ident in duplicated
            c["unconfirmed_delivered"] += ident in consumed and ident not in confirmed
    return {
        "sent": sent,
        "confirmed": len(confirmed),
        "nacked": len(nacked),
        "in_doubt": len(doubted),
        "consumed_distinct": len(consumed),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "duplicated": len(duplicated),
        "unconfirmed_delivered": len(unconfirmed_delivered),
        # a nacked publish must never be delivered: that would be a broken promise too
        "nacked_delivered": len(nacked & consumed),
        # which, and when each was sent and nacked (UTC), to find them in the logs
        "nacked_delivered_ids": {i: [_utc(sent_at.get(i)), _utc(nacked_at.get(i))]
                                 for i in sorted(nacked & consumed)[:20]},
        "ok": not lost and not (nacked & consumed),
        "by_nemesis": by_nemesis,
        "client_errors": errors,
    }


def _utc(t: float | None) -> str | None:
    """A time of the history (``time.monotonic``) as UTC wall-clock time."""
    if t is None:
        return None
    wall = t + time.time() - time.monotonic()
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%H:%M:%S.%f")[:-3]


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]
