"""The assignment ILP shared by the solver-based baselines (gavel, sia), solved with HiGHS via scipy.optimize.milp.

Each group (a job) offers options (GPU type, GPU count, weight); choose at most one option per group, exactly
one for groups marked ``must`` (in-flight jobs cannot be preempted), with the GPUs taken from each type within
its capacity, maximising the total weight (to a relative MIP gap of 0.01%). Solves are bounded by a time limit; on
timeout the best feasible solution found is used, and if none was found every in-flight job keeps its first option
(its current allocation) and nothing new starts.

HiGHS's presolve is off: these problems (one row per group, one per GPU type) leave it little to remove, and
without it the long runs' many solves reach the tighter gap faster (Sia's full-length philly run, before its
running jobs were offered every type: 115.5 s -> 100.7 s in bench/results/schedule.json; the README has the rest).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import numpy as np

Option = tuple[int, int, float]  # (type index, gpus, weight)


def solve_assignment(groups: list[list[Option]], must: list[bool], capacity: np.ndarray,
                     time_limit_s: float) -> list[int | None]:
    from scipy.optimize import Bounds, LinearConstraint, milp  # imported on first solve: keeps start-up fast
    from scipy.sparse import coo_matrix

    flat = [(g, k, opt) for g, opts in enumerate(groups) for k, opt in enumerate(opts)]
    if not flat:
        return [None] * len(groups)
    n = len(flat)
    weights = np.array([opt[2] for _, _, opt in flat])
    rows, cols, vals = [], [], []
    for i, (g, _, _) in enumerate(flat):
        rows.append(g)
        cols.append(i)
        vals.append(1.0)
    num_types = len(capacity)
    for i, (_, _, (t, gpus, _)) in enumerate(flat):
        rows.append(len(groups) + t)
        cols.append(i)
        vals.append(float(gpus))
    a = coo_matrix((vals, (rows, cols)), shape=(len(groups) + num_types, n)).tocsr()
    lb = np.concatenate([np.array([1.0 if m else 0.0 for m in must]), np.full(num_types, -np.inf)])
    ub = np.concatenate([np.ones(len(groups)), capacity.astype(float)])
    with native_stdout_to_stderr():
        res = milp(-weights, integrality=np.ones(n), bounds=Bounds(0, 1), constraints=LinearConstraint(a, lb, ub),
                   options={"time_limit": time_limit_s, "disp": False, "mip_rel_gap": 1e-4, "presolve": False})
    if res.x is None:
        return [0 if m else None for m in must]
    choice: list[int | None] = [None] * len(groups)
    for i, (g, k, _) in enumerate(flat):
        if res.x[i] > 0.5:
            choice[g] = k
    return choice


@contextlib.contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Send what native code prints to the process's stdout to stderr instead, for the duration.

    HiGHS prints some MIP lines with printf whatever its output options say (``HighsMipSolverData::
    transformNewIntegerFeasibleSolution tmpSolver.run();``), which would corrupt a tool's data on stdout
    (``arena-schedule simulate --json``)."""
    import ctypes

    libc = ctypes.CDLL(None)
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError):  # no stdout to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        libc.fflush(None)  # C's buffered stdout still holds the lines: out with them while fd 1 is stderr
        os.dup2(saved, 1)
        os.close(saved)
