"""Planner properties on random operator tables and known answers on hand-made ones."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from libarena.errors import ArenaError
from libarena.hardware import cluster_from_dict, get_gpu
from libarena.hardware.comm import AlphaBetaCommModel
from dataclasses import replace

from libarena.artifacts import Provenance
from libarena.plan import PlannerConfig, load_model_profile, plan_job, write_plans
from libarena.plan.planner import communication_load
from tests.plan.optables import cluster_record, gpt_like, operator_table, transformer_cluster
from tests.plan.strategies import clusters, operator_tables


def _single(gpu_type: str, nodes: int, per_node: int):
    return cluster_from_dict({"name": "test", "node_groups": [{"gpu_type": gpu_type, "nodes": nodes, "gpus_per_node": per_node}]})


def _check_planset(planset, config: PlannerConfig, num_clusters: int):
    for result in planset.grids:
        grid = result.grid
        if not result.feasible:
            if result.infeasible_reason.startswith("global batch"):
                assert result.infeasible_reason == config.too_few_microbatches(grid.pipeline_degree, planset.global_batch)
                continue
            assert result.infeasible_reason.startswith("out of memory")
            assert result.plans_out_of_memory == result.plans_considered > 0
            continue
        capacity = get_gpu(grid.gpu_type).memory_bytes * config.usable_memory_fraction
        proxies = [p for p in result.plans if p.is_proxy]
        assert len(proxies) == 1
        front = result.frontier
        assert proxies[0] in front
        assert proxies[0].computation_bias <= min(p.computation_bias for p in front) + 1e-9
        if config.frontier_cap:
            assert len(front) <= config.frontier_cap
        for plan in result.plans:
            # Priced at the micro-batches the runtime runs: whole ones, split evenly over each stage's replicas.
            B = plan.num_microbatches
            assert B == config.microbatches(grid.pipeline_degree, planset.global_batch)
            assert planset.global_batch % B == 0 and all((planset.global_batch // B) % st.dp == 0 for st in plan.stages)
            assert sum(plan.gpus_per_stage) == grid.num_gpus
            assert all(c > 0 and c & (c - 1) == 0 for c in plan.gpus_per_stage)
            assert len(plan.stages) == grid.pipeline_degree
            assert plan.stages[0].first_cluster == 0 and plan.stages[-1].end_cluster == num_clusters
            for a, b in zip(plan.stages, plan.stages[1:]):
                assert a.end_cluster == b.first_cluster and a.first_cluster < a.end_cluster
            for st in plan.stages:
                assert st.dp * st.tp == st.num_gpus
                assert st.gpu_offset % st.num_gpus == 0
                assert st.memory_bytes <= capacity
            assert plan.memory_per_gpu_bytes <= capacity
            assert sorted(st.gpu_offset for st in plan.stages) == sorted(
                set(st.gpu_offset for st in plan.stages)
            )
            expected = communication_load(
                np.array([[st.comm_per_microbatch_s for st in plan.stages]]),
                np.array([[st.grad_sync_s for st in plan.stages]]),
                plan.num_microbatches,
            )[0]
            assert plan.communication_load == pytest.approx(expected)
        for p in front:  # mutually non-dominated
            for q in front:
                if p is not q:
                    dominated = (
                        q.computation_bias <= p.computation_bias
                        and q.communication_load <= p.communication_load
                        and (q.computation_bias < p.computation_bias or q.communication_load < p.communication_load)
                    )
                    assert not dominated


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operator_tables(), cluster=clusters())
def test_random_tables_give_valid_frontiers(ops, cluster):
    config = PlannerConfig(max_gpus=8, frontier_cap=3)
    planset = plan_job(ops, cluster, config)
    assert planset.grids
    _check_planset(planset, config, len(ops.metadata["clusters"]))
    again = plan_job(ops, cluster, config)
    assert [p.plan_id for g in again.grids for p in g.plans] == [p.plan_id for g in planset.grids for p in g.plans]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operator_tables(max_clusters=5))
def test_vectorised_plans_match_the_exhaustive_reference(ops):
    cluster = _single("a40", 2, 2)
    fast = plan_job(ops, cluster, PlannerConfig(max_gpus=4, frontier_cap=0))
    slow = plan_job(ops, cluster, PlannerConfig(max_gpus=4, frontier_cap=0, exhaustive=True))
    for quick, full in zip(fast.grids, slow.grids, strict=True):
        assert quick.grid == full.grid
        def structure(p):
            return (tuple(p.stage_boundaries), tuple(p.gpus_per_stage), tuple(p.dp_per_stage), tuple(p.tp_per_stage),
                    tuple(p.zero_per_stage), tuple(p.remat_per_stage))

        by_structure = {structure(p): p for p in full.plans}
        assert len(by_structure) == len(full.plans)  # the key tells every plan apart
        for plan in quick.plans:
            twin = by_structure[structure(plan)]
            assert twin.plan_id == plan.plan_id
            assert twin.computation_bias == pytest.approx(plan.computation_bias, abs=1e-9)
            assert twin.communication_load == pytest.approx(plan.communication_load, rel=1e-9, abs=1e-15)
            assert twin.memory_per_gpu_bytes == pytest.approx(plan.memory_per_gpu_bytes)
        # a partition whose closest assignment does not fit takes the closest one that does: a grid is
        # infeasible only when no plan at all fits, and then both name (at most) the same least memory
        assert quick.feasible == full.feasible
        if quick.feasible:
            # The proxy's b_comp is the smallest any feasible plan of the grid reaches with its partition's
            # normalised assignment; exhaustive plans can only tie or beat it by using other assignments.
            assert min(p.computation_bias for p in full.plans) <= quick.proxy.computation_bias + 1e-9
        elif not quick.infeasible_reason.startswith("global batch"):
            assert quick.min_memory_bytes <= full.min_memory_bytes * (1 + 1e-9)
        assert quick.plans_out_of_memory <= quick.plans_considered


def test_balanced_model_gets_an_even_split():
    ops = gpt_like(num_clusters=16, hidden=1024, seq_len=512, batch=256)
    planset = plan_job(ops, _single("a100", 4, 4), PlannerConfig(gpu_types=("a100",), num_gpus=(16,), pipeline_degrees=(4,)))
    (result,) = planset.grids
    proxy = result.proxy
    assert proxy.gpus_per_stage == [4, 4, 4, 4]
    assert proxy.stage_boundaries == [0, 4, 8, 12]
    assert proxy.computation_bias == pytest.approx(0.0, abs=1e-12)
    # Each 4-GPU stage is one whole node: every P2P crosses nodes (ConnectX); the sending stage's dp replicas
    # each send their share of one micro-batch's activation at once, all through the node's one adapter.
    act = ops.metadata["clusters"][0]["activation_bytes"]
    assert proxy.dp_per_stage[0] > 1
    expected = AlphaBetaCommModel().time("p2p", act / 16, 2, "a100", crosses_nodes=True)
    assert proxy.p2p_per_microbatch_s == pytest.approx((expected,) * 3)
    assert sorted(st.gpu_offset for st in proxy.stages) == [0, 4, 8, 12]


def test_heavy_last_layer_gets_more_gpus():
    records = [transformer_cluster(i, 1024, 512, 64) for i in range(7)]
    heavy = transformer_cluster(7, 1024, 512, 64, layers=7)
    heavy["index"] = 7
    ops = operator_table(records + [heavy], global_batch=64, seq_len=512)
    planset = plan_job(ops, _single("a100", 2, 4), PlannerConfig(num_gpus=(8,), pipeline_degrees=(3,)))
    proxy = planset.grids[0].proxy
    assert proxy.gpus_per_stage[-1] > max(proxy.gpus_per_stage[:-1])
    assert proxy.stage_boundaries[-1] == 7  # the heavy layer alone in the last stage


def test_over_large_model_gets_tp_or_pp_but_no_dp_only_plan():
    # ~9.7B parameters (16 B/param with Adam: 155 GB): pure DP cannot fit on 24 GB A10s, even with ZeRO-1
    # (weights + gradients alone are 38.6 GB per GPU); TP or PP spread the weights (the paper's Case 2).
    ops = gpt_like(num_clusters=16, hidden=8192, seq_len=256, batch=32, layers_per_cluster=1)
    planset = plan_job(ops, _single("a10", 8, 2), PlannerConfig(num_gpus=(16,)))
    plans = [p for g in planset.grids for p in g.plans]
    assert plans, "some TP or PP plan must fit"
    dp_only = [p for p in plans if p.grid.pipeline_degree == 1 and all(t == 1 for t in p.tp_per_stage)]
    assert dp_only == []
    s1 = planset.grid("a10", 16, 1)
    assert not s1.feasible or all(t > 1 for p in s1.plans for t in p.tp_per_stage)
    assert any(p.grid.pipeline_degree > 1 or max(p.tp_per_stage) > 1 for p in plans)


def test_zero_is_chosen_only_when_memory_needs_it():
    ops = gpt_like(num_clusters=4, hidden=4096, seq_len=128, batch=64)
    roomy = plan_job(ops, _single("h100", 1, 8), PlannerConfig(num_gpus=(8,), pipeline_degrees=(1,)))
    assert roomy.grids[0].proxy.zero_per_stage == [0]
    tight = plan_job(ops, _single("a10", 4, 2), PlannerConfig(num_gpus=(8,), pipeline_degrees=(1,)))
    proxy = tight.grids[0].proxy
    assert proxy is not None and (proxy.zero_per_stage == [1] or proxy.tp_per_stage[0] > 1)
    no_zero = plan_job(ops, _single("a10", 4, 2), PlannerConfig(num_gpus=(8,), pipeline_degrees=(1,), allow_zero=False))
    assert all(z == 0 for g in no_zero.grids for p in g.plans for z in p.zero_per_stage)


def test_moe_all_to_all_is_charged_under_data_parallelism():
    dense = [transformer_cluster(i, 1024, 1024, 256) for i in range(4)]
    moe = [transformer_cluster(i, 1024, 1024, 256, moe_experts=4) for i in range(4)]
    cfg = PlannerConfig(num_gpus=(4,), pipeline_degrees=(1,))
    cluster = _single("a100", 2, 4)
    p_dense = plan_job(operator_table(dense), cluster, cfg).grids[0].proxy
    p_moe = plan_job(operator_table(moe), cluster, cfg).grids[0].proxy
    assert p_moe.dp_per_stage[0] > 1 and p_moe.stages[0].comm_per_microbatch_s > 0
    assert p_moe.communication_load > p_dense.communication_load


def test_model_that_fits_nowhere_lists_every_grid_infeasible():
    ops = gpt_like(num_clusters=4, hidden=16384, seq_len=128, batch=16)
    planset = plan_job(ops, _single("t4", 2, 2), PlannerConfig())
    assert planset.grids and not any(g.feasible for g in planset.grids)
    for g in planset.grids:
        assert "out of memory" in g.infeasible_reason and "t4" in g.infeasible_reason
        assert g.min_memory_bytes > get_gpu("t4").memory_bytes * 0.9
    table = planset.to_table()
    assert table.num_rows == len(planset.grids) and not any(table.column("feasible").to_pylist())



def test_a_partition_whose_closest_assignment_does_not_fit_takes_the_closest_that_does():
    """The last cluster holds 3e9 parameters (about 45 GiB with its optimizer state: too much for one 48 GB
    A40) and almost no load, so the load-proportional assignment gives it one GPU; two GPUs (tensor-parallel)
    hold it. The grid is feasible, with the last stage on two GPUs, as the exhaustive enumeration finds."""
    ops = operator_table([cluster_record(0, flops=5e15, bytes_=1e9, param_count=1e6),
                          cluster_record(1, flops=3e15, bytes_=1e9, param_count=1e6),
                          cluster_record(2, flops=1e12, bytes_=1e9, param_count=3e9)], global_batch=64)
    config = PlannerConfig(num_gpus=(4,), pipeline_degrees=(3,))
    (grid,) = plan_job(ops, _single("a40", 1, 4), config).grids
    (full,) = plan_job(ops, _single("a40", 1, 4), replace(config, exhaustive=True)).grids
    assert grid.feasible and full.feasible
    assert grid.proxy.gpus_per_stage == [1, 1, 2] and grid.proxy.plan_id in {p.plan_id for p in full.plans}
    # where no assignment fits, the message names the least memory any needs, not only the closest one's
    heavy = operator_table([cluster_record(0, flops=5e15, bytes_=1e9, param_count=1e6),
                            cluster_record(1, flops=3e15, bytes_=1e9, param_count=1e6),
                            cluster_record(2, flops=1e12, bytes_=1e9, param_count=7e9)], global_batch=64)
    (grid,) = plan_job(heavy, _single("a40", 1, 4), config).grids
    (full,) = plan_job(heavy, _single("a40", 1, 4), replace(config, exhaustive=True)).grids
    assert not grid.feasible and not full.feasible and "out of memory" in grid.infeasible_reason
    assert grid.min_memory_bytes == pytest.approx(full.min_memory_bytes)

def test_frontier_cap_keeps_the_proxy():
    rng = np.random.default_rng(3)
    records = [
        cluster_record(i, flops=float(rng.uniform(1e13, 1e15)), bytes_=1e10, param_count=int(rng.uniform(1e7, 2e8)),
                       activation_bytes=1e8, saved_activation_bytes=1e9, tp_allreduce_bytes=4e8)
        for i in range(12)
    ]
    ops = operator_table(records, global_batch=256)
    cluster = _single("v100", 1, 16)
    full = plan_job(ops, cluster, PlannerConfig(num_gpus=(16,), pipeline_degrees=(5,), frontier_cap=0)).grids[0]
    capped = plan_job(ops, cluster, PlannerConfig(num_gpus=(16,), pipeline_degrees=(5,), frontier_cap=2)).grids[0]
    assert len(capped.plans) == min(2, len(full.plans))
    assert capped.proxy.plan_id == full.proxy.plan_id
    assert {p.plan_id for p in capped.plans} <= {p.plan_id for p in full.plans}


def test_roofline_loads_charge_zero_flop_ops_bytes_over_bandwidth():
    records = [cluster_record(0, flops=0.0, bytes_=1e9), cluster_record(1, flops=1e12, bytes_=1e6)]
    profile = load_model_profile(operator_table(records))
    gpu = get_gpu("a100")
    loads = profile.loads(gpu)
    # cluster 0: only bytes (the optimizer op has no params here): 1e9 / HBM bandwidth
    assert loads[0] == pytest.approx(1e9 / gpu.hbm_bandwidth)
    # cluster 1: compute bound: FLOPs / peak (bf16)
    assert loads[1] == pytest.approx(1e12 / gpu.peak("bf16"), rel=1e-3)


def test_fused_loads_charge_bytes_only_where_they_reach_memory_after_fusion():
    # Per cluster (optables.operator_rows): two dots and a copy (kept by fusion: all their bytes) and an
    # elementwise optimizer add, which after fusion moves only the parameter buffers it touches.
    records = [cluster_record(0, flops=0.0, bytes_=1e9, param_count=1e6), cluster_record(1, flops=1e12, bytes_=1e6, param_count=2e6)]
    for rec in records:
        rec["optimizer_flops"], rec["optimizer_bytes"] = 1e6, 1e10
    profile = load_model_profile(operator_table(records))
    gpu = get_gpu("a100")
    compute, optimizer = profile.fused_loads(gpu)
    peak, bw = gpu.peak("bf16"), gpu.hbm_bandwidth
    assert compute[0] == pytest.approx(1e9 / bw)  # zero-FLOP dots and copy: bytes over bandwidth
    assert compute[1] == pytest.approx(1e12 / peak + 1e5 / bw, rel=1e-6)  # dots compute-bound, the copy not
    # The unfused add charges 1e10 bytes; fused, only the 4-byte parameters it reads (param_bytes).
    assert optimizer == pytest.approx([max(1e6 / peak, 4e6 / bw), max(1e6 / peak, 8e6 / bw)])
    unfused = profile.loads(gpu)
    assert np.all(compute + optimizer <= unfused * (1 + 1e-12))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda m: m.pop("clusters"), "no 'clusters'"),
        (lambda m: m.update(clusters=[]), "no clusters"),
        (lambda m: m["clusters"][0].pop("param_count"), "missing field"),
        (lambda m: m["clusters"][1].update(index=5), "index is 5"),
        (lambda m: m["clusters"][0].update(flops=-1.0), "non-negative"),
        (lambda m: m.update(dtype="int3"), "unknown dtype"),
        (lambda m: m.update(global_batch=0), "global_batch"),
        # what a plans file's readers would refuse is refused before it is written
        (lambda m: m.update(global_batch=10**30), r"global_batch must be an integer in \[1, 1048576\], got 1000000"),
        (lambda m: m.update(seq_len=-3), r"seq_len must be an integer in \[0, 1048576\], got -3"),
        (lambda m: m.update(seq_len="64"), "seq_len must be an integer"),
        (lambda m: m["clusters"][1].update(units=[]), r"clusters\[1\] must be a record with a non-empty list of 'units'"),
    ],
)
def test_bad_operator_tables_are_one_line_errors(mutate, message):
    ops = gpt_like(num_clusters=3, hidden=256, seq_len=64, batch=8)
    mutate(ops.metadata)
    with pytest.raises(ArenaError, match=message):
        load_model_profile(ops)


@pytest.mark.parametrize("values, message", [
    ([None], r"row 1, column 'cluster': a missing value is not a cluster index"),
    ([7], r"row 1, column 'cluster': 7 is not a cluster index \(0\.\.2\)"),
    ([2 ** 62], r"row 1, column 'cluster': 4611686018427387904 is not a cluster index"),
])
def test_a_bad_cluster_index_is_a_one_line_error_without_warnings(values, message):
    """A null cluster index reads as NaN: it is named as missing, not cast to a number (which also warned)."""
    import warnings

    import pyarrow as pa

    ops = gpt_like(num_clusters=3, hidden=256, seq_len=64, batch=8)
    cluster = ops.table.column("cluster").to_pylist()
    ops.table = ops.table.set_column(ops.table.column_names.index("cluster"), "cluster",
                                     pa.array(values + cluster[len(values):], type=pa.int64()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ArenaError, match=message):
            load_model_profile(ops)


@pytest.mark.parametrize("column, value, message", [
    ("phase", "bogus", r"row 1, column 'phase': 'bogus' is not one of forward, backward, optimizer"),
    ("phase", None, r"row 1, column 'phase': missing value"),
    ("name", None, r"row 1, column 'name': missing value"),
])
def test_an_operator_row_of_no_known_phase_or_name_is_refused(column, value, message):
    """arena-analyze show refused a null name that arena-plan took; an unknown phase counted as neither forward nor
    optimizer work, so the row's load went to the backward pass's share unnoticed."""
    import pyarrow as pa

    ops = gpt_like(num_clusters=3, hidden=256, seq_len=64, batch=8)
    values = ops.table.column(column).to_pylist()
    ops.table = ops.table.set_column(ops.table.column_names.index(column), column, pa.array([value] + values[1:], type=pa.string()))
    with pytest.raises(ArenaError, match=message):
        load_model_profile(ops)


def test_empty_operator_table_is_an_error():
    ops = gpt_like(num_clusters=3, hidden=256, seq_len=64, batch=8)
    ops.table = ops.table.slice(0, 0)
    with pytest.raises(ArenaError, match="empty"):
        load_model_profile(ops)


def test_plan_set_round_trips_through_the_artifact(tmp_path):
    from libarena.artifacts import Provenance, read_table
    from libarena.plan import read_plans, write_plans

    ops = gpt_like(num_clusters=6, hidden=1024, seq_len=256, batch=64)
    planset = plan_job(ops, _single("a40", 4, 2), PlannerConfig())
    path = tmp_path / "plans.parquet"
    write_plans(path, planset, Provenance(tool="tests"))
    back = read_plans(path)
    assert back.operator_table_sha256 == planset.operator_table_sha256
    assert back.clusters == planset.clusters and back.model == planset.model
    assert [p.plan_id for p in back.proxy_plans()] == [p.plan_id for p in planset.proxy_plans()]
    for a, b in zip(back.grids, planset.grids):
        assert a.grid == b.grid and a.infeasible_reason == b.infeasible_reason
        assert [p.stages for p in a.plans] == [p.stages for p in b.plans]
    meta = read_table(path, "plans").metadata
    assert meta["cluster"] == "test" and len(meta["clusters"]) == 6
    assert math.isfinite(meta["planner"]["usable_memory_fraction"])


def test_plan_job_reads_a_path_and_prices_with_a_measured_table(tmp_path):
    from libarena.hardware.comm import MeasuredCommModel
    from tests.plan.optables import write_operator_table

    path = write_operator_table(tmp_path / "ops.parquet", [transformer_cluster(i, 2048, 512, 64) for i in range(4)])
    cluster = _single("a100", 1, 4)
    config = PlannerConfig(num_gpus=(4,), pipeline_degrees=(1,), allow_zero=False)
    alpha_beta = plan_job(str(path), cluster, config).grids[0]
    # A measured table 100x slower than the alpha-beta model for every all-reduce on 4 A100s.
    reference = AlphaBetaCommModel()
    rows = [("all-reduce", "a100", p, False, v, 100 * reference.time("all-reduce", v, p, "a100", False))
            for p in (2, 4) for v in (1e3, 1e6, 1e9, 1e11)]
    measured = plan_job(path, cluster, config, comm=MeasuredCommModel.from_rows(rows)).grids[0]
    assert measured.comm_model == "measured" and alpha_beta.comm_model == "alpha-beta"
    # Log-log interpolation between the sampled volumes approximates alpha + beta * bytes within ~10%.
    ratio = measured.proxy.communication_load / alpha_beta.proxy.communication_load
    assert 90 < ratio < 110
    with pytest.raises(ArenaError, match="no measurements for v100"):
        plan_job(path, _single("v100", 1, 4), config, comm=MeasuredCommModel.from_rows(rows), require_measured_comm=True)


def test_recomputation_is_chosen_only_where_it_pays():
    """A stage recomputes when nothing else fits (or it communicates less); elsewhere plans and their ids are
    what they were without the option."""
    ops = gpt_like(num_clusters=4, hidden=2048, seq_len=1024, batch=2048)
    config = PlannerConfig(num_gpus=(4,), pipeline_degrees=(1,))
    # Activations (17 x tokens x hidden x 2 bytes per layer, 146 GB per layer at batch 2048; a micro-batch of 512
    # samples on 4 GPUs keeps 9 GB of each of the 4 layers) exceed four A10s at every dp/tp split; with
    # recomputation a micro-batch keeps only its layers' inputs, and one layer's activations are rebuilt at a time.
    cluster = _single("a10", 2, 2)
    without = plan_job(ops, cluster, replace(config, allow_remat=False)).grids[0]
    assert not without.feasible
    recomputing = plan_job(ops, cluster, config).grids[0]
    assert recomputing.feasible and recomputing.proxy.remat_per_stage == [1] and recomputing.proxy.recomputes
    assert recomputing.proxy.memory_per_gpu_bytes <= get_gpu("a10").memory_bytes * 0.9
    assert "r" in recomputing.proxy.label
    # Where everything fits, no stage recomputes and every plan keeps the id it has without the option.
    roomy = _single("h100", 1, 8)
    small = gpt_like(num_clusters=4, hidden=512, seq_len=128, batch=64)
    on = plan_job(small, roomy, PlannerConfig(num_gpus=(4,)))
    off = plan_job(small, roomy, PlannerConfig(num_gpus=(4,), allow_remat=False))
    assert not any(p.recomputes for p in on.plans())
    assert [p.plan_id for p in on.plans()] == [p.plan_id for p in off.plans()]


def test_a_recomputing_stage_repeats_its_forward_collectives():
    """Recomputation runs the forward pass again, its TP all-reduces included (half the recorded volume, which
    is a forward and a backward pass's): 1.5 x the micro-batch's communication, in the plan's costs."""
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan.costs import StageCostModel

    # Weights that need tp = 2 on four A100s and activations that need recomputation beside it.
    ops = gpt_like(num_clusters=4, hidden=8192, seq_len=2048, batch=256)
    (stage,) = plan_job(ops, _single("a100", 1, 4), PlannerConfig(num_gpus=(4,), pipeline_degrees=(1,))).grids[0].proxy.stages
    assert stage.remat and stage.tp == 2
    costs = StageCostModel(load_model_profile(ops), get_gpu("a100"), 4, AlphaBetaCommModel(), 0.9)
    plain = float(costs.comm_per_microbatch(0, 4, stage.dp, stage.tp, 4))
    assert plain > 0 and stage.comm_per_microbatch_s == pytest.approx(1.5 * plain)


def _stage_option_costs(profile, costs, plan, B):
    """Every option of each stage of ``plan`` that keeps its recomputation and fits: (comm_mb, grad, stage objective)."""
    from libarena.plan.costs import intra_stage_options

    s = plan.pipeline_degree
    per_stage = []
    for j, stage in enumerate(plan.stages):
        a, b = stage.first_cluster, stage.end_cluster
        options = []
        for dp, tp, zero, remat in intra_stage_options(stage.num_gpus, True, True):
            if remat != stage.remat or (profile.global_batch // B) % dp:
                continue
            if float(costs.memory(a, b, dp, tp, zero, s - j, B, remat)) > costs.capacity:
                continue
            comm = float(costs.comm_per_microbatch(a, b, dp, tp, B, remat))
            grad = float(costs.grad_sync(a, b, dp, tp, zero))
            options.append((comm, grad, B * comm + grad))
        per_stage.append(options)
    return per_stage


def test_stage_options_are_chosen_for_the_plans_l_comm_not_each_stage_alone():
    """l_comm's max terms couple the stages: where one stage is the bottleneck, another may take an option that
    communicates more per micro-batch and synchronises its gradients faster. Each stage taking its own best
    (B x comm_mb + grad_sync) left this 3-stage plan 10% above the best choice of the same stages."""
    import itertools

    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan.costs import StageCostModel

    ops = gpt_like(num_clusters=8, hidden=4096, seq_len=512, batch=32)
    profile = load_model_profile(ops)
    costs = StageCostModel(profile, get_gpu("a100"), 8, AlphaBetaCommModel(), 0.9)
    gains = []
    for n in (8, 16):
        (result,) = plan_job(ops, _single("a100", 2, 8), PlannerConfig(num_gpus=(n,), pipeline_degrees=(3,),
                                                                       frontier_cap=0)).grids
        B = result.num_microbatches
        for plan in result.plans:
            per_stage = _stage_option_costs(profile, costs, plan, B)
            joint = min(float(communication_load(np.array([o[0] for o in combo]), np.array([o[1] for o in combo]), B)[0])
                        for combo in itertools.product(*per_stage))
            own = [min(options, key=lambda o: o[2]) for options in per_stage]
            alone = float(communication_load(np.array([o[0] for o in own]), np.array([o[1] for o in own]), B)[0])
            assert plan.communication_load == pytest.approx(joint, rel=1e-9)
            assert plan.communication_load == pytest.approx(
                float(communication_load(np.array([st.comm_per_microbatch_s for st in plan.stages]),
                                         np.array([st.grad_sync_s for st in plan.stages]), B)[0]), rel=1e-12)
            gains.append(1 - joint / alone)
    assert max(gains) > 0.09 and min(gains) >= 0


def test_recomputing_partitions_are_rounded_against_the_loads_they_carry():
    """b_comp of a plan with recomputing stages is its distance from the assignment proportional to the loads those
    stages carry (one forward pass more); rounding only against the plain loads left closer assignments unused
    (here a partition rounded to 2/1/4/1 GPUs, 1.94 from its loads, where 2/2/2/2 is 1.41)."""
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan.costs import StageCostModel
    from libarena.plan.partition import load_proportional_assignment, partitions
    from libarena.plan.planner import StageTable, _closest_fitting, _normalised_stages, recomputing_bias

    ops = gpt_like(num_clusters=8, hidden=4096, seq_len=2048, batch=256)
    profile, gpu, n, s = load_model_profile(ops), get_gpu("a10"), 8, 4
    costs = StageCostModel(profile, gpu, 8, AlphaBetaCommModel(), 0.9)
    table = StageTable(costs, n, s, PlannerConfig().microbatches(s, 256), 256, True, True)
    loads, forward = profile.loads(gpu), profile.forward_loads(gpu)
    starts, ends = (a.astype(np.int64) for a in partitions(8, s))
    plain_gpus, _, plain_flat = _closest_fitting(table, load_proportional_assignment(loads, n, starts, ends), n, starts, ends)
    plain_bias = recomputing_bias(loads, forward, starts, ends, plain_gpus, table.gather("remat", plain_flat))
    gpus, bias, flat = _normalised_stages(table, loads, forward, n, starts, ends)
    remat = table.gather("remat", flat)
    fits = np.isfinite(table.gather("obj", flat)).all(axis=1)
    assert remat[fits].any(axis=1).sum() >= 20 and (gpus.sum(axis=1) == n).all()
    assert np.allclose(bias, recomputing_bias(loads, forward, starts, ends, gpus, remat))  # the bias of what it reports
    assert (bias[fits] <= plain_bias[fits] + 1e-12).all()
    closer = np.flatnonzero(fits & (bias < plain_bias - 0.4))
    assert closer.size >= 1
    assert any(list(plain_gpus[i]) == [2, 1, 4, 1] and list(gpus[i]) == [2, 2, 2, 2] for i in closer)
    # the planner's plans carry the same bias
    planset = plan_job(ops, _single("a10", 1, 8), PlannerConfig(num_gpus=(8,), pipeline_degrees=(4,), frontier_cap=0))
    for plan in planset.grids[0].plans:
        b = np.array([[st.first_cluster for st in plan.stages]])
        e = np.array([[st.end_cluster for st in plan.stages]])
        r = np.array([[st.remat for st in plan.stages]])
        g = np.array([[st.num_gpus for st in plan.stages]])
        assert plan.computation_bias == pytest.approx(float(recomputing_bias(loads, forward, b, e, g, r)[0]))


def test_recomputing_stages_pay_a_forward_pass_in_the_bias_and_the_objective():
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan.costs import StageCostModel
    from libarena.plan.planner import recomputing_bias

    profile = load_model_profile(gpt_like(num_clusters=4, hidden=1024, seq_len=512, batch=32))
    gpu = get_gpu("a100")
    loads, forward = profile.loads(gpu), profile.forward_loads(gpu)
    assert np.all(forward > 0) and np.all(forward < loads)
    starts, ends, gpus = np.array([[0, 2]]), np.array([[2, 4]]), np.array([[2, 2]])
    # Equal halves on equal GPUs: balanced; recomputing one half makes it the heavier one.
    assert recomputing_bias(loads, forward, starts, ends, gpus, np.array([[False, False]]))[0] == pytest.approx(0.0, abs=1e-9)
    assert recomputing_bias(loads, forward, starts, ends, gpus, np.array([[True, False]]))[0] > 0.1
    costs = StageCostModel(profile, gpu, 8, AlphaBetaCommModel(), 0.9)
    assert float(costs.recompute_seconds(0, 4)) == pytest.approx(float(profile.fused_forward_loads(gpu).sum()))
    plain = float(costs.memory(0, 4, 1, 1, False, 2, 8, False))
    remat = float(costs.memory(0, 4, 1, 1, False, 2, 8, True))
    assert remat < plain


def test_plans_and_operator_tables_of_schema_version_1_are_read(tmp_path):
    """Files written before recomputation existed: plans read with no stage recomputing; operator tables with
    the recomputation fields derived from their per-unit records."""
    import json

    import pyarrow.parquet as pq

    from libarena.artifacts import read_table, write_table
    from libarena.plan import read_plans

    def as_version_1(path, drop_column=None, edit=None):
        table = pq.read_table(path)
        header = json.loads(table.schema.metadata[b"arena"])
        header["schema_version"] = 1
        if edit:
            edit(header["metadata"])
        if drop_column:
            table = table.drop_columns([drop_column])
        pq.write_table(table.replace_schema_metadata({b"arena": json.dumps(header).encode()}), path)

    ops_path = tmp_path / "ops.parquet"
    records = [transformer_cluster(i, 512, 128, 32) for i in range(4)]
    write_table(ops_path, "operator_table", operator_table(records, global_batch=32).table, Provenance("tests"),
                {**operator_table(records, global_batch=32).metadata,
                 "units": [{"index": i, "name": r["units"][0], "input_activation_bytes": r["input_activation_bytes"],
                            "saved_activation_bytes": r["saved_activation_bytes"], "forward_flops": r["forward_flops"]}
                           for i, r in enumerate(records)]})
    fields = ("saved_constant_bytes", "input_activation_bytes", "max_unit_saved_activation_bytes",
              "max_unit_saved_constant_bytes", "forward_flops", "forward_bytes")

    def strip(meta):
        for rec in meta["clusters"]:
            for name in fields:
                rec.pop(name)

    as_version_1(ops_path, edit=strip)
    old = read_table(ops_path, "operator_table")
    assert old.schema_version == 2
    for rec, orig in zip(old.metadata["clusters"], records):
        assert rec["input_activation_bytes"] == orig["input_activation_bytes"]
        assert rec["max_unit_saved_activation_bytes"] == orig["saved_activation_bytes"]
        assert rec["forward_bytes"] == pytest.approx(orig["bytes"] / 3 * 0.9)
    planset = plan_job(old, _single("a100", 1, 8), PlannerConfig(num_gpus=(2,)))
    plans_path = tmp_path / "plans.parquet"
    write_plans(plans_path, planset, Provenance("tests"))
    as_version_1(plans_path, drop_column="remat_per_stage")
    again = read_plans(plans_path)
    assert [p.plan_id for p in again.plans()] == [p.plan_id for p in planset.plans()]
    assert all(p.remat_per_stage == [0] * p.pipeline_degree for p in again.plans())


def test_a_version_1_operator_table_with_an_absurd_unit_index_is_refused(tmp_path):
    """The version-1 upgrade sums per unit with np.bincount, which corrupts the heap (a crash at exit, not an
    exception) for an index near 2**63: the index range is checked first, and the reader refuses in one line."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from libarena.artifacts import read_table, write_table
    from libarena.errors import ArenaError

    records = [transformer_cluster(i, 512, 128, 32) for i in range(2)]
    ops = operator_table(records, global_batch=32)
    path = tmp_path / "ops.parquet"
    write_table(path, "operator_table", ops.table, Provenance("tests"),
                {**ops.metadata, "units": [{"index": i, "name": r["units"][0], "forward_flops": 1.0,
                                            "input_activation_bytes": 1.0, "saved_activation_bytes": 1.0}
                                           for i, r in enumerate(records)]})
    table = pq.read_table(path)
    header = json.loads(table.schema.metadata[b"arena"])
    header["schema_version"] = 1
    units = table.column("unit_index").to_pylist()
    units[0] = 2 ** 63 - 1
    table = table.set_column(table.column_names.index("unit_index"), "unit_index", pa.array(units, pa.int64()))
    pq.write_table(table.replace_schema_metadata({b"arena": json.dumps(header).encode()}), path)
    with pytest.raises(ArenaError, match="unit_index outside"):
        read_table(path, "operator_table")


def test_too_many_clusters_is_refused_before_any_partition_is_built():
    """34 clusters into 16 stages is C(33, 15) ~ 1e9 partitions: one line at once, not the memory of building
    them (the check used to run after the enumeration); the exhaustive reference checks its total first too."""
    import resource

    records = [cluster_record(i, flops=1e12, bytes_=1e9, param_count=1e6, activation_bytes=1e6) for i in range(34)]
    ops = operator_table(records, global_batch=256)
    cluster = _single("a100", 2, 8)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ArenaError, match=r"34 clusters into 16 stages is 1,037,158,320 partitions per grid"):
        plan_job(ops, cluster, PlannerConfig(num_gpus=(16,), pipeline_degrees=(16,)))
    with pytest.raises(ArenaError, match=r"--exhaustive: grid .* candidate plans \(limit 2,000,000\)"):
        plan_job(ops, cluster, PlannerConfig(num_gpus=(16,), pipeline_degrees=(16,), exhaustive=True))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500_000  # KiB: far from the tuples' ~100 GiB


def test_an_exhaustive_grid_of_many_gpu_assignments_is_counted_not_listed():
    """64 GPUs in 12 stages has 6.3 million power-of-two assignments (835 million in 16): they are counted from
    their generating function against --exhaustive-limit, not listed first (a MemoryError before the one-line
    refusal); the count equals the listing's where the listing is small."""
    import resource

    from libarena.plan.partition import power_of_two_compositions, weighted_composition_count

    for n, s in ((8, 3), (16, 4), (13, 5), (64, 6)):
        def weight(c: int) -> int:
            return c.bit_length() + 1
        listed = sum(math.prod(weight(c) for c in comp) for comp in power_of_two_compositions(n, s))
        assert weighted_composition_count(n, s, weight) == listed
    assert weighted_composition_count(64, 16, lambda c: 1) == 835_227_949
    records = [cluster_record(i, flops=1e12, bytes_=1e9, param_count=1e6, activation_bytes=1e6) for i in range(16)]
    ops = operator_table(records, global_batch=4096)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for stages in (12, 16):
        with pytest.raises(ArenaError, match=r"^--exhaustive: grid .* has [\d,]+ candidate plans \(limit 2,000,000\)"):
            plan_job(ops, _single("a100", 8, 8), PlannerConfig(max_gpus=64, num_gpus=(64,), pipeline_degrees=(stages,), exhaustive=True))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300_000  # KiB


def test_a_grid_whose_power_of_two_rounding_needs_gigabytes_is_refused_before_it_runs():
    """The fast planner's rounding DP holds (GPUs + 1) x partitions cells: 32,768 GPUs over 8 stages of 16
    clusters would take several GiB (a MemoryError, or the host's memory); refused in one line first."""
    records = [cluster_record(i, flops=1e12, bytes_=1e9, param_count=1e6, activation_bytes=1e6) for i in range(16)]
    ops = operator_table(records, global_batch=65_536)
    with pytest.raises(ArenaError, match=r"rounding 32768 GPUs over 8 stages of 16 clusters to powers of two needs "
                                         r"about [\d.]+ GiB \(limit 2 GiB\)"):
        plan_job(ops, _single("a100", 4096, 8), PlannerConfig(max_gpus=32_768, num_gpus=(32_768,), pipeline_degrees=(8,)))


def test_a_plans_file_with_contradicting_or_misshapen_rows_is_refused():
    """An infeasible row beside a grid's plans (it became a zero-stage plan, or hid the plans when first) and a
    P2P list whose length is not the stage boundaries' (it was replaced by zeros) are one-line errors."""
    import pyarrow as pa

    from libarena.artifacts import TableArtifact
    from libarena.artifacts.registry import get_kind
    from libarena.plan.io import _infeasible_row, planset_from_artifact, planset_metadata, planset_to_table

    ops = gpt_like(num_clusters=4, hidden=512, seq_len=128, batch=64)
    planset = plan_job(ops, _single("a100", 1, 4), PlannerConfig(num_gpus=(4,), pipeline_degrees=(2,)))
    rows = planset_to_table(planset).to_pylist()

    def artifact(table_rows):
        table = pa.Table.from_pylist(table_rows, schema=get_kind("plans").arrow_schema())
        return TableArtifact("plans", table, Provenance("test"), planset_metadata(planset), 2, "crafted.parquet")

    assert planset_from_artifact(artifact(rows)).grids[0].feasible
    infeasible = dict(_infeasible_row(planset.grids[0]), infeasible_reason="out of memory")
    for crafted, row in ((rows + [infeasible], len(rows) + 1), ([infeasible] + rows, 1)):
        with pytest.raises(ArenaError, match=rf"crafted.parquet: row {row}, column 'feasible': an infeasible row of a grid "
                                             r"\(a100 x4, 2 stages\) that also has other rows"):
            planset_from_artifact(artifact(crafted))
    misshapen = [dict(r) for r in rows]
    misshapen[0]["p2p_per_microbatch_s"] = [1.0, 2.0, 3.0]
    with pytest.raises(ArenaError, match=r"row 1, column 'p2p_per_microbatch_s': expected 1 finite non-negative values"):
        planset_from_artifact(artifact(misshapen))
    # stage offsets: each stage on GPUs of its own inside the grid, at a multiple of its size
    two_stage = next(r for r in rows if r["pipeline_degree"] == 2 and r["gpus_per_stage"] == [2, 2])
    for offsets in ([0, 100], [0, 0], [1, 2], [2, 3]):
        with pytest.raises(ArenaError, match=r"column 'stage_gpu_offsets': stages of \[2, 2\] GPUs at "):
            planset_from_artifact(artifact([dict(r, stage_gpu_offsets=offsets) if r is two_stage else r for r in rows]))
    assert planset_from_artifact(artifact([dict(r, stage_gpu_offsets=[2, 0]) if r is two_stage else r for r in rows]))
    # micro-batches the runtime would not run (a count of 2**62 hung arena-run counting down to one that splits
    # the batch; arena-profile priced 3 where 2 run), a global batch other than the plans' (10**12 ran out of memory)
    for column, value, message in (("num_microbatches", 2**62, r"4611686018427387904 micro-batches do not split the "
                                    r"global batch of 64 evenly \(the runtime would run 64\)"),
                                   ("num_microbatches", 3, r"3 micro-batches do not split the global batch of 64 evenly "
                                    r"\(the runtime would run 2\): plan again with arena-plan"),
                                   ("global_batch", 10**12, r"1000000000000 is not the plans' global batch \(64, at most "),
                                   ("global_batch", 32, r"32 is not the plans' global batch \(64")):
        with pytest.raises(ArenaError, match=rf"row 1, column '{column}': {message}"):
            planset_from_artifact(artifact([dict(rows[0], **{column: value})] + rows[1:]))
    from libarena.plan.config import runnable_microbatch_count

    assert runnable_microbatch_count(64, 2**62) == 64 and runnable_microbatch_count(64, 3) == 2  # bounded by the batch


def test_a_grid_is_refused_on_the_micro_batches_it_would_run_not_the_nominal_count():
    """The gate judges the count that runs: a batch of 32 gives 7 stages 16 micro-batches (28 lowered to a divisor),
    and 9 or 10 stages 32 (more per stage), so all are planned; 13 samples split into 1 or 13, so 3 stages (nominal
    12) would run one micro-batch and are refused, as is a batch smaller than the stages."""
    from libarena.plan import too_few_microbatches

    assert too_few_microbatches(32, 7) == too_few_microbatches(32, 9) == too_few_microbatches(32, 16) == ""
    assert too_few_microbatches(13, 3) == ("global batch 13 splits evenly into 1 micro-batches at most 12, fewer than "
                                           "the 3 stages")
    assert too_few_microbatches(13, 13) == ""  # 13 micro-batches of one sample
    assert too_few_microbatches(8, 9) == "global batch 8 is smaller than the 9 stages (one micro-batch each at least)"
    assert too_few_microbatches(64, 4, fixed=2) == ""  # a fixed count below the stages is the user's choice
    assert too_few_microbatches(1, 2, fixed=2) != ""
    ops = gpt_like(num_clusters=12, hidden=256, seq_len=64, batch=32)
    config = PlannerConfig(max_gpus=16, frontier_cap=0, gpu_types=("a40",), num_gpus=(16,))
    planset = plan_job(ops, _single("a40", 2, 8), config)
    counts = {g.grid.pipeline_degree: g.num_microbatches for g in planset.grids if g.feasible}
    assert counts[7] == 16 and counts[9] == counts[10] == counts[12] == 32  # before: 9 and 10 refused (36, 40 > 32)
    _check_planset(planset, config, 12)
    odd = plan_job(gpt_like(num_clusters=6, hidden=256, seq_len=64, batch=13), _single("a40", 1, 4),
                   PlannerConfig(max_gpus=4, frontier_cap=0))
    reasons = {g.grid.pipeline_degree: g.infeasible_reason for g in odd.grids if g.grid.num_gpus == 4}
    assert reasons[1] == "" and reasons[3].startswith("global batch 13 splits evenly into 1 micro-batches")


def test_plans_are_priced_at_the_micro_batches_the_runtime_runs():
    """4 x s micro-batches do not always split the global batch; the runtime then runs fewer, larger ones
    (``runnable_microbatch_count``), and the planner must price those, not a fractional G / (4 s)."""
    ops = gpt_like(num_clusters=6, hidden=512, seq_len=128, batch=40)
    planset = plan_job(ops, _single("a40", 1, 4), PlannerConfig(max_gpus=4, frontier_cap=0))
    counts = {g.grid.pipeline_degree: {p.num_microbatches for p in g.plans} for g in planset.grids if g.grid.num_gpus == 4}
    assert counts == {1: {4}, 2: {8}, 3: {10}, 4: {10}}  # 12 and 16 do not divide 40: 10 micro-batches of 4
    single_stage = [p for g in planset.grids if g.grid.num_gpus == 4 and g.grid.pipeline_degree == 1 for p in g.plans]
    # a micro-batch of 10 splits over 2 replicas, not over 4
    assert single_stage and all(p.stages[0].dp in (1, 2) for p in single_stage)
    from libarena.run.search import runnable_plan
    for g in planset.grids:
        for plan in g.plans:
            assert runnable_plan(plan, 40) is plan


def test_stage_collectives_across_nodes_share_the_node_adapter():
    """A stage of dp 4 x tp 4 on nodes of 4 runs four gradient rings through each node's one adapter at once;
    the planner prices that, not one ring with the adapter to itself."""
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan.costs import StageCostModel

    ops = gpt_like(num_clusters=4, hidden=1024, seq_len=512, batch=32)
    comm = AlphaBetaCommModel()
    profile = load_model_profile(ops)
    per_device = float(profile.arrays["param_bytes"].sum()) / 4  # the stage's gradients over tp 4
    sync = float(StageCostModel(profile, get_gpu("a100"), 4, comm, 0.9).grad_sync(0, 4, 4, 4, False))
    assert sync == pytest.approx(comm.time("all-reduce", 4 * per_device, 4, "a100", True), rel=1e-9)
    assert sync > 3.9 * comm.time("all-reduce", per_device, 4, "a100", True)
    # on one node of 16 the rings run over NVLink, one each
    one_node = float(StageCostModel(profile, get_gpu("a100"), 16, comm, 0.9).grad_sync(0, 4, 4, 4, False))
    assert one_node == pytest.approx(comm.time("all-reduce", per_device, 4, "a100", False), rel=1e-9)


@pytest.mark.parametrize("column,row,value,needle", [
    ("plan_id", 1, "<row 0's>", "is also row 1's"),
    ("plan_id", 0, "  ", "empty plan id"),
    ("gpu_type", 0, "h999", "unknown GPU type 'h999'"),
    ("num_gpus", 0, 1 << 30, "is not a power of two that"),
    ("zero_per_stage", 0, [5], "expected 0 or 1 per stage"),
    ("remat_per_stage", 0, [7], "expected 0 or 1 per stage"),
])
def test_plans_rows_no_planner_writes_are_refused_in_one_line(tmp_path, column, row, value, needle):
    """Rows edited out of what a plan can be (a duplicated or empty id, an unknown GPU type, more GPUs than the
    grid's nodes hold, ZeRO or recomputation flags other than 0/1): every reader refuses them, where before
    arena-profile and show/export went on (and a perf table made from them was refused only by simulate)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from libarena.plan import read_plans

    ops = gpt_like(num_clusters=6, hidden=1024, seq_len=256, batch=64)
    path = tmp_path / "plans.parquet"
    write_plans(path, plan_job(ops, _single("a40", 4, 2), PlannerConfig(num_gpus=(1, 2))), Provenance(tool="tests"))
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    single = [r for r, rec in enumerate(table.to_pylist()) if rec["feasible"] and rec["pipeline_degree"] == 1]
    assert len(single) >= 2
    values[single[row]] = values[single[0]] if value == "<row 0's>" else value
    table = table.set_column(table.schema.get_field_index(column), column,
                             pa.array(values, type=table.schema.field(column).type))
    pq.write_table(table, path)  # (the schema metadata, the artifact's header, comes along)
    with pytest.raises(ArenaError, match=re.escape(needle)):
        read_plans(path)
