"""``elasticflow`` and ``elasticflow-ls``: deadline-aware elastic scaling on homogeneous GPUs (Gu et al.,
ASPLOS'23).

ElasticFlow is not heterogeneity-aware: a job stays on the GPU type it asked for, and the policy scales its
GPU count. Per type, every round with a change:

1. Admission control, in arrival order, over time: after what running best-effort jobs keep (their smallest
   count until they end), the admitted jobs (running ones first, each group by deadline) plan their *minimum
   satisfactory share* into the type's free GPUs over the future (the fewest GPUs with which the decision view
   finishes the job by its deadline, taking at most what the jobs planned before it leave free at each moment,
   paying a rescale at each change of count and never left without GPUs once started, as the artifact's
   ``ef_sim_allocation`` plans time slots); a new job is admitted if such a plan exists in what they leave free,
   so a job that can start once another ends is admitted, not only one whose share fits now.
   ``elasticflow`` drops a job it cannot admit; ``elasticflow-ls`` (loosened deadlines, the paper's EF-LS) gives
   every job a deadline 10^9 s after its submission, as the artifact's ``elasticflow-l`` does
   (deadline_horizon_s; the trace's deadlines are not read), and would keep a job it could not admit as best
   effort, served after admitted jobs. Under ``elasticflow`` a job without a deadline is best effort, never
   dropped.
2. Allocation: admitted jobs in deadline order get their share of the plan's present (in-flight jobs keep their
   current count when it fits, to avoid needless checkpoint-resumes); admitted jobs planned to start later and
   best-effort jobs get their smallest runnable count where GPUs are left; leftover GPUs go greedily to the
   largest throughput gain per added GPU, if that also finishes the job earlier despite the rescale overhead.
Admitted jobs are never preempted to zero (the paper's setup).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

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
        self._planned_now: dict[int, int | None] = {}  # job index -> its count index now in this round's plan

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
        if self.config.deadline_horizon_s is not None:
            return job.spec.submit_time + self.config.deadline_horizon_s
        d = job.spec.deadline
        if d is None:
            return math.inf
        return job.spec.submit_time + self.config.deadline_slack * (d - job.spec.submit_time)

    def _overhead(self, job: Job, c: int) -> float:
        """What the job pays before it trains on count index c of its type if that is decided now."""
        sim = self.sim
        t = job.requested_type_index
        cur = job.alloc.count_index if job.alloc is not None and job.state != JobState.QUEUED else None
        if cur is None:
            return sim.launch_overhead(job, t, c)
        if c == cur:  # a starting job still pays the rest of its overhead
            return max(0.0, job.starts_at - sim.now) if job.state == JobState.STARTING else 0.0
        return sim.rescale_overhead(job, t, c)

    def _min_share(self, job: Job) -> int | None:
        """The fewest GPUs (count index) that finish the job by its deadline if it holds them from now on."""
        sim = self.sim
        t = job.requested_type_index
        deadline = self._deadline(job)
        for c in self._counts(job):
            if sim.estimated_finish(job, t, c, self._overhead(job, c)) <= deadline:
                return c
        return None

    def _plan(self, job: Job, free: _FreeTimeline) -> tuple[int | None, list[tuple[float, float, int]]] | None:
        """The job's minimum satisfactory share planned into ``free`` (admission control over time): the smallest
        count cap under which the job, taking at each moment the largest runnable count within the cap and the
        GPUs left free, finishes by its deadline. Returns (the count index it holds now, or None if it starts
        later; the plan's (start, end, count index) pieces), or None if no cap meets the deadline."""
        deadline = self._deadline(job)
        counts = self._counts(job)
        for k in range(len(counts)):
            pieces = self._fill(job, free, counts[:k + 1], deadline)
            if pieces is not None:
                return self._count_now(pieces), pieces
        return None

    def _count_now(self, pieces: list[tuple[float, float, int]]) -> int | None:
        """The count index a plan's pieces hold now, or None if the plan starts later."""
        return pieces[0][2] if pieces and pieces[0][0] <= self.sim.now else None

    def _fill(self, job: Job, free: _FreeTimeline, counts: list[int], deadline: float,
              pause: bool = False) -> list[tuple[float, float, int]] | None:
        """The job run from now on the largest of ``counts`` (count indices, ascending) that the GPUs ``free``
        leaves allow at each moment, as early as they allow, until it is done: its (start, end, count index)
        pieces, or None if it is not done by ``deadline`` (or ever). It pays its start-up (or, running, the rest
        of it) before it trains, and a rescale's overhead at every change of count; once started it is never left
        without GPUs (an admitted job is not preempted to zero): a moment with too few free GPUs makes the plan
        fail, unless ``pause`` (a reservation, not an admission)."""
        sim = self.sim
        t = job.requested_type_index
        thr = job.view_thr[t]
        samples = job.remaining_at(sim.now) * job.spec.global_batch
        overhead_left = 0.0
        pieces: list[tuple[float, float, int]] = []
        for start, end, gpus in free.segments():
            if start > deadline:
                return None
            fitting = [c for c in counts if (1 << c) <= gpus]
            if not fitting:
                if pieces and not pause:
                    return None
                continue
            c = fitting[-1]
            if not pieces:
                overhead_left = self._overhead(job, c)
            elif c != pieces[-1][2]:
                overhead_left += sim.rescale_overhead(job, t, c)
            run_from = min(end, start + overhead_left)
            overhead_left -= run_from - start
            done_at = None
            if run_from < end:
                need = samples / thr[c]
                if run_from + need <= end:
                    done_at = run_from + need
                else:
                    samples -= thr[c] * (end - run_from)
            piece_end = end if done_at is None else done_at
            if pieces and pieces[-1][2] == c and pieces[-1][1] == start:
                pieces[-1] = (pieces[-1][0], piece_end, c)  # one piece while the count stays
            else:
                pieces.append((start, piece_end, c))
            if done_at is not None:
                return pieces if done_at <= deadline else None
        return None

    def schedule(self) -> None:
        sim = self.sim
        pools = sim.pools
        # 1. admission control, planned over time: first what running best-effort jobs keep (their smallest count:
        # the allocation never takes them below it), then the admitted jobs' plans (running ones first, since they
        # hold their GPUs now; each group by deadline), then each new job's in what those leave
        free = [_FreeTimeline(sim.now, pool.capacity) for pool in pools]
        self._planned_now = {}
        for job in sim.active.values():
            if not job.policy_state.get("admitted"):
                free[job.requested_type_index].take(
                    self._fill(job, free[job.requested_type_index], self._counts(job)[:1], math.inf, pause=True) or [])
        by_deadline = lambda j: (self._deadline(j), j.index)  # noqa: E731
        admitted = (sorted((j for j in sim.active.values() if j.policy_state.get("admitted")), key=by_deadline)
                    + sorted((j for j in self.waiting if j.policy_state.get("admitted")), key=by_deadline))
        for job in admitted:
            t = job.requested_type_index
            plan = self._plan(job, free[t])
            if plan is None:  # behind its deadline now: it still holds (or will take) GPUs until it is done
                cap = job.alloc.count_index if job.active else self._counts(job)[0]
                pieces = self._fill(job, free[t], [c for c in self._counts(job) if c <= cap], math.inf, pause=True) or []
                plan = self._count_now(pieces), pieces
            self._planned_now[job.index] = plan[0]
            free[t].take(plan[1])
        for job in self.pending:
            t = job.requested_type_index
            plan = self._plan(job, free[t]) if math.isfinite(self._deadline(job)) else None
            if plan is not None:
                free[t].take(plan[1])
                self._planned_now[job.index] = plan[0]
                job.policy_state["admitted"] = True
                self.waiting.append(job)
            elif self.config.drop_infeasible and math.isfinite(self._deadline(job)):
                sim.drop(job)
            else:  # no deadline, or EF-LS: best effort
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
        floors: dict[int, int] = {}  # the fewest GPUs each running job may be shrunk to (computed once: it is costly)
        for job in sorted(running, key=lambda j: (self._deadline(j), j.index)):
            floor = self._min_share(job)
            floors[job.index] = self._counts(job)[0] if floor is None else floor
            target[job.index] = max(floors[job.index], job.alloc.count_index)
        total = sum(1 << c for c in target.values())
        # shrink in-flight jobs (smallest loss per freed GPU first) until the admitted jobs' shares of the plan's
        # present fit (an admitted job planned to start later needs nothing now)
        planned_now = [self._planned_now.get(j.index) for j in admitted]
        need = sum(1 << c for c in planned_now if c is not None)
        by_job = {j.index: j for j in running}
        while total + need > free:
            best, best_loss = None, math.inf
            for idx, c in target.items():
                job = by_job[idx]
                if c > floors[idx] and job.view_thr[t, c - 1] > 0:
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
            c = self._planned_now.get(job.index) if job.policy_state.get("admitted") else None
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
        # the artifact's elasticflow-l: every deadline 10^9 s away (LOOSEN_DEADLINE), so every job is admitted
        return ElasticFlowConfig(deadline_horizon_s=1e9, drop_infeasible=False)


class _FreeTimeline:
    """A GPU type's free GPUs from now on, piecewise constant: ``free[i]`` GPUs from ``times[i]`` until
    ``times[i + 1]`` (the last value for ever)."""

    def __init__(self, now: float, capacity: int):
        self.times = [now]
        self.free = [capacity]

    def segments(self) -> Iterator[tuple[float, float, int]]:
        for i, (start, gpus) in enumerate(zip(self.times, self.free)):
            yield start, self.times[i + 1] if i + 1 < len(self.times) else math.inf, gpus

    def _split(self, at: float) -> int:
        """The index of the piece that starts at ``at`` (made if needed)."""
        i = bisect.bisect_right(self.times, at) - 1
        if self.times[i] != at:
            i += 1
            self.times.insert(i, at)
            self.free.insert(i, self.free[i - 1])
        return i

    def take(self, pieces: list[tuple[float, float, int]]) -> None:
        """Take a plan's GPUs ((start, end, count index) pieces) from the free ones."""
        for start, end, c in pieces:
            if end <= start:
                continue
            i, j = self._split(start), self._split(end)
            for k in range(i, j):
                self.free[k] -= 1 << c
