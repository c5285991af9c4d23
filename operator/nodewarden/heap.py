"""Heap tuning of the operator process: large buffers go back to the system when freed.

glibc's malloc serves a request of at least `M_MMAP_THRESHOLD` bytes with its own
mapping, returned to the system on free. By default that threshold moves up to the size
of any such block freed, so after the first few TLS connections close, asyncio's 256 KiB
read buffer of every later one comes from the heap, among small objects, and the heap
never shrinks again (measured with `benchmarks/bench_power_fleet.py`: 1,000 BMC nodes
polled every 15 s, operator RSS 829 MB with the default, 512 MB with the threshold fixed
at 128 KiB). `tune()` fixes it at glibc's initial 128 KiB unless the environment already
sets `MALLOC_MMAP_THRESHOLD_`. Elsewhere (musl, macOS) nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3
"""mallopt's parameter number (glibc malloc.h)."""
MMAP_THRESHOLD = 128 * 1024
"""glibc's initial threshold, kept for good (asyncio's TLS read buffer is 256 KiB)."""


def tune() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); whether it was set here."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False  # the operator's environment decides
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    log.debug("malloc mmap threshold fixed at %d bytes: %s", MMAP_THRESHOLD, ok)
    return ok
