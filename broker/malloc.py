"""Giving freed heap memory back to the operating system (glibc only; a no-op elsewhere).

Bodies of more than 512 bytes live outside Python's own allocator, in malloc's heap. After a
burst (an outage's backlog written, a big queue drained) glibc keeps the freed pages, so the
process stays at its peak RSS although the memory is free. ``malloc_trim`` returns them.
"""
from __future__ import annotations

import ctypes
from typing import Any


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_mallinfo2: Any = None
_malloc_trim: Any = None
_mallopt: Any = None
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's own ceiling for its adaptive mmap threshold
try:
    _libc = ctypes.CDLL(None)
    _mallinfo2 = _libc.mallinfo2
    _mallinfo2.restype = _Mallinfo2
    _malloc_trim = _libc.malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
    _malloc_trim.restype = ctypes.c_int
    _mallopt = _libc.mallopt
    _mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    _mallopt.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc, or glibc < 2.33
    _mallinfo2 = _malloc_trim = _mallopt = None


def keep_free_heap(octets: int) -> bool:
    """Let malloc keep up to ``octets`` of freed heap at its top (glibc's trim threshold) and
    take blocks under ``MMAP_THRESHOLD`` from the heap, instead of its defaults (128 KiB each,
    raised only as large blocks are freed). Large message bodies (64 KiB-1 MiB) are allocated
    and freed at the message rate: with the defaults a free at the top of the heap gave the
    pages back and the next body faulted them in again (57 page faults per 1 MiB message).
    Free heap beyond ``octets`` still goes back through ``give_back``. False where malloc
    cannot be tuned."""
    if _mallopt is None:
        return False
    return bool(_mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and _mallopt(M_TRIM_THRESHOLD, octets))


def free_heap_bytes() -> int:
    """Bytes malloc holds free in its arenas (0 where that cannot be asked)."""
    return int(_mallinfo2().fordblks) if _mallinfo2 is not None else 0


_free_after_trim = 0


def give_back(threshold: int) -> int:
    """Trim the heap if more than ``threshold`` bytes were freed in it since the last trim
    (trimmed pages still count as free); returns the bytes that were free, 0 if nothing was
    done. Costs a walk of the free lists: call it from a periodic check, not per message."""
    global _free_after_trim
    free = free_heap_bytes()
    if free <= _free_after_trim + threshold or _malloc_trim is None:
        _free_after_trim = min(_free_after_trim, free)
        return 0
    _malloc_trim(0)
    _free_after_trim = free_heap_bytes()
    return free


def trim() -> None:
    """Give the free heap back now, whatever ``give_back`` last saw: after a one-off burst
    (a large HTTP request body) whose pages were free before and reused, which its growth
    test cannot tell from pages that stayed free."""
    global _free_after_trim
    if _malloc_trim is not None:
        _malloc_trim(0)
        _free_after_trim = free_heap_bytes()
