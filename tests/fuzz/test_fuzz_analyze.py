"""Fuzz arena-analyze: its command line, and operator tables fed to ``arena-analyze show``."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st

from libarena.artifacts import read_table
from tests.fuzz.corrupt import corrupt_bytes, mutated_table_bytes
from tests.fuzz.harness import run_and_check, run_cases

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]
TOOL = "arena-analyze"

VALID = {
    "--model": st.sampled_from(["gpt__tiny", "bert__tiny", "moe__tiny", "wide_resnet__tiny"]),
    "--global-batch": st.sampled_from(["1", "2", "8"]),
    "--seq-len": st.sampled_from(["8", "16"]),
    "--dtype": st.sampled_from(["bf16", "fp32", "fp16", "tf32"]),
    "--num-clusters": st.sampled_from(["1", "2", "4"]),
    "-o": st.sampled_from(["out.parquet", "sub/out.parquet"]),
}
INVALID = {
    "--model": st.sampled_from(["", "gpt", "gpt__", "__tiny", "gpt__nope", "resnet50", "gpt__tiny\n", "x" * 300,
                                "../gpt__tiny", "gpt__1.3B__x", "moe__-1B", "bert__0B", "gpt__1e9B"]),
    "--global-batch": st.sampled_from(["0", "-1", "abc", "", "1.5", "nan", "9" * 40, "-9223372036854775809",
                                       "1e3", "inf"]),
    "--seq-len": st.sampled_from(["0", "-5", "x", "", "2.5", "-9" * 20, str(2 ** 21)]),
    "--dtype": st.sampled_from(["fp8", "", "int4", "float128", "bf 16", "--json", "ünï"]),
    "--num-clusters": st.sampled_from(["0", "-1", "x", "", "1.5", "-" + "9" * 30]),
    "-o": st.sampled_from(["nodir/out.parquet", ".", "/", "sub", "sub/", "/proc/self/nope.parquet"]),
}
EXTRA_ARGS = st.sampled_from([[], [], [], ["--bogus"], ["--model"], ["-b"], ["extra-positional"], ["show"],
                              ["--list-models", "--json", "--top", "3"], ["--json"], ["--", "x"], ["-o"]])


@st.composite
def analyze_argv(draw) -> list[str]:
    broken = draw(st.sampled_from(sorted(INVALID)))
    argv: list[str] = []
    for opt in VALID:
        mode = "invalid" if opt == broken else draw(st.sampled_from(["valid", "valid", "omit", "invalid"]))
        if mode == "omit" and opt in ("--model", "--global-batch"):
            mode = "valid"
        if mode != "omit":
            argv += [opt, draw((INVALID if mode == "invalid" else VALID)[opt])]
    order = draw(st.permutations(range(0, len(argv), 2)))
    argv = [tok for i in order for tok in argv[i:i + 2]]
    return argv + draw(EXTRA_ARGS)


def _verify_ops(path):
    read_table(path, "operator_table")


def test_cli_args():
    def body(argv):
        run_and_check(TOOL, argv, extra_setup=lambda root: (root / "sub").mkdir(),
                      allowed_outputs=["out.parquet", "sub/out.parquet"], verify_output=_verify_ops)

    run_cases(TOOL, "cli_args", analyze_argv(), body)


@pytest.mark.slow
def test_absurd_sizes_are_refused_or_analyzed():
    """Type-valid but absurd sizes for a tiny model: a clean refusal, or a complete operator table."""
    cases = st.sampled_from([
        ["--model", "gpt__tiny", "--global-batch", str(2 ** 62)],
        ["--model", "gpt__tiny", "--global-batch", "4", "--seq-len", str(2 ** 40)],
        ["--model", "moe__tiny", "--global-batch", "8", "--num-clusters", str(10 ** 6)],
        ["--model", "wide_resnet__tiny", "--global-batch", "2", "--seq-len", "1"],
        ["--model", "bert__tiny", "--global-batch", "1", "--seq-len", "1", "--num-clusters", "1"],
        ["--model", "gpt__tiny", "--global-batch", str(2 ** 31 - 1), "--dtype", "fp16"],
    ])

    def body(argv):
        run_and_check(TOOL, argv + ["-o", "out.parquet"], allowed_outputs=["out.parquet"], verify_output=_verify_ops)

    run_cases(TOOL, "absurd_sizes", cases, body)


def test_show_mutated_tables(seeds):
    strategy = st.tuples(mutated_table_bytes("operator_table", seeds.ops.table, seeds.ops.metadata),
                         st.sampled_from([[], ["--json"], ["--top", "0"], ["--top", "100000", "--json"], ["--top", "-1"],
                                          ["--json", "--top", "3"]]),
                         st.booleans())

    def body(case):
        data, opts, via_stdin = case
        if via_stdin:
            run_and_check(TOOL, ["show", "-", *opts], stdin=data)
        else:
            run_and_check(TOOL, ["show", "ops.parquet", *opts], {"ops.parquet": data})

    run_cases(TOOL, "show_table", strategy, body)


def test_show_corrupt_bytes(seeds):
    strategy = st.tuples(corrupt_bytes(seeds.ops_bytes), st.sampled_from(["ops.parquet", "ops.csv", "-"]),
                         st.sampled_from([[], ["--json"]]))

    def body(case):
        data, name, opts = case
        if name == "-":
            run_and_check(TOOL, ["show", "-", *opts], stdin=data)
        else:
            run_and_check(TOOL, ["show", name, *opts], {name: data})

    run_cases(TOOL, "show_bytes", strategy, body)


def test_missing_and_special_inputs():
    """A few fixed cases the generators rarely hit: missing file, a directory, stdin empty."""
    for argv in (["show", "missing.parquet"], ["show", "."], ["show", "-"], ["show", "/dev/null"]):
        outcome = run_and_check(TOOL, argv)
        assert outcome.code == 2
