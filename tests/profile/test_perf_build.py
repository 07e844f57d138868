"""perf build: analyze -> plan -> roofline/profiled rows for a trace, then the simulator runs on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from libarena.artifacts import read_table
from libarena.hardware import cluster_from_dict

CLUSTER = {"name": "small-hetero", "node_groups": [
    {"gpu_type": "a100", "nodes": 2, "gpus_per_node": 4},
    {"gpu_type": "a10", "nodes": 4, "gpus_per_node": 2},
]}


@pytest.fixture(scope="module")
def moe_tiny_plans():
    from libarena.analyze import AnalyzeConfig, analyze_model
    from libarena.plan import PlannerConfig, load_model_profile, plan_job

    profile = load_model_profile(analyze_model(AnalyzeConfig("moe__tiny", 32)))
    cluster = cluster_from_dict(CLUSTER)
    return profile, plan_job(profile, cluster, PlannerConfig(max_gpus=8)), cluster


def test_roofline_rows_cover_every_configuration(moe_tiny_plans):
    from libarena.profile.roofline import roofline_rows

    profile, planset, cluster = moe_tiny_plans
    rows = roofline_rows(profile, planset, cluster)
    configurations = {(g.grid.gpu_type, g.grid.num_gpus, g.grid.num_nodes) for g in planset.grids}
    for key in configurations:
        views = {r["view"] for r in rows if (r["gpu_type"], r["num_gpus"], r["num_nodes"]) == key}
        assert {"dp", "ap", "arena"} <= views, key
    for r in rows:
        assert r["estimated"] and r["timer"] == "roofline" and r["iter_time_s"] > 0
        assert r["throughput"] == pytest.approx(32 / r["iter_time_s"])
    # The ap view is the best plan the planner found for a configuration: never slower than its proxies.
    for key in configurations:
        same = [r for r in rows if (r["gpu_type"], r["num_gpus"], r["num_nodes"]) == key]
        ap = min(r["iter_time_s"] for r in same if r["view"] == "ap")
        assert ap <= min(r["iter_time_s"] for r in same if r["view"] == "arena") + 1e-12
    # A faster GPU is faster: an A100 beats an A10 on the same count.
    def best(gpu: str, n: int) -> float:
        return min(r["iter_time_s"] for r in rows if r["gpu_type"] == gpu and r["num_gpus"] == n and r["view"] == "ap")
    assert best("a100", 2) < best("a10", 2)


def test_roofline_phase_times_lie_between_pure_compute_and_unfused_memory_traffic(moe_tiny_plans):
    import numpy as np

    from libarena.hardware import get_gpu
    from libarena.profile.roofline import phase_seconds

    profile = moe_tiny_plans[0]
    gpu = get_gpu("a100")
    compute, optimizer, forward = phase_seconds(profile, "a100")
    total = compute + optimizer
    flops_only = np.bincount(profile.op_cluster[profile.op_cluster >= 0], profile.op_flops[profile.op_cluster >= 0],
                             minlength=profile.num_clusters) / gpu.peak(profile.dtype)
    assert np.all(total >= flops_only * (1 - 1e-9))
    assert np.all(total <= profile.loads(gpu) * (1 + 1e-9))
    # Fusion keeps a real model's elementwise traffic off the memory bus: strictly less than unfused.
    assert total.sum() < 0.8 * profile.loads(gpu).sum()
    assert optimizer.sum() > 0
    # the forward pass (what a recomputing stage runs again) is part of the forward + backward time
    assert forward.sum() > 0 and np.all(forward <= compute * (1 + 1e-9))


def test_roofline_estimate_follows_the_1f1b_formula(moe_tiny_plans):
    from libarena.profile.roofline import RooflineConfig, roofline_iteration

    profile, planset, _ = moe_tiny_plans
    plan = next(g.proxy for g in planset.grids if g.proxy is not None and g.grid.pipeline_degree == 2)
    slow = roofline_iteration(profile, plan, RooflineConfig(achieved_fraction=0.25))
    fast = roofline_iteration(profile, plan, RooflineConfig(achieved_fraction=0.5))
    # Halving the attained fraction doubles compute and optimizer time; communication stays.
    compute_fast = fast.iter_time_s - fast.grad_sync_s
    assert slow.iter_time_s > fast.iter_time_s
    assert slow.grad_sync_s == pytest.approx(fast.grad_sync_s)
    assert slow.optimizer_s == pytest.approx(2 * fast.optimizer_s)
    assert compute_fast > 0


@pytest.mark.slow
def test_perf_build_then_simulate_end_to_end(tmp_path: Path):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps(CLUSTER))
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
        "j1,0,2000,gpt__tiny,100000,16,2,a100\n"
        "j2,10,3000,moe__tiny,100000,32,4,a10\n"
        "j3,20,1000,gpt__tiny,100000,16,1,a10\n"
    )
    perf = tmp_path / "perf.parquet"
    cache = tmp_path / "cache"
    arena_schedule = str(Path(sys.executable).parent / "arena-schedule")
    build = [arena_schedule, "perf", "build", "--trace", str(trace), "--cluster", str(cluster), "-o", str(perf),
             "--mode", "roofline", "--cache-dir", str(cache)]
    first = subprocess.run(build, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert "analyzing" in first.stderr
    table = read_table(perf, "perf_table").table
    assert {(m, b) for m, b in zip(table.column("model").to_pylist(), table.column("global_batch").to_pylist())} == {
        ("gpt__tiny", 16), ("moe__tiny", 32)}
    # Unchanged inputs: the operator tables come from the cache.
    second = subprocess.run(build, capture_output=True, text=True)
    assert second.returncode == 0 and "analyzing" not in second.stderr
    assert read_table(perf, "perf_table").table.equals(table)
    out = tmp_path / "run"
    sim = subprocess.run([arena_schedule, "simulate", "--trace", str(trace), "--perf", str(perf), "--cluster", str(cluster),
                          "--policy", "arena", "-o", str(out), "--json"], capture_output=True, text=True)
    assert sim.returncode == 0, sim.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["finished_jobs"] == 3


def test_perf_build_rejects_unknown_mode_and_dtype():
    from libarena.errors import ArenaError
    from libarena.pipeline.perf_build import PerfBuildConfig

    with pytest.raises(ArenaError, match="unknown perf build mode"):
        PerfBuildConfig(mode="guess")
    with pytest.raises(ArenaError, match="unknown dtype 'fp8'"):
        PerfBuildConfig(dtype="fp8")


def test_fp16_tables_let_volta_use_its_tensor_cores(tmp_path: Path):
    """A V100 has fp16 tensor cores and no bf16: its bf16 rows run at the fp32 peak, its fp16 rows several times
    faster; an A100's rows are the same in both (equal bf16 and fp16 peaks)."""
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.perf_build import PerfBuildConfig, pair_rows

    cluster = cluster_from_dict({"name": "volta-ampere", "node_groups": [
        {"gpu_type": "a100", "nodes": 1, "gpus_per_node": 4}, {"gpu_type": "v100", "nodes": 1, "gpus_per_node": 4}]})
    cache = CacheSettings(tmp_path / "cache")

    def best(dtype: str) -> dict[str, float]:
        rows = pair_rows("gpt__small", 16, cluster, PerfBuildConfig(mode="roofline", dtype=dtype), cache)
        out: dict[str, float] = {}
        for r in rows:
            if r["iter_time_s"] > 0 and r["fits_in_memory"]:
                out[r["gpu_type"]] = min(out.get(r["gpu_type"], float("inf")), r["iter_time_s"])
        return out

    bf16, fp16 = best("bf16"), best("fp16")
    assert fp16["a100"] == pytest.approx(bf16["a100"], rel=0.05)
    assert fp16["v100"] < 0.5 * bf16["v100"]


def test_dp_view_shards_adam_state_only_when_the_replicated_state_does_not_fit():
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan import load_model_profile
    from libarena.plan import Grid
    from libarena.profile.roofline import RooflineConfig, priced_data_parallel_plan, roofline_iteration
    from tests.plan.optables import cluster_record, operator_table

    def profile(total_params: float):
        records = [cluster_record(i, flops=1e13, bytes_=1e9, param_count=total_params / 4) for i in range(4)]
        return load_model_profile(operator_table(records, global_batch=64))

    def dp_plan_estimate(model_profile, gpus: int, config: RooflineConfig):
        grid = Grid(model_profile.name, 64, "a100", gpus, max(1, gpus // 8), 8, 1)
        plan, fits = priced_data_parallel_plan(model_profile, grid, comm, config)
        return roofline_iteration(model_profile, plan, config), fits

    comm, plain = AlphaBetaCommModel(), RooflineConfig(dp_zero=False)
    # 2.5B fp32 parameters: 20 GB of weights + gradients and 20 GB of Adam state exceed an A100-40GB's 36 GB;
    # with the Adam state sharded over 8 replicas (2.5 GB each) they fit.
    big = profile(2.5e9)
    assert not dp_plan_estimate(big, 8, plain)[1]
    zero_estimate, fits = dp_plan_estimate(big, 8, RooflineConfig())
    assert fits
    assert not dp_plan_estimate(big, 1, RooflineConfig())[1]  # one GPU has nothing to shard with
    # A model whose replicated state fits is priced exactly as before (no ZeRO, same time).
    small = profile(1e9)
    assert dp_plan_estimate(small, 8, RooflineConfig())[0].iter_time_s == pytest.approx(
        dp_plan_estimate(small, 8, plain)[0].iter_time_s)
    assert zero_estimate.iter_time_s > 0


def test_recomputing_plans_pay_a_forward_pass_and_the_dp_view_recomputes_where_memory_needs_it():
    from dataclasses import replace

    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan import Grid, load_model_profile
    from libarena.profile.estimate import PlanEstimate, perf_row
    from libarena.profile.roofline import RooflineConfig, phase_seconds, priced_data_parallel_plan, roofline_iteration
    from tests.plan.optables import gpt_like

    profile = load_model_profile(gpt_like(num_clusters=4, hidden=2048, seq_len=1024, batch=2048))
    comm = AlphaBetaCommModel()
    grid = Grid(profile.name, 2048, "a10", 4, 2, 2, 1)
    # 146 GB of activations per layer at this batch: data parallelism on four A10s fits only when it recomputes
    plain, plain_fits = priced_data_parallel_plan(profile, grid, comm, RooflineConfig(dp_remat=False))
    assert not plain_fits
    plan, fits = priced_data_parallel_plan(profile, grid, comm, RooflineConfig())
    assert fits and plan.recomputes and plan.stages[0].remat
    # the recomputing plan runs its forward pass once more: exactly the forward seconds longer per step
    slow = roofline_iteration(profile, plan, RooflineConfig(achieved_fraction=1.0))
    fast = roofline_iteration(profile, replace(plan, stages=(replace(plan.stages[0], remat=False),)), RooflineConfig(achieved_fraction=1.0))
    forward = float(phase_seconds(profile, "a10")[2].sum()) / 4  # spread over the 4 GPUs
    assert slow.iter_time_s - fast.iter_time_s == pytest.approx(forward, rel=1e-6)
    row = perf_row(PlanEstimate(plan, slow, fits, [], "roofline", True, 0.0), "dp", 0.0)
    assert row["recomputes"] is True and row["fits_in_memory"] is True


def test_alpa_export_refuses_a_plan_that_recomputes_in_some_stages_only(moe_tiny_plans):
    from dataclasses import replace

    from libarena.errors import ArenaError
    from libarena.plan.export import export_alpa

    _, planset, _ = moe_tiny_plans
    plan = next(p for p in planset.plans() if p.pipeline_degree == 2)
    assert export_alpa(planset, plan)["remat_layer"] is False
    everywhere = replace(plan, stages=tuple(replace(st, remat=True) for st in plan.stages))
    assert export_alpa(planset, everywhere)["remat_layer"] is True
    mixed = replace(plan, stages=(replace(plan.stages[0], remat=True), *plan.stages[1:]))
    with pytest.raises(ArenaError, match="some stages only"):
        export_alpa(planset, mixed)
