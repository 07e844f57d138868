"""A handful of cases per tool through the real console scripts (subprocess): the in-process harness sees
what users see — exit code, one line on stderr, no traceback, no partial output."""

from __future__ import annotations

import pytest

from tests.fuzz.harness import check_contract, invoke, invoke_script, workdir

pytestmark = [pytest.mark.fuzz, pytest.mark.xdist_group("fuzz")]

TRUNCATED = "truncated.parquet"
CASES = [
    ("arena-analyze", ["--model", "gpt__nope", "--global-batch", "8", "-o", "out.parquet"], b""),
    ("arena-analyze", ["--model", "gpt__tiny", "--global-batch", str(2 ** 62), "-o", "out.parquet"], b""),
    ("arena-analyze", ["show", TRUNCATED], b""),
    ("arena-plan", ["--ops", "-", "--cluster", "cluster.yaml", "-o", "plans.parquet"], b"PAR1 not really"),
    ("arena-plan", ["--ops", "ops.parquet", "--cluster", "bad.yaml", "-o", "plans.parquet"], b""),
    ("arena-plan", ["show", TRUNCATED], b""),
    ("arena-profile", ["-i", TRUNCATED, "-o", "perf.parquet"], b""),
    ("arena-profile", ["show", "bad.csv"], b""),
    ("arena-profile", ["-i", "plans.parquet", "--repeats", "0", "-o", "perf.parquet"], b""),
    ("arena-schedule", ["trace", "stats", "bad.csv"], b""),
    ("arena-schedule", ["simulate", "--trace", "bad.csv", "--perf", "perf.parquet", "--cluster", "cluster.yaml",
                        "-o", "run"], b""),
    ("arena-schedule", ["submit", "bad.yaml", "--state", "state.db"], b""),
    ("arena-schedule", ["status", "--state", TRUNCATED], b""),
    ("arena-run", ["--plan", TRUNCATED, "--model", "gpt__tiny", "--global-batch", "8", "--steps", "1",
                   "--checkpoint-dir", "ckpt", "--grid", "a40,1,1", "--no-ray"], b""),
    ("arena-run", ["--plan", "plans.parquet", "--model", "gpt__tiny", "--global-batch", "8", "--steps", "1",
                   "--checkpoint-dir", "ckpt", "--grid", "a40,x", "--no-ray"], b""),
    ("arena-run", ["--steps", "nope"], b""),
]


@pytest.mark.slow
@pytest.mark.parametrize("tool,argv,stdin", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_console_script_matches_in_process(seeds, tool, argv, stdin):
    files = {"ops.parquet": seeds.ops_bytes, "plans.parquet": seeds.plans_bytes, "perf.parquet": seeds.perf_bytes,
             "cluster.yaml": seeds.cluster_yaml.read_bytes(), TRUNCATED: seeds.plans_bytes[: len(seeds.plans_bytes) // 2],
             "bad.yaml": b"node_groups: [{gpu_type: a40, nodes: -1}]\n", "bad.csv": b"job_id,submission_time\n\xff\xfe,1\n"}
    with workdir(files) as (root, before):
        script = invoke_script(tool, argv, stdin=stdin, cwd=root)
        check_contract(tool, script, before, root)
    with workdir(files) as (root, before):
        in_process = invoke(tool, argv, stdin=stdin, cwd=root)
        check_contract(tool, in_process, before, root)
    assert script.code == in_process.code == 2, (script.describe(), in_process.describe())
    assert script.stderr.strip() == in_process.stderr.strip()
