"""examples/paper/Makefile end to end on a tiny configuration: a generated arena-ae trace of tiny models on a
four-GPU two-type cluster, every policy, the report; then Make's incrementality (a re-run does nothing, a changed
parameter redoes only the stages that use it) and the error for a missing trace folder."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

POLICIES = ("arena", "fcfs", "gavel", "elasticflow", "elasticflow-ls", "sia")
TRACE = "tiny"
NUM_JOBS = 6
BATCH = 4  # fewer distinct stage shapes to profile than at 8 (no 2-stage pipeline: it needs 8 micro-batches)

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def _write_inputs(root: Path) -> tuple[Path, Path]:
    traces = root / "traces"
    traces.mkdir()
    with (traces / f"simulate_trace_{TRACE}.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu", "gpu_type"])
        for i in range(NUM_JOBS):
            # ~0.3-0.6 ms per tiny iteration on the scaled GPU types: a million iterations (after the divisor of
            # 2) keep a job running for minutes, so jobs overlap and queue on four GPUs.
            writer.writerow([f"job-{i}", 60 * i, 2_000_000 + 500_000 * i, "gpt__tiny", 60 * i + 4 * 3600, BATCH,
                             (1, 2)[i % 2], ("a100", "v100")[i % 3 == 0]])
    cluster = root / "tiny-cluster.yaml"
    cluster.write_text("name: tiny\nnode_groups:\n"
                       "  - {gpu_type: a100, nodes: 1, gpus_per_node: 2}\n"
                       "  - {gpu_type: v100, nodes: 1, gpus_per_node: 2}\n")
    return traces, cluster


def _make(repo_root: Path, out: Path, traces: Path, cluster: Path, cache: Path, *extra: str,
          code: str = "unchanged") -> subprocess.CompletedProcess:
    # CODE_DIGEST is pinned: other work editing libarena/ while this test runs must not count as a change.
    command = ["make", "--no-print-directory", "-C", str(repo_root / "examples" / "paper"),
               f"BIN={Path(sys.executable).parent}", f"OUT={out}", f"TRACES_DIR={traces}", f"TRACES={TRACE}",
               f"CLUSTER={cluster}", f"CACHE_DIR={cache}", f"POLICIES={','.join(POLICIES)}", "MODEL=gpt__tiny",
               f"MODEL_BATCH={BATCH}", "ITERATION_DIVISOR=2", "HORIZON=", f"CODE_DIGEST={code}", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def _mtimes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_paper_pipeline_end_to_end_and_incremental(repo_root: Path, tmp_path: Path) -> None:
    traces, cluster = _write_inputs(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    done = _make(repo_root, out, traces, cluster, cache)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    # The prepared trace: every job, iteration counts halved.
    with (out / TRACE / "trace.csv").open() as f:
        assert [int(r["num_iteration"]) for r in csv.DictReader(f)] == [(2_000_000 + 500_000 * i) // 2 for i in range(NUM_JOBS)]

    # The performance table: tiny models are profiled on this machine and scaled to both GPU types (estimated).
    perf = pq.read_table(out / TRACE / "perf.parquet").to_pylist()
    assert {(r["model"], r["global_batch"]) for r in perf} == {("gpt__tiny", BATCH)}
    assert {r["gpu_type"] for r in perf} == {"a100", "v100"}
    assert {r["view"] for r in perf} >= {"arena", "dp"}
    assert all(r["estimated"] and r["iter_time_s"] > 0 for r in perf)

    # One simulation per policy, each accounting for every job; Arena finishes them all.
    (results,) = json.loads((out / "results.json").read_text())["traces"]
    assert results["trace"] == TRACE and results["stats"]["jobs"] == NUM_JOBS
    assert [m["policy"] for m in results["policies"]] == list(POLICIES)
    by_policy = {m["policy"]: m for m in results["policies"]}
    for name, m in by_policy.items():
        assert m["submitted_jobs"] == NUM_JOBS, name
        assert m["finished_jobs"] + m["unfinished_jobs"] + m["dropped_jobs"] == NUM_JOBS, name
        metrics = json.loads((out / TRACE / "compare" / name / "metrics.json").read_text())
        assert metrics["avg_jct_s"] == m["avg_jct_s"]
        assert pq.read_table(out / TRACE / "compare" / name / "jobs.parquet").num_rows == NUM_JOBS
    arena = by_policy["arena"]
    assert arena["finished_jobs"] == NUM_JOBS and arena["avg_throughput"] > 0
    assert arena["avg_jct_s"] >= arena["avg_queuing_s"] >= 0

    compare_policies = json.loads((out / TRACE / "compare" / "compare.json").read_text())["policies"]
    assert sorted(compare_policies) == sorted(POLICIES)
    table_rows = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in table_rows[1:]] == list(POLICIES)  # header, then one row each
    for figure in ("throughput.png", "jct_cdf.png", "queue_length.png"):
        assert (out / TRACE / "compare" / figure).stat().st_size > 1000
    assert (out / "summary.png").stat().st_size > 1000
    assert "proxy" in (out / "model" / "plans.txt").read_text()

    # A re-run is a no-op: no command runs, no file changes.
    before = _mtimes(out)
    again = _make(repo_root, out, traces, cluster, cache)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "arena-" not in again.stdout, again.stdout
    assert _mtimes(out) == before

    # Another policy list redoes the comparison and the report, not the trace or the performance table.
    fewer = _make(repo_root, out, traces, cluster, cache, "POLICIES=arena,fcfs")
    assert fewer.returncode == 0, fewer.stderr[-3000:]
    after = _mtimes(out)
    for unchanged in (f"{TRACE}/trace.csv", f"{TRACE}/perf.parquet", f"{TRACE}/trace-stats.json", "model/plans.parquet"):
        assert after[unchanged] == before[unchanged], unchanged
    assert after[f"{TRACE}/compare/compare.json"] != before[f"{TRACE}/compare/compare.json"]
    (results,) = json.loads((out / "results.json").read_text())["traces"]
    assert [m["policy"] for m in results["policies"]] == ["arena", "fcfs"]

    # An edit of Arena's code (stood in for by another CODE_DIGEST) redoes the stages that run a tool, which
    # timestamps alone would miss; the tools' own stage caches key on the real sources, so they serve it here.
    edited = _make(repo_root, out, traces, cluster, cache, "POLICIES=arena,fcfs", code="edited")
    assert edited.returncode == 0, edited.stderr[-3000:]
    assert "arena-schedule perf build" in edited.stdout and "arena-plan" in edited.stdout, edited.stdout
    assert "cached:" in edited.stderr, edited.stderr[-3000:]
    assert _mtimes(out)[f"{TRACE}/trace.csv"] == after[f"{TRACE}/trace.csv"]


def _code_digest(repo_root: Path, root: Path) -> str:
    """CODE_DIGEST as the Makefile computes it over ROOT's libarena/ and tools/ (make -pq: nothing runs)."""
    done = subprocess.run(["make", "--no-print-directory", "-C", str(repo_root / "examples" / "paper"), "-pq",
                           f"ROOT={root}", f"OUT={root / 'out'}", "MODEL="], capture_output=True, text=True, timeout=60)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("CODE_DIGEST := ")]
    return line.removeprefix("CODE_DIGEST := ")


def test_code_digest_follows_the_sources(repo_root: Path, tmp_path: Path) -> None:
    (tmp_path / "libarena" / "sub").mkdir(parents=True)
    (tmp_path / "tools").mkdir()
    source = tmp_path / "libarena" / "sub" / "stage.py"
    source.write_text("SPEED = 1\n")
    (tmp_path / "tools" / "main.py").write_text("pass\n")
    first = _code_digest(repo_root, tmp_path)
    assert first and first == _code_digest(repo_root, tmp_path)
    source.write_text("SPEED = 2\n")
    assert _code_digest(repo_root, tmp_path) != first
    assert _code_digest(repo_root, repo_root) != first


def test_missing_trace_folder_is_a_clear_error(repo_root: Path, tmp_path: Path) -> None:
    _, cluster = _write_inputs(tmp_path)
    done = _make(repo_root, tmp_path / "out", tmp_path / "no-such-folder", cluster, tmp_path / "cache", "MODEL=")
    assert done.returncode != 0
    assert f"no trace {tmp_path / 'no-such-folder'}/simulate_trace_{TRACE}.csv" in done.stderr
    assert "set TRACES_DIR" in done.stderr
    assert not (tmp_path / "out" / TRACE / "trace.csv").exists()


def test_prepare_trace_selects_scales_and_rejects_bad_input(repo_root: Path, tmp_path: Path) -> None:
    script = repo_root / "examples" / "paper" / "prepare_trace.py"
    source = tmp_path / "trace.csv"
    source.write_text("job_id,submission_time,num_iteration,model_name\n"
                      "late,300,10,gpt__tiny\nearly,100,7,gpt__tiny\nmiddle,200,3,gpt__tiny\n")
    out = tmp_path / "out.csv"
    done = subprocess.run([sys.executable, str(script), str(source), str(out), "--max-jobs", "2", "--iteration-divisor", "5"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["job_id"], r["num_iteration"]) for r in rows] == [("early", "1"), ("middle", "1")]  # first by time; >= 1

    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submission_time,model_name\na,1,gpt__tiny\n")
    failed = subprocess.run([sys.executable, str(script), str(bad), str(tmp_path / "never.csv")], capture_output=True, text=True)
    assert failed.returncode == 2
    assert failed.stderr.strip().splitlines() == [f"prepare_trace: {bad}: no column 'num_iteration' (columns: job_id, submission_time, model_name)"]
    assert not (tmp_path / "never.csv").exists()


def test_prepare_trace_moves_deadlines_as_the_artifact_does(repo_root: Path, tmp_path: Path) -> None:
    """--deadline-factor F: each deadline moves to submission + F x (deadline - submission), as the paper's
    artifact does with F = 5 (DEADLINE_FACTOR); a row without a deadline keeps none, a bad factor is refused."""
    script = repo_root / "examples" / "paper" / "prepare_trace.py"
    source = tmp_path / "trace.csv"
    source.write_text("job_id,submission_time,num_iteration,model_name,deadline\n"
                      "a,100,10,gpt__tiny,400\nb,200.5,10,gpt__tiny,\nc,300,10,gpt__tiny,301.25\n")
    out = tmp_path / "out.csv"
    done = subprocess.run([sys.executable, str(script), str(source), str(out), "--deadline-factor", "5"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["job_id"], r["deadline"]) for r in rows] == [("a", "1600"), ("b", ""), ("c", "306.25")]
    for factor in ("0", "nan", "-1"):
        failed = subprocess.run([sys.executable, str(script), str(source), str(tmp_path / "never.csv"),
                                 "--deadline-factor", factor], capture_output=True, text=True)
        assert failed.returncode == 2 and "--deadline-factor must be in (0, 1000]" in failed.stderr
        assert not (tmp_path / "never.csv").exists()
