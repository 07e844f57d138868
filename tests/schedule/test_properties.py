"""Property tests of the simulator with every policy on random small traces and clusters."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libarena.schedule.api import make_policy
from libarena.schedule.config import OverheadConfig, SimulatorConfig
from libarena.schedule.entities import JobSpec, JobState
from libarena.schedule.metrics import job_records
from libarena.schedule.perf import PerfLookup
from libarena.schedule.policies import policy_names
from libarena.schedule.simulator import Simulator
from tests.schedule.helpers import cluster
from tests.schedule.perf_fixtures import synthetic_perf_table

MODELS = [("gpt__760M", 128), ("gpt__1.3B", 256), ("moe__2.4B", 256), ("wide_resnet__1B", 512), ("bert__2.6B", 256)]
TYPES = ["a100", "a40", "v100"]
TABLE = synthetic_perf_table(MODELS, TYPES, max_gpus=16)


class CheckedSimulator(Simulator):
    """Checks the GPU pools against the jobs' allocations after every event, and logs training segments."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.segments: dict[int, list[tuple[float, float, float]]] = defaultdict(list)
        self._open: dict[int, tuple[float, float]] = {}

    def _close(self, job) -> None:
        if job.index in self._open:
            start, rate = self._open.pop(job.index)
            self.segments[job.index].append((start, self.now, rate))

    def start_training(self, job) -> None:
        super().start_training(job)
        assert self.now >= job.spec.submit_time
        self._open[job.index] = (self.now, job.rate)
        self.check()

    def _reallocate(self, job, alloc, action, overhead) -> None:
        self._close(job)
        super()._reallocate(job, alloc, action, overhead)

    def complete(self, job) -> None:
        self._close(job)
        super().complete(job)
        self.check()

    def tick(self) -> None:
        super().tick()
        self.check()

    def check(self) -> None:
        used = [dict() for _ in self.pools]
        for job in self.active.values():
            a = job.alloc
            pool = self.pools[a.type_index]
            assert sum(m.bit_count() for _, m in a.blocks) == a.num_gpus  # one type, exact count
            if a.num_gpus <= pool.gpn:
                assert a.num_nodes == 1  # buddy allocation inside one node
            assert job.view_thr[a.type_index, a.count_index] > 0 or job.true_thr[a.type_index, a.count_index] > 0
            for node, mask in a.blocks:
                assert used[a.type_index].get(node, 0) & mask == 0, "GPU given to two jobs"
                used[a.type_index][node] = used[a.type_index].get(node, 0) | mask
        for t, pool in enumerate(self.pools):
            for node in range(pool.num_nodes):
                assert pool.masks[node] == used[t].get(node, 0)
            assert 0 <= pool.free_total <= pool.capacity
            assert pool.free_total == pool.capacity - sum(m.bit_count() for m in used[t].values())


@st.composite
def scenarios(draw):
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))
    groups = [(t, draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 4]))) for t in types]
    n = draw(st.integers(1, 10))
    jobs = []
    for i in range(n):
        model, batch = draw(st.sampled_from(MODELS))
        submit = float(draw(st.integers(0, 4000)))
        jobs.append(JobSpec(f"j{i}", i + 1, submit, model, batch, draw(st.integers(1, 3000)),
                            draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from(types)),
                            submit + draw(st.integers(600, 40000)), draw(st.sampled_from([None, 1, 2, 3]))))
    policy = draw(st.sampled_from(policy_names()))
    overheads = draw(st.sampled_from([OverheadConfig(0, 0, 0, 0, 0, 0), OverheadConfig()]))
    return cluster(groups), jobs, policy, overheads


def run_checked(spec, jobs, policy, overheads):
    lookup = PerfLookup(TABLE, spec)
    sim = CheckedSimulator(jobs, lookup, spec, make_policy(policy), SimulatorConfig(overheads=overheads, stall_ticks=50))
    return sim, sim.run()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_simulation_invariants(scenario):
    spec, jobs, policy, overheads = scenario
    sim, res = run_checked(spec, jobs, policy, overheads)
    rec = job_records(res)
    statuses = rec.column("status").to_pylist()
    # every job finishes, or is reported unfinished / dropped / unschedulable
    assert len(statuses) == len(jobs)
    assert set(statuses) <= {"finished", "unfinished", "dropped", "unschedulable"}
    for job in res.jobs:
        if job.state == JobState.FINISHED:
            # work conservation: the iterations integrated over the training segments are the requested ones
            done = sum(rate * (end - start) for start, end, rate in sim.segments[job.index])
            assert done == pytest.approx(job.spec.num_iterations, rel=1e-6)
            assert job.first_start >= job.spec.submit_time
            assert job.finish_time >= job.first_start
        elif job.state != JobState.DROPPED:
            assert res.stopped_by in ("stalled", "horizon") or job.unschedulable
    if policy != "elasticflow" and res.stopped_by == "completion":
        assert all(s in ("finished", "unschedulable") for s in statuses)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_identical_runs_for_identical_inputs(scenario):
    spec, jobs, policy, overheads = scenario
    _, a = run_checked(spec, jobs, policy, overheads)
    _, b = run_checked(spec, jobs, policy, overheads)
    assert a.decisions == b.decisions
    ra, rb = job_records(a), job_records(b)
    for col in ra.column_names:
        va, vb = ra.column(col).to_pylist(), rb.column(col).to_pylist()
        assert [x if not (isinstance(x, float) and math.isnan(x)) else None for x in va] == \
               [x if not (isinstance(x, float) and math.isnan(x)) else None for x in vb]
    assert a.ts_throughput == b.ts_throughput
