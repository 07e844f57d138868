"""``elasticflow`` and ``elasticflow-ls``: deadline-aware elastic scaling on homogeneous GPUs (Gu et al.,
ASPLOS'23).

ElasticFlow is not heterogeneity-aware: a job stays on the GPU type it asked for, and the policy scales its
GPU count. Per type, every round with a change:

1. Admission control, in arrival order: a job's *minimum satisfactory share* is the fewest GPUs with which its
   decision view finishes it by its deadline; it is admitted if the admitted jobs' minimum shares plus its own
   fit the type's capacity. ``elasticflow`` drops a job it cannot admit; ``elasticflow-ls`` (loosened deadlines,
   the paper's EF-LS) stretches every deadline (deadline_slack, 2x the submit-to-deadline span) and keeps jobs it
   cannot admit as best effort, served after admitted jobs.
2. Allocation: admitted jobs in deadline order get their minimum share (in-flight jobs keep their current count
   when it fits, to avoid needless checkpoint-resumes); best-effort jobs get their smallest runnable count;
   leftover GPUs go greedily to the largest throughput gain per added GPU, if that also finishes the job earlier
   despite the rescale overhead.
Admitted jobs are never preempted to zero (the paper's setup).
"""

from __future__ import annotations

import math

from libarena.schedule.config import APSearch, ElasticFlowConfig, ProfilingKind
from libarena.schedule.entities import Job, JobState
from libarena.schedule.policies.base import Policy, register_policy


@register_policy
class ElasticFlowPolicy(Policy):
    name = "elasticflow"
    description = "ElasticFlow: deadline admission control + elastic GPU counts on the requested GPU type"
    default_view = "dp"
    profiling = ProfilingKind.FULL
    ap_search = APSearch.FULL
    config_class = ElasticFlowConfig
    config: ElasticFlowConfig

    @classmethod
    def default_config(cls) -> ElasticFlowConfig:
        return ElasticFlowConfig(deadline_slack=1.0, drop_infeasible=True)

    def __init__(self, config: ElasticFlowConfig | None = None):
        super().__init__(config if config is not None else self.default_config())

    def attach(self, sim) -> None:
        super().attach(sim)
        self.pending: list[Job] = []  # arrived, not yet through admission control
        self.waiting: list[Job] = []  # admitted or best effort, not yet launched

    def _counts(self, job: Job) -> list[int]:
        t = job.requested_type_index
        return [c for c in range(self.sim.perf.num_counts) if self.allowed[t, c] and job.view_thr[t, c] > 0]

    def placement_types(self, job: Job) -> list[int]:
        return [job.requested_type_index]

    def on_arrival(self, job: Job) -> None:
        self.pending.append(job)

    def withdraw(self, job: Job) -> None:
        self.pending = [j for j in self.pending if j is not job]
        self.waiting = [j for j in self.waiting if j is not job]

    def _deadline(self, job: Job) -> float:
        d = job.spec.deadline
        if d is None:
            return math.inf
        return job.spec.submit_time + self.config.deadline_slack * (d - job.spec.submit_time)

    def _min_share(self, job: Job) -> int | None:
        sim = self.sim
        t = job.requested_type_index
        cur = job.alloc.count_index if job.alloc is not None and job.state != JobState.QUEUED else None
        deadline = self._deadline(job)
        for c in self._counts(job):
            if cur is None:
                o = sim.launch_overhead(job, t, c)
            elif c == cur:  # a starting job still pays the rest of its overhead
                o = max(0.0, job.starts_at - sim.now) if job.state == JobState.STARTING else 0.0
            else:
                o = sim.rescale_overhead(job, t, c)
            if sim.estimated_finish(job, t, c, o) <= deadline:
                return c
        return None

    def schedule(self) -> None:
        sim = self.sim
        pools = sim.pools
        # 1. admission control
        committed = [0] * len(pools)
        for job in list(sim.active.values()) + self.waiting:
            if job.policy_state.get("admitted"):
                c = self._min_share(job)
                if c is None:
                    c = job.alloc.count_index if job.active else self._counts(job)[0]
                committed[job.requested_type_index] += 1 << c
        for job in self.pending:
            t = job.requested_type_index
            c = self._min_share(job)
            if c is not None and committed[t] + (1 << c) <= pools[t].capacity:
                committed[t] += 1 << c
                job.policy_state["admitted"] = True
                self.waiting.append(job)
            elif self.config.drop_infeasible:
                sim.drop(job)
            else:
                job.policy_state["admitted"] = False
                self.waiting.append(job)
        self.pending = []
        # 2. allocation, per GPU type
        for t, pool in enumerate(pools):
            self._allocate(t, pool)

    def _allocate(self, t: int, pool) -> None:
        sim = self.sim
        free = pool.capacity
        running = []
        for job in sim.active.values():
            if job.alloc.type_index != t:
                continue
            if job.state == JobState.STARTING:
                free -= job.alloc.num_gpus
            else:
                running.append(job)
        waiting = [j for j in self.waiting if j.requested_type_index == t]
        admitted = [j for j in waiting if j.policy_state.get("admitted")]
        best_effort = [j for j in waiting if not j.policy_state.get("admitted")]
        target: dict[int, int] = {}
        for job in sorted(running, key=lambda j: (self._deadline(j), j.index)):
            floor = self._min_share(job)
            if floor is None:
                floor = self._counts(job)[0]
            target[job.index] = max(floor, job.alloc.count_index)
        total = sum(1 << c for c in target.values())
        # shrink in-flight jobs (smallest loss per freed GPU first) until the admitted minimum shares fit
        need = sum(1 << (self._min_share(j) if self._min_share(j) is not None else self._counts(j)[0]) for j in admitted)
        by_job = {j.index: j for j in running}
        while total + need > free:
            best, best_loss = None, math.inf
            for idx, c in target.items():
                job = by_job[idx]
                floor = self._min_share(job)
                floor = self._counts(job)[0] if floor is None else floor
                if c > floor and job.view_thr[t, c - 1] > 0:
                    loss = (job.view_thr[t, c] - job.view_thr[t, c - 1]) / (1 << (c - 1))
                    if loss < best_loss:
                        best, best_loss = idx, loss
            if best is None:
                break
            total -= 1 << (target[best] - 1)
            target[best] -= 1
        # the admitted jobs by deadline, then the best-effort ones: the order they are given targets and launched in
        launch_order = sorted(admitted, key=lambda j: (self._deadline(j), j.enqueue_seq)) + best_effort
        for job in launch_order:
            c = self._min_share(job) if job.policy_state.get("admitted") else None
            c = self._counts(job)[0] if c is None else c
            if total + (1 << c) <= free:
                target[job.index] = c
                by_job[job.index] = job
                total += 1 << c
        # greedy scale-up with what is left
        while True:
            best, best_gain = None, 0.0
            for idx, c in target.items():
                job = by_job[idx]
                c2 = c + 1
                if c2 >= job.view_thr.shape[1] or not self.allowed[t, c2] or total + (1 << c) > free:
                    continue
                if not job.view_thr[t, c2] > job.view_thr[t, c]:
                    continue
                if job.active and (sim.estimated_finish(job, t, c2, sim.rescale_overhead(job, t, c2))
                                   >= sim.estimated_finish(job, t, c, 0.0)):
                    continue
                gain = (job.view_thr[t, c2] - job.view_thr[t, c]) / (1 << c)
                if gain > best_gain:
                    best, best_gain = idx, gain
            if best is None:
                break
            total += 1 << target[best]
            target[best] += 1
        # apply: shrinks, then launches, then growths; shrinks only where they let more launches be placed (the
        # halves they free may be scattered over nodes, where an aligned block is needed: the job would pay the
        # rescale and lose its GPUs for nothing)
        if self._shrinks_place_more(sim, pool, running, launch_order, target):
            for job in running:
                if target[job.index] < job.alloc.count_index:
                    sim.rescale(job, t, target[job.index])
        launched = set()
        for job in launch_order:  # an earlier best-effort arrival does not take the block an admitted job was given
            if job.index in target and sim.launch(job, t, target[job.index]):
                launched.add(job.index)
        if launched:
            self.waiting = [j for j in self.waiting if j.index not in launched]
        for job in running:
            if target[job.index] > job.alloc.count_index:
                sim.rescale(job, t, target[job.index])

    @staticmethod
    def _shrinks_place_more(sim, pool, running: list[Job], waiting: list[Job], target: dict[int, int]) -> bool:
        """Whether shrinking the running jobs to their targets lets more admitted jobs' launches be placed than
        without, or as many and more best-effort ones (tried on the pool in the launches' order and undone, as
        the simulator would place them)."""
        shrinking = [job for job in running if target[job.index] < job.alloc.count_index]
        launches = [(target[job.index], bool(job.policy_state.get("admitted"))) for job in waiting if job.index in target]
        if not shrinking or not launches:
            return False

        def placeable() -> tuple[int, int]:
            placed, admitted, best_effort = [], 0, 0
            for c, is_admitted in launches:
                blocks = pool.place(1 << c)
                if blocks is not None:
                    placed.append(blocks)
                    admitted += is_admitted
                    best_effort += not is_admitted
            for blocks in reversed(placed):
                pool.release(blocks)
            return admitted, best_effort

        without = placeable()
        moved = [(job.alloc, sim.place_resized(job.alloc, job.alloc.type_index, target[job.index])) for job in shrinking]
        more = placeable() > without
        for alloc, blocks in reversed(moved):
            if blocks is not None:
                sim.unplace_resized(alloc, alloc.type_index, blocks)
        return more


@register_policy
class ElasticFlowLSPolicy(ElasticFlowPolicy):
    name = "elasticflow-ls"
    description = "ElasticFlow with loosened deadlines: jobs it cannot admit run best effort instead of being dropped"

    @classmethod
    def default_config(cls) -> ElasticFlowConfig:
        return ElasticFlowConfig(deadline_slack=2.0, drop_infeasible=False)
