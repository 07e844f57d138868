"""Typed results of planning: stages, plans, grid results and the plan set (one job on one cluster)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from libarena.artifacts import content_digest
from libarena.plan.grids import Grid


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
    memory_bytes: float
    comm_per_microbatch_s: float
    grad_sync_s: float

    @property
    def clusters(self) -> range:
        return range(self.first_cluster, self.end_cluster)


@dataclass(frozen=True)
class ParallelPlan:
    grid: Grid
    plan_id: str
    num_microbatches: int
    stages: tuple[StagePlan, ...]
    computation_bias: float
    communication_load: float
    memory_per_gpu_bytes: float
    is_proxy: bool = False
    on_frontier: bool = True
    #: One-direction P2P time per micro-batch across each stage boundary (s - 1 entries).
    p2p_per_microbatch_s: tuple[float, ...] = ()

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


def make_plan_id(grid: Grid, boundaries: list[int], gpus: list[int], dp: list[int], tp: list[int], zero: list[int]) -> str:
    """Deterministic id from the grid key and the plan's structure (same plan -> same id, run after run)."""
    digest = content_digest(list(grid.key), boundaries, gpus, dp, tp, zero)[:10]
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
