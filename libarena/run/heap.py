"""Timed and training loops with the process's long-lived objects out of the cyclic garbage collector's way.

A process that holds compiled executables, parameters and optimizer state (the runtime's executor, a profiler
with its stage executables, a measurement child with several plans' executors for interleaved timing) makes
every collection the loop triggers walk all of it: in probes on the 2-core development host (not a benchmark
file) a tiny model's 2-device step ran slower with four other plans' executors alive than alone, and as fast
again once they were frozen (gc.freeze). Inside
``frozen_heap()`` everything alive at entry is frozen; what the loop itself allocates is collected as usual."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Freeze everything alive now (after a collection) for the body; nested uses share the outermost one."""
    global _depth
    if _depth == 0:
        gc.collect()
        gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
