"""arena-schedule end to end, by subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from libarena.artifacts import get_kind, read_document, read_table
from tests.schedule.perf_fixtures import write_perf, zoo_pairs

HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
ROWS = [f"j{i},{300 * i},{2000 + 100 * i},{m},{300 * i + 90000},{b},{g},{t}"
        for i, (m, b, g, t) in enumerate([("gpt__1.3B", 256, 2, "a100"), ("moe__2.4B", 512, 4, "a40"),
                                           ("bert__760M", 128, 1, "v100"), ("wide_resnet__1B", 512, 8, "a10"),
                                           ("gpt__760M", 128, 1, "a40"), ("moe__1.3B", 256, 2, "a100")] * 3)]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("arena-schedule")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, repo_root):
    d = tmp_path_factory.mktemp("cli")
    write_perf(d / "perf.parquet", zoo_pairs(), ["a100", "v100", "a40", "a10"])
    (d / "trace.csv").write_text(HEADER + "\n".join(ROWS) + "\n")
    (d / "bad.csv").write_text(HEADER + ROWS[0] + "\n" + "x,0,100,gpt__1.3B,5000,256,0,a100\n" + ROWS[1] + "\n")
    return d, repo_root / "examples" / "clusters" / "paper-sim-1280.yaml"


def test_simulate_writes_artifacts(inputs):
    d, cluster = inputs
    r = cli("simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster", str(cluster), "--policy", "arena",
            "-o", "run", "--json", "--plot", cwd=d)
    assert r.returncode == 0, r.stderr
    metrics = json.loads(r.stdout)
    assert metrics["submitted_jobs"] == 18 and metrics["finished_jobs"] == 18
    assert "arena: 18/18 finished" in r.stderr
    jobs = read_table(d / "run" / "jobs.parquet", "job_records")
    assert jobs.table.num_rows == 18 and jobs.metadata["policy"] == "arena"
    ts = read_table(d / "run" / "timeseries.parquet", "timeseries")
    assert ts.table.num_rows == metrics["ticks"]
    dec = read_document(d / "run" / "decisions.msgpack", "decisions")
    assert dec.data["action"].count("finish") == 18 and len(dec.data["job_ids"]) == 18
    written = json.loads((d / "run" / "metrics.json").read_text())
    assert written["avg_jct_s"] == pytest.approx(metrics["avg_jct_s"])
    # headed as every artifact: its kind, schema version and the inputs it came from, by content
    header = written["arena"]
    assert header["kind"] == "run_metrics" and header["schema_version"] == 1
    assert header["provenance"]["parameters"]["policy"] == "arena"
    assert [Path(i["path"]).name for i in header["provenance"]["inputs"]] == ["trace.csv", "perf.parquet", cluster.name]
    assert all(len(i["sha256"]) == 64 for i in header["provenance"]["inputs"])
    # the file holds exactly the fields its kind documents (schemas/run_metrics.json)
    assert set(written) - {"arena"} == {f.name for f in get_kind("run_metrics").fields}
    for png in ("throughput.png", "jct_cdf.png", "queue_length.png"):
        assert (d / "run" / png).read_bytes()[:4] == b"\x89PNG"


def test_bad_row_is_one_line_exit_2_and_no_output(inputs):
    d, cluster = inputs
    r = cli("simulate", "--trace", "bad.csv", "--perf", "perf.parquet", "--cluster", str(cluster), "-o", "badrun", cwd=d)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.csv: row 2, column 'num_gpu'" in lines[0] and "Traceback" not in r.stderr
    assert not (d / "badrun").exists()
    r = cli("simulate", "--trace", "bad.csv", "--perf", "perf.parquet", "--cluster", str(cluster), "-o", "skiprun",
            "--skip-bad-rows", "--policy", "fcfs", cwd=d)
    assert r.returncode == 0, r.stderr
    assert "skipped 1 bad row(s)" in r.stderr
    assert json.loads((d / "skiprun" / "metrics.json").read_text())["skipped_rows"] == 1


def test_unschedulable_jobs_say_why_in_the_records_and_on_stderr(inputs):
    """A job the policy can never place carries the reason in jobs.parquet, and the tool warns once per reason
    (on a cache hit too); a version-1 table, which had no reasons, is still read."""
    import pyarrow.parquet as pq

    d, cluster = inputs
    write_perf(d / "no-a100.parquet", zoo_pairs(), ["v100", "a40", "a10"])
    args = ["simulate", "--trace", "trace.csv", "--perf", "no-a100.parquet", "--cluster", str(cluster), "--policy",
            "fcfs", "-o", "rigid", "--cache-dir", "cache"]
    for attempt in ("fresh", "cached"):
        r = cli(*args, cwd=d)
        assert r.returncode == 0, r.stderr
        assert "fcfs: 12/18 finished (6 unfinished, 6 of them unschedulable, 0 dropped)" in r.stderr, attempt
        warned = [line for line in r.stderr.splitlines() if "unschedulable: " in line]
        assert len(warned) == 2, (attempt, r.stderr)  # two (model, batch) pairs asked for the missing a100s
        assert "unschedulable: 3 job(s) (first j0): fcfs: no configuration it may use (at most 16 GPUs per job, " \
               "on a100 only;" in warned[0]
        assert "(first j5)" in warned[1] and "moe__1.3B at global batch 256" in warned[1]
    assert "cached: rigid/" in r.stderr
    r = cli("compare", "--policies", "arena,fcfs", "--trace", "trace.csv", "--perf", "no-a100.parquet", "--cluster",
            str(cluster), "-o", "both", "--no-cache", cwd=d)
    assert r.returncode == 0, r.stderr
    warned = [line[line.index("unschedulable: "):][:58] for line in r.stderr.splitlines() if "unschedulable: " in line]
    assert warned == [f"unschedulable: 3 job(s) (first j{i}): fcfs: no configuration" for i in (0, 5)], r.stderr
    jobs = read_table(d / "rigid" / "jobs.parquet", "job_records").table
    reasons = dict(zip(jobs.column("job_id").to_pylist(), jobs.column("unschedulable_reason").to_pylist()))
    assert reasons["j1"] == "" and reasons["j6"].startswith("fcfs: no configuration") and "gpt__1.3B" in reasons["j6"]
    assert sorted(j for j, why in reasons.items() if why) == sorted(f"j{i}" for i in (0, 5, 6, 11, 12, 17))
    # the same table as version 1 wrote it: no reason column, which reading adds
    old = pq.read_table(d / "rigid" / "jobs.parquet")
    meta = old.schema.metadata[b"arena"]
    assert b'"schema_version": 2' in meta
    old = old.drop_columns(["unschedulable_reason"]).replace_schema_metadata(
        {b"arena": meta.replace(b'"schema_version": 2', b'"schema_version": 1')})
    pq.write_table(old, d / "v1.parquet")
    upgraded = read_table(d / "v1.parquet", "job_records").table
    assert upgraded.column("unschedulable_reason").to_pylist() == [
        "not recorded (job_records version 1)" if why else "" for why in reasons.values()]


@pytest.mark.parametrize("args,needle", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--policy", "fcfs", "--no-hetero"], "policy 'fcfs' has no option hetero"),
    (["--overhead", "bogus=1"], "--overhead 'bogus=1'"),
    (["--tick", "0"], "--tick: 0 is out of range"),
    (["--tick", "inf"], "--tick: inf is not a finite number"),
    (["--tick", "0.000001"], "--tick: 1e-06 is out of range"),
    (["--overhead", "checkpoint_resume_s=1e300"], "--overhead checkpoint_resume_s: 1e+300 is out of range"),
    (["--overhead", "checkpoint_resume_s=nan"], "--overhead checkpoint_resume_s: nan is not"),
    (["--promotion-time", "-1"], "--promotion-time: -1 is out of range"),
    (["--max-gpus-per-job", "-1"], "--max-gpus-per-job: -1 is out of range"),
    (["--policy", "arena", "--global-queue"], "policy 'arena' has no option per_type_queues"),
    (["--overhead", "reuse_plans=maybe"], "--overhead 'reuse_plans=maybe': 'maybe' is not true or false"),
])
def test_bad_options(inputs, args, needle):
    d, cluster = inputs
    r = cli("simulate", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster", str(cluster), "-o", "x", *args, cwd=d)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_conflicting_and_out_of_range_options_of_other_commands(inputs):
    """Options that cannot apply together, or are out of range, are refused in one line before any work."""
    d, cluster = inputs
    cases = [
        (["sweep", "--sequential", "--num-cpus", "0", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster",
          str(cluster), "-o", "sw"], "--sequential runs in this process"),
        (["perf", "build", "--pair", "gpt__tiny,16", "--cluster", str(cluster), "--seed", "-1", "-o", "pb.parquet"],
         "--seed: -1 is out of range"),
    ]
    for args, needle in cases:
        r = cli(*args, cwd=d)
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    assert not (d / "sw").exists() and not (d / "pb.parquet").exists()
    job = d / "job.yaml"
    job.write_text("model: gpt__760M\nglobal_batch: 128\niterations: 10\n")
    assert cli("submit", str(job), "--state", "s.db", cwd=d).returncode == 0
    r = cli("logs", "job-1", "--state", "s.db", "--output-lines", "-5", cwd=d)
    assert r.returncode == 2 and "--output-lines: -5 is out of range" in r.stderr


def test_fcfs_queue_and_reuse_flags(inputs):
    d, _ = inputs
    # one 4-GPU A100 node and one 2-GPU V100 node: the second A100 job waits for the first; the V100 job need not
    (d / "small.yaml").write_text("name: small\nnode_groups:\n  - {gpu_type: a100, nodes: 1, gpus_per_node: 4}\n"
                                  "  - {gpu_type: v100, nodes: 1, gpus_per_node: 2}\n")
    (d / "blocking.csv").write_text(HEADER + "a,0,40000,gpt__1.3B,900000,256,4,a100\nb,10,4000,gpt__1.3B,900000,256,4,a100\n"
                                    "c,20,1000,gpt__1.3B,900000,256,1,v100\n")
    base = ["simulate", "--trace", "blocking.csv", "--perf", "perf.parquet", "--cluster", "small.yaml", "--json", "-q"]
    runs = {}
    for name, extra in (("per-type", ["--policy", "fcfs"]), ("global", ["--policy", "fcfs", "--global-queue"]),
                        ("no-reuse", ["--policy", "sia", "--overhead", "reuse_profiles=false"]),
                        ("reuse", ["--policy", "sia"])):
        r = cli(*base, *extra, "-o", f"run-{name}", cwd=d)
        assert r.returncode == 0, r.stderr
        runs[name] = read_table(d / f"run-{name}" / "jobs.parquet", "job_records").table
    # one queue for all types can only delay launches; the per-type queues never wait behind another type
    per_type, single = (dict(zip(runs[k].column("job_id").to_pylist(), runs[k].column("start_time_s").to_pylist()))
                        for k in ("per-type", "global"))
    assert per_type["c"] < per_type["b"] and single["c"] >= single["b"] >= per_type["b"]
    paid = {k: sum(runs[k].column("overhead_s").to_pylist()) for k in ("reuse", "no-reuse")}
    assert paid["reuse"] < paid["no-reuse"]  # later jobs of a (model, batch) skip Sia's bootstrap profiling


@pytest.mark.slow
def test_compare_json_and_table(inputs):
    d, cluster = inputs
    r = cli("compare", "--policies", "arena,fcfs,elasticflow-ls,gavel,sia", "--trace", "trace.csv", "--perf",
            "perf.parquet", "--cluster", str(cluster), "-o", "cmp", "--json", "--plot", cwd=d)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc["policies"]) == {"arena", "fcfs", "elasticflow-ls", "gavel", "sia"}
    for m in doc["policies"].values():
        assert {"avg_jct_s", "avg_throughput", "peak_throughput", "finished_jobs", "avg_queuing_s"} <= set(m)
    # every baseline beside the reference on the jobs both finished
    assert doc["reference"] == "arena" and "vs_reference" not in doc["policies"]["arena"]
    for name in ("fcfs", "elasticflow-ls", "gavel", "sia"):
        pair = doc["policies"][name]["vs_reference"]
        assert 0 <= pair["jobs"] <= doc["policies"][name]["finished_jobs"]
        assert set(pair["reference"]) == set(pair["policy"]) == {"avg_jct_s", "p50_jct_s", "p90_jct_s"}
    assert (d / "cmp" / "gavel" / "jobs.parquet").is_file() and (d / "cmp" / "throughput.png").is_file()
    # compare.json is headed too: each policy's run parameters, the shared inputs once
    header = json.loads((d / "cmp" / "compare.json").read_text())["arena"]
    assert header["kind"] == "comparison" and header["schema_version"] == 1 and header["provenance"]["tool"] == "arena-schedule compare"
    assert "arena" not in doc  # stdout is the report, as simulate's and sweep's: the file carries the header
    written = json.loads((d / "cmp" / "compare.json").read_text())
    assert set(written) - {"arena"} == {f.name for f in get_kind("comparison").fields}
    assert sorted(header["provenance"]["parameters"]["policies"]) == sorted(doc["policies"])
    assert header["provenance"]["parameters"]["policies"]["sia"]["policy"] == "sia"
    assert [Path(i["path"]).name for i in header["provenance"]["inputs"]] == ["trace.csv", "perf.parquet", cluster.name]
    r = cli("compare", "--policies", "arena,fcfs", "--trace", "trace.csv", "--perf", "perf.parquet", "--cluster",
            str(cluster), "-o", "cmp2", cwd=d)
    assert r.returncode == 0 and "reduction" in r.stdout and "fcfs" in r.stdout and "both finished" in r.stdout


def test_trace_stats_and_perf_build(inputs, traces_dir):
    d, cluster = inputs
    r = cli("trace", "stats", str(traces_dir / "arena-ae" / "simulate_trace_venus.csv"), "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == 438
    r = cli("trace", "stats", "trace.csv", cwd=d)
    assert r.returncode == 0 and "jobs" in r.stdout
    # perf build's happy path is tests/profile/test_perf_build.py; here its bad input.
    r = cli("perf", "build", "--trace", "trace.csv", "--cluster", str(cluster), "-o", "p.parquet", "--mode", "guess", cwd=d)
    assert r.returncode == 2 and "unknown perf build mode 'guess'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (d / "p.parquet").exists()


def test_scheduler_does_not_import_jax(repo_root):
    code = ("import sys, libarena.schedule.api, libarena.schedule.plots, libarena.schedule.compare;"
            "from libarena.schedule.policies import policy_names; policy_names();"
            "assert not any(m == 'jax' or m.startswith('jax.') for m in sys.modules), 'jax imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_full_philly_trace_with_arena(inputs, traces_dir):
    d, cluster = inputs
    r = cli("simulate", "--trace", str(traces_dir / "arena-ae" / "simulate_trace_philly.csv"), "--perf", "perf.parquet",
            "--cluster", str(cluster), "--policy", "arena", "-o", "philly", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    m = json.loads(r.stdout)
    assert m["submitted_jobs"] == 1938
    assert m["finished_jobs"] + m["unfinished_jobs"] == 1938 and m["stopped_by"] == "completion"
    assert 0 < m["decision_time_per_tick_median_s"] < 60  # a time the run measured (its speed is the benchmarks')


def test_the_comparison_table_shows_the_reduction_on_the_jobs_both_finished_and_the_dropped_jobs():
    """The average over every job rewards dropping jobs (a dropped job counts until it was dropped): the table
    puts the reduction on the jobs both finished and the dropped count beside it."""
    from libarena.schedule.compare import compare_table_text

    def metrics(policy: str, jct_h: float, dropped: int) -> dict:
        return {"policy": policy, "avg_jct_s": jct_h * 3600, "avg_throughput": 10.0, "peak_throughput": 20.0,
                "finished_jobs": 10 - dropped, "unfinished_jobs": 0, "dropped_jobs": dropped, "avg_queuing_s": 0.0,
                "reschedules_per_job": 0.0, "decision_time_per_tick_median_s": 0.001}

    table = {"arena": metrics("arena", 4.0, 0), "elasticflow": metrics("elasticflow", 1.0, 7)}
    paired = {"elasticflow": {"jobs": 3, "reference": {"avg_jct_s": 2.0 * 3600}, "policy": {"avg_jct_s": 8.0 * 3600}}}
    text = compare_table_text(table, paired, width=400)
    row = next(line for line in text.splitlines() if "elasticflow" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    # all jobs: arena 300% "worse" (elasticflow dropped 7 jobs early); on the 3 both finished 75% better
    assert cells[:6] == ["elasticflow", "1.00", "-300.0%", "3", "2.00 / 8.00", "75.0%"] and cells[9] == "7", cells


def test_a_perf_table_piped_on_stdin_is_named_by_its_content_in_the_provenance(inputs, monkeypatch):
    """As a trace on stdin is, and as the tables piped into arena-plan and arena-profile are: the run's inputs
    name the piped table by its sha256, not only as "stdin"."""
    import io
    import types

    from libarena.artifacts import write_table
    from libarena.schedule.api import load_workload

    d, cluster = inputs
    art = read_table(d / "perf.parquet", "perf_table")
    stream = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", types.SimpleNamespace(buffer=stream, isatty=lambda: False, flush=lambda: None))
    write_table("-", "perf_table", art.table, art.provenance, art.metadata)
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(stream.getvalue())))
    _, refs, keys = load_workload(d / "trace.csv", Path("-"), cluster)
    assert refs[1]["path"] == "stdin" and len(refs[1]["sha256"]) == 64 and refs[1] == keys[1]


def test_the_inputs_are_named_by_the_bytes_that_were_parsed(inputs, monkeypatch, tmp_path):
    """A file replaced between its digest and its read (here: just before the performance table is read, by a
    table of other rows) must not be recorded, and cache-keyed, under the old content's digest. Before, each
    input was hashed first and read again later."""
    import hashlib
    import shutil

    import libarena.artifacts.io as artifact_io
    from libarena.schedule.api import load_workload

    d, cluster = inputs
    perf = tmp_path / "perf.parquet"
    shutil.copy(d / "perf.parquet", perf)
    other = tmp_path / "other.parquet"
    write_perf(other, zoo_pairs()[:3], ["a100", "v100", "a40", "a10"])
    assert other.read_bytes() != perf.read_bytes()
    read = artifact_io._read_input_bytes

    def replaced_first(path):
        if Path(path) == perf:
            other.replace(perf)  # an atomic replace by another process, just before this read
        return read(path)

    monkeypatch.setattr(artifact_io, "_read_input_bytes", replaced_first)
    workload, refs, keys = load_workload(d / "trace.csv", perf, cluster, skip_bad_rows=True)
    parsed = hashlib.sha256(perf.read_bytes()).hexdigest()  # the new content, which is what was simulated
    assert refs[1]["sha256"] == keys[1]["sha256"] == parsed
    assert len(workload.perf.pairs()) == 3
    for path, entry in zip((d / "trace.csv", cluster), (refs[0], refs[2])):
        assert entry == {"path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_columns_a_trace_format_does_not_read_are_named_in_a_warning(inputs):
    """A misspelt column (``priorty``) is not read: simulate and trace stats say so on stderr (the run still
    goes on: traces may carry columns of their own), and a trace without extra columns gets no such line."""
    d, cluster = inputs
    (d / "typo.csv").write_text(HEADER.strip() + ",priorty\n" + "\n".join(row + ",1" for row in ROWS[:3]) + "\n")
    r = cli("simulate", "--trace", "typo.csv", "--perf", "perf.parquet", "--cluster", str(cluster), "--policy", "fcfs",
            "-o", "typo-run", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    assert "typo.csv: ignored column(s) 'priorty'" in r.stderr
    r = cli("trace", "stats", "typo.csv", "--json", cwd=d)
    assert r.returncode == 0 and "ignored column(s) 'priorty'" in r.stderr
    r = cli("trace", "stats", "trace.csv", "--json", cwd=d)
    assert r.returncode == 0 and "ignored" not in r.stderr
