"""Profiling on arrival: a job whose (model, global batch) is not in the performance table is profiled
(the pipeline's analyze -> plan -> profile on one local device: ``arena-schedule perf build --pair``) before
it is scheduled.

Profiling runs one (model, batch) at a time, each as a detached shell script in its own directory (so it survives
a scheduler restart, which then picks up its result or restarts it). The script is a template with {model},
{batch}, {cluster} (the server's copy of its cluster file, in its workdir), {out} (the perf table to write) and
{schedule} (this environment's arena-schedule); the default is the pipeline's perf build. A profile that runs
longer than its time limit is killed with what it started, and its jobs rejected. A failed profile's end is what
later jobs of its pair meet too, until the retry interval has passed since it failed: the next job then has it
profiled again.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from libarena.checks import brief
from libarena.errors import ArenaError
from libarena.schedule.live.launchers.arena_run import tool
from libarena.schedule.live.processes import (process_env, recorded_group, running_pid, shell_records_own_pid,
                                              write_pid_file)

#: wall seconds a profile may run before it is stopped and its jobs rejected (a hung script would otherwise hold
#: every later new (model, batch) behind it: profiles run one at a time)
DEFAULT_PROFILE_TIMEOUT_S = 7200.0
#: wall seconds after a failed profile before a later job of its pair has it profiled again: a failure that
#: would repeat (a model that fits nowhere) is not re-run for every job, and one that would not (a full disk, a
#: killed host) does not reject the pair's jobs for good
DEFAULT_PROFILE_RETRY_S = 3600.0
#: what a profile script's template may name ({schedule}: this environment's arena-schedule)
TEMPLATE_FIELDS = ("model", "batch", "cluster", "out", "schedule")
#: the pipeline's perf build in its auto mode: tiny and small models profiled on this machine, paper-size ones
#: estimated from their roofline (executing a 27B-parameter model's stages here took the host's whole memory)
DEFAULT_SCRIPT = ("{schedule} perf build --pair {model},{batch} --cluster {cluster} --mode auto --granularity stage "
                  "--cache-dir .arena-cache -o {out}")


class ArrivalProfiler:
    def __init__(self, workdir: Path, cluster_path: Path, script: str | None = None,
                 timeout_s: float = DEFAULT_PROFILE_TIMEOUT_S, retry_after_s: float = DEFAULT_PROFILE_RETRY_S):
        self.root = Path(workdir)
        self.cluster_path = Path(cluster_path)
        self.timeout_s = float(timeout_s)
        self.retry_after_s = float(retry_after_s)
        if script is not None and not script.strip():
            raise ArenaError("--profile-script is empty (leave it out for the default perf build)")
        self.script = script or DEFAULT_SCRIPT
        try:  # a template that cannot be filled is refused now, not when the first job arrives
            self.script.format(**{**dict.fromkeys(TEMPLATE_FIELDS, "x"), "batch": 1})
        except (KeyError, IndexError, ValueError) as exc:
            raise ArenaError(f"--profile-script {brief(self.script)}: not a template of "
                             f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} ({type(exc).__name__}: {exc})") from None
        self.root.mkdir(parents=True, exist_ok=True)
        self.pending: list[tuple[str, int]] = []
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}

    def dir_of(self, model: str, batch: int) -> Path:
        return self.root / f"{model}__b{batch}"

    def request(self, model: str, batch: int, new_job: bool = True) -> None:
        """Profile the pair (its result comes back from :meth:`poll`). A ``new_job``'s request has a failure of
        the pair that is older than the retry interval profiled again; any other request (a restart's, for jobs
        already waiting) is answered with the pair's last result, reported or not."""
        key = (model, batch)
        if key in self.pending:
            return
        d = self.dir_of(*key)
        if new_job and self._failed_long_ago(d):
            for name in ("pid", "exit_code"):  # profiled again by poll
                (d / name).unlink(missing_ok=True)
        self.pending.append(key)

    def withdraw(self, model: str, batch: int) -> None:
        """No job waits for the pair any more (all were cancelled): its profile is not started, and one that runs
        is stopped, so that the one profiling slot goes to pairs whose jobs wait; a later job of the pair has it
        profiled afresh. A profile that has already ended keeps its result for that job."""
        key = (model, batch)
        if key not in self.pending:
            return
        self.pending.remove(key)
        if self._running(key):
            self._stop(key)
            d = self.dir_of(*key)
            if not (d / "exit_code").exists():
                (d / "pid").unlink(missing_ok=True)

    def mark_unusable(self, model: str, batch: int) -> None:
        """The profile exited 0 but its table could not be used: a failure like any other (retried likewise)."""
        code_file = self.dir_of(model, batch) / "exit_code"
        if code_file.exists():
            code_file.write_text("0 (table unusable)\n")

    def _failed_long_ago(self, d: Path) -> bool:
        code_file = d / "exit_code"
        try:
            code = code_file.read_text().strip()
            age = time.time() - code_file.stat().st_mtime
        except OSError:
            return False
        return not self._succeeded(d, code) and age > self.retry_after_s

    @staticmethod
    def _succeeded(d: Path, code: str) -> bool:
        """Whether the profile in ``d`` that ended with ``code`` left its table."""
        return code == "0" and (d / "perf.parquet").exists()

    def _process(self, key: tuple[str, int]) -> int | None:
        """The pid of the pair's profile script while that process runs; None once it is gone (or its pid now
        belongs to another process, after a host restart: the file records the process's start time too)."""
        proc = self._procs.get(key)
        if proc is not None:
            proc.poll()  # reap it if it ended: a zombie is not running
        return running_pid(self.dir_of(*key) / "pid")

    def _running(self, key: tuple[str, int]) -> bool:
        d = self.dir_of(*key)
        if (d / "exit_code").exists() or not (d / "pid").exists():
            return False
        return self._process(key) is not None

    def _start(self, key: tuple[str, int]) -> None:
        d = self.dir_of(*key)
        d.mkdir(parents=True, exist_ok=True)
        for name in ("pid", "exit_code", "perf.parquet"):
            (d / name).unlink(missing_ok=True)
        q = shlex.quote
        body = self.script.format(model=q(key[0]), batch=key[1], cluster=q(str(self.cluster_path.resolve())),
                                  out=q(str(d / "perf.parquet")), schedule=q(tool("arena-schedule")))
        # the script records its own pid first: a scheduler killed between starting it and recording the pid
        # still finds it on restart (and does not start the profile twice)
        (d / "run.sh").write_text(f"{shell_records_own_pid(d / 'pid')}\n{body}\n"
                                  "code=$?; echo $code > exit_code.tmp; mv -f exit_code.tmp exit_code; exit $code\n")
        with open(d / "output.log", "ab") as log:
            proc = subprocess.Popen(["/bin/sh", str(d / "run.sh")], cwd=str(d), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True, env=process_env(d))
        write_pid_file(d / "pid", proc.pid)
        self._procs[key] = proc

    def _stop(self, key: tuple[str, int]) -> None:
        """Kill a running profile: its script and everything it started (its own session; only while the group
        is still the script's)."""
        self._process(key)  # (reaps the script if it ended)
        pid = recorded_group(self.dir_of(*key) / "pid")
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass  # gone already
        proc = self._procs.pop(key, None)
        if proc is not None:
            proc.wait()

    def poll(self) -> list[tuple[str, int, Path | None, str]]:
        """Start the next pending profile when none runs; return finished ones as (model, batch, perf path or
        None, message)."""
        done = []
        busy = False
        retry = f"; the pair's next job has it profiled again {self.retry_after_s:g} s after the failure"
        for key in list(self.pending):
            d = self.dir_of(*key)
            code_file = d / "exit_code"
            if code_file.exists():
                self.pending.remove(key)
                self._procs.pop(key, None)
                code = code_file.read_text().strip()
                if self._succeeded(d, code):
                    done.append((key[0], key[1], d / "perf.parquet", "profiled"))
                elif code == "0":
                    done.append((key[0], key[1], None, f"profiling exited with 0 but wrote no table at {d / 'perf.parquet'} "
                                                       f"(see {d / 'output.log'}){retry}"))
                elif code.startswith("0 "):
                    done.append((key[0], key[1], None, f"profiling wrote a table that could not be used (see "
                                                       f"{d / 'output.log'}){retry}"))
                else:
                    done.append((key[0], key[1], None, f"profiling exited with {code} (see {d / 'output.log'}){retry}"))
            elif self._running(key):
                if time.time() - (d / "pid").stat().st_mtime <= self.timeout_s:
                    busy = True
                    continue
                self._stop(key)
                if code_file.exists():  # it finished as its time ran out: its result stands (next poll)
                    continue
                # its exit code file makes a restart, or a later job of the pair, see the same end
                (d / "exit_code").write_text("timeout\n")
                self.pending.remove(key)
                done.append((key[0], key[1], None, f"profiling ran longer than {self.timeout_s:g} s and was stopped "
                                                   f"(see {d / 'output.log'}){retry}"))
            elif code_file.exists():
                continue  # it wrote its exit code and ended since it was looked for: the next poll reads it
            elif (d / "pid").exists():
                (d / "pid").unlink()  # died without an exit code (host restart): start again below
        if not busy:
            for key in self.pending:
                if not (self.dir_of(*key) / "pid").exists():
                    self._start(key)
                    break
        return done
