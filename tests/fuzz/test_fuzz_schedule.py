"""Fuzz arena-schedule: traces (CSV), perf tables (Parquet/Arrow/CSV), cluster specs, simulator options,
job files for ``submit`` and state databases for ``status`` / ``logs``."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import strategies as st

from libarena.artifacts import read_document, read_table
from libarena.schedule.metrics import read_metrics
from tests.fuzz.corrupt import (corrupt_bytes, mutated_csv, mutated_document_text, mutated_table_bytes,
                                number_text)
from tests.fuzz.harness import invoke, run_and_check, run_cases

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]
TOOL = "arena-schedule"
RUN_FILES = ["run", "run/jobs.parquet", "run/timeseries.parquet", "run/decisions.msgpack", "run/metrics.json"]


def _verify_run(path):
    if path.name == "jobs.parquet":
        read_table(path, "job_records")
    elif path.name == "timeseries.parquet":
        read_table(path, "timeseries")
    elif path.name == "decisions.msgpack":
        read_document(path, "decisions")
    elif path.name == "metrics.json":
        read_metrics(path)


def _trace_csv(seeds) -> bytes:
    return ("\n".join(",".join(r) for r in [seeds.trace_header] + seeds.trace_rows) + "\n").encode()


def _inputs(seeds, **override) -> dict[str, bytes]:
    files = {"trace.csv": _trace_csv(seeds), "perf.parquet": seeds.perf_bytes,
             "cluster.yaml": seeds.cluster_yaml.read_bytes()}
    files.update(override)
    return files


def _simulate(files, *extra, policy="fcfs", trace="trace.csv", perf="perf.parquet", cluster="cluster.yaml"):
    argv = ["simulate", "--trace", trace, "--perf", perf, "--cluster", cluster, "--policy", policy, "-o", "run",
            *extra]
    return run_and_check(TOOL, argv, files, allowed_outputs=RUN_FILES, verify_output=_verify_run)


def test_mutated_traces(seeds):
    strategy = st.tuples(mutated_csv(seeds.trace_header, seeds.trace_rows), st.sampled_from(["fcfs", "arena"]),
                         st.sampled_from([[], ["--skip-bad-rows"], ["--horizon", "3600"]]))

    def body(case):
        data, policy, extra = case
        _simulate(_inputs(seeds, **{"trace.csv": data}), *extra, policy=policy)

    run_cases(TOOL, "trace_csv", strategy, body)


def test_trace_stats(seeds):
    itp_header = ["job_id", "submission_time", "duration", "num_gpu"]
    itp_rows = [["a", "0", "3600", "3"], ["b", "10", "60", "1"], ["c", "99", "7200", "40"]]
    strategy = st.tuples(st.one_of(mutated_csv(seeds.trace_header, seeds.trace_rows), mutated_csv(itp_header, itp_rows)),
                         st.sampled_from([[], ["--json"], ["--skip-bad-rows", "--json"], ["--cluster", "cluster.yaml"],
                                          ["--seed", "-1"], ["--seed", "x"], ["--cluster", "missing.yaml"]]))

    def body(case):
        data, extra = case
        outcome = run_and_check(TOOL, ["trace", "stats", "trace.csv", *extra], _inputs(seeds, **{"trace.csv": data}))
        if outcome.code == 0 and "--json" in extra:
            json.loads(outcome.stdout)

    run_cases(TOOL, "trace_stats", strategy, body)


def test_mutated_perf_tables(seeds):
    header, rows = seeds.perf_csv()
    strategy = st.one_of(
        st.tuples(st.just("perf.parquet"), mutated_table_bytes("perf_table", seeds.perf.table, seeds.perf.metadata)),
        st.tuples(st.just("perf.csv"), mutated_csv(header, rows)),
        st.tuples(st.just("perf.parquet"), corrupt_bytes(seeds.perf_bytes)),
    )

    def body(case):
        name, data = case
        _simulate(_inputs(seeds, **{name: data}), "--skip-bad-rows", perf=name)

    run_cases(TOOL, "perf_table", strategy, body)


def test_mutated_cluster_specs(seeds):
    def body(case):
        suffix, data = case
        _simulate(_inputs(seeds, **{"spec" + suffix: data}), "--skip-bad-rows", cluster="spec" + suffix)

    run_cases(TOOL, "cluster_spec", mutated_document_text(seeds.cluster, ("yaml", "toml")), body)


SIM_OPTIONS = {
    "--tick": st.one_of(st.sampled_from(["300", "1", "0.001", "1e9"]), number_text),
    "--horizon": st.one_of(st.sampled_from(["3600", "0", "1e12"]), number_text),
    "--seed": number_text,
    "--overhead": st.sampled_from(["launch=5", "nope=1", "launch=x", "launch", "launch=-1", "launch=nan",
                                   "launch=inf", "=", "restart=1e300"]),
    "--view": st.sampled_from(["arena", "dp", "ap", "dp-linear", "nope", ""]),
    "--objective": st.sampled_from(["throughput", "deadline", "fairness", "nope"]),
    "--queues": number_text,
    "--search-depth": number_text,
    "--promotion-time": number_text,
    "--max-gpus-per-job": number_text,
}


@st.composite
def sim_argv(draw) -> tuple[str, list[str]]:
    policy = draw(st.sampled_from(["arena", "fcfs", "gavel", "sia", "elasticflow", "elasticflow-ls", "nope", ""]))
    argv: list[str] = []
    for opt in draw(st.lists(st.sampled_from(sorted(SIM_OPTIONS)), min_size=1, max_size=3, unique=True)):
        argv += [opt, draw(SIM_OPTIONS[opt])]
    return policy, argv + draw(st.sampled_from([[], [], ["--json"], ["--bogus"], ["--horizon"]]))


def test_simulator_options(seeds):
    def body(case):
        policy, argv = case
        _simulate(_inputs(seeds), *argv, policy=policy)

    run_cases(TOOL, "sim_args", sim_argv(), body)


def _job_yaml(doc) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode()


def test_mutated_job_files(seeds):
    strategy = st.tuples(mutated_document_text(seeds.job, ("yaml",)),
                         st.sampled_from([[], [], ["--at", "0"], ["--at", "-1"], ["--at", "nan"], ["--at", "1e308"],
                                          ["--at", "x"], ["--state", "nodir/state.db"], ["--state", "."]]))

    def body(case):
        (_, data), extra = case
        argv = ["submit", "job.yaml", "--state", "state.db", *extra]
        run_and_check(TOOL, argv, {"job.yaml": data}, allowed_outputs=["state.db", "state.db-wal", "state.db-shm"])

    run_cases(TOOL, "job_file", strategy, body)


@pytest.fixture(scope="module")
def state_db(seeds, tmp_path_factory) -> bytes:
    """A state database holding one submitted job (written by ``submit`` itself)."""
    root = tmp_path_factory.mktemp("state")
    (root / "job.yaml").write_bytes(_job_yaml(seeds.job))
    outcome = invoke(TOOL, ["submit", "job.yaml", "--state", "state.db"], cwd=root)
    assert outcome.code == 0, outcome.describe()
    import sqlite3

    conn = sqlite3.connect(root / "state.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return (root / "state.db").read_bytes()


def test_status_and_logs_on_corrupt_state(state_db):
    strategy = st.tuples(st.one_of(corrupt_bytes(state_db), st.just(state_db)),
                         st.sampled_from([["status"], ["status", "--json"], ["status", "--active"],
                                          ["logs", "fuzz-job"], ["logs", "nope"], ["logs", "fuzz-job", "--tail", "-1"],
                                          ["logs", "fuzz-job", "--output-lines", "-5"]]))

    def body(case):
        data, command = case
        run_and_check(TOOL, [*command, "--state", "state.db"], {"state.db": data},
                      allowed_outputs=["state.db-wal", "state.db-shm"])

    run_cases(TOOL, "state_db", strategy, body)


def test_job_file_values_are_checked(seeds):
    """Every key of a job file with an absurd value: refused in one line, or accepted."""
    for key in seeds.job:
        for value in (None, -1, 0, 2 ** 70, float("nan"), "x", [], {}):
            doc = dict(seeds.job, **{key: value})
            run_and_check(TOOL, ["submit", "job.yaml", "--state", "state.db"], {"job.yaml": _job_yaml(doc)},
                          allowed_outputs=["state.db", "state.db-wal", "state.db-shm"])
