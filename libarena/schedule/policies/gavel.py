"""``gavel``: heterogeneity-aware round-based scheduling (Narayanan et al., OSDI'20), max-sum-throughput.

Every round with a change, an ILP picks a GPU type for every in-flight job and for the oldest queued jobs
(PolicyConfig.ilp_max_queued) maximising the sum of the jobs' throughputs (samples/s in the policy's view) under
per-type GPU capacity: the objective of Gavel's max-sum-throughput policy (its repository's
``max_sum_throughput.py``), which the Arena paper's artifact runs with every admitted job on one type. Admitting a
queued job comes first: each admission is worth more than a change of any one running job's throughput (the
artifact admits a job whenever the program stays feasible with it), the oldest first among equals. Gavel is not
elastic: a job's GPU count is the one it asked for (more where its view says it does not fit, Case 2). As in the
paper's setup, admitted jobs are never suspended; an in-flight job may be migrated to another type when the ILP
prefers it, at the cost of a checkpoint-resume and AP search: it is offered every other type (slower ones too, so
the program can swap two jobs' types or make room for a queued job), each valued net of the share of its
remaining time the restart loses (Gavel's leases assume preemption is cheap, which it is not here). The moves a
solve chooses are made together (two jobs may swap GPUs). Placement failures due to fragmentation leave the job
where it was (or queued). Each solve is limited to PolicyConfig.ilp_time_limit_s.
"""

from __future__ import annotations

import numpy as np

from libarena.schedule.config import APSearch, ProfilingKind
from libarena.schedule.entities import Job, JobState, count_index
from libarena.schedule.policies.base import Policy, register_policy
from libarena.schedule.policies.ilp import restart_discount, solve_assignment


@register_policy
class GavelPolicy(Policy):
    name = "gavel"
    description = "Gavel: heterogeneity-aware max-sum-throughput ILP per round (rigid GPU counts)"
    default_view = "dp"
    profiling = ProfilingKind.FULL
    ap_search = APSearch.FULL
    relative_cost = 6.0  # an ILP per round

    def attach(self, sim) -> None:
        super().attach(sim)
        self.queue: list[Job] = []

    def _counts(self, job: Job) -> list[int | None]:
        cached = job.policy_state.get("gavel_counts")
        if cached is None:
            cached = job.policy_state["gavel_counts"] = [self.requested_count_on(job, t) for t in range(len(self.sim.pools))]
        return cached

    def runnable(self, job: Job) -> bool:
        return any(c is not None for c in self._counts(job))

    def on_arrival(self, job: Job) -> None:
        self.queue.append(job)

    def withdraw(self, job: Job) -> None:
        self.queue = [j for j in self.queue if j is not job]

    def schedule(self) -> None:
        sim = self.sim
        capacity = np.array([p.capacity for p in sim.pools], dtype=np.int64)
        groups, must, jobs = [], [], []
        queued = self.queue[: self.config.ilp_max_queued]
        # throughputs in units of the round's largest (a common scale: the program's coefficients stay within 1)
        unit = max([float(job.view_thr.max()) for job in (*sim.active.values(), *queued)] + [1e-12])
        for job in sim.active.values():
            a = job.alloc
            t0, c0 = a.type_index, a.count_index
            options = []
            if job.state == JobState.RUNNING:
                remaining_s = job.remaining_at(sim.now) * job.spec.global_batch / job.view_thr[t0, c0]
                for t, c in enumerate(self._counts(job)):
                    if c is None or t == t0:
                        continue
                    # every other type, slower ones too (the program may swap two jobs' types or make room for a
                    # queued one), valued net of the share of the job's remaining time the restart loses
                    value = job.view_thr[t, c] / unit * restart_discount(sim.rescale_overhead(job, t, c), remaining_s)
                    if value > 0:
                        options.append((t, 1 << c, value))
            if not options:
                capacity[t0] -= a.num_gpus  # fixed where it is
                continue
            groups.append([(t0, a.num_gpus, job.view_thr[t0, c0] / unit)] + options)
            must.append(True)
            jobs.append(job)
        # an admission outweighs a change of any one running job's throughput (each at most 1 in these units); a
        # larger constant would loosen the solver's relative gap on the throughputs
        admission = 2.0
        for rank, job in enumerate(queued):
            # a vanishing age bonus breaks ties in arrival order
            bonus = 1e-3 * (len(queued) - rank) / len(queued)
            groups.append([(t, 1 << c, admission + job.view_thr[t, c] / unit + bonus)
                           for t, c in enumerate(self._counts(job)) if c is not None])
            must.append(False)
            jobs.append(job)
        if not groups:
            return
        choice = solve_assignment(groups, must, np.maximum(capacity, 0), self.config.ilp_time_limit_s,
                                  on_time_limit=lambda: sim.count("ilp_time_limit_hits"))
        launched = set()
        self.apply_moves([(job, opts[k][0], count_index(opts[k][1])) for job, opts, k in zip(jobs, groups, choice)
                          if k is not None and k != 0 and job.state != JobState.QUEUED])
        for job, opts, k in zip(jobs, groups, choice):
            if k is None or job.state != JobState.QUEUED:
                continue
            t, gpus, _ = opts[k]
            if sim.launch(job, t, count_index(gpus)):
                launched.add(job.index)
        if launched:
            self.queue = [j for j in self.queue if j.index not in launched]
