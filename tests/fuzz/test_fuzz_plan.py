"""Fuzz arena-plan: its options, operator tables, cluster specs (YAML/TOML), comm tables, and plans fed to
``show`` / ``export``."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import strategies as st

from libarena.artifacts import read_table
from tests.fuzz.corrupt import corrupt_bytes, mutated_document_text, mutated_table_bytes, number_text
from tests.fuzz.harness import run_and_check, run_cases

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]
TOOL = "arena-plan"

NUMBERS = st.one_of(st.sampled_from(["1", "2", "4", "16"]), number_text)
OPTIONS = {
    "--max-gpus": NUMBERS,
    "--gpu-type": st.sampled_from(["a40", "a10", "A40", "a100", "tpu", "", "h100"]),
    "--num-gpus": NUMBERS,
    "--stages": NUMBERS,
    "--microbatches-per-stage": NUMBERS,
    "--num-microbatches": st.one_of(st.sampled_from(["1", "8", str(10 ** 6)]), number_text),
    "--frontier-cap": st.one_of(st.sampled_from(["0", "1", "8"]), number_text),
    "--memory-fraction": st.sampled_from(["0.9", "1", "0", "-0.5", "1.5", "nan", "inf", "1e-300", "x", ""]),
    "--exhaustive-limit": st.sampled_from(["0", "1", "100", "-1", "x"]),
    "-o": st.sampled_from(["plans.parquet", "-", "nodir/p.parquet", ".", "sub/"]),
    "--comm": st.sampled_from(["comm.parquet", "missing.parquet", "ops.parquet", "cluster.yaml"]),
}
FLAGS = st.lists(st.sampled_from(["--no-zero", "--exhaustive", "--comm-required", "--bogus", "--json"]),
                 max_size=2, unique=True)


@st.composite
def plan_argv(draw) -> list[str]:
    argv = ["--ops", draw(st.sampled_from(["ops.parquet", "ops.parquet", "-", "missing.parquet", "cluster.yaml"])),
            "--cluster", draw(st.sampled_from(["cluster.yaml", "cluster.yaml", "missing.yaml", "ops.parquet"]))]
    for opt in draw(st.lists(st.sampled_from(sorted(OPTIONS)), min_size=1, max_size=4, unique=True)):
        argv += [opt, draw(OPTIONS[opt])]
    if "-o" not in argv:
        argv += ["-o", "plans.parquet"]
    return argv + draw(FLAGS)


def _verify_plans(path):
    read_table(path, "plans")


def _inputs(seeds, **override) -> dict[str, bytes]:
    files = {"ops.parquet": seeds.ops_bytes, "cluster.yaml": seeds.cluster_yaml.read_bytes(),
             "comm.parquet": seeds.comm_bytes}
    files.update(override)
    return files


def _plan(argv, files, stdin=b""):
    return run_and_check(TOOL, argv, files, stdin=stdin, extra_setup=lambda root: (root / "sub").mkdir(),
                         allowed_outputs=["plans.parquet"], verify_output=_verify_plans)


def test_cli_args(seeds):
    def body(argv):
        stdin = seeds.ops_bytes if "-" in argv[:2] else b""
        _plan(argv, _inputs(seeds), stdin)

    run_cases(TOOL, "cli_args", plan_argv(), body)


def test_mutated_operator_tables(seeds):
    strategy = st.tuples(mutated_table_bytes("operator_table", seeds.ops.table, seeds.ops.metadata), st.booleans())

    def body(case):
        data, via_stdin = case
        if via_stdin:
            _plan(["--ops", "-", "--cluster", "cluster.yaml", "--max-gpus", "2", "-o", "plans.parquet"],
                  _inputs(seeds), data)
        else:
            _plan(["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "2", "-o", "plans.parquet"],
                  _inputs(seeds, **{"ops.parquet": data}))

    run_cases(TOOL, "ops_table", strategy, body)


def test_corrupt_operator_bytes(seeds):
    def body(data):
        _plan(["--ops", "ops.parquet", "--cluster", "cluster.yaml", "-o", "plans.parquet"],
              _inputs(seeds, **{"ops.parquet": data}))

    run_cases(TOOL, "ops_bytes", corrupt_bytes(seeds.ops_bytes), body)


def test_mutated_cluster_specs(seeds):
    def body(case):
        suffix, data = case
        name = "spec" + suffix
        _plan(["--ops", "ops.parquet", "--cluster", name, "--max-gpus", "4", "-o", "plans.parquet"],
              _inputs(seeds, **{name: data}))

    run_cases(TOOL, "cluster_spec", mutated_document_text(seeds.cluster, ("yaml", "toml")), body)


def test_mutated_comm_tables(seeds):
    def body(data):
        _plan(["--ops", "ops.parquet", "--cluster", "cluster.yaml", "--max-gpus", "2", "--comm", "comm.parquet",
               "-o", "plans.parquet"], _inputs(seeds, **{"comm.parquet": data}))

    run_cases(TOOL, "comm_table", mutated_table_bytes("comm_table", seeds.comm.table, seeds.comm.metadata), body)


EXPORT_ARGS = st.lists(st.sampled_from([["--format", "alpa"], ["--format", "nope"], ["--gpu-type", "a40"],
                                        ["--gpu-type", "tpu"], ["--num-gpus", "2"], ["--num-gpus", "-3"],
                                        ["--num-gpus", "x"], ["--stages", "1"], ["--stages", "0"],
                                        ["--plan-id", "nope"], ["-o", "nodir/x.json"], ["-o", "."]]),
                       max_size=3).map(lambda parts: [tok for p in parts for tok in p])


def test_show_and_export_mutated_plans(seeds):
    strategy = st.tuples(mutated_table_bytes("plans", seeds.plans.table, seeds.plans.metadata),
                         st.sampled_from(["show", "show-json", "show-proxies", "export"]), EXPORT_ARGS)

    def body(case):
        data, command, extra = case
        files = {"plans.parquet": data}
        if command == "export":
            argv = ["export", "plans.parquet", "-o", "alpa.json", *extra]
            outcome = run_and_check(TOOL, argv, files, allowed_outputs=["alpa.json"],
                                    verify_output=lambda p: json.loads(p.read_text()))
        else:
            argv = ["show", "plans.parquet"] + {"show": [], "show-json": ["--json"],
                                                "show-proxies": ["--proxies", "--json"]}[command]
            outcome = run_and_check(TOOL, argv, files)
            if outcome.code == 0 and "--json" in argv:
                json.loads(outcome.stdout)

    run_cases(TOOL, "show_export", strategy, body)


def test_seed_cluster_is_valid(seeds):
    """The fuzzers mutate a spec that plans cleanly (so a refusal above is about the mutation)."""
    outcome = _plan(["--ops", "ops.parquet", "--cluster", "cluster.yaml", "-o", "plans.parquet"], _inputs(seeds))
    assert outcome.code == 0, outcome.describe()
    assert yaml.safe_load(seeds.cluster_yaml.read_text())["name"] == "tiny"
