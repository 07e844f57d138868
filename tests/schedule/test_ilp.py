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


def test_native_prints_during_a_solve_are_discarded():
    """HiGHS prints some MIP lines with printf regardless of its options; a tool's stdout carries data only,
    and its stderr only what -q leaves."""
    code = (
        "import ctypes, os, sys\n"
        "from libarena.schedule.policies.ilp import native_stdout_discarded\n"
        "libc = ctypes.CDLL(None)\n"
        "print('data-before', flush=True)\n"
        "with native_stdout_discarded():\n"
        "    libc.printf(b'native-line\\n')\n"
        "    os.write(1, b'raw-line\\n')\n"
        "print('data-after', flush=True)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["data-before", "data-after"]
    assert "native-line" not in r.stderr and "raw-line" not in r.stderr


def _gpus_used(groups, pick, num_types):
    """GPUs of each type that the picked options (one index or None per group) take."""
    used = np.zeros(num_types)
    for g, k in enumerate(pick):
        if k is not None:
            used[groups[g][k][0]] += groups[g][k][1]
    return used


def _value(groups, pick):
    return sum(groups[g][k][2] for g, k in enumerate(pick) if k is not None)


def _brute_force_best(groups, must, capacity):
    """The optimum by enumeration (small instances): every option or none per group."""
    import itertools

    best = -np.inf
    for pick in itertools.product(*[[None, *range(len(g))] for g in groups]):
        if any(m and k is None for m, k in zip(must, pick)):
            continue
        if np.all(_gpus_used(groups, pick, len(capacity)) <= capacity):
            best = max(best, _value(groups, pick))
    return best


def test_assignment_is_optimal_within_its_gap_on_random_instances():
    """The solver's choice is feasible and within the 0.01% gap of the optimum found by enumeration."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        num_types = int(rng.integers(1, 4))
        groups = [[(int(rng.integers(num_types)), int(2 ** rng.integers(0, 4)), float(rng.uniform(0.1, 5)))
                   for _ in range(int(rng.integers(1, 4)))] for _ in range(int(rng.integers(1, 6)))]
        capacity = rng.integers(1, 12, size=num_types)
        # an in-flight job's first option is its current allocation: the in-flight ones fit together
        must, held = [], np.zeros(num_types)
        for opts in groups:
            t, gpus, _ = opts[0]
            m = bool(rng.random() < 0.4) and held[t] + gpus <= capacity[t]
            held[t] += gpus if m else 0
            must.append(m)
        choice = solve_assignment(groups, must, capacity, time_limit_s=10)
        assert all(k is not None or not m for k, m in zip(choice, must))
        assert np.all(_gpus_used(groups, choice, num_types) <= capacity)
        assert _value(groups, choice) >= _brute_force_best(groups, must, capacity) * (1 - 1e-4) - 1e-9


def test_without_a_feasible_assignment_in_flight_jobs_keep_their_allocation_and_nothing_starts():
    """Two in-flight jobs whose current allocations (first options) exceed the capacity together: HiGHS finds
    no feasible point, and the fallback keeps every in-flight job on its first option and starts no queued job."""
    groups = [[(0, 4, 1.0), (0, 2, 0.5)], [(0, 4, 1.0), (0, 2, 0.5)], [(0, 1, 5.0)]]
    choice = solve_assignment(groups, [True, True, False], np.array([3]), time_limit_s=10)
    assert choice == [0, 0, None]


def test_a_solve_writes_nothing_to_stdout():
    """The first HiGHS instance of a process prints a banner with printf: discarded, neither in a tool's data
    nor in its (possibly -q) stderr."""
    code = ("import numpy as np\n"
            "from libarena.schedule.policies.ilp import solve_assignment\n"
            "print(solve_assignment([[(0, 2, 1.0)], [(0, 2, 2.0)]], [False, False], np.array([2]), 10))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[None, 0]"
    assert "HiGHS" not in r.stderr


def test_a_solve_stopped_by_the_time_limit_is_counted_and_reported():
    """A solve that stops at its wall-clock limit gives an answer that depends on the host: the run counts such
    solves (metrics ``ilp_time_limit_hits``) and the tools warn, so a run that may not repeat says so."""
    from libarena.pipeline.schedule import _report_run_notes
    from libarena.progress import SilentReport
    from libarena.schedule.api import make_policy, run_policy
    from libarena.schedule.config import SimulatorConfig
    from libarena.schedule.metrics import summarize
    from tests.schedule.helpers import NO_OVERHEADS, cluster, hand_table, job, workload

    groups = [[(0, 2, 1.0), (0, 4, 1.5)], [(0, 2, 2.0)]]
    hits: list[int] = []
    solve_assignment(groups, [False, False], np.array([4]), time_limit_s=10, on_time_limit=lambda: hits.append(1))
    assert hits == []
    solve_assignment(groups, [False, False], np.array([4]), time_limit_s=1e-9, on_time_limit=lambda: hits.append(1))
    assert hits == [1]

    table = hand_table({("gpt__1.3B", "a100"): {"dp": {1: 10.0, 2: 20.0}, "ap": {1: 10.0, 2: 20.0}}})
    jobs = [job(f"j{i}", "gpt__1.3B", 100, 1, "a100", submit=10.0 * i, row=i + 1) for i in range(3)]
    w = workload(jobs, table, cluster([("a100", 1, 4)]))
    config = SimulatorConfig(overheads=NO_OVERHEADS, horizon_s=3000.0)

    class Warnings(SilentReport):
        def __init__(self) -> None:
            self.said: list[str] = []

        def warn(self, message: str) -> None:
            self.said.append(message)

    for limit, expect_hits in ((10.0, False), (1e-9, True)):
        metrics = summarize(run_policy(w, make_policy("sia", ilp_time_limit_s=limit), config))
        assert (metrics["ilp_time_limit_hits"] > 0) == expect_hits, limit
        report = Warnings()
        _report_run_notes(None, metrics, report)
        assert bool(report.said) == expect_hits
        assert all(line.startswith("sia: ") and "ILP solve(s) stopped at the time limit" in line for line in report.said)
