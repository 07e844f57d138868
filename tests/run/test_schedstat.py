"""The dispatching thread's run-queue wait (libarena.run.schedstat)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from libarena.run import schedstat

needs_schedstat = pytest.mark.skipif(schedstat.run_queue_wait_s() is None, reason="the kernel reports no per-thread scheduler statistics")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@needs_schedstat
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_a_thread_sharing_its_core_with_a_busy_process_waits_for_it():
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    # a busy process pinned to the same one core: the two take turns, so this thread waits about half the time
    rival = subprocess.Popen([sys.executable, "-c", f"import os, time\nos.sched_setaffinity(0, {{{core}}})\n"
                              "print('ready', flush=True)\nend = time.perf_counter() + 30\nwhile time.perf_counter() < end: pass"],
                             stdout=subprocess.PIPE, text=True)
    os.sched_setaffinity(0, {core})  # this thread only (Linux: 0 is the calling thread)
    try:
        assert rival.stdout.readline().strip() == "ready"  # the rival is pinned and spinning (however slow its start)
        # the readings inside the clock's interval, so the wait cannot exceed it
        t0 = time.perf_counter()
        start = schedstat.run_queue_wait_s()
        _spin(0.6)
        waited = schedstat.waited_since(start)
        wall = time.perf_counter() - t0
    finally:
        rival.kill()
        rival.wait()
        os.sched_setaffinity(0, before)
    assert waited is not None and 0.2 * wall < waited <= wall


@needs_schedstat
def test_a_sleeping_thread_does_not_count_as_waiting():
    t0 = time.perf_counter()
    start = schedstat.run_queue_wait_s()
    time.sleep(0.3)
    waited = schedstat.waited_since(start)
    # asleep, not runnable: only the wake-up's delay, if any
    assert waited is not None and 0.0 <= waited < 0.5 * (time.perf_counter() - t0)


def test_no_scheduler_statistics_reads_as_unknown(monkeypatch):
    monkeypatch.setattr(schedstat, "_SCHEDSTAT", "/nonexistent/{tid}/schedstat")
    assert schedstat.run_queue_wait_s() is None
    assert schedstat.waited_since(1.0) is None and schedstat.waited_since(None) is None


def test_the_median_wait_is_unknown_where_any_step_is():
    assert schedstat.median_wait([0.002, 0.001, 0.004]) == 0.002
    assert schedstat.median_wait([0.002, None, 0.004]) is None and schedstat.median_wait([]) is None


@needs_schedstat
def test_each_thread_reads_its_own_wait():
    import threading

    def own() -> float:  # read afresh from the thread's own file, without the kept one
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9

    readings = []

    def sandwiched() -> tuple[float, float | None, float]:
        """The kept file's reading between two fresh ones: a thread's wait only grows, so a reading of another
        thread's file (or a stale one) falls outside them, whatever the host's preemptions in between."""
        before = own()
        kept = schedstat.run_queue_wait_s()
        return before, kept, own()

    def worker() -> None:
        readings.append(sandwiched())

    assert schedstat.run_queue_wait_s() is not None  # this thread's file is open now
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    (before, kept, after), = readings
    assert kept is not None and before <= kept <= after
    before, kept, after = sandwiched()
    assert before <= kept <= after
