"""Gathering socket writes for the AMQP 0-9-1 edge (sendmsg, large ones from a thread);
not the connection's tasks (amqp.py) nor its frames (amqp/connection.py)."""
from __future__ import annotations

import select
import socket
import time
from typing import Any

import trio
import trio.lowlevel

# Buffers per sendmsg call (Linux's IOV_MAX is 1024).
SEND_IOV_MAX = 512
# A write of at least this many octets (large bodies only) runs in a worker thread: the
# hand-off costs the loop tens of µs, the kernel's copy of 256 KiB about 50 µs.
THREAD_IO_MIN = 256 * 1024
# A large write's thread waits this long at most for a peer that does not read (then the
# writer task waits in trio, where the connection's cancellation reaches it).
THREAD_SEND_WAIT = 0.2

# Large writes have their own threads, so that they never take the default limiter's threads
# from the stores' writes (more copying threads than cores would not help anyway).
SEND_THREADS = 4
_send_threads: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("send_threads")


def _send_limiter() -> trio.CapacityLimiter:
    try:
        return _send_threads.get()
    except LookupError:
        limiter = trio.CapacityLimiter(SEND_THREADS)
        _send_threads.set(limiter)
        return limiter


def _advance(bufs: list, i: int, batch: list, sent: int) -> int:
    """The index in ``bufs`` after ``sent`` octets of ``batch`` (= ``bufs[i:...]``) went out;
    a buffer sent in part is replaced by the slice still to send."""
    for buf in batch:
        size = len(buf)
        if sent < size:
            if sent:
                bufs[i] = memoryview(buf)[sent:]
            break
        sent -= size
        i += 1
    return i


def _send_from(raw: socket.socket, bufs: list, i: int) -> int:
    """In a worker thread: write ``bufs`` from index ``i`` on, waiting for writability with
    ``poll`` between partial sends, for at most ``THREAD_SEND_WAIT`` seconds in all; returns
    the index reached (a partly sent buffer is left as the slice still to send). The bound
    lets a connection whose peer stopped reading end: the writer task waits in trio next."""
    count = len(bufs)
    poller = None
    waited = 0.0
    while i < count:
        batch = bufs[i:i + SEND_IOV_MAX] if i or count > SEND_IOV_MAX else bufs
        try:
            sent = raw.sendmsg(batch)
        except BlockingIOError:
            if waited >= THREAD_SEND_WAIT:
                return i
            if poller is None:
                poller = select.poll()
                poller.register(raw, select.POLLOUT)
            started = time.monotonic()
            poller.poll(THREAD_SEND_WAIT * 1000)
            waited += time.monotonic() - started
            continue
        i = _advance(bufs, i, batch, sent)
    return i


async def send_buffers(sock: Any, bufs: list) -> None:
    """Write ``bufs`` in order with gathering sends (sendmsg, no join): large message bodies
    go from the message itself to the kernel. A send may take only part of what it is
    given; the rest is sent next, starting inside a buffer where need be. A write of
    ``THREAD_IO_MIN`` octets or more is sent from a worker thread (the kernel's copy out
    overlaps the loop's work); the writer task awaits it, so bytes keep their order."""
    i, count = 0, len(bufs)
    if count > 1 and sum(map(len, bufs)) >= THREAD_IO_MIN:
        raw = sock._sock  # trio's socket wraps the stdlib one (non-blocking)
        while True:
            i = await trio.to_thread.run_sync(_send_from, raw, bufs, i, limiter=_send_limiter())
            if i >= count:
                return
            await trio.lowlevel.wait_writable(raw)
    while i < count:
        batch = bufs[i:i + SEND_IOV_MAX] if i or count > SEND_IOV_MAX else bufs
        sent = await sock.sendmsg(batch)
        i = _advance(bufs, i, batch, sent)
