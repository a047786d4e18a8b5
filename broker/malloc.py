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
try:
    _libc = ctypes.CDLL(None)
    _mallinfo2 = _libc.mallinfo2
    _mallinfo2.restype = _Mallinfo2
    _malloc_trim = _libc.malloc_trim
    _malloc_trim.argtypes = [ctypes.c_size_t]
    _malloc_trim.restype = ctypes.c_int
except (OSError, AttributeError):  # not glibc, or glibc < 2.33
    _mallinfo2 = _malloc_trim = None


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
