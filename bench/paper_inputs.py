"""Inputs shared by the benchmarks that run the paper's experiment (bench_scale, bench_policy, bench_remat): the
traces as examples/paper prepares them, the pipeline's performance table for their (model, batch) pairs,
whole-process timing of a tool, and the machine record every results file carries."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces" / "arena-ae"
CLUSTER = REPO / "examples" / "clusters" / "paper-sim-1280.yaml"
#: the pipeline's table for philly's, venus's and pai's pairs (built on first use; ignored by git)
DEFAULT_PERF = REPO / "bench" / "results" / "perf-arena-ae.parquet"
#: the same pairs trained in fp16 (V100s at their fp16 tensor-core rate instead of bf16's fp32 fallback)
FP16_PERF = REPO / "bench" / "results" / "perf-arena-ae-fp16.parquet"
PAPER_TRACES = ("philly", "venus", "pai")
#: the paper's policies, Arena first (the reference of the jobs-both-finished comparisons)
POLICIES = ("arena", "fcfs", "gavel", "elasticflow", "elasticflow-ls", "sia")
#: examples/paper's defaults (the artifact's setting): iterations / 5, 2,000 rounds of 300 s
ITERATION_DIVISOR = 5
#: the artifact's simulator multiplies the time to every deadline by 5 (examples/paper's DEADLINE_FACTOR)
DEADLINE_FACTOR = 5.0
SIM_FLAGS = ("--horizon", "600000", "--tick", "300", "--skip-bad-rows")


def schedule_tool() -> list[str]:
    script = Path(sys.executable).parent / "arena-schedule"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from arena_schedule.main import main; main()"]


#: Runs argv[2:] as its child and writes the child's peak RSS (KiB) to argv[1]. Linux keeps a process's peak RSS
#: across exec, and a child forked from a large process (a benchmark that built a performance table in-process
#: holds hundreds of MiB) starts with the parent's: counted from this small interpreter instead, a tool's figure
#: is its own. Its exit status is the child's (128 + N for a child killed by signal N; 127 when the command cannot
#: be started, said on stderr), and SIGTERM, SIGINT and SIGHUP sent to it are passed on to the child, once: the
#: child runs in a process group of its own, so a terminal's Ctrl-C reaches it through the wrapper only.
_PEAK_RSS_WRAPPER = ("import os, signal, sys\n"
                     "pid = 0\n"
                     "caught = []\n"
                     "def forward(sig, _):\n"
                     "    if not pid:\n"
                     "        caught.append(sig)\n"
                     "        return\n"
                     "    try:\n"
                     "        os.kill(pid, sig)\n"
                     "    except ProcessLookupError:  # reaped already\n"
                     "        pass\n"
                     "relayed = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)\n"
                     "for sig in relayed:\n"
                     "    signal.signal(sig, forward)\n"
                     "pid = os.fork()\n"
                     "if pid == 0:\n"
                     "    for sig in relayed:\n"
                     "        signal.signal(sig, signal.SIG_DFL)\n"
                     "    os.setpgid(0, 0)\n"
                     "    try:\n"
                     "        os.execvp(sys.argv[2], sys.argv[2:])\n"
                     "    except OSError as exc:\n"
                     "        print(f'cannot run {sys.argv[2]}: {exc.strerror or exc}', file=sys.stderr, flush=True)\n"
                     "        os._exit(127)\n"
                     "for sig in caught:  # arrived while forking\n"
                     "    os.kill(pid, sig)\n"
                     "_, status, usage = os.wait4(pid, 0)\n"
                     "for sig in relayed:\n"
                     "    signal.signal(sig, signal.SIG_IGN)\n"
                     "with open(sys.argv[1], 'w') as f:\n"
                     "    f.write(str(usage.ru_maxrss))\n"
                     "code = os.waitstatus_to_exitcode(status)\n"
                     "sys.exit(code if code >= 0 else 128 - code)\n")


def run_measured(argv: list[str], **popen: Any) -> tuple[int, float, int]:
    """Run a command to its end: (exit code, CPU seconds, peak RSS in bytes) of the command's process alone
    (the CPU of what it waited for included), however large this process is."""
    with tempfile.NamedTemporaryFile(prefix="peak-rss-", suffix=".txt", delete=False) as f:
        rss_file = Path(f.name)
    try:
        # (no terminal input: the tool runs in a background process group, where reading it would stop the tool)
        popen.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen([sys.executable, "-c", _PEAK_RSS_WRAPPER, str(rss_file), *argv], **popen)
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # the wrapper's and, waited for, its child's CPU time
        except BaseException as exc:  # this benchmark interrupted (Ctrl-C, a signal's exception): so is the tool
            try:  # a terminal's Ctrl-C reached the wrapper too, which passed it on: the tool may end on it
                proc.wait(timeout=10 if isinstance(exc, KeyboardInterrupt) else 0)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait()
            raise
        text = rss_file.read_text().strip()
    finally:
        rss_file.unlink(missing_ok=True)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime, int(text or 0) * 1024


def timed(argv: list[str], log: Path) -> dict[str, Any]:
    """Run a command; its wall time, CPU time and peak RSS (its own: run_measured), exit code, stdout."""
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}
    start = time.perf_counter()
    with open(log, "wb") as err, tempfile.TemporaryFile() as out:
        code, cpu_s, peak_rss = run_measured(argv, stdout=out, stderr=err, cwd=REPO, env=env)
        wall = time.perf_counter() - start
        out.seek(0)
        stdout = out.read().decode(errors="replace")
    record = {"wall_s": round(wall, 3), "cpu_s": round(cpu_s, 2), "peak_rss_bytes": peak_rss, "exit_code": code,
              "stdout": stdout}
    if code != 0:
        record["error"] = (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
    return record


def prepare(source: Path, target: Path, max_jobs: int | None) -> None:
    """examples/paper's first stage: the first ``max_jobs`` jobs, iterations / 5, times to deadlines x 5."""
    spec = importlib.util.spec_from_file_location("prepare_trace", REPO / "examples" / "paper" / "prepare_trace.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(module.prepare(source, max_jobs, ITERATION_DIVISOR, DEADLINE_FACTOR))


def perf_table(perf: Path | None, dtype: str = "bf16") -> Path:
    """``perf``, or the pipeline's table for philly's, venus's and pai's pairs trained in ``dtype`` (``arena-schedule
    perf build``, cache-keyed: rebuilt only when Arena's code or the inputs changed; a few minutes with empty
    caches)."""
    if perf is not None:
        return perf
    from libarena.pipeline.perf_build import PerfBuildConfig, perf_build
    from libarena.schedule.traces import read_trace

    target = {"bf16": DEFAULT_PERF, "fp16": FP16_PERF}[dtype]
    extra = sorted({(j.model, j.global_batch) for name in PAPER_TRACES[1:]
                    for j in read_trace(TRACES / f"simulate_trace_{name}.csv", skip_bad_rows=True).jobs})
    print(f"bench: {target} from arena-schedule perf build", file=sys.stderr, flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    perf_build(CLUSTER, str(target), PerfBuildConfig(dtype=dtype), trace=TRACES / "simulate_trace_philly.csv",
               pairs=extra, skip_bad_rows=True)
    return target


def machine_record(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """The machine a benchmark ran on and its load averages before (``os.getloadavg()`` at the start) and now:
    wall times carry whatever else ran beside them."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}
