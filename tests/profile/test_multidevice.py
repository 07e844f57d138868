"""Several host devices (subprocesses with XLA_FLAGS): the collective benchmark and direct measurement."""

from __future__ import annotations

import pytest

from libarena.artifacts import read_table


@pytest.mark.multidevice
def test_comm_benchmark_writes_an_interpolatable_comm_table(tmp_path):
    from libarena.hardware.comm import PRIMITIVES, load_comm_model
    from libarena.profile import CommBenchConfig, write_comm_table

    path = tmp_path / "comm.parquet"
    n = write_comm_table(str(path), CommBenchConfig(num_devices=2, min_bytes=1024, max_bytes=65536, points=2, repeats=3))
    art = read_table(path, "comm_table")
    rows = art.table.to_pylist()
    assert n == len(rows) == 2 * len(PRIMITIVES)
    assert {r["primitive"] for r in rows} == set(PRIMITIVES)
    assert all(r["gpu_type"] == "cpu" and r["num_devices"] == 2 and r["latency_s"] > 0 and r["timer"] == "host" for r in rows)
    model = load_comm_model(str(path))
    assert model.covers("cpu") and model.source("all-reduce", 2, "cpu", False) == "measured"
    mid = model.time("all-reduce", 8192.0, 2, "cpu", False)
    lo, hi = sorted(r["latency_s"] for r in rows if r["primitive"] == "all-reduce")
    assert lo <= mid <= hi


@pytest.mark.multidevice
@pytest.mark.slow
def test_direct_measurement_of_a_two_stage_pipeline(tmp_path):
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table
    from libarena.profile.measure import measure_in_subprocess

    plans = [p for p in enumerate_grid_plans("gpt__tiny", 8, 2, "cpu", 2) if p.pipeline_degree == 2]
    path = tmp_path / "plans.parquet"
    write_plans_table(str(path), "gpt__tiny", 8, plans, model_clusters("gpt__tiny", 8, num_clusters=2))
    grid = {"model": "gpt__tiny", "global_batch": 8, "gpu_type": "cpu", "num_gpus": 2, "num_nodes": 1}
    (result,) = measure_in_subprocess(path, [(grid, plans[0].plan_id)], 2, warmup=1, repeats=2, stage_times=True)
    # The runtime's own executor ran it (no second pipeline runner in the profiler).
    assert result["runner"] == "libarena.run.measure_plan"
    assert result["plan_id"] == plans[0].plan_id and len(result["samples_s"]) == 2
    assert 0 < result["iter_time_s"] < result["first_step_s"] < result["wall_s"]
    assert result["device_s"] == pytest.approx(2 * result["wall_s"])
    # asked for: each stage's busy time in one more step run task by task (both stages worked)
    assert len(result["stage_busy_s"]) == 2 and all(0 < t < result["first_step_s"] for t in result["stage_busy_s"])
