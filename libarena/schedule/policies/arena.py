"""``arena``: Arena's AP-aware dynamic scheduler (§3.5, Algorithm 1).

- P priority queues (λ = 1 is the highest). Queued jobs are visited by (λ, enqueue order). A job that
  cannot be placed even after scaling down up to D in-flight jobs blocks its queue: later jobs of the SAME
  queue may still launch and may scale others down; jobs of lower queues may only take GPUs that are already
  free, and the first of them that cannot stops the pass (Algorithm 1, lines 6-9).
- A job queued longer than the promotion time moves one queue up.
- Run-to-completion: an in-flight job is never preempted to zero, and is only scaled down to a configuration
  its view says can still run.
- Launch handler: place the job on its best placeable configuration (objective-specific order over GPU type
  x count); if none, halve the in-flight job with the smallest objective loss per freed GPU, up to D times
  (rolled back if the job still does not fit).
- In-flight handler: while GPUs are idle, apply the scale-up (more GPUs of the same type, or a switch of GPU
  type at a neighbouring count) with the largest gain per newly used GPU that also finishes the job earlier
  despite the rescale overhead, up to D times.
- Periodic defragmenting migration: when a queued job is blocked only by fragmentation on a type, the jobs of
  the least-used partially occupied node of that type are migrated elsewhere (at most D of them).
"""

from __future__ import annotations

from libarena.schedule.config import APSearch, ArenaPolicyConfig, ProfilingKind
from libarena.schedule.entities import Job, JobState, TypePool
from libarena.schedule.policies.base import Policy, register_policy
from libarena.schedule.policies.objectives import OBJECTIVES


@register_policy
class ArenaPolicy(Policy):
    name = "arena"
    description = "Arena: priority queues, launch/in-flight 2-D scaling with search depth D, AP-aware view"
    default_view = "arena"
    profiling = ProfilingKind.GRID
    ap_search = APSearch.PRUNED
    config_class = ArenaPolicyConfig
    config: ArenaPolicyConfig
    persistent_attrs = ("next_defrag", "_depth_exhausted")

    def __init__(self, config: ArenaPolicyConfig | None = None):
        super().__init__(config)
        if not self.config.pruning:
            self.ap_search = APSearch.FULL
        if not self.config.profiler:
            self.profiling = ProfilingKind.FULL

    def attach(self, sim) -> None:
        super().attach(sim)
        self.queue: list[Job] = []
        self.objective = OBJECTIVES[self.config.objective](sim)
        self._smallest_cache: dict[int, tuple[int, frozenset[int]]] = {}
        self.next_promotion = float("inf")
        self._depth_exhausted = False  # the last in-flight handler stopped at depth D: try again next tick
        self.next_defrag = sim.now + self.config.defrag_interval_s if self.config.defrag_interval_s > 0 else float("inf")

    # -- configurations ------------------------------------------------------------------------------
    def configs(self, job: Job) -> list[tuple[int, int]]:
        cached = job.policy_state.get("configs")
        if cached is not None:
            return cached
        types = range(len(self.sim.pools)) if self.config.hetero else [job.requested_type_index]
        out = []
        for t in types:
            if self.config.elastic:
                counts = [c for c in range(self.sim.perf.num_counts) if self.allowed[t, c] and job.view_thr[t, c] > 0]
            else:
                c = self.requested_count_on(job, t)
                counts = [] if c is None else [c]
            out.extend((t, c) for c in counts)
        job.policy_state["configs"] = out
        return out

    def runnable(self, job: Job) -> bool:
        return bool(self.configs(job))

    def on_arrival(self, job: Job) -> None:
        self.queue.append(job)
        if job.priority > 1:
            self.next_promotion = min(self.next_promotion, job.queue_since + self.config.promotion_time_s)

    def needs_schedule(self) -> bool:
        now = self.sim.now
        return (self.sim.dirty or self._depth_exhausted
                or (bool(self.queue) and (now >= self.next_promotion or now >= self.next_defrag)))

    # -- the scheduling round (Algorithm 1) ----------------------------------------------------------
    def schedule(self) -> None:
        sim = self.sim
        self._promote()
        if sim.now >= self.next_defrag:
            self.next_defrag = sim.now + self.config.defrag_interval_s
            self._defragment()
        self._victims: list[tuple[float, int, Job]] | None = None
        blocked = self.config.num_queues + 1  # λ' in Algorithm 1
        launched: set[int] = set()
        order = sorted(self.queue, key=lambda j: (j.priority, j.enqueue_seq))
        # GPUs the queued jobs need at their smallest configurations: a launch only grows into GPUs beyond that
        self._reserve = sum(self._smallest(j)[0] for j in order)
        for job in order:
            configs = self.configs(job)
            self._reserve -= self._smallest(job)[0]
            if not self.objective.admissible(job, configs):
                sim.drop(job)
                launched.add(job.index)
                continue
            ok = self._launch(job, configs, may_scale_down=job.priority <= blocked)
            if ok:
                launched.add(job.index)
            elif job.priority <= blocked:
                blocked = job.priority
            else:
                break
        if launched:
            self.queue = [j for j in self.queue if j.index not in launched]
        self._scale_up()
        self._refresh_promotion()

    def _promote(self) -> None:
        now = self.sim.now
        if now < self.next_promotion:
            return
        for job in self.queue:
            if job.priority > 1 and now - job.queue_since >= self.config.promotion_time_s:
                job.priority -= 1
                job.queue_since = now

    def _refresh_promotion(self) -> None:
        due = [j.queue_since + self.config.promotion_time_s for j in self.queue if j.priority > 1]
        self.next_promotion = min(due) if due else float("inf")

    # -- launch handler ------------------------------------------------------------------------------
    def _smallest(self, job: Job) -> tuple[int, frozenset[int]]:
        """(GPUs of the job's smallest configuration, its GPU types): static per job, asked every tick."""
        cached = self._smallest_cache.get(job.index)
        if cached is None:
            configs = self.configs(job)
            cached = (min((1 << c for _, c in configs), default=0), frozenset(t for t, _ in configs))
            self._smallest_cache[job.index] = cached
        return cached

    def _best_placeable(self, job: Job, configs: list[tuple[int, int]]) -> tuple[int, int] | None:
        pools = self.sim.pools
        for t, c in self.objective.launch_order(job, configs):
            if pools[t].can_place(1 << c):
                return t, c
        return None

    def _launch(self, job: Job, configs: list[tuple[int, int]], may_scale_down: bool) -> bool:
        sim = self.sim
        cfg = self._best_placeable(job, configs)
        if cfg is not None:
            return sim.launch(job, *self._grow_at_launch(job, *cfg))
        if not may_scale_down or not configs:
            return False
        need, types = self._smallest(job)
        if sum(sim.pools[t].capacity for t in types) < need:
            return False
        # tentative in-place halvings, undone unless the job then fits
        tentative: list[tuple[Job, TypePool, tuple]] = []
        for _, _, victim in self._victim_list():
            if len(tentative) >= self.config.search_depth:
                break
            a = victim.alloc
            if a.type_index not in types or victim.state != JobState.RUNNING:
                continue
            pool = sim.pools[a.type_index]
            _, freed = TypePool.shrink_blocks(a.blocks)
            pool.release(freed)
            tentative.append((victim, pool, freed))
            cfg = self._best_placeable(job, configs)
            if cfg is not None:
                break
        for _, pool, freed in reversed(tentative):
            pool.occupy(freed)
        if cfg is None:
            return False
        for victim, _, _ in tentative:
            a = victim.alloc
            sim.rescale(victim, a.type_index, a.count_index - 1)
        self._victims = None
        return sim.launch(job, *cfg)

    def _grow_at_launch(self, job: Job, t: int, c: int) -> tuple[int, int]:
        """Scale a launching job up for free (it pays no rescale yet) into idle GPUs that the jobs queued
        behind it do not need, while its view says each doubling still gains throughput."""
        if not self.config.elastic or self.config.objective != self.config.objective.THROUGHPUT:
            return t, c
        pool = self.sim.pools[t]
        v = job.view_thr
        while (c + 1 < v.shape[1] and self.allowed[t, c + 1] and v[t, c + 1] > v[t, c]
               and self.sim.cluster.free_gpus - (1 << (c + 1)) >= self._reserve and pool.can_place(1 << (c + 1))):
            c += 1
        return t, c

    def _victim_list(self) -> list[tuple[float, int, Job]]:
        if self._victims is None:
            out = []
            for job in self.sim.active.values():
                if job.state != JobState.RUNNING:
                    continue
                s = self.objective.victim_score(job)
                if s is not None:
                    out.append((s, job.index, job))
            out.sort(key=lambda x: (x[0], x[1]))
            self._victims = out
        return self._victims

    # -- in-flight handler ---------------------------------------------------------------------------
    def _upgrade_options(self, job: Job) -> list[tuple[int, int]]:
        a = job.alloc
        t, c = a.type_index, a.count_index
        out = []
        for t2, c2 in self.configs(job):
            if t2 == t:
                if c2 == c + 1:
                    out.append((t2, c2))
            elif abs(c2 - c) <= 1:
                out.append((t2, c2))
        return out

    def _scale_up(self) -> None:
        sim = self.sim
        pools = sim.pools
        overhead = sim.rescale_overhead()
        failed: set[tuple[int, int, int]] = set()
        ops = 0
        self._depth_exhausted = False
        while ops < self.config.search_depth:
            free = [p.free_total for p in pools]
            if not any(free):
                return
            best = None
            best_score = 0.0
            for job in sim.active.values():
                if job.state != JobState.RUNNING:
                    continue
                a = job.alloc
                for t2, c2 in self._upgrade_options(job):
                    need = (1 << c2) - (a.num_gpus if t2 == a.type_index else 0)
                    if need > free[t2] or (job.index, t2, c2) in failed:
                        continue
                    score = self.objective.upgrade_score(job, t2, c2, overhead)
                    if score is not None and (best is None or score > best_score):
                        best, best_score = (job, t2, c2), score
            if best is None:
                return
            job, t2, c2 = best
            if sim.rescale(job, t2, c2):
                ops += 1
                self._victims = None
            else:
                failed.add((job.index, t2, c2))
        self._depth_exhausted = True

    # -- defragmentation -----------------------------------------------------------------------------
    def _defragment(self) -> None:
        sim = self.sim
        for t, pool in enumerate(sim.pools):
            if pool.gpn == 1:
                continue
            blocked = [1 << c for j in self.queue for (tt, c) in self.configs(j)
                       if tt == t and pool.free_total >= (1 << c) and not pool.can_place(1 << c)]
            if not blocked:
                continue
            # the least used node that is not entirely free
            order = sorted((n for n in range(pool.num_nodes) if 0 < pool.free[n] < pool.gpn),
                           key=lambda n: (-int(pool.free[n]), n))
            for node in order[:4]:
                if self._evacuate(t, node):
                    break

    def _evacuate(self, t: int, node: int) -> bool:
        sim = self.sim
        pool = sim.pools[t]
        residents = [j for j in sim.active.values()
                     if j.alloc.type_index == t and j.alloc.num_nodes == 1 and j.alloc.blocks[0][0] == node]
        if not residents or len(residents) > self.config.search_depth:
            return False
        if any(j.state != JobState.RUNNING for j in residents):
            return False
        original = pool.masks[node]
        pool.masks[node] = (1 << pool.gpn) - 1  # keep the node out of the placements below
        pool._update(node)
        moved = []
        for job in sorted(residents, key=lambda j: (-j.alloc.num_gpus, j.index)):
            blocks = pool.place(job.alloc.num_gpus)
            if blocks is None:
                break
            moved.append((job, blocks))
        pool.masks[node] = original
        pool._update(node)
        if len(moved) < len(residents):
            for _, blocks in moved:
                pool.release(blocks)
            return False
        for job, blocks in moved:
            sim.migrate(job, blocks)
        return True
