"""Deterministic discrete-event cluster simulator.

Events (arrival, launch, rescale, completion, scheduling tick) sit on a heap keyed by (time, event-type
priority, sequence number): a total order, so a run is a pure function of its inputs. Policies act only at
scheduling ticks; between ticks jobs progress at the execution truth of their allocation. A job that is
launched or rescaled first pays its overheads (profiling, AP search, checkpoint-resume) while holding its GPUs.
"""

from __future__ import annotations

import heapq
import math
import time as _time
from dataclasses import dataclass, field

import numpy as np

from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec
from libarena.schedule.config import SimulatorConfig
from libarena.schedule.entities import Allocation, ClusterState, Job, JobSpec, JobState, TypePool
from libarena.schedule.events import ArrivalEvent, CompletionEvent, Event, LaunchEvent, RescaleEvent, SchedulingTickEvent
from libarena.schedule.perf import PerfLookup
from libarena.schedule.policies.base import Policy
from libarena.progress import ProgressCallback, ProgressUpdate


@dataclass
class SimulationResult:
    policy: str
    view: str
    jobs: list[Job]
    gpu_types: list[str]
    start_time: float
    end_time: float
    total_gpus: int
    #: per tick
    ts_time: list[float] = field(default_factory=list)
    ts_throughput: list[float] = field(default_factory=list)
    ts_busy_gpus: list[int] = field(default_factory=list)
    ts_running: list[int] = field(default_factory=list)
    ts_starting: list[int] = field(default_factory=list)
    ts_queued: list[int] = field(default_factory=list)
    ts_decision_s: list[float] = field(default_factory=list)
    ts_scheduled: list[bool] = field(default_factory=list)
    #: decisions, one entry per action
    decisions: dict[str, list] = field(default_factory=lambda: {
        "time": [], "job_index": [], "action": [], "gpu_type": [], "num_gpus": [], "num_nodes": [],
        "view_throughput": [], "true_throughput": []})
    stopped_by: str = "completion"
    wall_s: float = 0.0
    #: what the policy counted on the way (``Simulator.count``), e.g. ILP solves stopped by their time limit
    counters: dict[str, int] = field(default_factory=dict)
    #: GPU-seconds held by jobs (starting or training) from start_time to end_time, integrated between events
    gpu_seconds: float = 0.0


class Simulator:
    def __init__(self, specs: list[JobSpec], perf: PerfLookup, cluster: ClusterSpec, policy: Policy,
                 config: SimulatorConfig | None = None, trace_source: str = "trace",
                 progress: ProgressCallback | None = None):
        self.config = config or SimulatorConfig()
        #: hears (jobs settled, total jobs) whenever a job finishes or is dropped, at scheduling ticks
        self.progress = progress
        self._progress_reported = -1
        if not specs:
            raise ArenaError(f"{trace_source}: the trace has no jobs")
        self.perf = perf
        self.cluster_spec = cluster
        self.cluster = ClusterState(cluster, perf.gpu_types)
        self.pools: list[TypePool] = self.cluster.pools
        self.policy = policy
        self.overheads = self.config.overheads
        perf.lacking(specs, trace_source)
        pairs = [(s.model, s.global_batch) for s in specs]
        perf.check_view(policy.view, pairs)
        num_queues = getattr(policy.config, "num_queues", 3)
        self.jobs: list[Job] = []
        order = sorted(range(len(specs)), key=lambda i: (specs[i].submit_time, i))
        for idx, i in enumerate(order):
            s = specs[i]
            if s.requested_type is None or s.requested_type not in perf.type_index:
                raise ArenaError(f"{trace_source}: row {s.row}, column 'gpu_type': GPU type {s.requested_type!r} "
                                 f"is not in cluster {cluster.name} ({', '.join(perf.gpu_types)})")
            mp = perf.get(s.model, s.global_batch)
            prio = s.priority if s.priority is not None else _default_priority(s.job_id, num_queues, self.config.seed)
            self.jobs.append(Job(idx, s, perf.type_index[s.requested_type], min(max(1, prio), num_queues),
                                 mp.views[policy.view], mp.truth))
        first = self.jobs[0].spec.submit_time
        start = first if self.config.start_s is None else self.config.start_s
        if start > first:
            raise ArenaError(f"{trace_source}: --start {start:g} s is after the trace's first submission ({first:g} s)")
        if self.config.horizon_s is not None and first > start + self.config.horizon_s:
            # nothing would arrive: every metric would read 0 (an average JCT of 0 h looks like a result)
            raise ArenaError(f"{trace_source}: no job is submitted within the simulated window (--start {start:g} s, "
                             f"--horizon {self.config.horizon_s:g} s; the first submission is at {first:g} s)")
        self._init_state(start)
        self.pending_arrivals = len(self.jobs)
        self.result = SimulationResult(policy.name, policy.view, self.jobs, list(perf.gpu_types), self.start_time,
                                       self.start_time, self.cluster.total_gpus)
        self._check_work_bound(trace_source)
        policy.attach(self)

    def _init_state(self, now: float) -> None:
        """The state of a cluster with no job yet (shared with the live cluster)."""
        self.heap: list[tuple[float, int, int, Event]] = []
        self.seq = 0
        self.now = now
        self.start_time = now
        self.dirty = False
        self.active: dict[int, Job] = {}  # STARTING or RUNNING, by index, in launch order (Job.active_seq)
        self._active_seq = 0
        self.queued_count = 0
        self.pending_arrivals = 0
        self.done_count = 0
        self.unschedulable_count = 0
        self.all_settled = False
        self.decisions_this_tick = 0
        self.stall = 0
        self._enqueue_seq = 0
        #: When the profiles of a (model, global batch) and the plan of a (model, global batch, type, count
        #: index) are (or will be) ready: what later (re)starts reuse (OverheadConfig.reuse_profiles /
        #: reuse_plans). Ready times, not flags: a job launched while another profiles its pair waits for it.
        self.profiles_ready: dict[tuple[str, int], float] = {}
        self.plans_ready: dict[tuple[str, int, int, int], float] = {}

    def _check_work_bound(self, trace_source: str) -> None:
        """Refuse, before anything runs, a workload that needs more than ``max_ticks`` scheduling ticks even in
        the best case: the submissions' span, or a job that alone trains longer (at its fastest configuration,
        after its launch overhead), divided by the tick. Such inputs (a submission 10**18 s away, a billion
        iterations of a slow model) would otherwise keep the simulator going for days."""
        cfg = self.config
        usable = self.perf.usable
        end, why = self.jobs[-1].spec.submit_time, "the submissions span"
        overhead = self.overheads.ap_search_s(self.policy.ap_search) + self.overheads.profiling_s(self.policy.profiling)
        for job in self.jobs:
            best = float(np.max(job.true_thr, where=usable, initial=0.0))
            if best > 0:
                finish = job.spec.submit_time + overhead + job.spec.num_iterations * job.spec.global_batch / best
                if finish > end:
                    end, why = finish, f"job {job.spec.job_id} (row {job.spec.row}) alone trains until"
        span = end - self.start_time
        if cfg.horizon_s is not None:
            span = min(span, cfg.horizon_s)
        needed = math.floor(span / cfg.tick_s) + 1  # ticks at the run's start and every tick_s up to its end
        if needed > cfg.max_ticks:
            raise ArenaError(f"{trace_source}: simulating this workload needs at least {needed:.3g} scheduling ticks of "
                             f"{cfg.tick_s:g} s ({why} {span / 86400:.3g} days after the run's start), more than "
                             f"the limit of {cfg.max_ticks} (--max-ticks): use a larger --tick or a "
                             f"{'shorter --horizon' if cfg.horizon_s is not None else '--horizon'}")

    # -- event plumbing ----------------------------------------------------------------------------
    def push(self, event: Event) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (event.time, event.priority, self.seq, event))

    def run(self) -> SimulationResult:
        wall = _time.perf_counter()
        for job in self.jobs:
            self.push(ArrivalEvent(job.spec.submit_time, job))
        self.push(SchedulingTickEvent(self.start_time))
        horizon_end = None if self.config.horizon_s is None else self.start_time + self.config.horizon_s
        self.stop_reason = "completion"
        heap = self.heap
        res = self.result
        cluster, total = self.cluster, self.cluster.total_gpus
        while heap:
            t = heap[0][0]
            if horizon_end is not None and t > horizon_end:
                res.gpu_seconds += (total - cluster.free_gpus) * (horizon_end - self.now)
                self.now = horizon_end
                self.stop_reason = "horizon"
                break
            _, _, _, event = heapq.heappop(heap)
            # allocations change only in event handlers: what is held now was held since the last event
            res.gpu_seconds += (total - cluster.free_gpus) * (t - self.now)
            self.now = t
            event.handle(self)
            # Stale events (completions of superseded job versions) may remain; they must not move the end.
            if self.stop_reason == "stalled" or self.all_settled:
                break
        for job in self.active.values():
            self._settle(job)
        if self.progress is not None:
            self._report_progress(final=True)
        res.end_time = self.now
        res.stopped_by = self.stop_reason
        res.wall_s = _time.perf_counter() - wall
        return res

    def _report_progress(self, final: bool = False) -> None:
        settled = self.done_count + self.unschedulable_count
        if settled == self._progress_reported and not final:
            return
        self._progress_reported = settled
        self.progress(ProgressUpdate(f"simulating {self.policy.name}", len(self.jobs) if final else settled,
                                     len(self.jobs), f"simulated {(self.now - self.start_time) / 3600:.1f} h"))

    # -- event handlers ----------------------------------------------------------------------------
    def arrive(self, job: Job) -> None:
        job.state = JobState.QUEUED
        job.queue_since = self.now
        self._enqueue_seq += 1
        job.enqueue_seq = self._enqueue_seq
        self.pending_arrivals -= 1
        self.queued_count += 1
        if not self.policy.runnable(job):
            job.unschedulable = self.policy.unschedulable_reason(job)  # reported apart, not counted as queued
            self.unschedulable_count += 1
            self.queued_count -= 1
            if self._nothing_left():
                self.all_settled = True  # the run ends at its last arrival, as at its last completion
            return
        self.policy.on_arrival(job)
        self.dirty = True

    def start_training(self, job: Job) -> None:
        job.state = JobState.RUNNING
        alloc = job.alloc
        thr = job.true_thr[alloc.type_index, alloc.count_index]
        if not thr > 0:
            raise AssertionError(f"job {job.spec.job_id} placed where it cannot run")
        job.rate = float(thr) / job.spec.global_batch
        job.progress_time = self.now
        self._expect_completion(job)
        self.policy.on_start(job)
        self.dirty = True

    def complete(self, job: Job) -> None:
        job.progress = float(job.spec.num_iterations)
        job.progress_time = self.now
        job.state = JobState.FINISHED
        job.finish_time = self.now
        self._record("finish", job, job.alloc)
        self.cluster.release(job.alloc)
        del self.active[job.index]
        self.done_count += 1
        self.policy.on_finish(job)
        self.dirty = True
        if self._nothing_left():
            self.all_settled = True  # the run ends with its last job, not at the next tick

    def _nothing_left(self) -> bool:
        return self.done_count + self.unschedulable_count == len(self.jobs) and not self.active and self.pending_arrivals == 0

    def tick(self) -> None:
        if len(self.result.ts_time) >= self.config.max_ticks:
            # the bound on the simulator's own work (time and memory grow with the ticks): a tick past it is due, so
            # the run needs more (a run that ends within the limit, at its horizon or last event, never gets here)
            unfinished = len(self.jobs) - self.done_count - self.unschedulable_count
            raise ArenaError(f"the simulation reached the limit of {self.config.max_ticks} scheduling ticks (--max-ticks) "
                             f"at {(self.now - self.start_time) / 86400:.3g} simulated days with {unfinished} of "
                             f"{len(self.jobs)} jobs unfinished: use a larger --tick or a "
                             f"{'shorter --horizon' if self.config.horizon_s is not None else '--horizon'}, or raise "
                             f"--max-ticks")
        scheduled = False
        elapsed = 0.0
        self.decisions_this_tick = 0
        if self.policy.needs_schedule():
            t0 = _time.perf_counter()
            self.policy.schedule()
            elapsed = _time.perf_counter() - t0
            scheduled = True
            self.dirty = False
        res = self.result
        res.ts_time.append(self.now)
        thr = 0.0
        running = 0
        for job in self.active.values():
            if job.state == JobState.RUNNING:
                a = job.alloc
                thr += job.true_thr[a.type_index, a.count_index]
                running += 1
        res.ts_throughput.append(thr)
        res.ts_busy_gpus.append(self.cluster.total_gpus - self.cluster.free_gpus)
        res.ts_running.append(running)
        res.ts_starting.append(len(self.active) - running)
        res.ts_queued.append(self.queued_count)
        res.ts_decision_s.append(elapsed)
        res.ts_scheduled.append(scheduled)
        if self.progress is not None:
            self._report_progress()
        if self._nothing_left():
            self.all_settled = True  # nothing left that can happen (the last jobs dropped or never placeable)
            return
        if not self.active and self.pending_arrivals == 0 and self.decisions_this_tick == 0:
            self.stall += 1
            if self.stall >= self.config.stall_ticks:
                self.stop_reason = "stalled"
                return
        else:
            self.stall = 0
        self.push(SchedulingTickEvent(self.now + self.config.tick_s))

    # -- actions for policies ----------------------------------------------------------------------
    def count(self, what: str) -> None:
        """Count an event of the policy's in the run's result (``SimulationResult.counters``)."""
        self.result.counters[what] = self.result.counters.get(what, 0) + 1

    def can_place(self, t: int, c: int) -> bool:
        return self.pools[t].can_place(1 << c)

    def launch(self, job: Job, t: int, c: int) -> bool:
        """Place a queued job on 2**c GPUs of type t; False (and nothing changes) when it does not fit."""
        if job.state != JobState.QUEUED:
            raise AssertionError(f"launching job {job.spec.job_id} in state {job.state}")
        if not job.true_thr[t, c] > 0 or not job.view_thr[t, c] > 0:
            raise AssertionError(f"job {job.spec.job_id} cannot run on {1 << c} x {self.perf.gpu_types[t]}")
        alloc = self.cluster.allocation(t, c)
        if alloc is None:
            return False
        profiles_at = self._profiles_ready_at(job)
        plan_at = self._plan_ready_at(job, t, c, profiles_at)
        overhead = plan_at - self.now  # as launch_overhead(job, t, c)
        self._note_ready(job, t, c, profiles_at, plan_at)
        job.alloc = alloc
        job.state = JobState.STARTING
        job.version += 1
        job.profiled = True
        job.profiles_at = profiles_at
        if job.first_start is None:
            job.first_start = self.now
        job.overhead_s += overhead
        self.queued_count -= 1
        self._activate(job)
        self._start_after(job, overhead, "launch")
        self._record("launch", job, alloc)
        return True

    def rescale(self, job: Job, t: int, c: int) -> bool:
        """Move an active job to 2**c GPUs of type t (growing in place when possible); False if it does not fit."""
        old = job.alloc
        if (t, c) == (old.type_index, old.count_index):
            return True
        if not job.true_thr[t, c] > 0:
            raise AssertionError(f"job {job.spec.job_id} cannot run on {1 << c} x {self.perf.gpu_types[t]}")
        blocks = self.place_resized(old, t, c)
        if blocks is None:
            return False
        self._restart_on(job, Allocation(t, c, blocks))
        return True

    def place_resized(self, alloc: Allocation, t: int, c: int) -> tuple[tuple[int, int], ...] | None:
        """Take from the pools the GPUs a job on ``alloc`` holds once moved to 2**c GPUs of type t: its block
        grown in place where it can be, one halving in place, else a fresh placement once its GPUs are given
        back. None, the pools unchanged, where it does not fit. ``rescale`` moves jobs with it; a policy that
        weighs a move first tries it with it and takes it back with :meth:`unplace_resized`."""
        pool = self.pools[t]
        if t == alloc.type_index and c == alloc.count_index + 1:
            blocks = pool.try_grow_in_place(alloc.blocks)
            if blocks is not None:
                return blocks
        if t == alloc.type_index and c == alloc.count_index - 1:
            keep, free = TypePool.shrink_blocks(alloc.blocks)
            pool.release(free)
            return keep
        self.pools[alloc.type_index].release(alloc.blocks)
        blocks = pool.place(1 << c)
        if blocks is None:
            self.pools[alloc.type_index].occupy(alloc.blocks)
        return blocks

    def reassign(self, moves: list[tuple[Job, int, int]]) -> list[tuple[Job, int, int]]:
        """Move several running jobs at once to their (type, count index): the GPUs they hold are given back first,
        so they may swap or rotate GPU types, as a solver's assignment moves them together (each pays what a
        rescale costs). Placed largest first; a move that does not fit (fragmentation) is left out and the rest
        placed again without it. Returns the moves left out (nothing of theirs changes)."""
        moves = [(job, t, c) for job, t, c in moves if (t, c) != (job.alloc.type_index, job.alloc.count_index)]
        for job, t, c in moves:
            if job.state != JobState.RUNNING or not job.true_thr[t, c] > 0:
                raise AssertionError(f"job {job.spec.job_id} cannot move to {1 << c} x {self.perf.gpu_types[t]}")
        left_out: list[tuple[Job, int, int]] = []
        while moves:
            for job, _, _ in moves:
                self.pools[job.alloc.type_index].release(job.alloc.blocks)
            placed, failed = [], None
            for k in sorted(range(len(moves)), key=lambda k: -moves[k][2]):  # largest first; stable
                job, t, c = moves[k]
                blocks = self.pools[t].place(1 << c)
                if blocks is None:
                    failed = k
                    break
                placed.append((job, Allocation(t, c, blocks)))
            if failed is None:
                for job, alloc in placed:
                    self._restart_on(job, alloc)
                return left_out
            for _, alloc in placed:  # as it was, then again without the move that did not fit
                self.pools[alloc.type_index].release(alloc.blocks)
            for job, _, _ in moves:
                self.pools[job.alloc.type_index].occupy(job.alloc.blocks)
            left_out.append(moves.pop(failed))
        return left_out

    def unplace_resized(self, alloc: Allocation, t: int, blocks: tuple[tuple[int, int], ...]) -> None:
        """Undo :meth:`place_resized`: the pools as they were with the job on ``alloc``."""
        self.pools[t].release(blocks)
        self.pools[alloc.type_index].occupy(alloc.blocks)

    def trade(self, a: Job, b: Job) -> None:
        """Two running jobs trade their GPUs: each restarts on the other's allocation (GPU type, count and the
        same GPUs), paying what a rescale to it costs. The cluster's occupancy does not change."""
        if a.state != JobState.RUNNING or b.state != JobState.RUNNING or a is b:
            raise AssertionError("only two different running jobs can trade GPUs")
        alloc_a, alloc_b = a.alloc, b.alloc
        for job, alloc in ((a, alloc_b), (b, alloc_a)):
            if not job.true_thr[alloc.type_index, alloc.count_index] > 0:
                raise AssertionError(f"job {job.spec.job_id} cannot run on {alloc.num_gpus} x {self.perf.gpu_types[alloc.type_index]}")
        self._restart_on(a, alloc_b)
        self._restart_on(b, alloc_a)
        self.count("trades")  # in the decisions, two rescales: counted here for whoever audits a run's moves

    def _restart_on(self, job: Job, alloc: Allocation) -> None:
        """Restart an active job on ``alloc`` (its GPUs already held): checkpoint-resume and the AP search, or the
        wait for a reused plan, as rescale_overhead says. A job still starting keeps waiting for its profiles."""
        t, c = alloc.type_index, alloc.count_index
        profiles_at, plan_at = self._restart_ready_at(job, t, c)
        self._note_ready(job, t, c, profiles_at, plan_at)
        self._reallocate(job, alloc, "rescale", self.overheads.checkpoint_resume_s + plan_at - self.now)

    def migrate(self, job: Job, blocks: tuple[tuple[int, int], ...]) -> None:
        """Move an active job to other nodes of the same type and count (defragmentation): the plan is
        unchanged, so only checkpoint-resume is paid. ``blocks`` must already be occupied by the caller."""
        old = job.alloc
        self.cluster.release(old)
        overhead = self.overheads.checkpoint_resume_s
        if job.state == JobState.STARTING:  # its profiling and search go on: it starts no sooner than planned
            overhead = max(overhead, job.starts_at - self.now)
        self._reallocate(job, Allocation(old.type_index, old.count_index, blocks), "migrate", overhead)

    def drop(self, job: Job) -> None:
        if job.state != JobState.QUEUED:
            raise AssertionError("only queued jobs can be dropped")
        job.state = JobState.DROPPED
        job.finish_time = self.now
        self.queued_count -= 1
        self.done_count += 1
        self._record("drop", job, None)

    def estimated_finish(self, job: Job, t: int, c: int, overhead: float, view: bool = True) -> float:
        """When the job would finish on (t, c) per the view (or truth), starting now after ``overhead``."""
        thr = (job.view_thr if view else job.true_thr)[t, c]
        if not thr > 0:
            return float("inf")
        return self.now + overhead + job.remaining_at(self.now) * job.spec.global_batch / thr

    def _profiles_ready_at(self, job: Job) -> float:
        """When the job's profiles are ready if it (re)starts now: at once when it was profiled before; when
        another job's profiling of its (model, batch) ends, where profiles are reused; else after its own."""
        if job.profiled:
            return self.now
        own = self.now + self.overheads.profiling_s(self.policy.profiling)
        if self.overheads.reuse_profiles:
            pair = (job.spec.model, job.spec.global_batch)
            return min(own, max(self.now, self.profiles_ready.get(pair, own)))
        return own

    def _plan_ready_at(self, job: Job, t: int, c: int, profiles_at: float) -> float:
        """When the job's plan for 2**c GPUs of type t is ready: after its own AP search (once its profiles
        are), or, where plans are reused, when another job's search of that configuration ends if sooner, but
        never before its profiles (where each job profiles itself, a reused plan does not spare that)."""
        own = profiles_at + self.overheads.ap_search_s(self.policy.ap_search)
        if self.overheads.reuse_plans:
            config = (job.spec.model, job.spec.global_batch, t, c)
            return min(own, max(profiles_at, self.plans_ready.get(config, own)))
        return own

    def _note_ready(self, job: Job, t: int, c: int, profiles_at: float, plan_at: float) -> None:
        pair = (job.spec.model, job.spec.global_batch)
        self.profiles_ready[pair] = min(self.profiles_ready.get(pair, profiles_at), profiles_at)
        config = (*pair, t, c)
        self.plans_ready[config] = min(self.plans_ready.get(config, plan_at), plan_at)

    def launch_overhead(self, job: Job, t: int, c: int) -> float:
        """What launching the job on (t, c) now costs before it trains: its profiling (once per job, or once
        per (model, batch) where profiles are reused) and the AP search (once per configuration where plans
        are reused); a reused profile or plan still in the making is waited for."""
        return self._plan_ready_at(job, t, c, self._profiles_ready_at(job)) - self.now

    def rescale_overhead(self, job: Job, t: int, c: int) -> float:
        """What moving the running job to (t, c) costs: checkpoint-resume and the AP search (or the wait for a
        reused plan)."""
        return self.overheads.checkpoint_resume_s + self._restart_ready_at(job, t, c)[1] - self.now

    def _restart_ready_at(self, job: Job, t: int, c: int) -> tuple[float, float]:
        """(profiles, plan) ready times of an active job restarting now on (t, c): its profiles exist, or are still
        being made when it has not started yet."""
        profiles_at = max(self.now, job.profiles_at)
        return profiles_at, self._plan_ready_at(job, t, c, profiles_at)

    # -- where the simulated cluster and a live one differ ------------------------------------------
    # The simulator predicts when a (re)started job begins training and when it completes; a live cluster
    # (libarena.schedule.live) overrides these two to hand the action to a launcher and learns both times
    # from it instead. Everything else (state, actions, the policies) is shared.
    def _start_after(self, job: Job, overhead: float, action: str) -> None:
        event = LaunchEvent if action == "launch" else RescaleEvent
        job.starts_at = self.now + overhead
        self.push(event(job.starts_at, job, job.version))

    def _expect_completion(self, job: Job) -> None:
        self.push(CompletionEvent(float(self.now + job.remaining / job.rate), job, job.version))

    # -- internals ---------------------------------------------------------------------------------
    def _activate(self, job: Job) -> None:
        """Put a job at the end of the in-flight order (the only way into ``active``)."""
        self._active_seq += 1
        job.active_seq = self._active_seq
        self.active[job.index] = job

    def _settle(self, job: Job) -> None:
        if job.state == JobState.RUNNING:
            job.progress = min(float(job.spec.num_iterations), job.progress + job.rate * (self.now - job.progress_time))
            job.progress_time = self.now

    def _reallocate(self, job: Job, alloc: Allocation, action: str, overhead: float) -> None:
        if job.state == JobState.STARTING:  # the start-up it had not finished is replaced, not paid on top
            job.overhead_s -= max(0.0, job.starts_at - self.now)
        self._settle(job)
        job.alloc = alloc
        job.state = JobState.STARTING
        job.rate = 0.0
        job.version += 1
        job.reschedules += 1
        job.overhead_s += overhead
        self._start_after(job, overhead, action)
        self._record(action, job, alloc)

    def _record(self, action: str, job: Job, alloc: Allocation | None) -> None:
        self.decisions_this_tick += 1
        d = self.result.decisions
        d["time"].append(self.now)
        d["job_index"].append(job.index)
        d["action"].append(action)
        if alloc is None:
            d["gpu_type"].append("")
            d["num_gpus"].append(0)
            d["num_nodes"].append(0)
            d["view_throughput"].append(0.0)
            d["true_throughput"].append(0.0)
        else:
            d["gpu_type"].append(self.perf.gpu_types[alloc.type_index])
            d["num_gpus"].append(alloc.num_gpus)
            d["num_nodes"].append(alloc.num_nodes)
            d["view_throughput"].append(float(job.view_thr[alloc.type_index, alloc.count_index]))
            d["true_throughput"].append(float(job.true_thr[alloc.type_index, alloc.count_index]))


def _default_priority(job_id: str, num_queues: int, seed: int = 0) -> int:
    """Priority for traces without a priority column: a stable hash of the job id and the seed spread over the
    queues (independent of row order, identical for every policy). Seed 0 hashes the id alone, as every figure
    before seeds drew priorities did; another seed draws another assignment, so a sweep over seeds varies the
    priorities on traces that are not adapted (where the seed changes nothing else)."""
    import zlib

    key = job_id if seed == 0 else f"{seed}\x00{job_id}"
    return zlib.crc32(key.encode()) % num_queues + 1
