"""A consumer that never acks costs about what a paged queue entry does, not its payload:
a broker process (journal store) delivers 20,000 persistent 1 KiB messages to a consumer
with no prefetch limit that never acks; once the journal has paged the deliveries out
(their messages kept by location only) and handed the freed heap back, the broker's RSS
grew by less than 1,000 B per delivery (1,400 B before the heap was trimmed; 640 B after,
bench.journal_memory's figures in docs/performance-durability.md)."""
from __future__ import annotations

import threading
import time

import pytest

from bench.journal_memory import _blast, _consume_never_ack, _declare
from bench.procinfo import TrioMQProcess, rss_kb

N = 20_000
SIZE = 1024
BOUND = 1000  # RSS bytes per never-acked delivery


@pytest.mark.timeout(300)
def test_never_acked_deliveries_cost_less_than_their_payload():
    with TrioMQProcess(quiet=True) as b:
        _declare(b.url, "u")
        time.sleep(0.5)  # the broker's own start-up allocations settle
        base = (rss_kb(b.pid) or 0) * 1024
        done = threading.Event()
        threading.Thread(target=_consume_never_ack, args=(b.url, "u", N, done),
                         daemon=True).start()
        _blast(b.url, "u", N, SIZE)
        assert done.wait(240), "the consumer did not get every delivery"
        # paging (after 1-2 s) and the trim run on the broker's own schedule: wait for them
        per = float("inf")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            per = ((rss_kb(b.pid) or 0) * 1024 - base) / N
            if per < BOUND:
                break
            time.sleep(0.5)
        assert per < BOUND, f"{per:.0f} B of RSS per never-acked {SIZE} B delivery"
