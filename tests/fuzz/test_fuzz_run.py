"""Fuzz arena-run: its options, the plans file it trains from, and ``--grid`` strings.

Training compiles and runs the model (seconds to minutes), so every case either carries one invalid option
or asks for more devices than the in-process run has (``--no-ray --devices 1`` with a two-GPU grid): the
request, the plans and the checkpoint directory are validated in full and the run stops before training.
Real training runs are in tests/run and the fault test (test_faults.py).
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from tests.fuzz.corrupt import corrupt_bytes, mutated_table_bytes, number_text
from tests.fuzz.harness import run_and_check, run_cases

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]
TOOL = "arena-run"
ALLOWED = ["ckpt", "report.json"]

VALID = {
    "--plan": st.sampled_from(["plans.parquet"]),
    "--model": st.sampled_from(["gpt__tiny"]),
    "--global-batch": st.sampled_from(["8"]),
    "--steps": st.sampled_from(["1", "5", str(10 ** 9)]),
    "--checkpoint-dir": st.sampled_from(["ckpt", "ckpt/nested"]),
    "--grid": st.sampled_from(["a40,2,1", "a40,2,2", "a10,2,1", "A40,2,2"]),
    "--search-max": st.sampled_from(["0", "3"]),
    "--search-steps": st.sampled_from(["1", "2"]),
    "--checkpoint-every": st.sampled_from(["0", "10"]),
    "--seed": st.sampled_from(["0", "7"]),
    "--dtype": st.sampled_from(["fp32", "bf16"]),
    "--lr": st.sampled_from(["1e-3", "0.1"]),
}
INVALID = {
    "--plan": st.sampled_from(["missing.parquet", "ops.parquet", ".", "ckpt", "report.json"]),
    "--model": st.sampled_from(["gpt__nope", "", "bert__tiny", "gpt__1.3B", "x" * 200, "gpt__tiny\x00"]),
    "--global-batch": st.one_of(st.sampled_from(["0", "-1", "16", "x", ""]), number_text.filter(lambda t: t != "8")),
    "--steps": st.sampled_from(["0", "-1", "x", "", "1.5"]),
    "--grid": st.sampled_from(["", "a40", "a40,", "a40,x", "a40,0,1", "a40,2,0", "a40,-2,1", "tpu,2,1", "a40,3,1",
                               "a40,2,3", "a40,1024,1", ",,", "a40,2,1,1", "a40, 2, 1", "a40,1e3,1",
                               "a40,99999999999999999999,1"]),
    "--plan-id": st.sampled_from(["nope", "", "a40-n2-s1-0000000000"]),
    "--search": st.sampled_from(["exhaustive", "", "PRUNED"]),
    "--search-max": st.sampled_from(["-1", "x"]),
    "--search-steps": st.sampled_from(["0", "-4", "x"]),
    "--checkpoint-every": st.sampled_from(["-1", "x"]),
    "--devices": st.sampled_from(["0", "-1", "x"]),
    "--dtype": st.sampled_from(["int8", "", "fp8", "tf32x"]),
}
EXTRA = st.sampled_from([[], [], ["--proxy"], ["--search", "pruned"], ["--search", "full"], ["--json"],
                         ["--report", "report.json"], ["--bogus"], ["--proxy", "--search", "pruned"]])


@st.composite
def run_argv(draw) -> list[str]:
    broken = draw(st.sampled_from(sorted(INVALID)))
    argv: list[str] = []
    for opt in sorted(set(VALID) | set(INVALID)):
        if opt == broken:
            argv += [opt, draw(INVALID[opt])]
        elif opt in VALID and (opt in ("--plan", "--model", "--global-batch", "--steps", "--checkpoint-dir")
                               or draw(st.booleans())):
            argv += [opt, draw(VALID[opt])]
    if broken != "--devices":
        argv += ["--devices", "1"]
    return argv + ["--no-ray"] + draw(EXTRA)


def test_cli_args(seeds):
    def body(argv):
        run_and_check(TOOL, argv, seeds.plan_files(), allowed_outputs=ALLOWED)

    run_cases(TOOL, "cli_args", run_argv(), body)


def test_mutated_plans(seeds):
    strategy = st.tuples(st.one_of(mutated_table_bytes("plans", seeds.plans.table, seeds.plans.metadata),
                                   corrupt_bytes(seeds.plans_bytes)),
                         st.sampled_from([["--grid", "a40,2,1"], ["--grid", "a10,2,2"], ["--grid", "a40,2", "--search",
                                                                                         "pruned"]]))

    def body(case):
        data, grid = case
        argv = ["--plan", "plans.parquet", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "2",
                "--checkpoint-dir", "ckpt", *grid, "--no-ray", "--devices", "1"]
        run_and_check(TOOL, argv, seeds.plan_files(**{"plans.parquet": data}), allowed_outputs=ALLOWED)

    run_cases(TOOL, "plans_table", strategy, body)


def _one_gpu(grid: str) -> bool:
    """A grid of one GPU fits the in-process run's single device: it would train for real (see the docstring)."""
    parts = grid.split(",")
    try:
        return len(parts) >= 2 and int(parts[1]) == 1
    except ValueError:
        return False


def test_grid_strings(seeds):
    text = st.one_of(st.text(max_size=24),
                     st.tuples(st.sampled_from(["a40", "a10", "A40", "tpu", "", " a40"]),
                               number_text, number_text).map(lambda t: ",".join(t))).filter(lambda g: not _one_gpu(g))

    def body(grid):
        argv = ["--plan", "plans.parquet", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "2",
                "--checkpoint-dir", "ckpt", "--grid", grid, "--no-ray", "--devices", "1"]
        run_and_check(TOOL, argv, seeds.plan_files(), allowed_outputs=ALLOWED)

    run_cases(TOOL, "grid", text, body)
