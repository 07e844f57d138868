"""The live scheduler's server loop (``arena-schedule serve``) and its crash recovery.

Each loop iteration (every ``poll_s`` wall seconds) picks up new submissions (profiling those whose
(model, batch) the performance table lacks) and finished profiles; when scheduler time reaches the next tick
(ticks every ``tick_s`` scheduler seconds from 0: the simulator's grid under ``simulate --start 0``; by default it
starts at the first submission), it polls the launcher, feeds the
reports to the LiveCluster's event heap, runs the policy, and commits, in ONE transaction, the job snapshots,
the decision log and the launch intents, and only then hands the intents to the launcher (marking them
launched). Between ticks the same pass runs at once when something happens (a job arrives, starts training,
finishes or fails; the launcher is polled every loop iteration), so a job submitted to an idle cluster is
launched within about ``poll_s`` instead of at the next tick; the tick stays as the periodic re-optimisation.
Restart = rebuild the LiveCluster from the snapshots, re-issue intents not marked launched (the
launcher ignores versions it already runs), and let the next poll report what happened in between.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libarena.artifacts import write_bytes
from libarena.checks import MAX_TICK_S, MIN_TICK_S, Range, check_fields
from libarena.errors import ArenaError
from libarena.hardware import cluster_from_bytes
from libarena.schedule.config import OverheadConfig, SimulatorConfig
from libarena.schedule.entities import JobSpec
from libarena.schedule.live import store as st
from libarena.schedule.live.clock import MAX_COMPRESSION, VirtualClock
from libarena.schedule.live.cluster import LiveCluster
from libarena.schedule.live.jobfile import JobSubmission
from libarena.schedule.live.launchers import LaunchRequest, LauncherContext, LauncherOptions, get_launcher
from libarena.schedule.live.profiling import DEFAULT_PROFILE_RETRY_S, DEFAULT_PROFILE_TIMEOUT_S, ArrivalProfiler
from libarena.schedule.live.store import ServerLock, Store, damaged_state, holds_jobs
from libarena.schedule.perf import load_perf


@dataclass(frozen=True)
class ServeConfig:
    cluster: Path
    perf: Path
    state: Path
    policy: str = "arena"
    policy_options: dict[str, Any] = field(default_factory=dict)
    tick_s: float = 300.0
    compression: float = 1.0
    launcher: str = "arena-run"
    #: launcher and profiler files (default: <state>.d next to the database)
    workdir: Path | None = None
    overheads: OverheadConfig = field(default_factory=OverheadConfig)
    #: wall seconds between polls of the database (submissions) and of running profiles
    poll_s: float = 0.5
    profile_script: str | None = None
    #: wall seconds a profile on arrival may run before it is stopped and its jobs rejected
    profile_timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S
    #: wall seconds after a failed profile before a later job of its pair has it profiled again
    profile_retry_s: float = DEFAULT_PROFILE_RETRY_S
    #: how the launcher runs jobs (the Ray address, arena-run's checkpoint interval, ...)
    launcher_options: LauncherOptions = field(default_factory=LauncherOptions)
    #: react to events: a scheduling pass as soon as a job arrives, starts, finishes or fails (polled every
    #: ``poll_s``), besides the periodic tick; False: passes only at ticks, exactly as the simulator schedules
    #: (what the live-vs-simulator equivalence test compares)
    event_passes: bool = True

    def __post_init__(self) -> None:
        check_fields(self, {
            "tick_s": Range("--tick", MIN_TICK_S, MAX_TICK_S),
            "compression": Range("--time-compression", 0, MAX_COMPRESSION, lo_open=True),
            "poll_s": Range("--poll", 0.001, 60),
            "profile_timeout_s": Range("--profile-timeout", 1, 30 * 86400),
            "profile_retry_s": Range("--profile-retry", 0, 30 * 86400),
        })
        if str(self.perf) == "-":
            raise ArenaError("--perf -: serve reads its performance table again at every restart: give a file")
        if Path(self.cluster).exists() and not Path(self.cluster).is_file():
            raise ArenaError(f"--cluster {self.cluster}: serve reads its cluster again at every restart (and binds "
                             "the state to its content): give a regular file")
        workdir = None if self.workdir is None else Path(self.workdir).absolute()
        if workdir is not None and not workdir.exists() and not workdir.parent.is_dir():  # a mistyped parent
            raise ArenaError(f"--workdir {self.workdir}: directory {workdir.parent} does not exist (only the workdir "
                             f"itself is created)")
        from libarena.schedule.live.launchers.base import LAUNCHERS

        if self.launcher in LAUNCHERS:  # an unknown one is refused, with the known ones, where it is made
            used = LAUNCHERS.get(self.launcher).options_used
            for name, flag in (("address", "--address"), ("checkpoint_every", "--checkpoint-every")):
                if getattr(self.launcher_options, name) is not None and name not in used:
                    raise ArenaError(f"{flag} has no effect with the {self.launcher} launcher")

    def read_cluster(self) -> bytes:
        """The cluster file's bytes, read once per start: what the state is bound to, what the scheduler loads
        and what its jobs and profiles are given are then the same content."""
        from libarena.artifacts.untrusted import MAX_SPEC_BYTES, read_bounded

        return read_bounded(self.cluster, MAX_SPEC_BYTES, "cluster spec")

    def settings(self, cluster_sha256: str) -> dict[str, Any]:
        """What must not change across restarts of the same state database (the cluster's content too: its
        running jobs hold GPUs of its pools)."""
        return {"cluster": str(Path(self.cluster).resolve()), "cluster_sha256": cluster_sha256, "perf": str(Path(self.perf).resolve()),
                "policy": self.policy, "policy_options": {k: str(v) for k, v in sorted(self.policy_options.items())},
                "tick_s": self.tick_s, "compression": self.compression, "launcher": self.launcher,
                "overheads": dataclasses.asdict(self.overheads)}


def cluster_copy_path(workdir: Path, cluster: Path, sha256: str) -> Path:
    """Where a start keeps the copy of its cluster file that its profiles and jobs read: in a folder named by the
    content (a restart with the same cluster finds it, running jobs keep reading theirs), under the file's own
    name (a spec without a ``name`` is named after its file; the suffix says YAML or TOML)."""
    return workdir / "clusters" / sha256[:16] / cluster.name


def write_cluster_copy(path: Path, content: bytes) -> None:
    """Write the copy once, atomically."""
    from libarena.artifacts import write_bytes

    if not (path.is_file() and path.read_bytes() == content):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, content)


@dataclass
class TickStats:
    time: float
    decision_s: float
    decisions: int
    queued: int
    active: int
    step_s: float
    #: False for a pass that reacted to an event (an arrival, a start, a completion) between ticks
    periodic: bool = True


#: the file in a server's workdir naming the state database (its ``state_id``) whose jobs the workdir holds
WORKDIR_OWNER = "state-id"
#: how many passes' statistics a server keeps (``Server.ticks``; the benchmark's 1,000 jobs take a few thousand)
MAX_KEPT_TICKS = 100_000


def read_workdir_owner(workdir: Path) -> str | None:
    """The state id a workdir's owner file names (None: no such file)."""
    path = workdir / WORKDIR_OWNER
    try:
        with open(path, "rb") as f:
            raw = f.read(65)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ArenaError(f"{path}: unreadable ({e.strerror or e})") from None
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > 64 or not text or not all(c in "0123456789abcdef" for c in text):
        raise ArenaError(f"{path}: is not a state id (this workdir's owner file is damaged; move the workdir aside)")
    return text


class Server:
    def __init__(self, config: ServeConfig):
        # one server per state database, for its whole life: taken before anything is read or written
        self.lock = ServerLock(config.state)
        created = self.lock.created
        try:
            self._open(config)
        except BaseException:
            launcher = getattr(self, "launcher", None)
            if launcher is not None:
                launcher.close()
            store = getattr(self, "store", None)
            # a database this failed start made holds nothing, unless a job was submitted into it meanwhile
            remove = created and not holds_jobs(config.state, store.conn if store is not None else None)
            if store is not None:
                store.close()
            if remove:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{config.state}{suffix}").unlink(missing_ok=True)
            self.lock.release()
            raise

    def _open(self, config: ServeConfig) -> None:
        from libarena.schedule.api import make_policy

        self.config = config
        self.store = Store(config.state, create=True)
        cluster_bytes = config.read_cluster()
        cluster_sha256 = hashlib.sha256(cluster_bytes).hexdigest()
        settings = config.settings(cluster_sha256)
        stored = self.store.get_meta("settings")
        if stored is not None and not isinstance(stored, dict):
            raise ArenaError(f"{config.state}: setting 'settings' is damaged (not a mapping: {str(stored):.80})")
        if stored is not None:
            # (a key this version binds that an older one did not is not held against the database)
            changed = sorted(k for k in settings if k in stored and stored[k] != settings[k])
            if changed:
                raise ArenaError(f"{config.state}: was served with different {', '.join(changed)} "
                                 f"(e.g. {changed[0]}={stored.get(changed[0])!r}); use a new --state")
        origin = self._stored_number("wall_origin") if stored is not None else time.time()
        self.clock = VirtualClock(origin, config.compression)
        #: when this process began serving (a job submitted while the server was down keeps its clock time: the
        #: ticks the restarted server catches up on reach it)
        self._started_wall = time.time()
        self.cluster_spec = cluster_from_bytes(cluster_bytes, config.cluster)
        self.perf = load_perf(config.perf, self.cluster_spec)
        for rows in self.store.perf_rows():
            import pyarrow as pa

            self.perf.extend(pa.table(rows))
        self.policy = make_policy(config.policy, **config.policy_options)
        self.sim_config = SimulatorConfig(tick_s=config.tick_s, overheads=config.overheads)
        self.last_tick: float | None = self._stored_number("last_tick", optional=True)
        # the latest pass, periodic or not: scheduler time never goes back across a restart
        last_pass = self._stored_number("last_pass", optional=True)
        if last_pass is None:
            last_pass = self.last_tick
        self.live = LiveCluster(self.perf, self.cluster_spec, self.policy, self.sim_config,
                                now=last_pass if last_pass is not None else 0.0)
        with self._stored("setting 'policy_state'"):
            for name, value in (self.store.get_meta("policy_state") or {}).items():
                if name not in getattr(self.policy, "persistent_attrs", ()):
                    raise ValueError(f"{config.policy} keeps no {name!r}")
                setattr(self.policy, name, value)
        # the launcher's files of the jobs already running live in the workdir the database was served with
        served_in = self.store.get_meta("workdir") if stored is not None else None
        if served_in is not None and not (isinstance(served_in, str) and served_in):
            raise ArenaError(f"{config.state}: setting 'workdir' is damaged (not a path: {str(served_in):.80})")
        if config.workdir is not None and served_in is not None and Path(config.workdir).resolve() != Path(served_in):
            raise ArenaError(f"{config.state}: was served with --workdir {served_in}, where its jobs' files are; "
                             "serve it with that one (or none), or use a new --state")
        workdir = config.workdir or served_in or config.state.with_name(config.state.name + ".d")
        self.workdir = Path(workdir).resolve()
        # the workdir's files are named by job id and version, which every database starts afresh: one that another
        # database served would hand this one's jobs that one's runs, checkpoints and profiles
        state_id = self.store.get_meta("state_id")
        owner = read_workdir_owner(self.workdir)
        if owner is not None and owner != state_id:
            raise ArenaError(f"{config.state}: --workdir {self.workdir} holds the jobs of another state database "
                             f"({WORKDIR_OWNER} names {owner}); serve that database, or give this one its own --workdir")
        # profiles and jobs read the content this start loaded, even if the file is edited while it serves
        cluster_copy = cluster_copy_path(self.workdir, Path(config.cluster), cluster_sha256)
        self.profiler = ArrivalProfiler(self.workdir / "profiles", cluster_copy, config.profile_script,
                                        config.profile_timeout_s, config.profile_retry_s)
        self.launcher = get_launcher(config.launcher, LauncherContext(
            self.workdir / "launcher", cluster_copy, self.clock, self.perf, config.launcher_options))
        write_cluster_copy(cluster_copy, cluster_bytes)  # once both accepted their options
        if stored is None:
            # bound to these settings only once every one of them loaded: a start refused for a bad input
            # leaves the database servable with corrected ones; both in one transaction, since a later start
            # reads the origin wherever the settings are
            with self.store.transaction() as c:
                self.store.set_meta("settings", settings, c)
                self.store.set_meta("wall_origin", origin, c)
        self.store.set_meta("workdir", str(self.workdir))
        if state_id is None:  # (a database served before the workdir was marked takes its workdir now)
            state_id = secrets.token_hex(16)
            self.store.set_meta("state_id", state_id)
        if owner is None:
            write_bytes(self.workdir / WORKDIR_OWNER, f"{state_id}\n".encode())
        self.default_type = max(self.perf.gpu_types, key=lambda t: (self.cluster_spec.num_gpus(t), -self.perf.gpu_types.index(t)))
        #: the latest passes' statistics (bounded: a server runs for months) and how many passes ran
        self.ticks: collections.deque[TickStats] = collections.deque(maxlen=MAX_KEPT_TICKS)
        self.pass_count = 0
        #: a version the launcher keeps losing (its process dies without an exit code) fails the job
        self.max_relaunches = 3
        # kept in the database: a server restarted after each loss must not relaunch a dying version for ever
        with self._stored("setting 'relaunches'"):
            self._relaunches: dict[tuple[str, int], int] = {
                (str(job_id), int(version)): int(count) for job_id, version, count in self.store.get_meta("relaunches") or []}
        #: the log id up to which cancel requests were acted on (``arena-schedule cancel``)
        self._cancels_after = self.store.cancels_seen()
        self._stop = False
        #: the signal that stopped ``serve`` (None: it ran to its end)
        self.stop_signal: int | None = None
        self._recover()

    # -- recovery -------------------------------------------------------------------------------------
    def _stored(self, what: str):
        """Stored JSON of the wrong shape (a hand edit, another version's database) is a one-line error naming
        what is damaged, not an exception from deep in the restore."""
        return damaged_state(self.config.state, what)

    def _stored_number(self, key: str, optional: bool = False) -> float | None:
        value = self.store.get_meta(key)
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ArenaError(f"{self.config.state}: setting {key!r} is damaged (not a number: {str(value):.80})")
        return float(value)

    def _recover(self) -> None:
        queued = []
        with self.store.transaction() as c:
            with self._stored("setting 'reuse_state'"):
                self.live.restore_reuse_state(self.store.get_meta("reuse_state"))
            for row in self.store.jobs((st.PROFILING, st.ARRIVING, st.QUEUED, st.STARTING, st.RUNNING)):
                with self._stored(f"job {row['job_id']}'s stored state"):
                    state = row["state"] or {}
                    if row["status"] == st.PROFILING:
                        sub = JobSubmission.from_dict(row["spec"])
                        self.profiler.request(sub.model, sub.global_batch, new_job=False)
                        continue
                    spec = JobSpec(**state["spec"])
                    if row["status"] == st.ARRIVING:
                        self.live.submit(spec, row["arrival_time"])
                        continue
                    job = self.live.restore(spec, state["snapshot"])
                    if row["status"] == st.QUEUED:
                        queued.append(job)
            with self._stored("setting 'active_order'"):
                self.live.reorder_active(self.store.get_meta("active_order") or [])
            self.live.requeue(queued)
            reissue = []
            for rec in self.store.launches(("intent",)):
                job = self.live.by_id.get(rec["job_id"])
                current = job is not None and job.active and job.version == rec["version"]
                if current:
                    with self._stored(f"job {rec['job_id']}'s launch request (version {rec['version']})"):
                        reissue.append(LaunchRequest.from_dict(rec["request"]))
                else:
                    c.execute("UPDATE launches SET state = 'superseded' WHERE job_id = ? AND version = ?",
                              (rec["job_id"], rec["version"]))
            if self.live.active or queued:
                Store.log(c, self.live.now, None, "recover", {"queued": len(queued), "active": len(self.live.active),
                                                              "reissued": [f"{r.job_id}/v{r.version}" for r in reissue]})
        # as _execute does: every version leaving its GPUs stops before any starts (an interrupted trade gives two
        # jobs each other's GPUs)
        for req in reissue:
            self.launcher.vacate(req)
        for req in reissue:
            self.launcher.launch(req)
            self.store.mark_launch(req.job_id, req.version, "launched")

    # -- submissions and profiling ----------------------------------------------------------------------
    def _job_spec(self, row: dict[str, Any], sub: JobSubmission, arrival: float) -> JobSpec:
        # a deadline is seconds after submission (the job file's meaning): a job that arrives later, after its
        # (model, batch) was profiled or a server restart, keeps it; one taken earlier, at the pass of a server
        # behind its clock, counts from that arrival
        submitted = row["not_before"] if row["not_before"] is not None else self.clock.at(row["submitted_wall"])
        deadline = None if sub.deadline_s is None else min(arrival, submitted) + sub.deadline_s
        return JobSpec(row["job_id"], row["seq"], arrival, sub.model, sub.global_batch, sub.iterations, sub.num_gpus,
                       sub.gpu_type or self.default_type, deadline, sub.priority)

    def _arrive(self, c, row: dict[str, Any], sub: JobSubmission, arrival: float) -> None:
        spec = self._job_spec(row, sub, arrival)
        try:
            self.live.submit(spec, arrival)
        except ArenaError as e:
            Store.set_status(c, row["job_id"], st.REJECTED, error=str(e))
            Store.log(c, None, row["job_id"], "reject", {"why": str(e)})
            return
        Store.set_status(c, row["job_id"], st.ARRIVING, state={"spec": dataclasses.asdict(spec)}, arrival_time=arrival)

    def _arrival_time(self, row: dict[str, Any], at_least: float) -> float:
        # a replayed job (submit --at) arrives exactly at its time, unless that has passed
        if row["not_before"] is not None:
            return max(row["not_before"], at_least, self.live.now)
        arrival = max(self.clock.at(row["submitted_wall"]), at_least, self.live.now)
        # a server that falls behind its clock while it serves (ticks due faster than it runs them: a high
        # --compression) takes a job submitted meanwhile at its own next pass: the clock's time would lie ahead
        # of every pass it runs for a long while (not when it is only catching up after a restart, nor within a tick)
        if row["submitted_wall"] >= self._started_wall and self.clock.now() - self.next_tick_time() > self.config.tick_s:
            return min(arrival, max(self.next_tick_time(), self.live.now))
        return arrival

    def ingest(self) -> None:
        rows = self.store.jobs((st.SUBMITTED,))
        finished = self.profiler.poll()
        if not rows and not finished:
            return
        with self.store.transaction() as c:
            for model, batch, path, message in finished:
                with self._stored("a profiling job's stored submission"):
                    waiting = [r for r in self.store.jobs((st.PROFILING,))
                               if (r["spec"]["model"], r["spec"]["global_batch"]) == (model, batch)]
                if path is not None:
                    try:
                        from libarena.artifacts import read_table
                        from libarena.artifacts.kinds.perf_table import check_perf_table

                        import pyarrow.compute as pc

                        art = read_table(path, "perf_table")
                        check_perf_table(art.table, art.source)
                        # only the pair it was asked for: rows of another pair would enter the lookup unprofiled
                        # by this server and unsaved in its state
                        table = art.table.filter(pc.and_(pc.equal(art.table["model"], model),
                                                         pc.equal(art.table["global_batch"], batch)))
                        if table.num_rows == 0:
                            raise ArenaError(f"{path}: has no rows for {model} (batch {batch})")
                        self.perf.extend(table)
                        self.store.add_perf_rows(c, model, batch, table.to_pydict())
                    except ArenaError as e:
                        path, message = None, f"profiling produced no usable table: {e}"
                        self.profiler.mark_unusable(model, batch)
                for r in waiting:
                    Store.log(c, self.clock.now(), r["job_id"], "profiled" if path else "profile-failed", {"message": message})
                    if path is None:
                        Store.set_status(c, r["job_id"], st.REJECTED, error=message)
                    else:
                        with self._stored(f"job {r['job_id']}'s stored submission"):
                            sub = JobSubmission.from_dict(r["spec"])
                        self._arrive(c, r, sub, self._arrival_time(r, self.clock.now()))
            for row in rows:
                with self._stored(f"job {row['job_id']}'s stored submission"):
                    sub = JobSubmission.from_dict(row["spec"])
                why = self.launcher.cannot_run(sub.iterations)
                if why is None and sub.gpu_type is not None and sub.gpu_type not in self.perf.type_index:
                    why = (f"GPU type {sub.gpu_type!r} is not in cluster {self.cluster_spec.name} "
                           f"({', '.join(self.perf.gpu_types)})")
                if why is not None:
                    Store.set_status(c, row["job_id"], st.REJECTED, error=why)
                    Store.log(c, None, row["job_id"], "reject", {"why": why})
                elif not self.perf.has(sub.model, sub.global_batch):
                    self.profiler.request(sub.model, sub.global_batch)
                    Store.set_status(c, row["job_id"], st.PROFILING)
                    Store.log(c, self.clock.now(), row["job_id"], "profile", {"model": sub.model, "global_batch": sub.global_batch})
                else:
                    self._arrive(c, row, sub, self._arrival_time(row, float("-inf")))

    # -- ticks ----------------------------------------------------------------------------------------
    def _poll(self, t: float) -> dict[str, Any]:
        versions = {j.spec.job_id: j.version for j in self.live.active.values()}
        return self.launcher.poll(t, versions) if versions else {}

    def _withdraw_unwaited_profiles(self) -> None:
        """After cancels: the profiles that no job waits for any more are not started, or are stopped."""
        waiting = set()
        for row in self.store.jobs((st.PROFILING,)):
            with self._stored(f"job {row['job_id']}'s stored submission"):
                sub = JobSubmission.from_dict(row["spec"])
            waiting.add((sub.model, sub.global_batch))
        for model, batch in list(self.profiler.pending):
            if (model, batch) not in waiting:
                self.profiler.withdraw(model, batch)
                with self.store.transaction() as c:
                    Store.log(c, self.live.now, None, "profile-withdrawn", {"model": model, "batch": batch})

    def _events_due(self, t: float, reports: dict[str, Any]) -> bool:
        """Whether something happened that a scheduling pass should react to at once: an arrival (or any event)
        due on the heap, a version that finished, failed, was lost, or started training."""
        live = self.live
        if live.heap and live.heap[0][0] <= t:
            return True
        for job_id, rep in reports.items():
            job = live.by_id.get(job_id)
            if job is None or job.version != rep.version:
                continue
            if rep.phase in ("finished", "failed", "lost") or (rep.phase == "running" and job.state.value == "starting"):
                return True
        return False

    def tick(self, t: float, periodic: bool = True, reports: dict[str, Any] | None = None,
             cancels: tuple[list[tuple[int, str, str, float]], int] | None = None) -> TickStats:
        """A scheduling pass at scheduler time ``t``: the periodic one (every tick), or one that reacts to an
        event (``periodic`` False: the periodic ticks keep their times). ``reports``: the launcher's statuses
        when the caller already polled it at ``t``; ``cancels``: the cancel requests to act on first, and the log
        id they were read up to (:meth:`Store.cancel_requests`): those made by ``t`` (a restarted server catching
        up on its ticks acts on a later one at the pass that reaches its time)."""
        wall0 = time.perf_counter()
        live = self.live
        if reports is None:
            reports = self._poll(t)
        lost = live.apply(reports, self.launcher.measured_progress, polled_at=t)
        live.advance(t)
        requests, cancels_seen = cancels if cancels is not None else ([], self._cancels_after)
        for i, request in enumerate(requests):
            if self.clock.at(request[3]) > t:
                requests, cancels_seen = requests[:i], request[0] - 1
                break
        unplaced = self._cancel(t, requests)
        decision_s = live.tick()
        decisions = live.decisions_this_tick
        intents, entries, touched = live.drain()
        for job in live.jobs:  # progress, queue position and promotions change without an action
            # (not a job that can never be placed: written once, when it became so, not again every pass)
            if job.active or (job.state.value == "queued" and not job.unschedulable):
                touched.setdefault(job.spec.job_id, job)
        with self.store.transaction() as c:
            for job_id, job in touched.items():
                snap = live.snapshot(job)
                snap["measured_progress"] = self.launcher.measured_progress
                rep = reports.get(job_id)
                if rep is not None and rep.version == job.version and rep.iterations_done is not None:
                    snap["reported_iterations"] = rep.iterations_done
                Store.set_status(c, job_id, live.status_of(job),
                                 state={"spec": dataclasses.asdict(job.spec), "snapshot": snap},
                                 error=live.error_of(job))
            for req in intents:
                Store.add_launch(c, req.job_id, req.version, req.to_dict(), req.decided_at)
            for time_, job_id, kind, detail in entries:
                Store.log(c, time_, job_id, kind, detail)
            for job_id, why in unplaced:
                row = self.store.job(job_id)
                if row is not None and row["status"] in (st.SUBMITTED, st.PROFILING):
                    Store.set_status(c, job_id, st.CANCELLED, error=why)
                    Store.log(c, t, job_id, "cancel", {"why": why})
                else:
                    Store.log(c, t, job_id, "cancel-ignored", {"status": None if row is None else row["status"]})
            if cancels_seen != self._cancels_after:
                self.store.set_meta("cancels_seen", cancels_seen, c)
            if decisions:
                Store.log(c, t, None, "tick" if periodic else "event-pass",
                          {"decisions": decisions, "decision_s": decision_s, "queued": live.queued_count,
                           "active": len(live.active)})
            if periodic:
                self.store.set_meta("last_tick", t, c)
            self.store.set_meta("last_pass", t, c)
            self.store.set_meta("active_order", live.active_order(), c)
            self.store.set_meta("reuse_state", live.reuse_state(), c)
            persistent = {n: getattr(self.policy, n) for n in getattr(self.policy, "persistent_attrs", ())}
            self.store.set_meta("policy_state", persistent, c)
        if periodic:
            self.last_tick = t
        self._cancels_after = cancels_seen
        self._execute(intents)
        if unplaced and self.profiler.pending:
            self._withdraw_unwaited_profiles()
        for req in lost:
            job = live.by_id.get(req.job_id)
            if job is None or not job.active or job.version != req.version:
                continue  # this pass moved or ended the job: _execute stopped the lost version, no relaunch
            key = (req.job_id, req.version)
            self._relaunches[key] = self._relaunches.get(key, 0) + 1
            if self._relaunches[key] > self.max_relaunches:
                job = live.by_id[req.job_id]
                live.fail(job, f"lost by the launcher {self.max_relaunches + 1} times")
                self.launcher.stop(req.job_id, req.version)
                _, entries, _ = live.drain()
                with self.store.transaction() as c:
                    self._save_relaunches(c)
                    Store.set_status(c, req.job_id, live.status_of(job),
                                     state={"spec": dataclasses.asdict(job.spec), "snapshot": live.snapshot(job)},
                                     error=live.error_of(job))
                    for time_, job_id, kind, detail in entries:
                        Store.log(c, time_, job_id, kind, detail)
                continue
            with self.store.transaction() as c:  # counted before it is tried: a crash in between counts it anyway
                self._save_relaunches(c)
            self.launcher.relaunch(req)
            with self.store.transaction() as c:
                Store.log(c, t, req.job_id, "relaunch", {"version": req.version, "why": "lost by the launcher"})
        for job_id in [j for j in touched if j in live.failed]:
            job = live.by_id[job_id]
            self.launcher.stop(job_id, job.version)
        live.forget_ended()
        stats = TickStats(t, decision_s, decisions, live.queued_count, len(live.active), time.perf_counter() - wall0,
                          periodic)
        self.ticks.append(stats)
        self.pass_count += 1
        return stats

    def _cancel(self, t: float, requests: list[tuple[int, str, str, float]]) -> list[tuple[str, str]]:
        """Cancel the jobs the scheduler holds (their versions stopped here, before this pass gives their GPUs to
        others and before it is committed: a crash in between leaves the request to act on again); returns the
        requests for the jobs it does not hold (submitted or profiling: their rows are marked in the pass's
        transaction; an ended job's request is logged as ignored)."""
        live = self.live
        unplaced = []
        for _, job_id, why, _ in requests:
            job = live.by_id.get(job_id)
            if job is None:
                unplaced.append((job_id, why))
                continue
            if job.state not in LiveCluster.CANCELLABLE:
                live.log_entries.append((t, job_id, "cancel-ignored", {"status": live.status_of(job)}))
                continue
            version = live.cancel(job, why)
            if version is not None:
                self.launcher.stop(job_id, version, at=t)
        return unplaced

    def _save_relaunches(self, c) -> None:
        # only the versions of jobs still in flight, here as in the database: a finished or failed job is never
        # relaunched again
        live = self.live
        self._relaunches = {(job_id, version): n for (job_id, version), n in sorted(self._relaunches.items())
                            if job_id in live.by_id and live.by_id[job_id].active}
        self.store.set_meta("relaunches", [[job_id, version, n] for (job_id, version), n in self._relaunches.items()], c)

    def _execute(self, intents: list[LaunchRequest]) -> None:
        latest: dict[str, int] = {}
        for req in intents:
            latest[req.job_id] = req.version
        current = []
        for req in intents:
            if latest[req.job_id] != req.version:
                self.store.mark_launch(req.job_id, req.version, "superseded")
            else:
                current.append(req)
        # every job that leaves its GPUs this round stops before any starts (a trade is a cycle of two)
        for req in current:
            self.launcher.vacate(req)
        for req in current:
            self.launcher.launch(req)
            self.store.mark_launch(req.job_id, req.version, "launched")

    # -- the loop -------------------------------------------------------------------------------------
    def next_tick_time(self) -> float:
        return 0.0 if self.last_tick is None else self.last_tick + self.config.tick_s

    def idle(self) -> bool:
        live = self.live
        pending = self.store.conn.execute("SELECT COUNT(*) FROM jobs WHERE status IN (?, ?, ?)",
                                          (st.SUBMITTED, st.PROFILING, st.ARRIVING)).fetchone()[0]
        return not pending and not live.active and not live.queued_count and not live.heap and not self.profiler.pending

    def step(self) -> bool:
        """One loop iteration; returns True when a pass ran (the caller sleeps otherwise): the periodic tick when
        its time has come, else (``event_passes``) a pass at once when an arrival, a launcher report or a cancel
        request is due."""
        self.lock.check()
        self.ingest()
        cancels = self.store.cancel_requests(self._cancels_after)
        if not cancels[0]:
            self._cancels_after = cancels[1]
        t = self.next_tick_time()
        now = self.clock.now()
        if now >= t:
            self.tick(t, cancels=cancels)
            return True
        if self.config.event_passes:
            now = max(now, self.live.now)
            reports = self._poll(now)
            # (a cancel frees GPUs at once; with passes only at ticks it waits for the next one, as arrivals do)
            if cancels[0] or self._events_due(now, reports):
                self.tick(now, periodic=False, reports=reports, cancels=cancels)
                return True
        return False

    def request_stop(self, signum: int | None = None, *_: Any) -> None:
        """Stop after the current step (a signal handler: the state stays consistent, a restart resumes)."""
        self._stop = True
        if signum is not None:
            self.stop_signal = signum

    def serve(self, until_idle: bool = False, max_wall_s: float | None = None, install_signals: bool = True,
              max_ticks: int | None = None) -> bool:
        """Serve until stopped (a signal, ``max_wall_s``), or until every job is done (``until_idle``) or
        ``max_ticks`` ticks have run: whether it ran to such an end (a stop requested in its last step included)."""
        if install_signals:
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        end = None if max_wall_s is None else time.time() + max_wall_s
        while not self._stop and (end is None or time.time() < end):
            if self.step():
                if (until_idle and self.idle()) or (max_ticks is not None and self.pass_count >= max_ticks):
                    return True
                continue
            wait = (self.next_tick_time() - self.clock.now()) / self.config.compression
            time.sleep(max(0.0, min(self.config.poll_s, wait)))
        return False

    def close(self) -> None:
        # the lock last, whatever fails before it: releasing it closes a descriptor of the database file, which
        # would drop the POSIX locks SQLite holds on a connection still open (store.ServerLock)
        try:
            self.launcher.close()
        finally:
            try:
                self.store.close()
            finally:
                self.lock.release()
