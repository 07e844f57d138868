"""The producing commands' stage cache, --quiet and --json, run in-process (tests.fuzz.harness.invoke, the same
run_app wrapper the console scripts use) in a fresh working directory, so the default .arena-cache is the test's."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.ipc as ipc
import pytest
import yaml

from libarena.artifacts import read_table
from tests.fuzz.harness import invoke
from tests.schedule.perf_fixtures import write_perf

CLUSTER = {"name": "tiny", "node_groups": [{"gpu_type": "a40", "nodes": 1, "gpus_per_node": 2},
                                           {"gpu_type": "a10", "nodes": 1, "gpus_per_node": 2}]}
TRACE = ("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
         "j0,0,200,gpt__1.3B,90000,256,1,a40\nj1,60,300,gpt__1.3B,,256,2,a10\nj2,120,100,gpt__1.3B,5000,256,2,a40\n")
ANALYZE = ["--model", "gpt__tiny", "--global-batch", "8", "--num-clusters", "4"]


def ok(outcome):
    assert outcome.code == 0, outcome.describe()
    return outcome


def summary(outcome) -> dict:
    return json.loads(ok(outcome).stdout)


def entries(root: Path, stage: str) -> list[Path]:
    return sorted((root / ".arena-cache" / "stages" / stage).iterdir())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A working directory with an analyzed gpt__tiny (computed once: the first, uncached run)."""
    root = tmp_path_factory.mktemp("cli-cache")
    (root / "cluster.yaml").write_text(yaml.safe_dump(CLUSTER))
    (root / "trace.csv").write_text(TRACE)
    write_perf(root / "perf.parquet", [("gpt__1.3B", 256)], ["a40", "a10"], max_gpus=4)
    first = summary(invoke("arena-analyze", [*ANALYZE, "-o", "ops.parquet", "--json"], cwd=root))
    assert first["cache"]["hit"] is False and first["cache"]["stored"] and first["rows"] > 0
    return root


def test_analyze_second_run_is_a_cache_hit_with_identical_bytes(work):
    again = invoke("arena-analyze", [*ANALYZE, "-o", "ops2.parquet"], cwd=work)
    assert "cached: ops2.parquet" in ok(again).stderr and "lowered" not in again.stderr
    assert (work / "ops2.parquet").read_bytes() == (work / "ops.parquet").read_bytes()
    doc = summary(invoke("arena-analyze", [*ANALYZE, "-o", "ops3.parquet", "--json"], cwd=work))
    assert doc["cache"]["hit"] is True and doc["output"] == "ops3.parquet" and doc["tool"] == "arena-analyze"
    assert len(entries(work, "arena-analyze")) == 1


def test_analyze_no_cache_recomputes_the_same_table(work):
    doc = summary(invoke("arena-analyze", [*ANALYZE, "-o", "fresh.parquet", "--json", "--no-cache"], cwd=work))
    assert doc["cache"]["hit"] is False and doc["cache"]["stored"]
    assert (work / "fresh.parquet").read_bytes() == (work / "ops.parquet").read_bytes()


def test_stdout_hit_streams_a_readable_artifact(work):
    out = ok(invoke("arena-analyze", [*ANALYZE, "-o", "-"], cwd=work))
    assert "cached: stdout" in out.stderr
    table = ipc.open_stream(io.BytesIO(out.stdout)).read_all()
    assert table.replace_schema_metadata(None).equals(read_table(work / "ops.parquet", "operator_table").table)
    # the stream feeds the next stage as a pipe would
    plans = ok(invoke("arena-plan", ["--cluster", "cluster.yaml", "--max-gpus", "2", "-o", "piped.parquet"],
                      stdin=out.stdout, cwd=work))
    assert read_table(work / "piped.parquet", "plans").table.num_rows > 0 and "grids feasible" in plans.stderr


@pytest.mark.parametrize("argv", [
    ["arena-analyze", *ANALYZE, "--json"],  # -o defaults to -
    ["arena-analyze", *ANALYZE, "-o", "-", "--json"],
    ["arena-plan", "--ops", "ops.parquet", "--cluster", "cluster.yaml", "-o", "-", "--json"],
    ["arena-profile", "-i", "plans.parquet", "-o", "-", "--json"],
    ["arena-schedule", "perf", "build", "--trace", "trace.csv", "--cluster", "cluster.yaml", "-o", "-", "--json"],
])
def test_json_with_data_on_stdout_is_refused(work, argv):
    out = invoke(argv[0], argv[1:], cwd=work)
    lines = out.stderr.splitlines()
    assert out.code == 2 and len(lines) == 1 and "--json" in lines[0] and "-o -" in lines[0], out.describe()
    assert out.stdout == b""


def test_plan_misses_on_changed_parameters_or_inputs_and_hits_otherwise(work):
    base = ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "2", "--json"]
    first = summary(invoke("arena-plan", [*base, "-o", "p1.parquet"], cwd=work))
    assert first["cache"]["hit"] is False and first["plans"] > 0
    assert summary(invoke("arena-plan", [*base, "-o", "p2.parquet"], cwd=work))["cache"]["hit"] is True
    assert (work / "p1.parquet").read_bytes() == (work / "p2.parquet").read_bytes()
    assert summary(invoke("arena-plan", [*base, "--no-zero", "-o", "p3.parquet"], cwd=work))["cache"]["hit"] is False
    other = dict(CLUSTER, node_groups=CLUSTER["node_groups"][:1])
    (work / "cluster1.yaml").write_text(yaml.safe_dump(other))
    changed = [a if a != "cluster.yaml" else "cluster1.yaml" for a in base]
    assert summary(invoke("arena-plan", [*changed, "-o", "p4.parquet"], cwd=work))["cache"]["hit"] is False
    # stdin: keyed by the piped table's content
    piped = [a for a in base if a not in ("--ops", "ops.parquet")] + ["--frontier-cap", "3"]
    data = (work / "ops.parquet").read_bytes()
    assert summary(invoke("arena-plan", [*piped, "-o", "p5.parquet"], stdin=data, cwd=work))["cache"]["hit"] is False
    assert summary(invoke("arena-plan", [*piped, "-o", "p6.parquet"], stdin=data, cwd=work))["cache"]["hit"] is True


def test_corrupt_entry_is_recomputed_through_the_cli(work):
    argv = ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "2", "--stages", "1"]
    ok(invoke("arena-plan", [*argv, "-o", "c1.parquet"], cwd=work))
    entry = next(p for p in entries(work, "arena-plan")
                 if (p / "output.parquet").read_bytes() == (work / "c1.parquet").read_bytes())
    (entry / "output.parquet").write_bytes((entry / "output.parquet").read_bytes()[:-40])
    again = ok(invoke("arena-plan", [*argv, "-o", "c2.parquet"], cwd=work))
    assert "corrupt" in again.stderr and "grids feasible" in again.stderr  # reported, then planned again
    assert (work / "c2.parquet").read_bytes() == (work / "c1.parquet").read_bytes()
    assert "cached:" in ok(invoke("arena-plan", [*argv, "-o", "c3.parquet"], cwd=work)).stderr


def test_quiet_prints_nothing_on_success(work):
    for _ in range(2):  # a miss, then a hit
        out = ok(invoke("arena-plan", ["-q", "--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "1",
                                       "-o", "q.parquet"], cwd=work))
        assert out.stderr == "" and out.stdout == b""
    out = ok(invoke("arena-schedule", ["simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster",
                                       "cluster.yaml", "-o", "qrun", "--quiet"], cwd=work))
    assert out.stderr == "" and (work / "qrun" / "metrics.json").is_file()
    # errors still print their one line
    bad = invoke("arena-plan", ["-q", "--ops", "missing.parquet", "--cluster", "cluster.yaml", "-o", "x.parquet"], cwd=work)
    assert bad.code == 2 and bad.stderr.startswith("arena-plan: error:")


def test_simulate_and_compare_hit_restores_every_file(work):
    sim = ["simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster", "cluster.yaml", "--json",
           "--policy", "fcfs"]
    first = summary(invoke("arena-schedule", [*sim, "-o", "run1"], cwd=work))
    second = summary(invoke("arena-schedule", [*sim, "-o", "run2"], cwd=work))
    assert first["cache"]["hit"] is False and second["cache"]["hit"] is True
    assert first["finished_jobs"] == second["finished_jobs"] == 3  # the metrics stay at the top level
    assert sorted(second["files"]) == ["decisions.msgpack", "jobs.parquet", "metrics.json", "timeseries.parquet"]
    for name in second["files"]:
        assert (work / "run1" / name).read_bytes() == (work / "run2" / name).read_bytes()
    assert summary(invoke("arena-schedule", [*sim, "-o", "run3", "--tick", "60"], cwd=work))["cache"]["hit"] is False
    cmp = ["compare", "--policies", "arena,fcfs", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster",
           "cluster.yaml"]
    a = summary(invoke("arena-schedule", [*cmp, "-o", "cmp1", "--json"], cwd=work))
    b = summary(invoke("arena-schedule", [*cmp, "-o", "cmp2", "--json"], cwd=work))
    assert not a["cache"]["hit"] and b["cache"]["hit"] and a["policies"] == b["policies"]
    table = ok(invoke("arena-schedule", [*cmp, "-o", "cmp3"], cwd=work))
    assert "cached: cmp3/" in table.stderr and b"fcfs" in table.stdout  # the comparison table, from the cache
    assert (work / "cmp3" / "fcfs" / "jobs.parquet").read_bytes() == (work / "cmp1" / "fcfs" / "jobs.parquet").read_bytes()


def test_perf_build_roofline_is_cached(work):
    (work / "tiny.csv").write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
                                   "j0,0,200,gpt__tiny,90000,8,1,a40\n")
    argv = ["perf", "build", "--trace", "tiny.csv", "--cluster", "cluster.yaml", "--mode", "roofline", "--json"]
    first = summary(invoke("arena-schedule", [*argv, "-o", "pb1.parquet"], cwd=work))
    second = summary(invoke("arena-schedule", [*argv, "-o", "pb2.parquet"], cwd=work))
    assert not first["cache"]["hit"] and second["cache"]["hit"] and second["rows"] == first["rows"] > 0
    assert first["pairs"] == [["gpt__tiny", 8]]
    assert (work / "pb1.parquet").read_bytes() == (work / "pb2.parquet").read_bytes()
    third = summary(invoke("arena-schedule", [*argv, "-o", "pb3.parquet", "--no-cache"], cwd=work))
    assert not third["cache"]["hit"]


def test_non_tty_stderr_has_no_progress_bar_output(work):
    out = ok(invoke("arena-schedule", ["simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster",
                                       "cluster.yaml", "-o", "plain", "--no-cache"], cwd=work))
    assert "\x1b[" not in out.stderr and "━" not in out.stderr
    assert out.stderr.splitlines() == [line for line in out.stderr.splitlines() if line.startswith("arena:")]


@pytest.mark.slow
def test_profile_is_cached_and_keyed_by_the_device(work):
    ok(invoke("arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "1", "--gpu-type", "a40",
                             "-o", "one.parquet"], cwd=work))
    argv = ["-i", "one.parquet", "--no-dp", "--warmup", "0", "--repeats", "1", "--cache-dir", "pc", "--json"]
    first = summary(invoke("arena-profile", [*argv, "-o", "perf1.parquet"], cwd=work))
    second = summary(invoke("arena-profile", [*argv, "-o", "perf2.parquet"], cwd=work))
    assert not first["cache"]["hit"] and second["cache"]["hit"] and first["device"]["platform"] == "cpu"
    assert (work / "perf1.parquet").read_bytes() == (work / "perf2.parquet").read_bytes()
    assert (work / "pc" / "stages" / "arena-profile").is_dir()
    assert not any(p.name == "stages" for p in (work / "pc").glob("*/*.json"))


def test_profiles_are_served_only_to_runs_that_time_them_alike_on_the_same_host(work, monkeypatch):
    """A stage profiled with 1 timed run is not served to a run that asks for 2; on CPU, a profile (or a whole
    output) made on one host is not served on another, whose cores are another device."""
    import platform

    ok(invoke("arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "1", "--gpu-type", "a40",
                             "-o", "one-b.parquet"], cwd=work))
    argv = ["-i", "one-b.parquet", "--no-dp", "--warmup", "0", "--cache-dir", "pc-b", "--json"]
    first = summary(invoke("arena-profile", [*argv, "--repeats", "1", "-o", "t1.parquet"], cwd=work))
    assert first["stages_profiled"] > 0 and first["stages_skipped"] == 0
    again = summary(invoke("arena-profile", [*argv, "--repeats", "1", "--no-cache", "-o", "t1b.parquet"], cwd=work))
    assert again["stages_profiled"] == 0 and again["stages_skipped"] == first["stages_profiled"]
    more = summary(invoke("arena-profile", [*argv, "--repeats", "2", "-o", "t2.parquet"], cwd=work))
    assert more["stages_profiled"] == first["stages_profiled"]
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    elsewhere = summary(invoke("arena-profile", [*argv, "--repeats", "1", "-o", "t3.parquet"], cwd=work))
    assert elsewhere["cache"]["hit"] is False and elsewhere["stages_profiled"] == first["stages_profiled"]


def test_one_cache_serves_analyze_plan_model_and_perf_build(work):
    """The operator table arena-analyze caches is the one arena-plan --model and perf build --pair read (no second
    analysis); arena-plan --model plans exactly what arena-plan --ops plans from that table."""
    from libarena.plan import read_plans

    ok(invoke("arena-analyze", ["--model", "gpt__tiny", "--global-batch", "8", "-o", "default-ops.parquet"], cwd=work))
    analyses = entries(work, "arena-analyze")
    by_model = ok(invoke("arena-plan", ["--model", "gpt__tiny", "--global-batch", "8", "--cluster", "cluster.yaml",
                                        "--max-gpus", "2", "-o", "by-model.parquet"], cwd=work))
    assert "analyzing" not in by_model.stderr and entries(work, "arena-analyze") == analyses
    ok(invoke("arena-plan", ["--ops", "default-ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "2",
                             "-o", "by-ops.parquet"], cwd=work))
    assert read_plans(work / "by-model.parquet").to_table().equals(read_plans(work / "by-ops.parquet").to_table())
    pair = summary(invoke("arena-schedule", ["perf", "build", "--pair", "gpt__tiny,8", "--cluster", "cluster.yaml",
                                             "--mode", "roofline", "--json", "-o", "pair.parquet"], cwd=work))
    assert pair["pairs"] == [["gpt__tiny", 8]] and entries(work, "arena-analyze") == analyses
    bad = invoke("arena-plan", ["--model", "gpt__tiny", "--cluster", "cluster.yaml", "-o", "x.parquet"], cwd=work)
    assert bad.code == 2 and "--global-batch" in bad.stderr


def test_a_pipe_input_is_neither_served_from_nor_stored_in_the_cache(work):
    """A pipe has no content digest (nor has ``<(...)``, whose /dev/fd path bash gives the next one too): keyed by
    its path alone, a run with another cluster through the same path was served the first run's plans."""
    import os
    import threading

    from libarena.plan import read_plans

    fifo = work / "cluster.fifo"
    os.mkfifo(fifo)
    for i, groups in enumerate((CLUSTER["node_groups"], CLUSTER["node_groups"][:1])):
        text = yaml.safe_dump(dict(CLUSTER, node_groups=groups))
        writer = threading.Thread(target=fifo.write_text, args=(text,), daemon=True)
        writer.start()
        outcome = invoke("arena-plan", ["--ops", "ops.parquet", "--cluster", str(fifo), "--max-gpus", "2", "--json",
                                        "-o", f"fifo{i}.parquet"], cwd=work)
        writer.join(timeout=30)
        doc = summary(outcome)
        assert doc["cache"]["hit"] is False and doc["cache"]["stored"] is False
        assert "not cached: " in outcome.stderr and "not a regular file" in outcome.stderr
    assert {g.grid.gpu_type for g in read_plans(work / "fifo1.parquet").grids} == {"a40"}


def test_profiling_a_plans_file_without_a_feasible_plan_is_a_one_line_error(work):
    """Every grid infeasible (out of memory in a millionth of each GPU's): no stage is built, not even the whole
    model's data-parallel one (for a large model that alone can exhaust the host's memory)."""
    ok(invoke("arena-plan", ["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "1",
                             "--memory-fraction", "0.000001", "-o", "none.parquet"], cwd=work))
    failed = invoke("arena-profile", ["-i", "none.parquet", "--cache-dir", "pc-none", "-o", "none-perf.parquet"], cwd=work)
    assert failed.code == 2 and "nothing to profile: the plans file has no feasible plan" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and "Traceback" not in failed.stderr
    assert not (work / "none-perf.parquet").exists()


def test_outputs_that_would_lose_a_cache_or_misname_a_table_are_refused(work):
    """A cache inside a directory output would be swapped out with the old output when the new one is moved in
    (and the entries just stored with it); a table named .csv would be a Parquet file under a CSV name."""
    sim = ["simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster", "cluster.yaml", "--policy", "fcfs"]
    inside = invoke("arena-schedule", [*sim, "-o", "run-in", "--cache-dir", "run-in/cache"], cwd=work)
    assert inside.code == 2 and "--cache-dir run-in/cache is inside the output run-in" in inside.stderr
    assert len(inside.stderr.strip().splitlines()) == 1 and not (work / "run-in").exists()
    text = invoke("arena-schedule", ["perf", "build", "--pair", "gpt__1.3B,256", "--cluster", "cluster.yaml",
                                     "--mode", "roofline", "-o", "perf.csv"], cwd=work)
    assert text.code == 2 and "-o perf.csv: tables are written as Parquet" in text.stderr
    assert "name the output perf.parquet" in text.stderr and not (work / "perf.csv").exists()
