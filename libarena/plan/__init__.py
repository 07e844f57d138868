"""arena-plan: grids, load-aware parallelism planning, Pareto frontiers and proxy plans (§3.2-3.3), and the
one parallel-plan type every later stage uses.

Pure numpy/pyarrow (never imports JAX, never a model: it reads operator tables). The API the profiler, runtime
and scheduler use::

    from libarena.plan import PlannerConfig, plan_job, read_plans, write_plans
    planset = plan_job(read_table("ops.parquet", "operator_table"), load_cluster("c.yaml"), PlannerConfig())
    for plan in planset.proxy_plans():           # one ParallelPlan per feasible grid
        plan.grid.gpu_type, plan.grid.num_gpus, plan.grid.pipeline_degree
        for stage in plan.stages:                # StagePlan: clusters, num_gpus, dp, tp, zero, memory...
            ...
    planset.layout.stage_unit_ranges(plan)       # the model units each stage executes
"""

from libarena.plan.config import (
    MICROBATCHES_PER_STAGE,
    PlannerConfig,
    microbatch_count,
    planned_microbatch_count,
    replica_microbatch,
    runnable_microbatch_count,
    too_few_microbatches,
)
from libarena.plan.grids import Grid, Resources, enumerate_grids, stage_offsets
from libarena.plan.io import planset_from_artifact, planset_metadata, planset_to_table, read_plans, write_plans
from libarena.plan.layout import StageLayout
from libarena.plan.model import ModelProfile, load_model_profile, operator_table_digest
from libarena.plan.planner import communication_load, plan_job
from libarena.plan.types import DP_PLAN_ID, GridResult, ParallelPlan, PlanSet, StagePlan, data_parallel_plan, make_plan

__all__ = [
    "DP_PLAN_ID",
    "MICROBATCHES_PER_STAGE",
    "Grid",
    "GridResult",
    "ModelProfile",
    "ParallelPlan",
    "PlanSet",
    "PlannerConfig",
    "Resources",
    "StageLayout",
    "StagePlan",
    "communication_load",
    "data_parallel_plan",
    "enumerate_grids",
    "load_model_profile",
    "make_plan",
    "microbatch_count",
    "operator_table_digest",
    "plan_job",
    "planned_microbatch_count",
    "planset_from_artifact",
    "planset_metadata",
    "planset_to_table",
    "read_plans",
    "replica_microbatch",
    "runnable_microbatch_count",
    "stage_offsets",
    "too_few_microbatches",
    "write_plans",
]
