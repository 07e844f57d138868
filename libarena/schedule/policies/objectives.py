"""Arena's scheduling objectives (§3.5): throughput (eq. 5), throughput under deadlines (eq. 6), finish-time
fairness (eq. 7), and average JCT (eq. 5's greedy with Smith's rule, Arena's default). Each tells the generic
event-driven algorithm how to rank launch configurations, scale-down victims and scale-up operations; all
numbers come from the policy's decision view."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from libarena.schedule.config import Objective
from libarena.schedule.entities import Job

if TYPE_CHECKING:
    from libarena.schedule.simulator import Simulator


class ThroughputObjective:
    """eq. 5: maximise the sum of job throughputs. Greedy by throughput per GPU (diminishing returns make
    dense, small allocations the better use of scarce GPUs)."""

    def __init__(self, sim: Simulator):
        self.sim = sim
        #: job index -> (its configurations, their launch order); the throughput order depends on the job's
        #: view only, and a queued job is re-examined every tick, so it is sorted once.
        self._launch_orders: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}

    def admissible(self, job: Job, configs: list[tuple[int, int]]) -> bool:
        return True

    def isolated_s(self, job: Job) -> float:
        """Seconds the whole job takes alone on its fastest configuration the policy allows (its view)."""
        best = job.policy_state.get("best_view")
        if best is None:  # over Arena's configurations (its type and elasticity settings)
            best = job.policy_state["best_view"] = max((float(job.view_thr[tc]) for tc in self.sim.policy.configs(job)),
                                                       default=0.0)
        return job.spec.num_iterations * job.spec.global_batch / best if best > 0 else float("inf")

    def launch_order(self, job: Job, configs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        cached = self._launch_orders.get(job.index)
        if cached is not None and cached[0] is configs:
            return cached[1]
        v = job.view_thr
        order = sorted(configs, key=lambda tc: (-v[tc] / (1 << tc[1]), -v[tc], tc))
        self._launch_orders[job.index] = (configs, order)
        return order

    def rate_scale(self, job: Job) -> float:
        """What the objective divides the job's samples/s by (1: every sample counts the same)."""
        return 1.0

    def victim_score(self, job: Job) -> float | None:
        """Throughput lost per freed GPU when halving the job; None if it may not shrink."""
        a = job.alloc
        t, c = a.type_index, a.count_index
        if c == 0 or not job.view_thr[t, c - 1] > 0:
            return None
        return (job.view_thr[t, c] - job.view_thr[t, c - 1]) / (1 << (c - 1)) / self.rate_scale(job)

    #: upgrade_score(job, t2, c2) is upgrade_gain(job, t2, c2) where upgrade_pays_off(job, t2, c2), else
    #: None, and the gain depends only on the job's view and allocation: Arena's in-flight handler then keeps
    #: the gains of the running jobs' upgrades in an index instead of scoring every job every round.
    static_upgrade_gain: ClassVar[bool] = True
    #: victim_score(job) depends only on the job's view and allocation (Arena indexes it as jobs start)
    static_victim_score: ClassVar[bool] = True

    def upgrade_gain(self, job: Job, t2: int, c2: int) -> float | None:
        """Throughput gained per newly occupied GPU by moving the job to (t2, c2); None if it gains nothing."""
        a = job.alloc
        t, c = a.type_index, a.count_index
        v_old, v_new = job.view_thr[t, c], job.view_thr[t2, c2]
        if not v_new > v_old:
            return None
        extra = (1 << c2) - (1 << c) if t2 == t else (1 << c2)
        return (v_new - v_old) / max(1, extra) / self.rate_scale(job)

    def rate_change(self, job: Job, before: tuple[int, int], after: tuple[int, int]) -> float:
        """The objective's change if the job ran on (type, count index) ``after`` instead of ``before``: its
        throughput gained (negative: lost)."""
        return (job.view_thr[after] - job.view_thr[before]) / self.rate_scale(job)

    def upgrade_pays_off(self, job: Job, t2: int, c2: int) -> bool:
        """Whether the job, moved to (t2, c2) now, finishes earlier despite the rescale overhead."""
        overhead = self.sim.rescale_overhead(job, t2, c2)
        a = job.alloc
        v_old, v_new = job.view_thr[a.type_index, a.count_index], job.view_thr[t2, c2]
        rem = job.remaining_at(self.sim.now) * job.spec.global_batch
        return bool(overhead + rem / v_new < rem / v_old)

    def upgrade_score(self, job: Job, t2: int, c2: int) -> float | None:
        """Throughput gained per newly occupied GPU; None unless the job also finishes earlier despite the
        rescale overhead."""
        gain = self.upgrade_gain(job, t2, c2)
        if gain is None or not self.upgrade_pays_off(job, t2, c2):
            return None
        return gain


class DeadlineObjective(ThroughputObjective):
    """eq. 5 under eq. 6: a job runs only on a configuration that meets its deadline (the fewest GPUs that
    do); a job no configuration can make in time is dropped; scale-downs never break a deadline."""

    static_victim_score = False  # whether a halved job still meets its deadline moves with time

    def _meets(self, job: Job, t: int, c: int, overhead: float) -> bool:
        d = job.spec.deadline
        return d is None or self.sim.estimated_finish(job, t, c, overhead) <= d

    def admissible(self, job: Job, configs: list[tuple[int, int]]) -> bool:
        return any(self._meets(job, t, c, self.sim.launch_overhead(job, t, c)) for t, c in configs)

    def launch_order(self, job: Job, configs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        v = job.view_thr
        ok = [tc for tc in configs if self._meets(job, tc[0], tc[1], self.sim.launch_overhead(job, *tc))]
        return sorted(ok, key=lambda tc: (tc[1], -v[tc], tc))

    def victim_score(self, job: Job) -> float | None:
        score = super().victim_score(job)
        if score is None:
            return None
        a = job.alloc
        t, c = a.type_index, a.count_index - 1
        if not self._meets(job, t, c, self.sim.rescale_overhead(job, t, c)):
            return None
        return score


class FairnessObjective(ThroughputObjective):
    """eq. 7: minimise the largest finish-time fairness rho = (time so far + time left on the allocation) /
    (time the job needs alone on its best configuration)."""

    static_upgrade_gain = False  # rho moves with time
    static_victim_score = False

    def rho(self, job: Job, t: int, c: int, overhead: float = 0.0) -> float:
        finish = self.sim.estimated_finish(job, t, c, overhead)
        return (finish - job.spec.submit_time) / self.isolated_s(job)

    def launch_order(self, job: Job, configs: list[tuple[int, int]]) -> list[tuple[int, int]]:
        v = job.view_thr
        return sorted(configs, key=lambda tc: (-v[tc], tc[1], tc))

    def victim_score(self, job: Job) -> float | None:
        a = job.alloc
        if a.count_index == 0 or not job.view_thr[a.type_index, a.count_index - 1] > 0:
            return None
        t, c = a.type_index, a.count_index - 1
        return self.rho(job, t, c, self.sim.rescale_overhead(job, t, c))

    def upgrade_score(self, job: Job, t2: int, c2: int) -> tuple[float, float] | None:
        a = job.alloc
        before = self.rho(job, a.type_index, a.count_index)
        after = self.rho(job, t2, c2, self.sim.rescale_overhead(job, t2, c2))
        if not after < before:
            return None
        # help the job furthest behind first, and with its option that helps it most (rho before alone would tie
        # all of a job's options, and the first improving one in their order would win)
        return before, before - after


class JCTObjective(ThroughputObjective):
    """Average JCT: eq. 5's greedy with each job's throughput gained or lost per GPU weighted by 1 / the
    job's isolated duration (Smith's rule, weighted shortest processing time first). Where GPUs are
    contended, scale-ups go to, and scale-downs spare, the jobs that finish soonest with them; a long job
    gives way. The weight is fixed per job, so the scores stay functions of the job's allocation (indexed)."""

    def rate_scale(self, job: Job) -> float:
        return self.isolated_s(job)


OBJECTIVES = {Objective.JCT: JCTObjective, Objective.THROUGHPUT: ThroughputObjective,
              Objective.DEADLINE: DeadlineObjective, Objective.FAIRNESS: FairnessObjective}
