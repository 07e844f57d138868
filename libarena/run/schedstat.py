"""How long the calling thread waited for a core: the kernel's run-queue delay (Linux ``schedstat``).

The runtime issues every call of a step from one thread. On a host whose devices are its own cores, that
thread competes with the device threads for the same cores, and a probe of a 2-device pipelined step showed it
runnable but waiting for a core for a quarter of the step (docs/profiler-accuracy.md, "The tiny models' 2-device bias"). Its CPU
time (``time.thread_time``) does not show that; the scheduler's per-thread statistics do."""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Sequence

#: per-thread scheduler statistics: on-CPU ns, run-queue wait ns, timeslices (Documentation/scheduler/sched-stats)
_SCHEDSTAT = "/proc/self/task/{tid}/schedstat"

# The step reads this twice, so each thread keeps its file open and re-reads it from the start (about a tenth
# of an open and read each time); the key notices a forked child's thread (another id) and another path.
_open = threading.local()


def run_queue_wait_s() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a core since it started; None where the
    kernel does not report it (not Linux, or built without scheduler statistics)."""
    key = (threading.get_native_id(), _SCHEDSTAT)
    try:
        if getattr(_open, "key", None) != key:
            _open.file, _open.key = open(_SCHEDSTAT.format(tid=key[0]), "rb", buffering=0), key
        return int(os.pread(_open.file.fileno(), 256, 0).split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        _open.key = None
        return None


def waited_since(start: float | None) -> float | None:
    """Run-queue wait of the calling thread since ``start`` (a :func:`run_queue_wait_s` reading)."""
    now = run_queue_wait_s()
    return None if start is None or now is None else max(0.0, now - start)


def median_wait(waits: Sequence[float | None]) -> float | None:
    """The median of per-step waits; None when there are none or any step's is unknown."""
    return float(statistics.median(waits)) if waits and None not in waits else None
