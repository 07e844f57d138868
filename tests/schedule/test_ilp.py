"""The assignment ILP of the solver-based baselines (gavel, sia)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from libarena.schedule.policies.ilp import solve_assignment


def test_assignment_respects_capacity_and_in_flight_jobs():
    # two types of 4 GPUs; job 0 is in flight (must keep an option), jobs 1-2 compete for type 0
    groups = [[(0, 4, 1.0), (1, 4, 0.5)], [(0, 4, 10.0)], [(0, 2, 3.0), (1, 2, 2.0)]]
    choice = solve_assignment(groups, [True, False, False], np.array([4, 4]), time_limit_s=10)
    assert choice[0] is not None and choice[1] == 0
    used = {0: 0, 1: 0}
    for g, k in enumerate(choice):
        if k is not None:
            t, gpus, _ = groups[g][k]
            used[t] += gpus
    assert used[0] <= 4 and used[1] <= 4
    assert choice[0] == 1 and choice[2] is None  # job 1 takes type 0; the in-flight job moves to type 1


def test_native_prints_during_a_solve_reach_stderr_not_stdout():
    """HiGHS prints some MIP lines with printf regardless of its options; a tool's stdout carries data only."""
    code = (
        "import ctypes, os, sys\n"
        "from libarena.schedule.policies.ilp import native_stdout_to_stderr\n"
        "libc = ctypes.CDLL(None)\n"
        "print('data-before', flush=True)\n"
        "with native_stdout_to_stderr():\n"
        "    libc.printf(b'native-line\\n')\n"
        "    os.write(1, b'raw-line\\n')\n"
        "print('data-after', flush=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["data-before", "data-after"]
    assert "native-line" in r.stderr and "raw-line" in r.stderr
