"""Constants the journal store's parts share (record types, sizes, intervals) and a directory
fsync. No state of its own."""
from __future__ import annotations

import logging
import os

from ...queues.ops import Op
from .. import journal_format as jf
from ..records import _MSG_HEAD

log = logging.getLogger("broker.journal")

ASYNC_INTERVAL = 0.1  # seconds between fsyncs with flush="async"
NAN = float("nan")
_ENQUEUE, _DELIVER, _REQUEUE = Op.ENQUEUE, Op.DELIVER, Op.REQUEUE
_T_ENQ, _T_ENQ_REF, _T_REMOVE = jf.T_ENQ, jf.T_ENQ_REF, jf.T_REMOVE
# The smallest T_ENQ record of a body (empty exchange, routing key and properties): what a
# live entry is counted for in a segment's live bytes (a lower bound of what moving it writes)
ENQ_MIN = jf.HDR_SIZE + jf.ENQ.size + _MSG_HEAD.size + 2
DELIVERED_MAX = jf.HDR_SIZE + jf.DELIVERED_N.size  # one T_DELIVERED record at most
UNACKED_PAGE_AFTER = 1.0  # seconds a delivery stays unacked before its message is paged out
# Bodies paged out of unacked deliveries are freed in the middle of the C heap, between
# records that stay, so glibc keeps their pages (about 600 B per 1 KiB delivery) until
# malloc_trim hands free pages back; done once this much was released, off the hot path.
TRIM_AFTER = 8 << 20
# A trim walks the whole heap (0.3 ms for 200 MB freed, 50-65 ms for a 1.6 GB heap here,
# freed or not), holding the main arena's lock: it runs in a worker thread, and the next
# waits this many times as long as the last took (at most 1% of the time).
TRIM_SPACING = 100


def fsync_dir(path: str) -> None:
    """Make a file created, renamed or deleted in directory ``path`` durable."""
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)

    finally:
        os.close(dfd)
