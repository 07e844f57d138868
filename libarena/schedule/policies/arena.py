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
- In-flight trade (ours; ``trade_margin``, 0 disables): two running jobs on different GPU types trade their
  GPUs (each restarts on the other's allocation) when one's objective gain exceeds the other's loss by the
  margin, best trade first, up to D per round. Under the JCT objective it puts the short jobs on the fast
  GPUs (Smith's rule across GPU types) without leaving anyone without GPUs: a job launched on a slow type while
  the fast one was taken moves up as soon as a longer job holds GPUs it values less. The allocations swap
  whole, counts included, so the giver may end on fewer GPUs than it held (its pause is priced by the margin). The same rule at launch:
  a launching job takes a running job's GPUs on another type, and that job restarts on the free GPUs the
  launching one would have had, when the launching job gains more than the margin times the other's loss.
- In-flight exchange (ours; ``exchange_margin``, off by default): a running job may switch to a faster GPU
  type at a neighbouring count whose GPUs are taken, by halving up to D running jobs of that type (smallest
  objective loss first), when its gain exceeds their losses by the margin; up to D exchanges per round.
- Periodic defragmenting migration: when a queued job is blocked only by fragmentation on a type, the jobs of
  the least-used partially occupied node of that type are migrated elsewhere (at most D of them).
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections.abc import Callable, Hashable, Iterable, Iterator

from libarena.schedule.config import APSearch, ArenaPolicyConfig, Objective, ProfilingKind
from libarena.schedule.entities import Job, JobState
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
    comparison_reference = True
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
        # Where the objective's scores of a running job depend only on its allocation, the in-flight handler
        # and the launch handler's scale-down read them from indexes kept as jobs start, instead of scoring
        # every in-flight job in every round (at ten times the paper's scale that was most of the run).
        self._upgrades = (RunningJobIndex(sim, self._upgrade_entries) if self.objective.static_upgrade_gain
                          else None)
        self._victim_index = (RunningJobIndex(sim, self._victim_entries) if self.objective.static_victim_score
                              else None)
        # the in-flight exchange's and trade's candidates (their objectives' gains and losses are functions of
        # the job's allocation)
        static = self.config.objective in (Objective.JCT, Objective.THROUGHPUT)
        self._exchanges = self.config.exchange_margin > 0 and static
        self._switches = RunningJobIndex(sim, self._switch_entries) if self._exchanges else None
        self._trades = RunningJobIndex(sim, self._trade_entries) if self.config.trade_margin > 0 and static else None
        self.next_promotion = float("inf")
        self._depth_exhausted = False  # the last in-flight handler stopped at depth D: try again next tick
        self.next_defrag = sim.now + self.config.defrag_interval_s if self.config.defrag_interval_s > 0 else float("inf")

    # -- configurations ------------------------------------------------------------------------------
    def configs(self, job: Job) -> list[tuple[int, int]]:
        cached = job.policy_state.get("configs")
        if cached is not None:
            return cached
        types = self.placement_types(job)
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

    def placement_types(self, job: Job) -> list[int]:
        return list(range(len(self.sim.pools))) if self.config.hetero else [job.requested_type_index]

    def runnable(self, job: Job) -> bool:
        return bool(self.configs(job))

    def on_arrival(self, job: Job) -> None:
        self.queue.append(job)
        if job.priority > 1:
            self.next_promotion = min(self.next_promotion, job.queue_since + self.config.promotion_time_s)

    def withdraw(self, job: Job) -> None:
        self.queue = [j for j in self.queue if j is not job]

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
        self._victims: list[Job] | None = None
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
        if self._exchanges:
            self._exchange()
        if self._trades is not None:
            self._trade()
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
            t, c = self._grow_at_launch(job, *cfg)
            if self._trades is not None:
                swap = self._launch_trade(job, t, c)
                if swap is not None:
                    holder, (t2, c2) = swap
                    if sim.rescale(holder, t, c):  # the holder restarts on the free GPUs the job would have taken
                        self._victims = None
                        sim.count("trades_at_launch")
                        return sim.launch(job, t2, c2)
            return sim.launch(job, t, c)
        if not may_scale_down or not configs:
            return False
        need, types = self._smallest(job)
        if sum(sim.pools[t].capacity for t in types) < need:
            return False
        def fits() -> bool:  # where the job goes once the halvings are real
            nonlocal cfg
            cfg = self._best_placeable(job, configs)
            return cfg is not None

        victims = self._tentative_halvings(types, lambda victim: True, fits)
        if victims is None:
            return False
        for victim in victims:
            a = victim.alloc
            # the search halved jobs on every type the job may use; only the halvings on the type it is placed
            # on free GPUs it takes (the pools are per type): the others would pay a restart for nothing
            if a.type_index == cfg[0]:
                sim.rescale(victim, a.type_index, a.count_index - 1)
        self._victims = None
        return sim.launch(job, *cfg)

    def _tentative_halvings(self, types: frozenset[int], admit: Callable[[Job], bool | None],
                            fits: Callable[[], bool]) -> list[Job] | None:
        """Halve running jobs on ``types`` in place, in victim order and at most D of them, until ``fits()``;
        ``admit(victim)`` may pass a victim over (False) or end the search (None). Every halving is undone:
        returns the victims to halve for real if the job then fits, else None."""
        sim = self.sim
        tentative: list[tuple[Job, tuple]] = []
        placed = False
        for victim in self._victims_in_order(types):
            if len(tentative) >= self.config.search_depth:
                break
            a = victim.alloc
            if a.type_index not in types or victim.state != JobState.RUNNING:
                continue
            verdict = admit(victim)
            if verdict is None:
                break
            if not verdict:
                continue
            tentative.append((victim, sim.place_resized(a, a.type_index, a.count_index - 1)))  # a halving in place
            if fits():
                placed = True
                break
        for victim, kept in reversed(tentative):
            sim.unplace_resized(victim.alloc, victim.alloc.type_index, kept)
        return [victim for victim, _ in tentative] if placed else None

    def _grow_at_launch(self, job: Job, t: int, c: int) -> tuple[int, int]:
        """Scale a launching job up for free (it pays no rescale yet) into idle GPUs that the jobs queued
        behind it do not need, while its view says each doubling still gains throughput."""
        if not self.config.elastic or self.config.objective not in (Objective.JCT, Objective.THROUGHPUT):
            return t, c
        pool = self.sim.pools[t]
        v = job.view_thr
        while (c + 1 < v.shape[1] and self.allowed[t, c + 1] and v[t, c + 1] > v[t, c]
               and self.sim.cluster.free_gpus - (1 << (c + 1)) >= self._reserve and pool.can_place(1 << (c + 1))):
            c += 1
        return t, c

    def _victims_in_order(self, types: frozenset[int]) -> Iterable[Job]:
        """The running jobs that may be halved, by (objective loss, job index); from the index, only those on
        ``types`` (the caller skips the others)."""
        if self._victim_index is not None:
            walks = [self._victim_index.walk(t) for t in sorted(types)]
            return (entry[-1] for entry in (walks[0] if len(walks) == 1 else heapq.merge(*walks)))
        if self._victims is None:
            out = []
            for job in self.sim.active.values():
                if job.state != JobState.RUNNING:
                    continue
                s = self._victim_score(job)
                if s is not None:
                    out.append((s, job.index, job))
            out.sort(key=lambda x: (x[0], x[1]))
            self._victims = [job for _, _, job in out]
        return self._victims

    def _victim_score(self, job: Job) -> float | None:
        """The objective's loss per freed GPU of halving a running job, or None where the halved count is not
        one of the job's configurations: without count scaling (``elastic`` off, the §5.6 ablation) no job is
        halved, by the launch handler or the exchange, and none is grown back by the in-flight handler."""
        a = job.alloc
        if (a.type_index, a.count_index - 1) not in self.configs(job):
            return None
        return self.objective.victim_score(job)

    def _victim_entries(self, job: Job) -> list[tuple[int, tuple]]:
        """A running job that may be halved, listed by its GPU type and ranked by (objective loss, job index)."""
        score = self._victim_score(job)
        return [] if score is None else [(job.alloc.type_index, (score, job.index))]

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

    def on_start(self, job: Job) -> None:
        for index in (self._upgrades, self._victim_index, self._switches, self._trades):
            if index is not None:
                index.add(job)

    def _upgrade_entries(self, job: Job) -> list[tuple[tuple[int, int], tuple]]:
        """A running job's scale-ups with a gain, listed by (type, GPUs newly needed) and ranked by (-gain,
        in-flight order, option order): the order in which the exhaustive scan below lets one win."""
        a = job.alloc
        out = []
        for k, (t2, c2) in enumerate(self._upgrade_options(job)):
            gain = self.objective.upgrade_gain(job, t2, c2)
            if gain is not None:
                need = (1 << c2) - (a.num_gpus if t2 == a.type_index else 0)
                out.append(((t2, need), (-gain, job.active_seq, k, t2, c2)))
        return out

    def _best_upgrade(self, free: list[int], failed: set[tuple[int, int, int]]) -> tuple[Job, int, int] | None:
        """The scale-up with the largest score among those that fit the free GPUs and have not failed this
        round; ties go to the job first in the in-flight order, then to its first option."""
        if self._upgrades is not None:
            # the first option of each fitting list that pays off now and has not failed; the best of those
            best = None
            for t2, need in self._upgrades.keys():
                if need > free[t2]:
                    continue
                for entry in self._upgrades.walk((t2, need)):
                    if best is not None and entry[:3] >= best[:3]:
                        break  # the rest of the list ranks lower still
                    job, c2 = entry[-1], entry[4]
                    if (job.index, t2, c2) not in failed and self.objective.upgrade_pays_off(job, t2, c2):
                        best = entry
                        break
            return None if best is None else (best[-1], best[3], best[4])
        best = None
        best_score = None  # a float, or a tuple compared in order (the fairness objective's)
        for job in self.sim.active.values():
            if job.state != JobState.RUNNING:
                continue
            a = job.alloc
            for t2, c2 in self._upgrade_options(job):
                need = (1 << c2) - (a.num_gpus if t2 == a.type_index else 0)
                if need > free[t2] or (job.index, t2, c2) in failed:
                    continue
                score = self.objective.upgrade_score(job, t2, c2)
                if score is not None and (best is None or score > best_score):
                    best, best_score = (job, t2, c2), score
        return best

    def _scale_up(self) -> None:
        sim = self.sim
        pools = sim.pools
        failed: set[tuple[int, int, int]] = set()
        ops = 0
        self._depth_exhausted = False
        while ops < self.config.search_depth:
            free = [p.free_total for p in pools]
            if not any(free):
                return
            best = self._best_upgrade(free, failed)
            if best is None:
                return
            job, t2, c2 = best
            if sim.rescale(job, t2, c2):
                ops += 1
                self._victims = None
            else:
                failed.add((job.index, t2, c2))
        self._depth_exhausted = True

    def _switch_entries(self, job: Job) -> list[tuple[int, tuple]]:
        """A running job's switches to another GPU type (at a neighbouring count) that gain, listed by that
        type and ranked by (-gain, job index, count): the gain per newly used GPU times its GPUs, i.e. the
        objective's weighted throughput gained."""
        out = []
        for t2, c2 in self._upgrade_options(job):
            if t2 != job.alloc.type_index:
                gain = self.objective.upgrade_gain(job, t2, c2)
                if gain is not None:
                    out.append((t2, (-gain * (1 << c2), job.index, c2)))
        return out

    def _switch_lists(self) -> dict[int, Iterable[tuple]]:
        """Per GPU type, the running jobs' switches to it in rank order (from the index, or by a scan)."""
        if self._switches is not None:
            return {t2: self._switches.walk(t2) for t2 in self._switches.keys()}
        lists: dict[int, list[tuple]] = {}
        for job in self.sim.active.values():
            if job.state == JobState.RUNNING:
                for t2, key in self._switch_entries(job):
                    lists.setdefault(t2, []).append(key + (job.version, job))
        return {t2: sorted(entries, key=lambda e: e[:3]) for t2, entries in lists.items()}

    def _cheapest_halving(self, t: int) -> float | None:
        """The smallest objective loss per freed GPU of halving a running job of type ``t``."""
        for victim in self._victims_in_order(frozenset((t,))):
            if victim.alloc.type_index == t and victim.state == JobState.RUNNING:
                return self._victim_score(victim)
        return None

    def _exchange_candidates(self) -> list[tuple[float, int, Job, int, int]]:
        """The most promising switches of this round, best first, as (-gain, job index, job, type, count): per
        type, those whose gain beats the margin times the cheapest halving there (a lower bound on any
        exchange's loss) and that pay off now; at most 4 D of them (each may try D halvings)."""
        limit = 4 * self.config.search_depth  # a bound on the round's work (the exchange is off by default)
        out = []
        for t2, entries in self._switch_lists().items():
            cheapest = self._cheapest_halving(t2)
            if cheapest is None:
                continue
            floor = self.config.exchange_margin * cheapest
            taken = 0
            for neg_gain, index, c2, _, job in entries:
                if -neg_gain <= floor or taken >= limit:
                    break
                if self.objective.upgrade_pays_off(job, t2, c2):
                    out.append((neg_gain, index, job, t2, c2))
                    taken += 1
        out.sort(key=lambda x: (x[0], x[1]))
        return out[:limit]

    def _exchange(self) -> None:
        sim = self.sim
        depth, margin = self.config.search_depth, self.config.exchange_margin
        touched: set[int] = set()  # jobs exchanged or halved this round are left alone until the next
        done = 0
        for neg_gain, _, job, t2, c2 in self._exchange_candidates():
            if done >= depth:
                break
            if job.index in touched:
                continue
            pool, need, gain = sim.pools[t2], 1 << c2, -neg_gain
            if pool.can_place(need):
                continue  # nothing to exchange for (the in-flight handler's to take)
            loss = 0.0

            def admit(victim: Job) -> bool | None:  # until the losses outweigh the gain
                nonlocal loss
                if victim is job or victim.index in touched:
                    return False
                score = self._victim_score(victim)
                if score is None:
                    return False
                loss += score * (victim.alloc.num_gpus // 2)
                return None if loss * margin >= gain else True

            victims = self._tentative_halvings(frozenset((t2,)), admit, lambda: pool.can_place(need))
            if victims is None:
                continue
            for victim in victims:
                a = victim.alloc
                sim.rescale(victim, a.type_index, a.count_index - 1)
                touched.add(victim.index)
            self._victims = None
            if sim.rescale(job, t2, c2):
                touched.add(job.index)
                done += 1

    def _trade_entries(self, job: Job) -> list[tuple[tuple, tuple]]:
        """A running job's trades with a job on another GPU type: listed as the taker of each allocation it
        could run on (by its own allocation and that one; ranked by its gain, best first) and as the giver of
        its own to a job on that one (by that allocation and its own; ranked by its loss, least first)."""
        own = (job.alloc.type_index, job.alloc.count_index)
        out = []
        for other in self.configs(job):
            if other[0] != own[0]:
                change = self.objective.rate_change(job, own, other)
                out.append((("take", own, other), (-change, job.index)))
                out.append((("give", other, own), (-change, job.index)))
        return out

    def _best_trade(self) -> tuple[Job, Job] | None:
        """The trade of the largest net objective gain (ties: the lower job indexes) whose taker gains more than
        the margin times the giver's loss and finishes earlier despite the rescale."""
        margin = self.config.trade_margin
        best = None
        for key in self._trades.keys():
            if key[0] != "take":
                continue
            giver = next(self._trades.walk(("give", key[1], key[2])), None)  # the least loss first
            if giver is None:
                continue
            loss = giver[0]
            for entry in self._trades.walk(key):  # the best gain first
                gain = -entry[0]
                rank = (loss - gain, entry[1], giver[1])
                if not gain > margin * max(loss, 0.0) or (best is not None and rank >= best[0]):
                    break  # the rest of the list gains less
                taker = entry[-1]
                if self.objective.upgrade_pays_off(taker, *key[2]):
                    best = (rank, taker, giver[-1])
                    break
        return None if best is None else (best[1], best[2])

    def _launch_trade(self, job: Job, t: int, c: int) -> tuple[Job, tuple[int, int]] | None:
        """A trade at launch: the running job whose GPUs (on another type) the launching job values more than the
        free (t, c) it would get, by more than the margin times that job's loss if it moved to (t, c) instead;
        the largest net gain (ties: the lower job index). None if there is none."""
        margin = self.config.trade_margin
        best = None
        for other in self.configs(job):
            if other[0] == t:
                continue
            gain = self.objective.rate_change(job, (t, c), other)
            if not gain > 0:
                continue
            holder = next(self._trades.walk(("give", (t, c), other)), None)  # its least loss first
            if holder is None:
                continue
            loss = holder[0]
            rank = (loss - gain, holder[1])
            if gain > margin * max(loss, 0.0) and (best is None or rank < best[0]):
                best = (rank, holder[-1], other)
        return None if best is None else (best[1], best[2])

    def _trade(self) -> None:
        for _ in range(self.config.search_depth):
            pair = self._best_trade()
            if pair is None:
                return
            self.sim.trade(*pair)  # both restart: their index entries go stale
            self._victims = None

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
            for node in order[:4]:  # a bound on the round's work: the least used nodes are the likely ones
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


class RunningJobIndex:
    """Sorted lists of entries about the running jobs (``Job.state`` RUNNING), for policies that would
    otherwise score every in-flight job in every round.

    What an entry says about a job holds as long as the job runs on the allocation it had when indexed, so
    entries are made when the job starts (``add``, from the policy's ``on_start``) and an entry of a job that
    has since moved (``Job.version``) or stopped is dropped when a walk meets it. ``entries_of(job)`` gives
    ``(list key, sort key)`` pairs; a list holds ``sort key + (version, job)`` tuples in ascending order (sort
    keys must be unique among a job's entries). The index (re)builds itself from the in-flight jobs at its
    first walk and whenever the simulator's in-flight dict is replaced (a live cluster restoring its order)."""

    def __init__(self, sim, entries_of: Callable[[Job], Iterable[tuple[Hashable, tuple]]]):
        self.sim = sim
        self.entries_of = entries_of
        self.lists: dict[Hashable, list[tuple]] = {}
        self.entries = 0
        #: entries of moved or finished jobs are swept out when the lists grow past this (amortised O(1))
        self._sweep_at = 1024
        self._built_for: dict | None = None

    def _sync(self) -> None:
        if self._built_for is not self.sim.active:
            self.lists, self.entries, self._built_for = {}, 0, self.sim.active
            for job in self.sim.active.values():
                if job.state == JobState.RUNNING:
                    self.add(job)

    def add(self, job: Job) -> None:
        if self._built_for is not self.sim.active:
            return  # built from the in-flight jobs at the next walk
        for key, sort_key in self.entries_of(job):
            insort(self.lists.setdefault(key, []), sort_key + (job.version, job))
            self.entries += 1
        if self.entries > self._sweep_at:  # drop what walks have not met
            for entries in self.lists.values():
                entries[:] = [e for e in entries if e[-1].state == JobState.RUNNING and e[-1].version == e[-2]]
            self.entries = sum(len(entries) for entries in self.lists.values())
            self._sweep_at = max(1024, 2 * self.entries)

    def keys(self) -> list[Hashable]:
        self._sync()
        return list(self.lists)

    def walk(self, key: Hashable) -> Iterator[tuple]:
        """The current entries of one list, in order (the caller may stop early; it must not add meanwhile)."""
        self._sync()
        entries = self.lists.get(key, [])
        i = 0
        while i < len(entries):
            entry = entries[i]
            job = entry[-1]
            if job.state != JobState.RUNNING or job.version != entry[-2]:
                del entries[i]
                self.entries -= 1
                continue
            yield entry
            i += 1
