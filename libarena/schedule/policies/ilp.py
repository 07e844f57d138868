"""The assignment ILP shared by the solver-based baselines (gavel, sia), solved with HiGHS (highspy).

Each group (a job) offers options (GPU type, GPU count, weight); choose at most one option per group, exactly
one for groups marked ``must`` (in-flight jobs cannot be preempted), with the GPUs taken from each type within
its capacity, maximising the total weight (to a relative MIP gap of 0.01%). Solves are bounded by a time limit; on
timeout the best feasible solution found is used, and if none was found every in-flight job keeps its first option
(its current allocation) and nothing new starts.

HiGHS's presolve is off: these problems (one row per group, one per GPU type) leave it little to remove, and
without it the long runs' many solves reach the tighter gap faster (Sia's full-length philly run, before its
running jobs were offered every type: 115.5 s -> 100.7 s in bench/results/schedule.json; docs/policy-investigation.md, "The baselines' solver", has the rest).
So is its feasibility-jump heuristic (HiGHS >= 1.11, on by default): in profiling probes on the development
host it cost a fixed ~4.5 ms a solve, nearly all of a typical solve's time (a few hundred binaries, solved at
the root in well under a millisecond), and on 1,230 problems recorded from Sia's philly window every solve chose
the same options without it. highspy directly rather than scipy's ``milp``, which has no way to pass that option.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np

Option = tuple[int, int, float]  # (type index, gpus, weight)


def restart_discount(overhead_s: float, remaining_s: float) -> float:
    """Sia's restart factor: the share of a running job's remaining time that a config change does not lose."""
    return max(0.0, 1.0 - overhead_s / max(remaining_s, 1e-9))


def solve_assignment(groups: list[list[Option]], must: list[bool], capacity: np.ndarray,
                     time_limit_s: float, on_time_limit: Callable[[], None] | None = None) -> list[int | None]:
    """The chosen option of each group (None: none). ``on_time_limit`` hears of a solve stopped by the time limit:
    its answer then depends on the host's speed (and load), where every other answer is the same anywhere."""
    import highspy  # imported on first solve: keeps start-up fast

    flat = [(g, k, opt) for g, opts in enumerate(groups) for k, opt in enumerate(opts)]
    if not flat:
        return [None] * len(groups)
    n, num_groups, num_types = len(flat), len(groups), len(capacity)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n, num_groups + num_types
    lp.col_cost_ = np.array([-opt[2] for _, _, opt in flat])  # HiGHS minimises
    lp.col_lower_, lp.col_upper_ = np.zeros(n), np.ones(n)
    lp.row_lower_ = np.concatenate([np.array([1.0 if m else 0.0 for m in must]), np.full(num_types, -highspy.kHighsInf)])
    lp.row_upper_ = np.concatenate([np.ones(num_groups), capacity.astype(float)])
    # column i (option k of group g, on type t with some GPUs) has two entries: its group's row and its type's
    index = np.empty(2 * n, dtype=np.int32)
    value = np.empty(2 * n)
    index[0::2] = [g for g, _, _ in flat]
    index[1::2] = [num_groups + opt[0] for _, _, opt in flat]
    value[0::2] = 1.0
    value[1::2] = [float(opt[1]) for _, _, opt in flat]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.arange(0, 2 * n + 1, 2, dtype=np.int32)
    lp.a_matrix_.index_, lp.a_matrix_.value_ = index, value
    lp.integrality_ = [highspy.HighsVarType.kInteger] * n
    with native_stdout_discarded():  # the first Highs() of a process prints a banner with printf
        highs = highspy.Highs()
        for name, setting in (("output_flag", False), ("presolve", "off"), ("mip_rel_gap", 1e-4),
                              ("time_limit", float(time_limit_s)), ("mip_heuristic_run_feasibility_jump", False)):
            if highs.setOptionValue(name, setting) != highspy.HighsStatus.kOk:
                raise RuntimeError(f"HiGHS {highs.version()} refuses option {name}={setting!r} (Arena needs highspy >= 1.11)")
        highs.passModel(lp)
        highs.run()
    if on_time_limit is not None and highs.getModelStatus() == highspy.HighsModelStatus.kTimeLimit:
        on_time_limit()
    if highs.getInfo().primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return [0 if m else None for m in must]
    x = highs.getSolution().col_value
    choice: list[int | None] = [None] * len(groups)
    for i, (g, k, _) in enumerate(flat):
        if x[i] > 0.5:
            choice[g] = k
    return choice


@contextlib.contextmanager
def native_stdout_discarded() -> Iterator[None]:
    """Discard what native code prints to the process's stdout, for the duration.

    HiGHS prints a two-line banner on the first ``Highs()`` of a process and some MIP lines with printf whatever
    its output options say (``HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();``): on
    stdout they would corrupt a tool's data (``arena-schedule simulate --json``), on stderr they would break
    ``-q``, and they say nothing a user of the scheduler needs. (Fd 1 is the process's: what another thread writes
    to stdout meanwhile is lost too; the simulator and the live server decide on one thread.)"""
    import ctypes

    libc = ctypes.CDLL(None)
    try:
        sys.stdout.flush()
        sink = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # no stdout to protect, or nowhere to send it
        yield
        return
    try:
        saved = os.dup(1)
    except OSError:
        os.close(sink)
        yield
        return
    try:
        os.dup2(sink, 1)
        yield
    finally:
        libc.fflush(None)  # C's buffered stdout still holds the lines: out with them while fd 1 is the sink
        os.dup2(saved, 1)
        os.close(saved)
        os.close(sink)
