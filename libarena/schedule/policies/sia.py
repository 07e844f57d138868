"""``sia``: heterogeneity- and elasticity-aware ILP scheduling (Jayaram Subramanya et al., SOSP'23).

Sia's view is its bootstrapped estimate: 1-GPU (smallest fitting count) data-parallel throughput per GPU type,
extrapolated linearly with the GPU count (the ``dp-linear`` view, §2.3 of the Arena paper). Every round with a
change, an ILP chooses one (GPU type, count) per job, maximising the sum of job utilities under per-type capacity:

    utility(job, config) = sqrt(N_min x estimate(config) / estimate(job's smallest config)) x (1 - restart share)

N_min x estimate / smallest estimate is Sia's normalised goodput (its paper's G_ij, with N_min the fewest GPUs
the job runs on; statistical efficiency is 1 at the traces' fixed batches), raised to Sia's fairness power p as
the Arena paper's artifact runs it, p = 0.5, maximised (Sia's own default is p = -0.5 with a no-allocation
penalty of 1.1, minimised; see docs/baselines.md). The restart share (checkpoint-resume + AP search over the
job's estimated remaining time, capped at 1) discounts a config change of an in-flight job; Sia's own factor,
(age - restarts x R) / (age + R), gave Sia less on philly (docs/baselines.md). In-flight jobs must keep a config
(no preemption); they are offered their current config, one count up
on the same type, one count down (only while jobs queue: shrinking can only help to admit them), and the same
count on every other type (slower ones too, so the program can swap two jobs' types). Queued jobs (the oldest
PolicyConfig.ilp_max_queued) are offered every config up to PolicyConfig.max_gpus_per_job. This bounds the ILP
to about 6 x (in-flight jobs) + (GPU types x counts) x (queued jobs) binaries; each solve is limited to
PolicyConfig.ilp_time_limit_s.
"""

from __future__ import annotations

import math

import numpy as np

from libarena.schedule.config import APSearch, ProfilingKind
from libarena.schedule.entities import Job, JobState
from libarena.schedule.policies.base import Policy, register_policy
from libarena.schedule.policies.ilp import restart_discount, solve_assignment


@register_policy
class SiaPolicy(Policy):
    name = "sia"
    description = "Sia: ILP over GPU type and count per round, from 1-GPU bootstrapped linear estimates"
    default_view = "dp-linear"
    profiling = ProfilingKind.BOOTSTRAP
    ap_search = APSearch.FULL
    relative_cost = 12.0  # an ILP per round

    def attach(self, sim) -> None:
        super().attach(sim)
        self.queue: list[Job] = []

    def _configs(self, job: Job) -> list[tuple[int, int]]:
        cached = job.policy_state.get("sia_configs")
        if cached is None:
            ok = (job.view_thr > 0) & self.allowed
            cached = job.policy_state["sia_configs"] = [(int(t), int(c)) for t, c in zip(*np.nonzero(ok))]
            job.policy_state["sia_base"] = min(job.view_thr[t, c] for t, c in cached) if cached else 1.0
            job.policy_state["sia_min_gpus"] = min(1 << c for _, c in cached) if cached else 1
        return cached

    def runnable(self, job: Job) -> bool:
        return bool(self._configs(job))

    def on_arrival(self, job: Job) -> None:
        self.queue.append(job)

    def withdraw(self, job: Job) -> None:
        self.queue = [j for j in self.queue if j is not job]

    def _utility(self, job: Job, t: int, c: int) -> float:
        """sqrt of Sia's normalised goodput (N_min x the config's estimate / the smallest config's)."""
        return math.sqrt(job.policy_state["sia_min_gpus"] * job.view_thr[t, c] / job.policy_state["sia_base"])

    def schedule(self) -> None:
        sim = self.sim
        capacity = np.array([p.capacity for p in sim.pools], dtype=np.int64)
        groups, must, jobs, configs = [], [], [], []
        for job in sim.active.values():
            a = job.alloc
            t0, c0 = a.type_index, a.count_index
            if job.state == JobState.STARTING:
                capacity[t0] -= a.num_gpus
                continue
            self._configs(job)
            remaining_s = job.remaining_at(sim.now) * job.spec.global_batch / job.view_thr[t0, c0]
            # the same count on every other type, slower ones too: Sia's program weighs every configuration of
            # every job, so it may move a job to a slower type to give its GPUs to one that values them more
            cand = [(t0, c0)] + [(t, c) for t, c in self._configs(job)
                                 if (t == t0 and c == c0 + 1) or (t == t0 and c == c0 - 1 and self.queue)
                                 or (t != t0 and c == c0)]
            opts = [(t0, 1 << c0, self._utility(job, t0, c0))]
            opts += [(t, 1 << c, self._utility(job, t, c) * restart_discount(sim.rescale_overhead(job, t, c), remaining_s))
                     for t, c in cand[1:]]
            groups.append(opts)
            must.append(True)
            jobs.append(job)
            configs.append(cand)
        for job in self.queue[: self.config.ilp_max_queued]:
            cand = self._configs(job)
            groups.append([(t, 1 << c, self._utility(job, t, c)) for t, c in cand])
            must.append(False)
            jobs.append(job)
            configs.append(cand)
        if not groups:
            return
        choice = solve_assignment(groups, must, np.maximum(capacity, 0), self.config.ilp_time_limit_s,
                                  on_time_limit=lambda: sim.count("ilp_time_limit_hits"))
        chosen = [(job, cand[k]) for job, cand, k in zip(jobs, configs, choice) if k is not None]
        # shrinks first, then moves and growths (retried after the others free GPUs), then launches
        for job, (t, c) in chosen:
            if job.state == JobState.RUNNING and t == job.alloc.type_index and c < job.alloc.count_index:
                sim.rescale(job, t, c)
        self.apply_moves([(job, t, c) for job, (t, c) in chosen
                          if job.state == JobState.RUNNING and (t, c) != (job.alloc.type_index, job.alloc.count_index)])
        launched = set()
        for job, (t, c) in chosen:
            if job.state == JobState.QUEUED and sim.launch(job, t, c):
                launched.add(job.index)
        if launched:
            self.queue = [j for j in self.queue if j.index not in launched]
