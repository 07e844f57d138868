"""README's "A worked example" runs verbatim, as a new user would paste it into a shell at the top of a fresh
clone: the block is extracted from README.md and run by bash with ``set -euo pipefail`` in a directory holding
only what a clone has (``examples/``). Only the paper's traces are replaced, by small generated traces of the
same format (the block would otherwise analyze and simulate the 1,938-job philly trace), so a command that
needs an extra flag, or a file no earlier step creates, fails this test.

The live scheduler started in the background at the end is stopped by the test, with the jobs it launched."""

from __future__ import annotations

import csv
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from libarena.schedule.live.processes import processes_started_under, recorded_pid

REPO = Path(__file__).resolve().parents[2]
#: the README's inputs that are replaced (each must still appear in the block: the test follows README edits)
TRACES = {
    "../shared/traces/arena-ae/simulate_trace_philly.csv": "philly-small.csv",
    "../shared/traces/arena-ae/simulate_trace_venus.csv": "venus-small.csv",
}


def worked_example() -> str:
    """The shell block of README.md's "A worked example" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("### A worked example", 1)[1]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README: no ```sh block under 'A worked example'"
    return match.group(1)


def _small_trace(path: Path) -> None:
    """Four jobs of two paper-size models (arena-ae format): a few seconds to analyze, plan and simulate."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu",
                    "gpu_type"])
        for i, (model, batch, gpus, gpu) in enumerate([("gpt__760M", 128, 2, "a100"), ("moe__690M", 256, 4, "v100"),
                                                       ("gpt__760M", 128, 1, "a40"), ("moe__690M", 256, 8, "a10")]):
            w.writerow([f"j{i}", 600 * i, 3000 + 1000 * i, model, 600 * i + 86400, batch, gpus, gpu])


def test_worked_example_block_is_plain_shell():
    block = worked_example()
    for original in TRACES:
        assert original in block, f"README no longer reads {original}: update TRACES in this test"
    assert "..." not in re.sub(r"#.*", "", block), "a placeholder (...) outside a comment cannot run"
    assert not re.search(r"^[^#]*\[--", block, re.M), "optional flags in [brackets] outside a comment cannot run"


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the example's own wait (1500 s) must end first on a slow runner
def test_worked_example_runs_verbatim(tmp_path):
    work = tmp_path / "clone"
    shutil.copytree(REPO / "examples", work / "examples",
                    ignore=shutil.ignore_patterns("out", "out-*", "__pycache__"))
    block = worked_example()
    for original, small in TRACES.items():
        _small_trace(work / small)
        block = block.replace(original, small)
    script = work / "worked-example.sh"
    script.write_text("set -euo pipefail\n" + block)
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    # files, not pipes: the server started in the background keeps its stdout and stderr open after bash exits
    with open(tmp_path / "out.txt", "w") as out_f, open(tmp_path / "err.txt", "w") as err_f:
        proc = subprocess.Popen(["bash", str(script)], cwd=work, env=env, stdout=out_f, stderr=err_f,
                                start_new_session=True)
        try:
            proc.wait(timeout=1500)
        finally:
            _stop_background_jobs(proc, work)
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert proc.returncode == 0, f"the worked example failed:\n{err[-4000:]}"
    for produced in ("ops.parquet", "plans.parquet", "alpa.json", "perf.parquet", "comm.parquet",
                     "perf-paper-sim.parquet", "run/metrics.json", "run/throughput.png", "cmp/compare.json",
                     "plans-tiny.parquet", "state.db"):
        assert (work / produced).exists(), produced
    assert list((work / "ckpt").glob("50")), "arena-run did not train to step 50"
    assert '"policies"' in out and "job-1" in out  # compare --json, then submit's job id and its status


def _stop_background_jobs(proc: subprocess.Popen, work: Path) -> None:
    """The server (a background job in the script's process group) first, then the arena-run versions it
    launched (each in its own session, as real jobs outlive the scheduler)."""
    import time

    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        end = time.time() + grace
        while time.time() < end:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    for pid_file in work.glob("state.db.d/launcher/jobs/*/v*/pid"):
        pid = recorded_pid(pid_file)
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    # a version launched just before the server was killed has no pid file yet, and its Ray workers may have
    # left its group: every process the server started carries its state directory in its environment
    for _ in range(5):
        left = processes_started_under(work)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.5)
    assert not processes_started_under(work), "processes the example's server started still run"
