"""arena-plan: grids, load-aware parallelism planning, Pareto frontiers and proxy plans (§3.2-3.3).

Pure numpy/pyarrow (never imports JAX). The API the profiler, runtime and scheduler use::

    from libarena.plan import PlannerConfig, plan_job, read_plans, write_plans
    planset = plan_job(read_table("ops.parquet", "operator_table"), load_cluster("c.yaml"), PlannerConfig())
    for plan in planset.proxy_plans():           # one ParallelPlan per feasible grid
        plan.grid.gpu_type, plan.grid.num_gpus, plan.grid.pipeline_degree
        for stage in plan.stages:                # StagePlan: clusters, num_gpus, dp, tp, zero, memory...
            ...
"""

from libarena.plan.config import PlannerConfig
from libarena.plan.grids import Grid, enumerate_grids, stage_offsets
from libarena.plan.io import planset_from_artifact, planset_metadata, planset_to_table, read_plans, write_plans
from libarena.plan.model import ModelProfile, load_model_profile, operator_table_digest
from libarena.plan.planner import communication_load, plan_job
from libarena.plan.types import GridResult, ParallelPlan, PlanSet, StagePlan

__all__ = [
    "Grid",
    "GridResult",
    "ModelProfile",
    "ParallelPlan",
    "PlanSet",
    "PlannerConfig",
    "StagePlan",
    "communication_load",
    "enumerate_grids",
    "load_model_profile",
    "operator_table_digest",
    "plan_job",
    "planset_from_artifact",
    "planset_metadata",
    "planset_to_table",
    "read_plans",
    "stage_offsets",
    "write_plans",
]
