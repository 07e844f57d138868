"""Run a tool's real console script in a subprocess bounded in memory, CPU and wall-clock time, and measure it.

The limits are the test of "bounded time and memory": a case that would run away is stopped by the kernel
(RLIMIT_AS, set by a small wrapper that then execs the tool: allocations fail, which a tool can only report as an internal error; RLIMIT_CPU: SIGXCPU) or by the
wall-clock watchdog (SIGKILL to its process group), and the contract check then fails. Each run's wall time
and peak resident memory (``os.wait4``'s rusage of the child) feed the per-category report
(:data:`STATS`, printed at the end of the session; measured on a shared machine).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: Address space and CPU seconds of one case (JAX's tools need about 1 GiB of address space to start).
MEMORY_LIMIT_BYTES = 3 << 30
CPU_LIMIT_S = 60
WALL_LIMIT_S = 120.0


@dataclass
class Result:
    argv: list[str]
    code: int  # exit status; -N when killed by signal N
    stdout: bytes
    stderr: str
    wall_s: float
    peak_rss_mib: float

    def describe(self) -> str:
        return (f"argv={self.argv!r} exit={self.code} wall={self.wall_s:.1f}s rss={self.peak_rss_mib:.0f}MiB "
                f"stderr={self.stderr[-1500:]!r}")


@dataclass
class CategoryStats:
    cases: int = 0
    clean_errors: int = 0  # exit 2 with one line "<tool>: error: ..."
    successes: int = 0  # exit 0 (a valid input, or a harmless one)
    quiet_pipe_ends: int = 0  # exit 141 (SIGPIPE) without an error message
    worst_wall_s: float = 0.0
    worst_wall_case: str = ""
    worst_rss_mib: float = 0.0
    worst_rss_case: str = ""
    exit_codes: dict[str, int] = field(default_factory=dict)


#: category -> what its cases did (this process's cases; see write_report)
STATS: dict[str, CategoryStats] = {}


#: A bare interpreter sets the limits on itself and execs the tool (same process, so wait4 measures the tool).
#: Not a preexec_fn: the test process runs JAX's threads, and running Python between fork and exec is unsafe then.
#: the case's process sees at most two cores: its address space grows with them (a stack per thread of XLA's and
#: the BLAS's pools), and the 3 GiB limit was sized on a 2-core host, not for a many-core CI runner
_LIMIT_AND_EXEC = ("import os, resource, sys; mem, cpu = int(sys.argv[1]), int(sys.argv[2]); "
                   "os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2]); "
                   "resource.setrlimit(resource.RLIMIT_AS, (mem, mem)); resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu)); "
                   "os.execv(sys.argv[3], sys.argv[3:])")


def limited(command: list[str]) -> list[str]:
    """``command`` run under the limits of one case (RLIMIT_AS and RLIMIT_CPU, set before it starts)."""
    return [sys.executable, "-S", "-c", _LIMIT_AND_EXEC, str(MEMORY_LIMIT_BYTES), str(CPU_LIMIT_S), *command]


def tool_path(tool: str) -> str:
    return str(Path(sys.executable).with_name(tool))


def run_limited(tool: str, argv: list[str], *, cwd: Path, stdin: bytes | None = None,
                wall_s: float = WALL_LIMIT_S, env: dict[str, str] | None = None) -> Result:
    """``tool argv`` (the console script) in ``cwd`` under the limits; returns its status, output and cost."""
    # glibc reserves up to 8 malloc arenas of 64 MiB per core: two, as on the host the limit was sized on
    full_env = dict(os.environ, RAY_AUTH_MODE="disabled", MALLOC_ARENA_MAX="2", **(env or {}))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        if stdin is not None:
            inp.write(stdin)
            inp.seek(0)
        t0 = time.perf_counter()
        proc = subprocess.Popen(limited([tool_path(tool), *argv]), cwd=cwd,
                                stdin=inp if stdin is not None else subprocess.DEVNULL, stdout=out, stderr=err,
                                env=full_env, start_new_session=True)
        watchdog = threading.Timer(wall_s, lambda: _kill_group(proc.pid))
        watchdog.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            watchdog.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        _kill_group(proc.pid)  # anything the tool left running in its session
        out.seek(0)
        err.seek(0)
        return Result([tool, *argv], proc.returncode, out.read(), err.read().decode("utf-8", "backslashreplace"), wall,
                      usage.ru_maxrss / 1024)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def record(category: str, result: Result) -> None:
    stats = STATS.setdefault(category, CategoryStats())
    stats.cases += 1
    stats.exit_codes[str(result.code)] = stats.exit_codes.get(str(result.code), 0) + 1
    if result.code == 0:
        stats.successes += 1
    elif result.code == 2 and len(result.stderr.splitlines()) == 1 and " error: " in result.stderr:
        stats.clean_errors += 1
    elif result.code == 128 + signal.SIGPIPE and " error: " not in result.stderr:
        stats.quiet_pipe_ends += 1
    short = " ".join(result.argv)[:160]
    if result.wall_s > stats.worst_wall_s:
        stats.worst_wall_s, stats.worst_wall_case = result.wall_s, short
    if result.peak_rss_mib > stats.worst_rss_mib:
        stats.worst_rss_mib, stats.worst_rss_case = result.peak_rss_mib, short


def check_clean(result: Result, *, codes: tuple[int, ...] = (0, 2), needle: str | None = None) -> None:
    """The contract of a hostile case: an expected exit status, no traceback, no internal error, and an exit 2
    is exactly one line ``<tool>: error: ...`` (containing ``needle`` when given)."""
    tool = result.argv[0]
    assert result.code in codes, f"exit {result.code}, expected one of {codes}: {result.describe()}"
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.describe()
    if result.code == 2:
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), result.describe()
        if needle is not None:
            assert needle in lines[0], f"{needle!r} not in the error: {result.describe()}"


def write_report(directory: str | os.PathLike[str] | None) -> None:
    """This process's STATS as JSON (one file per process: xdist workers each write theirs)."""
    if not directory or not STATS:
        return
    path = Path(directory) / f"hostile-{os.getpid()}.json"
    path.write_text(json.dumps({k: asdict(v) for k, v in STATS.items()}, indent=1, sort_keys=True))


def summary_lines(stats: dict[str, dict]) -> list[str]:
    lines = []
    for name, s in sorted(stats.items()):
        lines.append(f"{name}: {s['cases']} cases, {s['clean_errors']} clean errors, {s['successes']} exit 0, "
                     f"{s['quiet_pipe_ends']} quiet SIGPIPE ends; worst wall {s['worst_wall_s']:.2f} s "
                     f"({s['worst_wall_case']}), worst peak RSS {s['worst_rss_mib']:.0f} MiB ({s['worst_rss_case']})")
    return lines
