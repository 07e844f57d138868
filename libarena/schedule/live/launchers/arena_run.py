"""Real jobs: each (job, version) is an ``arena-run`` process in its own session (it outlives the scheduler).

Layout under the launcher's work directory::

    plans/<model>__b<batch>.parquet       arena-plan --model output, shared by a model's jobs
    cache/                                 the stage cache of those plans (operator tables included)
    jobs/<job>/ckpt/                       the job's checkpoints (every version resumes from them)
    jobs/<job>/v<version>/request.json     the launch request (written first: the idempotency record)
                         /run.sh, pid, output.log, report.json, exit_code

A rescale or migration stops the previous version (SIGTERM to its process group, then SIGKILL) and starts
the next one from the job's checkpoint directory with the new grid: checkpoint-resume. Placement on Ray is
by ``arena-run``'s GPU-type resource (``gpu_type:<t>``); with no Ray address each version runs an embedded
Ray presenting ``num_gpus`` local devices as the GPU type. Progress is the newest checkpoint step.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from libarena.checks import MAX_STEPS
from libarena.schedule.live.processes import (process_env, recorded_group, recorded_pid, running_pid,
                                              shell_records_own_pid, write_pid_file)
from libarena.schedule.live.launchers.base import JobLauncher, LaunchRequest, LauncherContext, RunStatus, register_launcher


def tool(name: str) -> str:
    """The console script of a sibling tool, from this interpreter's environment."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


@register_launcher
class ArenaRunLauncher(JobLauncher):
    name = "arena-run"
    measured_progress = True
    options_used = ("address", "checkpoint_every", "search_max", "arena_run_args", "commands")

    def __init__(self, context: LauncherContext):
        self.ctx = context
        self.root = Path(context.workdir)
        (self.root / "plans").mkdir(parents=True, exist_ok=True)
        (self.root / "jobs").mkdir(parents=True, exist_ok=True)
        self.options = context.options
        self._children: dict[tuple[str, int], subprocess.Popen] = {}
        #: the tools' commands: this environment's console scripts unless the options put others in their place
        self.commands: dict[str, str] = {name: tool(name) for name in ("arena-plan", "arena-run")}
        self.commands.update(context.options.commands)

    def cannot_run(self, iterations: int) -> str | None:
        if iterations > MAX_STEPS:  # arena-run's own bound (--steps): the job would fail at its first launch
            return f"{iterations} iterations: arena-run trains at most {MAX_STEPS} steps in one run"
        return None

    def run_dir(self, job_id: str, version: int) -> Path:
        return self.root / "jobs" / job_id / f"v{version}"

    def checkpoint_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id / "ckpt"

    def plans_path(self, model: str, batch: int) -> Path:
        return self.root / "plans" / f"{model}__b{batch}.parquet"

    def script(self, req: LaunchRequest, run_dir: Path) -> str:
        plans = self.plans_path(req.model, req.global_batch)
        q = shlex.quote
        # arena-plan --model analyzes on the way (both steps cached under the launcher's directory)
        prepare = (f"if [ ! -f {q(str(plans))} ]; then {q(self.commands['arena-plan'])} --model {q(req.model)} "
                   f"--global-batch {req.global_batch} --cluster {q(str(self.ctx.cluster_path))} "
                   f"--cache-dir {q(str(self.root / 'cache'))} -o {q(str(run_dir / 'plans.parquet'))} "
                   f"&& mv -f {q(str(run_dir / 'plans.parquet'))} {q(str(plans))}; fi")
        run = [self.commands["arena-run"], "--plan", str(plans), "--model", req.model, "--global-batch", str(req.global_batch),
               "--steps", str(req.iterations), "--checkpoint-dir", str(self.checkpoint_dir(req.job_id)),
               "--report", str(run_dir / "report.json"), *self._plan_args(req)]
        if self.options.checkpoint_every is not None:
            run += ["--checkpoint-every", str(self.options.checkpoint_every)]
        run += ["--address", self.options.address] if self.options.address else ["--devices", str(req.num_gpus)]
        run += self.options.arena_run_args
        # the script records its own pid first: a scheduler killed between starting it and recording the pid
        # still finds it on restart (and does not start the version twice)
        return (shell_records_own_pid(run_dir / "pid") + f"\n{prepare} && {' '.join(q(a) for a in run)}\n"
                f"code=$?; echo $code > {q(str(run_dir / 'exit_code.tmp'))}; mv -f {q(str(run_dir / 'exit_code.tmp'))} "
                f"{q(str(run_dir / 'exit_code'))}; exit $code\n")

    def _plan_args(self, req: LaunchRequest) -> list[str]:
        """How arena-run chooses the plan: a pruned search on the allocation; on a joined cluster, an allocation
        larger than one node (the search measures in one process, which needs the whole grid on one node) runs
        the proxy plan of the pipeline degree the performance table's arena row has, one host per node."""
        search = ["--grid", f"{req.gpu_type},{req.num_gpus}", "--search", "pruned", "--search-max",
                  str(self.options.search_max), "--search-steps", "1"]
        perf = self.ctx.perf  # the server's lookup, built on the same cluster: its node sizes and the arena rows
        if not self.options.address or perf is None or req.gpu_type not in perf.type_index:
            return search
        per_node = int(perf.gpus_per_node[perf.type_index[req.gpu_type]])
        if req.num_gpus <= per_node:
            return search
        degree = perf.pipeline_degree(req.model, req.global_batch, req.gpu_type, req.num_gpus)
        return ["--grid", f"{req.gpu_type},{req.num_gpus},{degree or 1}", "--hosts", str(req.num_gpus // per_node)]

    def launch(self, request: LaunchRequest) -> None:
        run_dir = self.run_dir(request.job_id, request.version)
        if (run_dir / "pid").exists():
            return  # already started: launching is idempotent per (job, version)
        self.vacate(request)
        self._start(request, run_dir)

    def vacate(self, request: LaunchRequest) -> None:
        if request.previous_version is not None:
            self._stop_version(request.job_id, request.previous_version)

    def relaunch(self, request: LaunchRequest) -> None:
        run_dir = self.run_dir(request.job_id, request.version)
        self._stop_version(request.job_id, request.version)  # what is left of the lost one (its script's children)
        for name in ("pid", "exit_code", "started_wall"):
            (run_dir / name).unlink(missing_ok=True)
        self._start(request, run_dir)

    def _start(self, request: LaunchRequest, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "request.json").write_text(json.dumps(request.to_dict()))
        (run_dir / "run.sh").write_text(self.script(request, run_dir))
        env = process_env(run_dir)
        env.setdefault("RAY_AUTH_MODE", "disabled")
        with open(run_dir / "output.log", "ab") as log:
            proc = subprocess.Popen(["/bin/sh", str(run_dir / "run.sh")], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=env, cwd=str(run_dir))
        (run_dir / "started_wall").write_text(repr(time.time()))
        write_pid_file(run_dir / "pid", proc.pid)
        self._children[(request.job_id, request.version)] = proc

    def _stop_version(self, job_id: str, version: int, grace_s: float = 20.0) -> None:
        run_dir = self.run_dir(job_id, version)
        if recorded_pid(run_dir / "pid") is None or (run_dir / "exit_code").exists():
            return
        (run_dir / "stopped").write_text(repr(time.time()))
        # only the recorded process group: after a host restart its pid may be another process's
        pid = recorded_group(run_dir / "pid")
        if pid is None:
            self._reap(job_id, version)
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            end = time.time() + wait
            while time.time() < end and recorded_group(run_dir / "pid") == pid:
                self._reap(job_id, version)
                time.sleep(0.1)
            if recorded_group(run_dir / "pid") != pid:
                break
        self._reap(job_id, version)

    def _reap(self, job_id: str, version: int) -> None:
        proc = self._children.get((job_id, version))
        if proc is not None and proc.poll() is not None:
            del self._children[(job_id, version)]

    def stop(self, job_id: str, version: int, at: float | None = None) -> None:
        self._stop_version(job_id, version)

    def _newest_checkpoint(self, job_id: str) -> Path | None:
        ckpt = self.checkpoint_dir(job_id)
        steps = [p for p in ckpt.iterdir() if p.name.isdigit()] if ckpt.is_dir() else []
        return max(steps, key=lambda p: int(p.name)) if steps else None

    def progress(self, job_id: str) -> float | None:
        newest = self._newest_checkpoint(job_id)
        return float(newest.name) if newest is not None else None

    def _training_end(self, job_id: str, started_wall: float, exit_wall: float) -> float:
        """When a finished version's training ended: its final checkpoint (written after the last step), not the
        process's exit, which follows seconds of Ray and JAX teardown."""
        newest = self._newest_checkpoint(job_id)
        try:
            saved = newest.stat().st_mtime if newest is not None else exit_wall
        except OSError:
            saved = exit_wall
        return min(exit_wall, max(started_wall, saved))

    def poll(self, now: float, versions: dict[str, int]) -> dict[str, RunStatus]:
        clock = self.ctx.clock
        out = {}
        # every child that has ended is reaped, not only the polled versions': a version whose shell was still
        # exiting when its exit code was read is not polled again, and would stay a zombie
        for job_id, version in list(self._children):
            self._reap(job_id, version)
        for job_id, version in versions.items():
            run_dir = self.run_dir(job_id, version)
            if recorded_pid(run_dir / "pid") is None:
                out[job_id] = RunStatus(job_id, version, "lost", message="never started")
                continue
            try:
                started_wall = float((run_dir / "started_wall").read_text())
            except (OSError, ValueError):  # killed before writing it: the pid file is as old
                started_wall = (run_dir / "pid").stat().st_mtime
            started = clock.at(started_wall)
            done = self.progress(job_id)
            code_file = run_dir / "exit_code"
            if not code_file.exists() and running_pid(run_dir / "pid") is not None:
                out[job_id] = RunStatus(job_id, version, "running", started, None, done)
            elif code_file.exists():  # (looked at again once the process is gone: the script writes it, then exits)
                code = code_file.read_text().strip()
                exit_wall = code_file.stat().st_mtime
                finished = clock.at(exit_wall)
                if code == "0":
                    finished = clock.at(self._training_end(job_id, started_wall, exit_wall))
                    out[job_id] = RunStatus(job_id, version, "finished", started, finished, done)
                else:
                    out[job_id] = RunStatus(job_id, version, "failed", started, finished, done,
                                            message=f"arena-run exited with {code} (see {run_dir / 'output.log'})")
            else:
                out[job_id] = RunStatus(job_id, version, "lost", started, None, done, message="process gone")
        return out

    def logs(self, job_id: str, version: int) -> Path | None:
        p = self.run_dir(job_id, version) / "output.log"
        return p if p.exists() else None
