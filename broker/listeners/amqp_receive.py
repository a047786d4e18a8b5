"""When what a client sent arrived: the kernel's receive time of a plain TCP read.

A read returns, besides the bytes, the time the kernel received the last segment in it
(``SO_TIMESTAMP``, Linux), so a delay counted from a message's arrival does not start
later because the broker took its time to read it (a burst of publishes queued in the
socket while earlier ones were handled). Without the option (another platform, a TLS
stream) the arrival is the read itself.
"""
from __future__ import annotations

import socket
import struct
import sys
import time

# SO_TIMESTAMP (= SCM_TIMESTAMP), which Python's socket module does not name: 29 in
# Linux's generic socket options (x86, arm, ...); the reply's type is checked against it
SO_TIMESTAMP = 29 if sys.platform == "linux" else None
_TIMEVAL = struct.Struct("@qq")  # struct timeval on 64-bit Linux: seconds, microseconds
ANC_SIZE = socket.CMSG_SPACE(_TIMEVAL.size)


def stamp_arrivals(sock) -> int:
    """Ask the kernel to time-stamp what ``sock`` receives; the ancillary buffer size to
    read with (0 when the platform cannot)."""
    if SO_TIMESTAMP is None or struct.calcsize("@l") != 8:
        return 0
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)
    except OSError:
        return 0
    return ANC_SIZE


def arrived_ago(ancdata: list, within: float = float("inf")) -> float:
    """Seconds since the last segment of a read arrived (0.0 when the read has no time), at
    most ``within``: the monotonic time since the socket was last read empty, when all of
    this read was still to come. The kernel's time is the wall clock, so a clock step
    between the arrival and the read would otherwise count in full (a step forward made a
    delay start hours early, its message due at once); a step back counts as no wait."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMP and len(data) >= _TIMEVAL.size:
            sec, usec = _TIMEVAL.unpack_from(data)
            return min(max(0.0, within), max(0.0, time.time() - (sec + usec * 1e-6)))
    return 0.0


def release_all(bufs: list[memoryview]) -> None:
    """Let go of the buffers a read received into (a body may be handed on next)."""
    for buf in bufs:
        buf.release()
