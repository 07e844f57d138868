"""Analytic (execution-free) performance rows for models too large to execute on the local device.

The paper's simulation uses performance tables pre-measured on real GPUs. Where a stage cannot be executed
here (a 27B-parameter MoE on a laptop CPU), its time comes from the model's real HLO instead: each
clustered operator's roofline load on the target GPU (eq. 2 per instruction with XLA's own FLOP and byte
counts, bytes counted as they reach memory after XLA fuses elementwise chains: see phase_seconds), divided across the stage's dp x tp workers and B micro-batches, de-rated by the
fraction of the roofline that large-model training attains, then composed with the same communication
model and the same 1F1B formula as profiled rows. Rows are marked ``estimated`` with timer ``roofline``.

Pure numpy (no JAX): it works from the planner's ModelProfile and ParallelPlan objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from libarena.hardware import ClusterSpec, get_gpu
from libarena.hardware.comm import AlphaBetaCommModel, CommModel
from libarena.plan.costs import StageCostModel
from libarena.plan.model import ModelProfile
from libarena.plan.types import ParallelPlan, PlanSet
from libarena.profile.pipeline import IterationEstimate, StageTimes, one_f_one_b

TIMER = "roofline"


@dataclass(frozen=True)
class RooflineConfig:
    #: Fraction of the roofline a training step attains: Megatron-LM trains GPT-3 175B at 163 of the A100's
    #: 312 bf16 TFLOP/s (52%; Narayanan et al., SC'21). Applied to compute and optimizer time alike.
    achieved_fraction: float = 0.52
    #: Fraction of GPU memory a plan may use (same default as the planner).
    memory_fraction: float = 0.9
    #: Micro-batches of the pure data-parallel (dp view) plan: gradient accumulation as the planner's s = 1.
    dp_microbatches: int = 4
    #: The dp view shards the Adam state across its replicas (ZeRO-1, parameters stay replicated) when the
    #: fully replicated state does not fit, as data-parallel frameworks do; False: plain replication only.
    dp_zero: bool = True


def phase_seconds(profile: ModelProfile, gpu_type: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster roofline seconds of one step on one GPU: (forward + backward, optimizer update).

    Fusion-aware (ModelProfile.fused_loads): the unfused HLO charges every elementwise instruction a
    round trip to memory, which on a GPU XLA fuses away; counting it would make the step several times
    memory-bound (bert__2.6B at batch 256: 83 TB moved unfused, 11 TB after fusion, for 4.4 PFLOP).
    """
    return profile.fused_loads(get_gpu(gpu_type))


def estimate_plan(profile: ModelProfile, plan: ParallelPlan, config: RooflineConfig = RooflineConfig(),
                  phases: tuple[np.ndarray, np.ndarray] | None = None) -> IterationEstimate:
    """1F1B iteration time of ``plan`` from roofline loads (the planner's comm figures for collectives);
    ``phases`` is phase_seconds() for the plan's GPU type when the caller already has it."""
    compute, optimizer = phases if phases is not None else phase_seconds(profile, plan.grid.gpu_type)
    B = plan.num_microbatches
    stages = []
    for j, st in enumerate(plan.stages):
        clusters = slice(st.first_cluster, st.end_cluster)
        compute_mb = float(compute[clusters].sum()) / (B * st.dp * st.tp) / config.achieved_fraction
        optimizer_s = float(optimizer[clusters].sum()) / (st.tp * (st.dp if st.zero else 1)) / config.achieved_fraction
        p2p = plan.p2p_per_microbatch_s
        # Stage j sends its activation forward and receives the gradient back: one boundary each way.
        p2p_s = (p2p[j] if j < len(p2p) else 0.0) + (p2p[j - 1] if j > 0 and j - 1 < len(p2p) else 0.0)
        stages.append(StageTimes(compute_mb, st.comm_per_microbatch_s, p2p_s, st.grad_sync_s, optimizer_s))
    return one_f_one_b(stages, B)


def dp_plan_estimate(
    profile: ModelProfile, gpu_type: str, num_gpus: int, gpus_per_node: int, comm: CommModel, config: RooflineConfig,
    phases: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[IterationEstimate, bool]:
    """Data parallelism on ``num_gpus`` GPUs (every GPU holds the whole model; ZeRO-1 when only that fits,
    see RooflineConfig.dp_zero): time and whether it fits."""
    costs = StageCostModel(profile, get_gpu(gpu_type), gpus_per_node, comm, config.memory_fraction)
    O, B = profile.num_clusters, config.dp_microbatches
    zero = False
    fits = float(costs.memory(0, O, num_gpus, 1, False, 1, B)) <= costs.capacity
    if not fits and config.dp_zero and num_gpus > 1:
        zero = fits = float(costs.memory(0, O, num_gpus, 1, True, 1, B)) <= costs.capacity
    compute, optimizer = phases if phases is not None else phase_seconds(profile, gpu_type)
    stage = StageTimes(
        compute_s=float(compute.sum()) / (B * num_gpus) / config.achieved_fraction,
        comm_s=float(costs.comm_per_microbatch(0, O, num_gpus, 1, B)),
        grad_sync_s=float(costs.grad_sync(0, O, num_gpus, 1, zero)),
        optimizer_s=float(optimizer.sum()) / (num_gpus if zero else 1) / config.achieved_fraction,
    )
    return one_f_one_b([stage], B), fits


def perf_rows(
    profile: ModelProfile,
    planset: PlanSet,
    cluster: ClusterSpec,
    config: RooflineConfig = RooflineConfig(),
    comm: CommModel | None = None,
) -> list[dict[str, Any]]:
    """Performance-table rows (views arena, ap, dp) for every GPU configuration the planner considered."""
    comm = comm or AlphaBetaCommModel()
    configurations: dict[tuple[str, int, int], list[Any]] = {}
    for grid_result in planset.grids:
        g = grid_result.grid
        configurations.setdefault((g.gpu_type, g.num_gpus, g.num_nodes), []).append(grid_result)
    rows = []

    def row(view: str, gpu_type: str, n: int, nodes: int, stages: int, plan_id: str, estimate: IterationEstimate, fits: bool) -> dict[str, Any]:
        t = estimate.iter_time_s
        return {
            "model": profile.name, "global_batch": profile.global_batch, "gpu_type": gpu_type, "num_gpus": n,
            "num_nodes": nodes, "pipeline_degree": stages, "plan_id": plan_id, "view": view, "iter_time_s": t,
            "throughput": profile.global_batch / t if t > 0 else math.nan, "fits_in_memory": fits, "timer": TIMER,
            "estimated": True, "profiling_cost_device_s": 0.0,
        }

    phases_by_type: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for (gpu_type, n, nodes), grid_results in sorted(configurations.items()):
        phases = phases_by_type.setdefault(gpu_type, phase_seconds(profile, gpu_type))
        candidates = []
        for grid_result in grid_results:
            for plan in grid_result.plans:
                estimate = estimate_plan(profile, plan, config, phases)
                candidates.append((estimate, plan))
                if plan.is_proxy:
                    rows.append(row("arena", gpu_type, n, nodes, plan.grid.pipeline_degree, plan.plan_id, estimate, True))
        if candidates:
            best_estimate, best = min(candidates, key=lambda c: (c[0].iter_time_s, c[1].plan_id))
            rows.append(row("ap", gpu_type, n, nodes, best.grid.pipeline_degree, best.plan_id, best_estimate, True))
        per_node = grid_results[0].grid.gpus_per_node
        dp_estimate, dp_fits = dp_plan_estimate(profile, gpu_type, n, per_node, comm, config, phases)
        rows.append(row("dp", gpu_type, n, nodes, 1, f"{gpu_type}-n{n}-dp", dp_estimate, dp_fits))
    return rows
