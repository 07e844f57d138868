"""Real tiny training through the live scheduler: arena-schedule serve launches arena-run (on an embedded Ray
whose devices carry the gpu_type:a100 resource), the job trains to completion with checkpoints, and the
scheduler records launch, start and finish."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
import yaml

from libarena.artifacts import Provenance, write_table
from tests.live.test_cli import run

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_real_tiny_training_through_arena_run(tmp_path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "cpu", "node_groups": [{"gpu_type": "a100", "nodes": 1, "gpus_per_node": 2}]}))
    # decision numbers only (a hand-written table): 1 GPU is the best configuration, so no rescale happens
    rows = {"model": ["gpt__tiny"] * 4, "global_batch": [8] * 4, "gpu_type": ["a100"] * 4, "num_gpus": [1, 1, 2, 2],
            "view": ["arena", "ap", "arena", "ap"], "iter_time_s": [0.05, 0.05, 0.08, 0.08],
            "throughput": [160.0, 160.0, 100.0, 100.0]}
    perf = tmp_path / "perf.parquet"
    write_table(perf, "perf_table", pa.table(rows), Provenance(tool="tests"))
    state = tmp_path / "state.db"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "tiny", "model": "gpt__tiny", "global_batch": 8, "iterations": 12}))
    run("submit", job, "--state", state)
    run("serve", "--cluster", cluster, "--perf", perf, "--state", state, "--tick", "2", "--poll", "0.5", "--until-idle",
        "--checkpoint-every", "4", "--overhead", "pruned_ap_search_s=0", "--overhead", "grid_profiling_s=0",
        timeout=480)  # Ray start, JAX compile and the pruned AP search dominate on a loaded 2-core machine
    doc = json.loads(run("status", "--state", state, "--json").stdout)
    (row,) = doc["jobs"]
    assert row["status"] == "finished", row
    log = run("logs", "tiny", "--state", state, "--output-lines", "50").stdout
    assert " launch version=1 gpu_type=a100 num_gpus=1" in log and " finish " in log
    assert "steps 1..12: loss" in log  # arena-run's own output, shown by logs
    ckpt = tmp_path / "state.db.d" / "launcher" / "jobs" / "tiny" / "ckpt"
    assert {p.name for p in ckpt.iterdir() if p.name.isdigit()} >= {"12"}
    report = json.loads((tmp_path / "state.db.d" / "launcher" / "jobs" / "tiny" / "v1" / "report.json").read_text())
    assert report
