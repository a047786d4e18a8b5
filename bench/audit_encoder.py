"""The audit converter's encoder, CPU per event: batches of 1,024 compact events (a
publish, its delivery and its ack, as the C hooks record them) through ``BatchEncoder``.

    python -m bench.audit_encoder [ROOT]

ROOT: a tree holding ``broker/audit`` (default: this checkout), e.g. an older commit's
``broker/audit/{__init__,events,encoder}.py`` and its ``.avsc`` extracted with ``git
show``, to compare two versions on the same machine in the same run."""
from __future__ import annotations

import os
import sys
import time


def main() -> None:
    root = sys.argv[1] if len(sys.argv) > 1 else os.getcwd()
    sys.path.insert(0, root)
    from broker.audit import events
    from broker.audit.encoder import BatchEncoder
    ch = ("/", "guest", "127.0.0.1:5000", 1)
    q = ("/", "work")
    t0 = 1_700_000_000.0
    rows: list = []
    for i in range(342):
        m = 1000 + i
        rows += [(events.PUBC, t0 + i, ch, "", "work", m, None, 100, True, i + 1, "work",
                  "routed"),
                 (events.DELC, t0 + i, q, m, "ctag", i + 1, False, 1, ch, None, None, None),
                 (events.ACKC, t0 + i, q, m, "ctag", i + 1, ch, None, None, None, None, None)]
    rows = rows[:1024]
    enc = BatchEncoder("n1", 1)
    enc.encode(rows)
    best = 1e9
    for _ in range(5):
        started = time.process_time()
        for _ in range(200):
            enc.encode(rows)
        best = min(best, (time.process_time() - started) / (200 * len(rows)))
    print(f"{root}: {best * 1e9:.0f} ns/event (CPU, best of 5 x 200 batches of {len(rows)})")


if __name__ == "__main__":
    main()
