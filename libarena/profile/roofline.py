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

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from libarena.hardware import ClusterSpec, get_gpu
from libarena.hardware.comm import AlphaBetaCommModel, CommModel
from libarena.plan import Grid, GridResult, ParallelPlan, PlanSet, Resources, data_parallel_plan
from libarena.plan.config import USABLE_MEMORY_FRACTION
from libarena.plan.costs import StageCostModel
from libarena.plan.model import ModelProfile
from libarena.profile.estimate import PlanEstimate, perf_rows
from libarena.profile.pipeline import IterationEstimate, StageTimes, one_f_one_b

TIMER = "roofline"


@dataclass(frozen=True)
class RooflineConfig:
    #: Fraction of the roofline a training step attains: Megatron-LM trains its 530B and 1T models at 163 of the
    #: A100's 312 bf16 TFLOP/s (52%; Narayanan et al., SC'21, Table 1; 43-47% for its 1.7B-145B models, nearer
    #: the zoo's sizes). Applied to compute and optimizer time alike.
    achieved_fraction: float = 0.52
    #: Fraction of GPU memory a plan may use (the planner's default).
    memory_fraction: float = USABLE_MEMORY_FRACTION
    #: Micro-batches of the pure data-parallel (dp view) plan: gradient accumulation as the planner's s = 1.
    dp_microbatches: int = 4
    #: The dp view shards the Adam state across its replicas (ZeRO-1, parameters stay replicated) when the
    #: fully replicated state does not fit, as data-parallel frameworks do; False: plain replication only.
    dp_zero: bool = True
    #: ... and recomputes activations in the backward pass when that is what it takes to fit.
    dp_remat: bool = True


def phase_seconds(profile: ModelProfile, gpu_type: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-cluster roofline seconds of one step on one GPU: (forward + backward, optimizer update, forward alone:
    what a recomputing stage runs once more).

    Fusion-aware (ModelProfile.fused_loads): the unfused HLO charges every elementwise instruction a
    round trip to memory, which on a GPU XLA fuses away; counting it would make the step several times
    memory-bound (bert__2.6B at batch 256: 83 TB moved unfused, 11 TB after fusion, for 4.4 PFLOP).
    """
    gpu = get_gpu(gpu_type)
    compute, optimizer = profile.fused_loads(gpu)
    return compute, optimizer, profile.fused_forward_loads(gpu)


def roofline_iteration(profile: ModelProfile, plan: ParallelPlan, config: RooflineConfig = RooflineConfig(),
                       phases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> IterationEstimate:
    """1F1B iteration time of a priced ``plan`` from roofline loads (the planner's comm figures for collectives);
    ``phases`` is phase_seconds() for the plan's GPU type when the caller already has it."""
    compute, optimizer, forward = phases if phases is not None else phase_seconds(profile, plan.grid.gpu_type)
    B = plan.num_microbatches
    stages = []
    for j, st in enumerate(plan.stages):
        clusters = slice(st.first_cluster, st.end_cluster)
        # a recomputing stage runs its forward pass twice
        work = float(compute[clusters].sum()) + (float(forward[clusters].sum()) if st.remat else 0.0)
        compute_mb = work / (B * st.dp * st.tp) / config.achieved_fraction
        optimizer_s = float(optimizer[clusters].sum()) / (st.tp * (st.dp if st.zero else 1)) / config.achieved_fraction
        p2p = plan.p2p_per_microbatch_s
        # Stage j sends its activation forward and receives the gradient back: one boundary each way.
        p2p_s = (p2p[j] if j < len(p2p) else 0.0) + (p2p[j - 1] if j > 0 and j - 1 < len(p2p) else 0.0)
        stages.append(StageTimes(compute_mb, st.comm_per_microbatch_s, p2p_s, st.grad_sync_s, optimizer_s))
    return one_f_one_b(stages, B)


def priced_data_parallel_plan(profile: ModelProfile, grid: Grid, comm: CommModel, config: RooflineConfig) -> tuple[ParallelPlan, bool]:
    """Data parallelism on the grid's GPUs (every GPU holds the whole model), priced by the planner's cost
    model: the plan and whether it fits. Where the replicated plan does not fit, it shards the Adam state
    (ZeRO-1, RooflineConfig.dp_zero), then recomputes activations (RooflineConfig.dp_remat), then both, as
    data-parallel frameworks do: the first of these that fits."""
    costs = StageCostModel(profile, get_gpu(grid.gpu_type), grid.gpus_per_node, comm, config.memory_fraction)
    O, B, n = profile.num_clusters, config.dp_microbatches, grid.num_gpus
    choices = [(False, False)]
    if config.dp_zero and n > 1:
        choices.append((True, False))
    if config.dp_remat:
        choices.append((False, True))
        if config.dp_zero and n > 1:
            choices.append((True, True))
    zero, remat = choices[0]
    fits = False
    for zero, remat in choices:
        if float(costs.memory(0, O, n, 1, zero, 1, B, remat)) <= costs.capacity:
            fits = True
            break
    if not fits:
        zero, remat = choices[0]
    plan = data_parallel_plan(grid, O, B)
    stage = replace(plan.stages[0], zero=zero, remat=remat, comm_per_microbatch_s=float(costs.comm_per_microbatch(0, O, n, 1, B, remat)),
                    grad_sync_s=float(costs.grad_sync(0, O, n, 1, zero)))
    return replace(plan, stages=(stage,)), fits


def roofline_rows(
    profile: ModelProfile,
    planset: PlanSet,
    cluster: ClusterSpec,
    config: RooflineConfig = RooflineConfig(),
    comm: CommModel | None = None,
) -> list[dict[str, Any]]:
    """Performance-table rows (views arena, ap, dp) for every GPU configuration the planner considered."""
    comm = comm or AlphaBetaCommModel()
    grids: dict[Resources, list[GridResult]] = {}
    for grid_result in planset.grids:
        grids.setdefault(grid_result.grid.resources, []).append(grid_result)
    resources = sorted(grids, key=lambda r: (r.gpu_type, r.num_gpus, r.num_nodes))
    phases_by_type: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def estimate(plan: ParallelPlan, fits: bool) -> PlanEstimate:
        phases = phases_by_type.setdefault(plan.grid.gpu_type, phase_seconds(profile, plan.grid.gpu_type))
        return PlanEstimate(plan, roofline_iteration(profile, plan, config, phases), fits,
                            [st.memory_bytes for st in plan.stages], TIMER, True, 0.0)

    estimates, dp_estimates = [], {}
    for r in resources:
        for grid_result in grids[r]:
            # the planner kept only plans that fit in memory
            estimates.extend(estimate(plan, True) for plan in grid_result.plans)
        dp_plan, dp_fits = priced_data_parallel_plan(profile, replace(grids[r][0].grid, pipeline_degree=1), comm, config)
        dp_estimates[r] = estimate(dp_plan, dp_fits)
    return perf_rows(estimates, dp_estimates, resources)
