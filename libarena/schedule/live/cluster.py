"""LiveCluster: the Simulator's cluster state and policy actions, driven by a launcher instead of predictions.

The policies call exactly the same actions (launch, rescale, migrate, drop, estimated_finish, ...) on it as on
the Simulator. What differs (the two hooks of Simulator): a (re)started job's training start and its
completion are not predicted but reported by the launcher (``apply``), and every action becomes a
``LaunchRequest`` intent that the server persists before handing it to the launcher. Events still go through
the simulator's heap, so a tick at scheduler time T sees exactly the events at or before T, in the same order
as the simulator.
"""

from __future__ import annotations

import time as _time
from typing import Any

from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec
from libarena.schedule.config import SimulatorConfig
from libarena.schedule.entities import Allocation, ClusterState, Job, JobSpec, JobState
from libarena.schedule.events import ArrivalEvent, CompletionEvent, LaunchEvent
from libarena.schedule.live.launchers import LaunchRequest, RunStatus
from libarena.schedule.perf import PerfLookup
from libarena.schedule.policies.base import Policy
from libarena.schedule.simulator import SimulationResult, Simulator, _default_priority


class LiveCluster(Simulator):
    def __init__(self, perf: PerfLookup, cluster: ClusterSpec, policy: Policy, config: SimulatorConfig | None = None,
                 now: float = 0.0):
        # the Simulator's state, without a trace: jobs are added as they are submitted
        self.config = config or SimulatorConfig()
        self.perf = perf
        self.cluster_spec = cluster
        self.cluster = ClusterState(cluster, perf.gpu_types)
        self.pools = self.cluster.pools
        self.policy = policy
        self.overheads = self.config.overheads
        self.num_queues = getattr(policy.config, "num_queues", 3)
        self.jobs: list[Job] = []
        self.by_id: dict[str, Job] = {}
        self._init_state(now)
        self.result = SimulationResult(policy.name, policy.view, self.jobs, list(perf.gpu_types), now, now,
                                       self.cluster.total_gpus)
        #: produced by the actions, drained by the server after each step
        self.intents: list[LaunchRequest] = []
        self.log_entries: list[tuple[float, str, str, dict[str, Any]]] = []
        self.touched: dict[str, Job] = {}
        self.failed: dict[str, str] = {}  # job id -> why
        self.cancelled: dict[str, str] = {}  # job id -> why (arena-schedule cancel)
        self.requests: dict[str, LaunchRequest] = {}  # job id -> its current version's request
        self._reported: set[tuple[int, int, str]] = set()
        #: (job id, version) -> when the launcher says it finished (it may be before the pass that learns it)
        self._finished_at: dict[tuple[str, int], float] = {}
        self._record_time: float | None = None
        policy.attach(self)

    # -- jobs -----------------------------------------------------------------------------------------
    def add_job(self, spec: JobSpec) -> Job:
        if spec.job_id in self.by_id:
            raise AssertionError(f"job {spec.job_id} added twice")
        if spec.requested_type not in self.perf.type_index:
            raise ArenaError(f"job {spec.job_id}: GPU type {spec.requested_type!r} is not in cluster "
                             f"{self.cluster_spec.name} ({', '.join(self.perf.gpu_types)})")
        if not self.perf.has(spec.model, spec.global_batch):
            raise ArenaError(f"job {spec.job_id}: {spec.model} (batch {spec.global_batch}) is not in the performance table")
        mp = self.perf.get(spec.model, spec.global_batch)
        view = mp.views[self.policy.view]
        prio = spec.priority if spec.priority is not None else _default_priority(spec.job_id, self.num_queues, self.config.seed)
        # the index is the submission number (spec.row), stable across restarts: policies break ties by it
        job = Job(spec.row - 1, spec, self.perf.type_index[spec.requested_type], min(max(1, prio), self.num_queues),
                  view, mp.truth)
        self.jobs.append(job)
        self.by_id[spec.job_id] = job
        return job

    def submit(self, spec: JobSpec, arrival_time: float) -> Job:
        job = self.add_job(spec)
        self.pending_arrivals += 1
        self.push(ArrivalEvent(max(arrival_time, self.now), job))
        return job

    # -- the two hooks where a live cluster differs from the simulated one ---------------------------
    def _start_after(self, job: Job, overhead: float, action: str) -> None:
        a = job.alloc
        job.starts_at = self.now + overhead  # the estimate; the launcher reports the real start
        prev = self.requests.get(job.spec.job_id)
        previous = None if prev is None else prev.version
        if prev is not None and any(r is prev for r in self.intents):
            # acted on twice in one round: the earlier intent is superseded and never launched, so the version
            # to stop (and resume from) is the one before it
            previous = prev.previous_version
        req = LaunchRequest(job.spec.job_id, job.version, action, job.spec.model, job.spec.global_batch,
                            job.spec.num_iterations, self.perf.gpu_types[a.type_index], a.num_gpus,
                            tuple(node for node, _ in a.blocks), float(overhead), float(self.now),
                            previous)
        self.requests[job.spec.job_id] = req
        self.intents.append(req)

    def _expect_completion(self, job: Job) -> None:
        pass  # the launcher reports it

    def complete(self, job: Job) -> None:
        """As the simulator (not for a job that failed or was cancelled meanwhile), but a job's finish is recorded
        at the time the launcher says it finished, even when the pass that learns it comes later (a poll interval,
        or a scheduler restart, after it)."""
        at = self._finished_at.pop((job.spec.job_id, job.version), None)
        if job.state == JobState.DROPPED:
            return
        self._record_time = at if at is not None and at < self.now else None
        try:
            super().complete(job)
        finally:
            self._record_time = None
        if at is not None and at < job.finish_time:
            job.finish_time = at

    def _record(self, action: str, job: Job, alloc: Allocation | None) -> None:
        self.decisions_this_tick += 1
        detail: dict[str, Any] = {"version": job.version}
        if alloc is not None:
            detail.update(gpu_type=self.perf.gpu_types[alloc.type_index], num_gpus=alloc.num_gpus,
                          num_nodes=alloc.num_nodes, nodes=[n for n, _ in alloc.blocks],
                          view_throughput=float(job.view_thr[alloc.type_index, alloc.count_index]),
                          true_throughput=float(job.true_thr[alloc.type_index, alloc.count_index]))
        when = self._record_time if action == "finish" and self._record_time is not None else self.now
        self.log_entries.append((when, job.spec.job_id, action, detail))
        self.touched[job.spec.job_id] = job

    def arrive(self, job: Job) -> None:
        if job.state != JobState.PENDING:  # cancelled before its arrival came off the heap
            return
        super().arrive(job)
        self.touched[job.spec.job_id] = job

    def start_training(self, job: Job) -> None:
        # a version reported started and finished at one time: its completion (ordered first at equal times)
        # has ended the job, which must not start again (the simulator pushes a completion only after a start)
        if job.state != JobState.STARTING:
            return
        super().start_training(job)
        self.log_entries.append((self.now, job.spec.job_id, "start", {"version": job.version}))
        self.touched[job.spec.job_id] = job

    # -- launcher reports ---------------------------------------------------------------------------------
    def apply(self, statuses: dict[str, RunStatus], measured_progress: bool, polled_at: float | None = None) -> list[LaunchRequest]:
        """Turn the launcher's reports into events on the heap; returns the requests of lost versions to relaunch.
        ``polled_at``: the scheduler time the reports were taken (a measured iteration count is as of then; default
        the cluster's clock)."""
        lost = []
        for job_id, st in sorted(statuses.items()):
            job = self.by_id.get(job_id)
            if job is None or not job.active or job.version != st.version:
                continue
            key = (job.index, job.version)
            if st.phase == "lost":
                lost.append(self.requests[job_id])
                continue
            if st.phase == "failed":
                self.fail(job, st.message or "failed")
                continue
            if st.phase in ("running", "finished") and (key + ("start",)) not in self._reported:
                self._reported.add(key + ("start",))
                if job.state == JobState.STARTING:
                    self.push(LaunchEvent(max(self.now, float(st.started_at if st.started_at is not None else self.now)),
                                          job, job.version))
            if st.phase == "finished" and (key + ("finish",)) not in self._reported:
                self._reported.add(key + ("finish",))
                finished = float(st.finished_at if st.finished_at is not None else self.now)
                self._finished_at[(job_id, job.version)] = finished
                self.push(CompletionEvent(max(self.now, finished), job, job.version))
            elif st.phase == "running" and measured_progress and st.iterations_done is not None \
                    and job.state == JobState.RUNNING:
                job.progress = min(float(job.spec.num_iterations), float(st.iterations_done))
                # as of the poll, not of the last pass: the progress model adds rate x time only after it
                job.progress_time = self.now if polled_at is None else max(self.now, float(polled_at))
        return lost

    def fail(self, job: Job, why: str) -> None:
        if job.active:
            self.cluster.release(job.alloc)
            del self.active[job.index]
        elif job.state == JobState.QUEUED:
            self.queued_count -= 1
        self._end(job, "fail", why, self.failed)

    def _end(self, job: Job, kind: str, why: str, reasons: dict[str, str]) -> None:
        """A job ended other than by finishing (it failed, or was cancelled), once out of the queue or its GPUs."""
        job.state = JobState.DROPPED
        job.finish_time = self.now
        self.done_count += 1
        reasons[job.spec.job_id] = why
        self.policy.on_finish(job)
        self.dirty = True
        self.log_entries.append((self.now, job.spec.job_id, kind, {"version": job.version, "why": why}))
        self.touched[job.spec.job_id] = job

    #: the states a job can be cancelled in: arriving, queued, starting, running (the others have ended)
    CANCELLABLE = (JobState.PENDING, JobState.QUEUED, JobState.STARTING, JobState.RUNNING)

    def cancel(self, job: Job, why: str) -> int | None:
        """Cancel a job at the current time, in whatever state the server holds it (arriving, queued, starting,
        running): its GPUs are freed and the policy forgets it. Returns the version the launcher must stop (None:
        it holds no GPUs)."""
        stop = None
        if job.state == JobState.PENDING:
            self.pending_arrivals -= 1
            self._drop_arrival(job)
        elif job.state == JobState.QUEUED:
            if job.unschedulable:
                self.unschedulable_count -= 1
            else:
                self.queued_count -= 1
                self.policy.withdraw(job)
        elif job.active:
            self._settle(job)
            stop = job.version
            self.cluster.release(job.alloc)
            del self.active[job.index]
        else:
            raise AssertionError(f"job {job.spec.job_id} is {job.state.value}: nothing to cancel")
        self._end(job, "cancel", why, self.cancelled)
        return stop

    def _drop_arrival(self, job: Job) -> None:
        """Take a cancelled job's arrival off the heap: left there (its handler ignores it), it would hold the job in
        memory and keep ``serve --until-idle`` from ending until its time, which may be far off (``submit --at``),
        where a restart, which does not reload it, would be idle at once."""
        import heapq

        kept = [entry for entry in self.heap if not (isinstance(entry[3], ArrivalEvent) and entry[3].job is job)]
        if len(kept) != len(self.heap):
            self.heap[:] = kept
            heapq.heapify(self.heap)

    def forget_ended(self) -> int:
        """Drop the jobs that ended (finished, failed, cancelled, dropped, never placeable) once their last state
        is committed: a server runs for months, and each pass walks its jobs; what it then holds is what a restart
        rebuilds from the database. Returns how many were dropped."""
        ended = [j for j in self.jobs if j.state in (JobState.FINISHED, JobState.DROPPED) or j.unschedulable]
        if not ended:
            return 0
        gone = {j.index for j in ended}
        self.jobs[:] = [j for j in self.jobs if j.index not in gone]  # in place: the result object shares the list
        for job in ended:
            job_id = job.spec.job_id
            del self.by_id[job_id]
            # (the counts of ended jobs go with them, as after a restart: done + unschedulable = jobs held, ended)
            if job.state in (JobState.FINISHED, JobState.DROPPED):
                self.done_count -= 1
            else:
                self.unschedulable_count -= 1
            for table in (self.requests, self.failed, self.cancelled):
                table.pop(job_id, None)
        self._reported = {key for key in self._reported if key[0] not in gone}
        ids = {j.spec.job_id for j in ended}
        self._finished_at = {key: at for key, at in self._finished_at.items() if key[0] not in ids}
        return len(ended)

    # -- time -----------------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Handle every event at or before scheduler time t (completions, starts, arrivals), in order."""
        import heapq

        heap = self.heap
        while heap and heap[0][0] <= t:
            time_, _, _, event = heapq.heappop(heap)
            self.now = max(self.now, time_)
            event.handle(self)
        self.now = max(self.now, t)

    def tick(self) -> float:
        """One scheduling round at the current time; returns the policy's decision time (0 when it had nothing to do)."""
        self.decisions_this_tick = 0
        if not self.policy.needs_schedule():
            return 0.0
        t0 = _time.perf_counter()
        self.policy.schedule()
        self.dirty = False
        return _time.perf_counter() - t0

    def drain(self) -> tuple[list[LaunchRequest], list[tuple], dict[str, Job]]:
        out = (self.intents, self.log_entries, self.touched)
        self.intents, self.log_entries, self.touched = [], [], {}
        return out

    # -- snapshots ------------------------------------------------------------------------------------
    def status_of(self, job: Job) -> str:
        if job.spec.job_id in self.cancelled:
            return "cancelled"
        if job.spec.job_id in self.failed:
            return "failed"
        if job.unschedulable:
            return "unschedulable"
        return {JobState.PENDING: "arriving", JobState.QUEUED: "queued", JobState.STARTING: "starting",
                JobState.RUNNING: "running", JobState.FINISHED: "finished", JobState.DROPPED: "dropped"}[job.state]

    def error_of(self, job: Job) -> str | None:
        """What its status shows as the job's error: why it failed, or why it can never be placed."""
        return self.cancelled.get(job.spec.job_id) or self.failed.get(job.spec.job_id) or job.unschedulable

    def snapshot(self, job: Job) -> dict[str, Any]:
        a = job.alloc
        req = self.requests.get(job.spec.job_id)
        return {
            "state": job.state.value, "priority": job.priority, "queue_since": job.queue_since,
            "enqueue_seq": job.enqueue_seq, "version": job.version, "progress": job.progress,
            "progress_time": job.progress_time, "rate": job.rate, "first_start": job.first_start,
            "finish_time": job.finish_time, "reschedules": job.reschedules, "overhead_s": job.overhead_s,
            "profiled": job.profiled, "starts_at": job.starts_at, "profiles_at": job.profiles_at,
            # the policy's per-job decisions (e.g. ElasticFlow's admission); list values are caches, recomputed
            "policy_state": {k: v for k, v in job.policy_state.items() if isinstance(v, (bool, int, float, str))},
            "alloc": None if a is None else {"gpu_type": self.perf.gpu_types[a.type_index], "count_index": a.count_index,
                                             "blocks": [list(b) for b in a.blocks]},
            "request": None if req is None else req.to_dict(),
            "remaining": job.remaining_at(self.now),
            "true_rate": (float(job.true_thr[a.type_index, a.count_index]) / job.spec.global_batch) if a is not None else 0.0,
            "snapshot_time": self.now,
        }

    def restore(self, spec: JobSpec, snap: dict[str, Any]) -> Job:
        """Rebuild a queued or active job from its snapshot (the server calls ``requeue`` for queued ones after)."""
        job = self.add_job(spec)
        job.priority = snap["priority"]
        job.queue_since = snap["queue_since"]
        job.enqueue_seq = snap["enqueue_seq"]
        job.version = snap["version"]
        job.progress = snap["progress"]
        job.progress_time = snap["progress_time"]
        job.first_start = snap["first_start"]
        job.reschedules = snap["reschedules"]
        job.overhead_s = snap["overhead_s"]
        job.profiled = snap["profiled"]
        job.starts_at = float(snap.get("starts_at", 0.0))  # absent from snapshots written before they were kept
        job.profiles_at = float(snap.get("profiles_at", 0.0))
        if job.profiled:  # its profiles exist (the server's saved reuse state covers finished jobs' pairs)
            self.profiles_ready.setdefault((spec.model, spec.global_batch), self.now)
        job.policy_state.update(snap.get("policy_state") or {})
        self._enqueue_seq = max(self._enqueue_seq, job.enqueue_seq)
        if snap["request"] is not None:
            self.requests[spec.job_id] = LaunchRequest.from_dict(snap["request"])
        state = JobState(snap["state"])
        if state in (JobState.STARTING, JobState.RUNNING):
            al = snap["alloc"]
            alloc = Allocation(self.perf.type_index[al["gpu_type"]], al["count_index"],
                               tuple((int(n), int(m)) for n, m in al["blocks"]))
            self.cluster.occupy(alloc)
            self.plans_ready.setdefault((spec.model, spec.global_batch, alloc.type_index, alloc.count_index), self.now)
            job.alloc = alloc
            job.state = state
            if state == JobState.RUNNING:
                job.rate = float(job.true_thr[alloc.type_index, alloc.count_index]) / spec.global_batch
            self._activate(job)
        elif state == JobState.QUEUED:
            job.state = JobState.QUEUED
            self.queued_count += 1
        else:
            raise AssertionError(f"job {spec.job_id}: cannot restore a {state.value} job")
        return job

    def active_order(self) -> list[str]:
        return [j.spec.job_id for j in self.active.values()]

    def reuse_state(self) -> dict[str, list[list[Any]]]:
        """The profiles and plans later (re)starts reuse, with their ready times (saved by the server so a
        restart neither profiles a finished job's (model, batch) again nor forgets the plans searched)."""
        names = self.perf.gpu_types
        return {"profiles": [[m, b, at] for (m, b), at in sorted(self.profiles_ready.items())],
                "plans": [[m, b, names[t], c, at] for (m, b, t, c), at in sorted(self.plans_ready.items())]}

    def restore_reuse_state(self, state: dict[str, Any] | None) -> None:
        """Take back what :meth:`reuse_state` saved; entries for GPU types the performance table lacks are dropped."""
        state = state or {}
        for m, b, at in state.get("profiles", []):
            self.profiles_ready[(str(m), int(b))] = float(at)
        for m, b, name, c, at in state.get("plans", []):
            if name in self.perf.type_index:
                self.plans_ready[(str(m), int(b), self.perf.type_index[name], int(c))] = float(at)

    def reorder_active(self, order: list[str]) -> None:
        """Restore the in-flight jobs' order (policies iterate them in it, and break ties by it)."""
        rank = {job_id: i for i, job_id in enumerate(order)}
        items = sorted(self.active.items(), key=lambda kv: (rank.get(kv[1].spec.job_id, len(rank)), kv[1].index))
        self.active = {}
        self._active_seq = 0
        for _, job in items:
            self._activate(job)

    def requeue(self, jobs: list[Job]) -> None:
        """Hand restored queued jobs back to the policy, in their original queue order."""
        for job in sorted(jobs, key=lambda j: j.enqueue_seq):
            if not self.policy.runnable(job):
                job.unschedulable = self.policy.unschedulable_reason(job)
                self.queued_count -= 1
                self.unschedulable_count += 1
                continue
            self.policy.on_arrival(job)
        # not dirty: the snapshots are the state right after the last tick's round; what happened since is
        # reported again by the launcher and goes through the heap
