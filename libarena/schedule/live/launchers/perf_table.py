"""Emulated hosts: every job progresses at the performance table's execution truth, in scheduler time.

A version launched at scheduler time d with modelled overhead o trains from d + o at truth(type, count) /
global batch iterations per second, from the progress its previous version had reached when it was stopped
(the same arithmetic as the simulator, so the two agree exactly). Runs are records in their own SQLite file,
and a run's state is a pure function of the clock, so the emulated jobs keep "running" while the scheduler is
down, like real ones.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from libarena.errors import ArenaError
from libarena.schedule.entities import count_index
from libarena.schedule.live.launchers.base import JobLauncher, LaunchRequest, LauncherContext, RunStatus, register_launcher


@register_launcher
class PerfTableLauncher(JobLauncher):
    name = "perf-table"
    measured_progress = False

    def __init__(self, context: LauncherContext):
        if context.perf is None:
            raise ArenaError("the perf-table launcher needs the performance table")
        self.perf = context.perf
        context.workdir.mkdir(parents=True, exist_ok=True)
        self.path = Path(context.workdir) / "emulated-hosts.db"
        self.conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        self._cache: dict[tuple[str, int], tuple[LaunchRequest, float, float, float, float | None]] = {}
        try:
            self._load()
        except BaseException:
            self.conn.close()
            raise

    def _load(self) -> None:
        try:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("CREATE TABLE IF NOT EXISTS runs (job_id TEXT NOT NULL, version INTEGER NOT NULL, "
                              "request TEXT NOT NULL, start_progress REAL NOT NULL, train_start REAL NOT NULL, "
                              "rate REAL NOT NULL, stopped_at REAL, PRIMARY KEY (job_id, version))")
            rows = self.conn.execute("SELECT * FROM runs").fetchall()
        except sqlite3.DatabaseError as e:
            raise ArenaError(f"{self.path}: not an emulated-hosts database ({e})") from None
        for row in rows:
            try:
                j, v, r, sp, ts, rate, stop = row
                numbers = (sp, ts, rate) if stop is None else (sp, ts, rate, stop)
                if not all(isinstance(x, (int, float)) for x in numbers):
                    raise ValueError("a time, progress or rate that is not a number")
                self._cache[(j, v)] = (LaunchRequest.from_dict(json.loads(r)), sp, ts, rate, stop)
            except (KeyError, TypeError, ValueError) as e:  # json's decode error is a ValueError
                raise ArenaError(f"{self.path}: the run of job {row[0]!s:.80} is damaged ({type(e).__name__}: "
                                 f"{str(e):.200})") from None

    def _rate(self, req: LaunchRequest) -> float:
        mp = self.perf.get(req.model, req.global_batch)
        t = self.perf.type_index[req.gpu_type]
        c = count_index(req.num_gpus)
        thr = float(mp.truth[t, c])
        if not thr > 0:
            raise ArenaError(f"job {req.job_id}: {req.model} cannot run on {req.num_gpus} x {req.gpu_type}")
        return thr / req.global_batch

    def _progress_at(self, key: tuple[str, int], when: float) -> float:
        req, start_progress, train_start, rate, stopped = self._cache[key]
        if stopped is not None:
            when = min(when, stopped)
        if when <= train_start:
            return start_progress
        return min(float(req.iterations), start_progress + rate * (when - train_start))

    def launch(self, request: LaunchRequest) -> None:
        key = (request.job_id, request.version)
        if key in self._cache:
            return
        self.vacate(request)
        prev = (request.job_id, request.previous_version)
        start_progress = self._progress_at(prev, request.decided_at) if prev in self._cache else 0.0
        train_start = request.decided_at + request.overhead_s
        rate = self._rate(request)
        with self.conn:
            self.conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, NULL)",
                              (request.job_id, request.version, json.dumps(request.to_dict()), start_progress, train_start, rate))
        self._cache[key] = (request, start_progress, train_start, rate, None)

    def _stop(self, key: tuple[str, int], when: float) -> None:
        req, sp, ts, rate, stopped = self._cache[key]
        if stopped is None:
            with self.conn:
                self.conn.execute("UPDATE runs SET stopped_at = ? WHERE job_id = ? AND version = ?", (when, *key))
            self._cache[key] = (req, sp, ts, rate, when)

    def vacate(self, request: LaunchRequest) -> None:
        prev = (request.job_id, request.previous_version)
        if request.previous_version is not None and prev in self._cache:
            self._stop(prev, request.decided_at)

    def stop(self, job_id: str, version: int, at: float | None = None) -> None:
        if (job_id, version) in self._cache:
            req = self._cache[(job_id, version)][0]
            self._stop((job_id, version), req.decided_at if at is None else at)

    def poll(self, now: float, versions: dict[str, int]) -> dict[str, RunStatus]:
        out = {}
        for job_id, version in versions.items():
            key = (job_id, version)
            if key not in self._cache:
                out[job_id] = RunStatus(job_id, version, "lost", message="no such run")
                continue
            req, start_progress, train_start, rate, stopped = self._cache[key]
            # the same expression as the simulator's predicted completion
            finish = float(train_start + (req.iterations - start_progress) / rate)
            if now < train_start:
                out[job_id] = RunStatus(job_id, version, "starting", iterations_done=start_progress)
            elif now < finish:
                out[job_id] = RunStatus(job_id, version, "running", train_start, None, self._progress_at(key, now))
            else:
                out[job_id] = RunStatus(job_id, version, "finished", train_start, finish, float(req.iterations))
        return out

    def close(self) -> None:
        self.conn.close()
