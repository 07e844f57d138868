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
libarena.profile.concurrency) enter it through ``frozen_heap()``.

Which physical pages back a process's heap is a third such state, fixed when the process starts. On the 2-core
development host (THP in ``madvise`` mode) four measuring children of wide_resnet__small's one-device 4-micro-batch
plan, alive together and timed in rotating turns, differed by up to 11-13% in two of three probes (one child
slower than the other three for its whole life, steady within it), and by 1-3% with their heaps on transparent
huge pages (probes, not a benchmark file; docs/profiler-accuracy.md, "The heap's pages"). So every process that times or runs stages
-- the profiler's and the measurement's children, the runtime's workers -- is started with glibc's
``glibc.malloc.hugetlb=1`` (:func:`huge_page_heap_env`), which makes malloc advise huge pages for the heap and
its mmap'd chunks; a tunable glibc reads once, when the process starts, so it is set for the children, not in
a running process."""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_depth = 0

#: mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: temporaries up to this size come from the heap: glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
MMAP_THRESHOLD_BYTES = 32 << 20
#: free memory the heap's top keeps instead of returning it to the system (and faulting it in again)
TRIM_THRESHOLD_BYTES = 1 << 30
_malloc_steady: bool | None = None

#: glibc's tunable (2.35 and later) that makes malloc advise transparent huge pages for what it maps
HUGE_PAGE_TUNABLE = ("glibc.malloc.hugetlb", "1")
#: the kernel's transparent huge page mode ("always", "madvise" or "never"; absent without THP)
THP_MODE_PATH = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_page_heap_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a process to start with its C heap on transparent huge pages: GLIBC_TUNABLES with
    glibc.malloc.hugetlb=1, any other tunable kept and an earlier hugetlb value replaced."""
    name, value = HUGE_PAGE_TUNABLE
    kept = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and t.split("=", 1)[0] != name]
    return {**env, "GLIBC_TUNABLES": ":".join([*kept, f"{name}={value}"])}


def heap_pages(env: Mapping[str, str] | None = None, thp_mode_path: Path = THP_MODE_PATH) -> dict[str, Any]:
    """For a results file: the glibc tunables a process has (``env``: this one's) and the kernel's THP mode
    (None where the kernel has no THP), i.e. whether its heap can be on huge pages."""
    env = os.environ if env is None else env
    try:
        text = thp_mode_path.read_text()
    except OSError:
        mode = None
    else:
        chosen = [w.strip("[]") for w in text.split() if w.startswith("[")]
        mode = chosen[0] if chosen else None
    tunables = env.get("GLIBC_TUNABLES", "")
    name, value = HUGE_PAGE_TUNABLE
    advised = f"{name}={value}" in tunables.split(":")
    return {"glibc_tunables": tunables, "thp_mode": mode,
            "huge_pages": mode == "always" or (mode == "madvise" and advised)}


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
