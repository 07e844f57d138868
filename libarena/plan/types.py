"""The parallel plan, in one representation for the whole pipeline: stages, plans, grid results and the plan
set (one job on one cluster).

arena-plan makes them (with its cost estimates), ``plan.io`` reads and writes them, the profiler times them
and the runtime runs them (``run.RunPlan`` binds a plan to the model units its stages execute, through the
plan set's :class:`~libarena.plan.layout.StageLayout`). Plans made outside the planner (the profiler's
pure data-parallel plan, the runtime search's candidates, enumerations for tests) are built with
:func:`make_plan` and carry no cost estimates (NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from libarena.artifacts import content_digest
from libarena.errors import ArenaError
from libarena.plan.grids import Grid, Resources
from libarena.plan.layout import StageLayout

#: Plan id of the pure data-parallel plan of a grid's GPUs (the performance table's ``dp`` view).
DP_PLAN_ID = "dp"


@dataclass(frozen=True)
class StagePlan:
    index: int
    #: Clusters [first_cluster, end_cluster) of the operator table.
    first_cluster: int
    end_cluster: int
    num_gpus: int
    dp: int
    tp: int
    #: ZeRO-1: optimizer state sharded across the stage's data-parallel group.
    zero: bool
    #: First GPU of the stage within the grid's GPUs (buddy placement; see grids.stage_offsets).
    gpu_offset: int
    #: The planner's estimates (NaN / 0 for plans it did not price).
    memory_bytes: float = math.nan
    comm_per_microbatch_s: float = 0.0
    grad_sync_s: float = 0.0
    #: Activation recomputation: every unit of the stage recomputes its activations in the backward pass.
    remat: bool = False

    @property
    def clusters(self) -> range:
        return range(self.first_cluster, self.end_cluster)

    @property
    def intra(self) -> tuple[int, int, int, bool, bool]:
        """(GPU count, dp, tp, zero, remat): the stage's intra-stage choice."""
        return (self.num_gpus, self.dp, self.tp, self.zero, self.remat)


@dataclass(frozen=True)
class ParallelPlan:
    grid: Grid
    plan_id: str
    num_microbatches: int
    stages: tuple[StagePlan, ...]
    #: The planner's metrics (NaN for plans it did not price).
    computation_bias: float = math.nan
    communication_load: float = math.nan
    memory_per_gpu_bytes: float = math.nan
    is_proxy: bool = False
    on_frontier: bool = True
    #: One-direction P2P time per micro-batch across each stage boundary (s - 1 entries).
    p2p_per_microbatch_s: tuple[float, ...] = ()

    @property
    def pipeline_degree(self) -> int:
        return len(self.stages)

    @property
    def num_gpus(self) -> int:
        return sum(st.num_gpus for st in self.stages)

    @property
    def resources(self) -> Resources:
        return self.grid.resources

    @property
    def stage_gpu_offsets(self) -> list[int]:
        return [st.gpu_offset for st in self.stages]

    @property
    def label(self) -> str:
        parts = [f"[{st.first_cluster}:{st.end_cluster}) {st.num_gpus}g dp{st.dp} tp{st.tp}{' z' if st.zero else ''}"
                 f"{' r' if st.remat else ''}" for st in self.stages]
        return f"{self.plan_id or 'plan'} B={self.num_microbatches}: " + " | ".join(parts)

    @property
    def stage_boundaries(self) -> list[int]:
        return [st.first_cluster for st in self.stages]

    @property
    def gpus_per_stage(self) -> list[int]:
        return [st.num_gpus for st in self.stages]

    @property
    def dp_per_stage(self) -> list[int]:
        return [st.dp for st in self.stages]

    @property
    def tp_per_stage(self) -> list[int]:
        return [st.tp for st in self.stages]

    @property
    def zero_per_stage(self) -> list[int]:
        return [int(st.zero) for st in self.stages]

    @property
    def remat_per_stage(self) -> list[int]:
        return [int(st.remat) for st in self.stages]

    @property
    def recomputes(self) -> bool:
        return any(st.remat for st in self.stages)


def make_plan(
    grid: Grid, boundaries: Sequence[int], gpus: Sequence[int], dp: Sequence[int], tp: Sequence[int],
    zero: Sequence[int] | None, num_microbatches: int, num_clusters: int, plan_id: str | None = None,
    offsets: Sequence[int] | None = None, is_proxy: bool = False, on_frontier: bool = True,
    remat: Sequence[int] | None = None,
) -> ParallelPlan:
    """A plan from its structure (no cost estimates): stage s covers clusters [boundaries[s], boundaries[s+1]).

    ``offsets``: each stage's first GPU within the grid's (default: stages one after another); ``plan_id``
    defaults to the planner's deterministic id of the structure."""
    s = len(boundaries)
    zero = list(zero) if zero else [0] * s
    remat = list(remat) if remat else [0] * s
    if not (len(gpus) == len(dp) == len(tp) == len(zero) == len(remat) == s) or (offsets is not None and len(offsets) != s):
        raise ArenaError(f"plan {plan_id or '?'}: per-stage lists have different lengths")
    if offsets is None:
        offsets = [sum(gpus[:j]) for j in range(s)]
    ends = [*boundaries[1:], num_clusters]
    stages = []
    for j in range(s):
        a, b = int(boundaries[j]), int(ends[j])
        if not 0 <= a < b <= num_clusters:
            raise ArenaError(f"plan {plan_id or '?'}: stage {j} spans clusters [{a}, {b}) outside the {num_clusters} clusters")
        stages.append(StagePlan(j, a, b, int(gpus[j]), int(dp[j]), int(tp[j]), bool(zero[j]), int(offsets[j]),
                                remat=bool(remat[j])))
    if plan_id is None:
        plan_id = make_plan_id(grid, [int(b) for b in boundaries], [int(g) for g in gpus], [int(d) for d in dp],
                               [int(t) for t in tp], [int(z) for z in zero], [int(r) for r in remat])
    return ParallelPlan(grid, plan_id, int(num_microbatches), tuple(stages), is_proxy=is_proxy, on_frontier=on_frontier)


def data_parallel_plan(grid: Grid, num_clusters: int, num_microbatches: int = 1) -> ParallelPlan:
    """Pure data parallelism on the grid's GPUs: one stage of every cluster, dp = the grid's GPU count."""
    n = grid.num_gpus
    return make_plan(grid, [0], [n], [n], [1], [0], num_microbatches, num_clusters, DP_PLAN_ID, on_frontier=False)


def make_plan_id(grid: Grid, boundaries: list[int], gpus: list[int], dp: list[int], tp: list[int], zero: list[int],
                 remat: list[int] | None = None) -> str:
    """Deterministic id from the grid key and the plan's structure (same plan -> same id, run after run). The
    recomputation flags join the digest only when a stage recomputes: plans without it keep the ids they had
    before recomputation existed, so existing caches and files stay valid."""
    parts: list = [list(grid.key), boundaries, gpus, dp, tp, zero]
    if remat and any(remat):
        parts.append(remat)
    digest = content_digest(*parts)[:10]
    return f"{grid.gpu_type}-n{grid.num_gpus}-s{grid.pipeline_degree}-{digest}"


def infeasible_plan_id(grid: Grid) -> str:
    return f"{grid.gpu_type}-n{grid.num_gpus}-s{grid.pipeline_degree}-infeasible"


@dataclass(frozen=True)
class GridResult:
    grid: Grid
    #: Frontier plans (all feasible plans, frontier ones marked, in exhaustive mode), best b_comp first.
    plans: tuple[ParallelPlan, ...]
    num_microbatches: int
    #: Candidate plans assessed and those dropped because no intra-stage choice fit in memory.
    plans_considered: int
    plans_out_of_memory: int
    infeasible_reason: str = ""
    #: Smallest peak memory per GPU any candidate needs (the number behind an OOM reason).
    min_memory_bytes: float = math.nan
    comm_model: str = ""

    @property
    def feasible(self) -> bool:
        return bool(self.plans)

    @property
    def proxy(self) -> ParallelPlan | None:
        for plan in self.plans:
            if plan.is_proxy:
                return plan
        return None

    @property
    def frontier(self) -> list[ParallelPlan]:
        return [p for p in self.plans if p.on_frontier]


@dataclass
class PlanSet:
    """Everything arena-plan produces for one job on one cluster."""

    model: dict[str, Any]
    global_batch: int
    seq_len: int
    dtype: str
    cluster_name: str
    operator_table_sha256: str
    clusters: list[dict[str, Any]]
    grids: list[GridResult]
    planner: dict[str, Any] = field(default_factory=dict)
    comm_model: str = ""

    @property
    def model_name(self) -> str:
        return str(self.model.get("name", ""))

    @property
    def layout(self) -> StageLayout:
        """Which model units each cluster covers (the plans' stages resolved to units)."""
        return StageLayout.from_cluster_records(self.clusters)

    def plans(self) -> list[ParallelPlan]:
        """Every plan of every feasible grid, in file order."""
        return [p for g in self.grids for p in g.plans]

    def proxy_plans(self) -> list[ParallelPlan]:
        return [g.proxy for g in self.grids if g.proxy is not None]

    def grid(self, gpu_type: str, num_gpus: int, pipeline_degree: int) -> GridResult:
        for g in self.grids:
            if (g.grid.gpu_type, g.grid.num_gpus, g.grid.pipeline_degree) == (gpu_type, num_gpus, pipeline_degree):
                return g
        raise KeyError((gpu_type, num_gpus, pipeline_degree))

    def plan(self, plan_id: str) -> ParallelPlan:
        for g in self.grids:
            for p in g.plans:
                if p.plan_id == plan_id:
                    return p
        raise KeyError(plan_id)

    def to_table(self):
        from libarena.plan.io import planset_to_table

        return planset_to_table(self)

    def metadata(self) -> dict[str, Any]:
        from libarena.plan.io import planset_metadata

        return planset_metadata(self)
