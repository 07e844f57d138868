"""Profiling on arrival: a job whose (model, global batch) is not in the performance table is profiled
(the pipeline's analyze -> plan -> profile on one local device: ``arena-schedule perf build --pair``) before
it is scheduled.

Profiling runs one (model, batch) at a time, each as a detached shell script in its own directory (so it
survives a scheduler restart, which then picks up its result or restarts it). The script is a template with
{model}, {batch}, {cluster} and {out} (the perf table to write); the default is the pipeline's perf build.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from libarena.checks import brief
from libarena.errors import ArenaError
from libarena.schedule.live.launchers.arena_run import _alive, tool

#: what a profile script's template may name ({schedule}: this environment's arena-schedule)
TEMPLATE_FIELDS = ("model", "batch", "cluster", "out", "schedule")
DEFAULT_SCRIPT = ("{schedule} perf build --pair {model},{batch} --cluster {cluster} --mode local --granularity stage "
                  "--cache-dir .arena-cache -o {out}")


class ArrivalProfiler:
    def __init__(self, workdir: Path, cluster_path: Path, script: str | None = None):
        self.root = Path(workdir)
        self.cluster_path = Path(cluster_path)
        if script is not None and not script.strip():
            raise ArenaError("--profile-script is empty (leave it out for the default perf build)")
        self.script = script or DEFAULT_SCRIPT
        try:  # a template that cannot be filled is refused now, not when the first job arrives
            self.script.format(**dict.fromkeys(TEMPLATE_FIELDS, ""))
        except (KeyError, IndexError, ValueError) as exc:
            raise ArenaError(f"--profile-script {brief(self.script)}: not a template of "
                             f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} ({type(exc).__name__}: {exc})") from None
        self.root.mkdir(parents=True, exist_ok=True)
        self.pending: list[tuple[str, int]] = []
        self._procs: dict[tuple[str, int], subprocess.Popen] = {}

    def dir_of(self, model: str, batch: int) -> Path:
        return self.root / f"{model}__b{batch}"

    def request(self, model: str, batch: int) -> None:
        if (model, batch) not in self.pending:
            self.pending.append((model, batch))

    def _running(self, key: tuple[str, int]) -> bool:
        d = self.dir_of(*key)
        if (d / "exit_code").exists() or not (d / "pid").exists():
            return False
        proc = self._procs.get(key)
        if proc is not None:
            proc.poll()
        return _alive(int((d / "pid").read_text()))

    def _start(self, key: tuple[str, int]) -> None:
        d = self.dir_of(*key)
        d.mkdir(parents=True, exist_ok=True)
        for name in ("pid", "exit_code", "perf.parquet"):
            (d / name).unlink(missing_ok=True)
        q = shlex.quote
        body = self.script.format(model=q(key[0]), batch=key[1], cluster=q(str(self.cluster_path.resolve())),
                                  out=q(str(d / "perf.parquet")), schedule=q(tool("arena-schedule")))
        (d / "run.sh").write_text(f"{body}\ncode=$?; echo $code > exit_code.tmp; mv -f exit_code.tmp exit_code; exit $code\n")
        with open(d / "output.log", "ab") as log:
            proc = subprocess.Popen(["/bin/sh", str(d / "run.sh")], cwd=str(d), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        (d / "pid.tmp").write_text(str(proc.pid))
        os.replace(d / "pid.tmp", d / "pid")
        self._procs[key] = proc

    def poll(self) -> list[tuple[str, int, Path | None, str]]:
        """Start the next pending profile when none runs; return finished ones as (model, batch, perf path or
        None, message)."""
        done = []
        busy = False
        for key in list(self.pending):
            d = self.dir_of(*key)
            code_file = d / "exit_code"
            if code_file.exists():
                self.pending.remove(key)
                self._procs.pop(key, None)
                code = code_file.read_text().strip()
                if code == "0" and (d / "perf.parquet").exists():
                    done.append((key[0], key[1], d / "perf.parquet", "profiled"))
                else:
                    done.append((key[0], key[1], None, f"profiling exited with {code} (see {d / 'output.log'})"))
            elif self._running(key):
                busy = True
            elif (d / "pid").exists():
                (d / "pid").unlink()  # died without an exit code (host restart): start again below
        if not busy:
            for key in self.pending:
                if not (self.dir_of(*key) / "pid").exists():
                    self._start(key)
                    break
        return done
