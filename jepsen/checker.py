"""What a history means: every confirmed id must be consumed at least once."""
from __future__ import annotations

from .workload import History


def check(h: History) -> dict:
    with h.lock:
        confirmed = set(h.confirmed)
        nacked = set(h.nacked)
        doubted = set(h.doubted)
        consumed = set(h.consumed)
        duplicated = {i for i, n in h.consumed.items() if n > 1}
        sent = len(h.sent)
    lost = sorted(confirmed - consumed)
    unconfirmed_delivered = consumed - confirmed
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
        "ok": not lost and not (nacked & consumed),
    }


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]
