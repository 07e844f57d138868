"""Fuzz arena-profile: its options, plans fed to it, perf tables (Parquet/Arrow/CSV) fed to ``show``, and the
``comm`` benchmark's options.

Profiling itself compiles and times stage executables (seconds each), so the plans cases name a device that
does not exist here (``cpu:7``): the plans are read and validated in full, and the run stops right after, at
the device check. Real profiling runs are in tests/profile and in the fault test (test_faults.py).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import strategies as st

from tests.fuzz.corrupt import corrupt_bytes, mutated_csv, mutated_table_bytes, number_text
from tests.fuzz.harness import run_and_check, run_cases

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]
TOOL = "arena-profile"
NO_DEVICE = ["--device", "cpu:7"]

VALID = {
    "--warmup": st.sampled_from(["0", "1", "2"]),
    "--repeats": st.sampled_from(["1", "3"]),
    "--granularity": st.sampled_from(["unit", "stage"]),
    "--statistic": st.sampled_from(["median", "min"]),
    "--timer": st.sampled_from(["auto", "host"]),
    "-o": st.sampled_from(["perf.parquet", "perf.csv"]),
    "--cache-dir": st.sampled_from(["cache"]),
    "--measure-repeats": st.sampled_from(["1", "3"]),
}
INVALID = {
    "--warmup": st.one_of(st.sampled_from(["-1", "x", ""]), number_text.filter(lambda t: not t.strip().isdigit())),
    "--repeats": st.sampled_from(["0", "-3", "x", "", "1.5", "nan"]),
    "--granularity": st.sampled_from(["layer", "", "UNIT ", "op"]),
    "--statistic": st.sampled_from(["mean", "", "p99"]),
    "--timer": st.sampled_from(["cupti-x", "", "wall"]),
    "-o": st.sampled_from(["nodir/perf.parquet", ".", "sub/"]),
    "--cache-dir": st.sampled_from(["/proc/arena-cache", "plans.parquet"]),
    "--measure-repeats": st.sampled_from(["0", "-1", "x"]),
    "--device": st.sampled_from(["cpu:7", "tpu", "cpu:x", "", "local:1", "cpu:-1", "nvidia:9", "cpu:99999999999999999"]),
}
FLAGS = st.lists(st.sampled_from(["--all-frontier", "--exhaustive", "--measure", "--no-dp", "--bogus"]), max_size=2,
                 unique=True)


@st.composite
def profile_argv(draw) -> list[str]:
    argv = ["-i", draw(st.sampled_from(["plans.parquet", "plans.parquet", "-", "missing.parquet", "ops.parquet"]))]
    for opt in VALID:
        mode = draw(st.sampled_from(["valid", "omit", "invalid"]))
        if mode != "omit":
            argv += [opt, draw((INVALID if mode == "invalid" else VALID)[opt])]
    argv += ["--device", draw(INVALID["--device"])]  # never profile for real (see the module docstring)
    argv += draw(st.sampled_from([[], [], ["--ops", "ops.parquet"], ["--ops", "plans.parquet"], ["--comm", "missing"],
                                  ["--comm", "ops.parquet"]]))
    return argv + draw(FLAGS)


def test_cli_args(seeds):
    def body(argv):
        stdin = seeds.plans_bytes if argv[1] == "-" else b""
        run_and_check(TOOL, argv, seeds.plan_files(), stdin=stdin, extra_setup=lambda root: (root / "sub").mkdir(),
                      allowed_outputs=["cache", *(value for flag, value in zip(argv, argv[1:]) if flag == "-o")])

    run_cases(TOOL, "cli_args", profile_argv(), body)


def test_mutated_plans(seeds):
    strategy = st.tuples(st.one_of(mutated_table_bytes("plans", seeds.plans.table, seeds.plans.metadata),
                                   corrupt_bytes(seeds.plans_bytes)),
                         st.sampled_from([[], ["--all-frontier"], ["--exhaustive"], ["--no-dp"]]), st.booleans())

    def body(case):
        data, extra, via_stdin = case
        argv = ["-i", "-" if via_stdin else "plans.parquet", "-o", "perf.parquet", "--cache-dir", "cache",
                *NO_DEVICE, *extra]
        run_and_check(TOOL, argv, seeds.plan_files(**{"plans.parquet": data}), stdin=data if via_stdin else b"",
                      allowed_outputs=["cache"])

    run_cases(TOOL, "plans_table", strategy, body)


def test_show_mutated_perf_tables(seeds):
    strategy = st.tuples(st.one_of(mutated_table_bytes("perf_table", seeds.perf.table, seeds.perf.metadata),
                                   corrupt_bytes(seeds.perf_bytes)),
                         st.sampled_from([[], ["--json"]]), st.booleans())

    def body(case):
        data, extra, via_stdin = case
        if via_stdin:
            outcome = run_and_check(TOOL, ["show", "-", *extra], stdin=data)
        else:
            outcome = run_and_check(TOOL, ["show", "perf.parquet", *extra], {"perf.parquet": data})
        if outcome.code == 0 and extra:
            json.loads(outcome.stdout)

    run_cases(TOOL, "perf_show", strategy, body)


def test_show_mutated_perf_csv(seeds):
    header, rows = seeds.perf_csv()

    def body(data):
        run_and_check(TOOL, ["show", "perf.csv"], {"perf.csv": data})

    run_cases(TOOL, "perf_csv", mutated_csv(header, rows), body)


COMM_OPTIONS = {
    "--devices": number_text, "--min-bytes": number_text, "--max-bytes": number_text, "--points": number_text,
    "--repeats": number_text,
}


@st.composite
def comm_argv(draw) -> list[str]:
    argv = ["comm", "-o", draw(st.sampled_from(["comm.parquet", "nodir/c.parquet", "."]))]
    for opt in draw(st.lists(st.sampled_from(sorted(COMM_OPTIONS)), min_size=1, max_size=3, unique=True)):
        argv += [opt, draw(COMM_OPTIONS[opt])]
    # a device that is not here, or more devices than this process has: the benchmark never runs for real
    argv += draw(st.sampled_from([["--device", "tpu"], ["--device", "cpu:3"], ["--device", ""],
                                  ["--devices", "4096"], ["--devices", "0"], ["--devices", "-2"]]))
    return argv


def test_comm_options():
    def body(argv):
        run_and_check(TOOL, argv, allowed_outputs=["comm.parquet"])

    run_cases(TOOL, "comm_args", comm_argv(), body)
