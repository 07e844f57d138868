"""Timed and training loops with the process's long-lived objects out of the cyclic garbage collector's way.

A process that holds compiled executables, parameters and optimizer state (the runtime's executor, a profiler
with its stage executables, a measurement child with several plans' executors for interleaved timing) makes
every collection the loop triggers walk all of it: in probes on the 2-core development host (not a benchmark
file) a tiny model's 2-device step ran slower with four other plans' executors alive than alone, and as fast
again once they were frozen (gc.freeze). Inside
``frozen_heap()`` everything alive at entry is frozen; what the loop itself allocates is collected as usual.

The C heap needs the same care on a host. XLA:CPU takes each call's temporaries from malloc, and glibc moves its
mmap threshold with what the process freed before (and trims the heap's top above twice that): whether a
call's large temporaries are page-faulted in afresh on every call depends on what ran earlier in the process.
In probes (not a benchmark file) gpt__tiny's 16-sample stage ran at 11.4 ms, or at 15.4 ms with about 2,200
page faults per call when a 4-sample stage had run first -- steady within the process, so no statistic of
its samples shows it. :func:`steady_malloc` fixes both thresholds for the rest of the process; the loops that
run stages or steps (the timers, the co-run and measurement children, the runtime's training and measurement
loops, and the communication and host-sharing micro-benchmarks of libarena.profile.comm_bench and
libarena.profile.concurrency) enter it through ``frozen_heap()``."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0

#: mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: temporaries up to this size come from the heap: glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD_BYTES = 32 << 20
#: free memory the heap's top keeps instead of returning it to the system (and faulting it in again)
TRIM_THRESHOLD_BYTES = 1 << 30
_malloc_steady: bool | None = None


def steady_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds for the rest of this process (idempotent); False where the C
    library has no ``mallopt`` (not glibc) or refuses the values."""
    global _malloc_steady
    if _malloc_steady is None:
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (AttributeError, OSError):
            _malloc_steady = False
        else:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            # both set: a fixed mmap threshold also stops the trim threshold from following it
            _malloc_steady = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _malloc_steady


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze everything alive now (after a collection) for the body; nested uses share the outermost one.
    The first use also fixes the C heap's thresholds (:func:`steady_malloc`), for good."""
    global _depth
    if _depth == 0:
        steady_malloc()
        gc.collect()
        gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
