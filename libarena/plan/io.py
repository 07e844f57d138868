"""PlanSet <-> ``plans`` artifact (one row per frontier plan, one per infeasible grid)."""

from __future__ import annotations

import math
import os
from typing import Any

import pyarrow as pa

from libarena.artifacts import Provenance, read_table, write_table
from libarena.artifacts.registry import get_kind
from libarena.errors import ArenaError
from libarena.plan.grids import Grid
from libarena.plan.types import GridResult, ParallelPlan, PlanSet, StagePlan, infeasible_plan_id


def _plan_row(result: GridResult, plan: ParallelPlan) -> dict[str, Any]:
    g = result.grid
    return {
        "model": g.model,
        "global_batch": g.global_batch,
        "gpu_type": g.gpu_type,
        "num_gpus": g.num_gpus,
        "num_nodes": g.num_nodes,
        "pipeline_degree": g.pipeline_degree,
        "plan_id": plan.plan_id,
        "feasible": True,
        "infeasible_reason": "",
        "num_microbatches": plan.num_microbatches,
        "stage_boundaries": plan.stage_boundaries,
        "gpus_per_stage": plan.gpus_per_stage,
        "dp_per_stage": plan.dp_per_stage,
        "tp_per_stage": plan.tp_per_stage,
        "zero_per_stage": plan.zero_per_stage,
        "computation_bias": plan.computation_bias,
        "communication_load": plan.communication_load,
        "memory_per_gpu_bytes": plan.memory_per_gpu_bytes,
        "is_proxy": plan.is_proxy,
        "gpus_per_node": g.gpus_per_node,
        "stage_gpu_offsets": [st.gpu_offset for st in plan.stages],
        "memory_per_stage_bytes": [st.memory_bytes for st in plan.stages],
        "comm_per_microbatch_s": [st.comm_per_microbatch_s for st in plan.stages],
        "grad_sync_s": [st.grad_sync_s for st in plan.stages],
        "p2p_per_microbatch_s": list(plan.p2p_per_microbatch_s),
        "on_frontier": plan.on_frontier,
        "plans_considered": result.plans_considered,
        "plans_out_of_memory": result.plans_out_of_memory,
        "comm_model": result.comm_model,
    }


def _infeasible_row(result: GridResult) -> dict[str, Any]:
    g = result.grid
    return {
        "model": g.model,
        "global_batch": g.global_batch,
        "gpu_type": g.gpu_type,
        "num_gpus": g.num_gpus,
        "num_nodes": g.num_nodes,
        "pipeline_degree": g.pipeline_degree,
        "plan_id": infeasible_plan_id(g),
        "feasible": False,
        "infeasible_reason": result.infeasible_reason,
        "num_microbatches": result.num_microbatches,
        "stage_boundaries": [],
        "gpus_per_stage": [],
        "dp_per_stage": [],
        "tp_per_stage": [],
        "zero_per_stage": [],
        "computation_bias": math.nan,
        "communication_load": math.nan,
        "memory_per_gpu_bytes": result.min_memory_bytes,
        "is_proxy": False,
        "gpus_per_node": g.gpus_per_node,
        "stage_gpu_offsets": [],
        "memory_per_stage_bytes": [],
        "comm_per_microbatch_s": [],
        "grad_sync_s": [],
        "p2p_per_microbatch_s": [],
        "on_frontier": False,
        "plans_considered": result.plans_considered,
        "plans_out_of_memory": result.plans_out_of_memory,
        "comm_model": result.comm_model,
    }


def planset_rows(planset: PlanSet) -> list[dict[str, Any]]:
    rows = []
    for result in planset.grids:
        if result.feasible:
            rows.extend(_plan_row(result, p) for p in result.plans)
        else:
            rows.append(_infeasible_row(result))
    return rows


def planset_to_table(planset: PlanSet) -> pa.Table:
    kind = get_kind("plans")
    rows = planset_rows(planset)
    return pa.Table.from_pylist(rows, schema=kind.arrow_schema())


def planset_metadata(planset: PlanSet) -> dict[str, Any]:
    return {
        "model": planset.model,
        "operator_table_sha256": planset.operator_table_sha256,
        "cluster": planset.cluster_name,
        "clusters": planset.clusters,
        "global_batch": planset.global_batch,
        "seq_len": planset.seq_len,
        "dtype": planset.dtype,
        "planner": planset.planner,
        "comm_model": planset.comm_model,
    }


def write_plans(path: str | os.PathLike[str], planset: PlanSet, provenance: Provenance) -> None:
    write_table(path, "plans", planset_to_table(planset), provenance, planset_metadata(planset))


def read_plans(path: str | os.PathLike[str]) -> PlanSet:
    """Read a ``plans`` artifact back into a :class:`PlanSet` (grids in file order)."""
    artifact = read_table(path, "plans")
    return planset_from_artifact(artifact)


def planset_from_artifact(artifact) -> PlanSet:
    meta = artifact.metadata
    for key in ("model", "operator_table_sha256", "cluster", "clusters"):
        if key not in meta:
            raise ArenaError(f"{artifact.source}: plans metadata has no {key!r} entry")
    rows = artifact.table.to_pylist()
    order: list[tuple] = []
    by_grid: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["model"], row["global_batch"], row["gpu_type"], row["num_gpus"], row["num_nodes"], row["pipeline_degree"])
        if key not in by_grid:
            order.append(key)
            by_grid[key] = []
        by_grid[key].append(row)
    grids = []
    for key in order:
        group = by_grid[key]
        first = group[0]
        grid = Grid(
            model=first["model"],
            global_batch=first["global_batch"],
            gpu_type=first["gpu_type"],
            num_gpus=first["num_gpus"],
            num_nodes=first["num_nodes"],
            gpus_per_node=first["gpus_per_node"],
            pipeline_degree=first["pipeline_degree"],
        )
        common = dict(
            num_microbatches=first["num_microbatches"],
            plans_considered=first["plans_considered"],
            plans_out_of_memory=first["plans_out_of_memory"],
            comm_model=first["comm_model"],
        )
        if not first["feasible"]:
            grids.append(
                GridResult(grid, (), infeasible_reason=first["infeasible_reason"], min_memory_bytes=first["memory_per_gpu_bytes"], **common)
            )
            continue
        plans = []
        for row in group:
            bounds = row["stage_boundaries"]
            ends = bounds[1:] + [len(meta["clusters"])]
            stages = tuple(
                StagePlan(
                    index=j,
                    first_cluster=bounds[j],
                    end_cluster=ends[j],
                    num_gpus=row["gpus_per_stage"][j],
                    dp=row["dp_per_stage"][j],
                    tp=row["tp_per_stage"][j],
                    zero=bool(row["zero_per_stage"][j]),
                    gpu_offset=row["stage_gpu_offsets"][j],
                    memory_bytes=row["memory_per_stage_bytes"][j],
                    comm_per_microbatch_s=row["comm_per_microbatch_s"][j],
                    grad_sync_s=row["grad_sync_s"][j],
                )
                for j in range(len(bounds))
            )
            plans.append(
                ParallelPlan(
                    grid=grid,
                    plan_id=row["plan_id"],
                    num_microbatches=row["num_microbatches"],
                    stages=stages,
                    computation_bias=row["computation_bias"],
                    communication_load=row["communication_load"],
                    memory_per_gpu_bytes=row["memory_per_gpu_bytes"],
                    is_proxy=row["is_proxy"],
                    on_frontier=row["on_frontier"],
                    p2p_per_microbatch_s=tuple(row["p2p_per_microbatch_s"]),
                )
            )
        feasible_min = min(p.memory_per_gpu_bytes for p in plans)
        grids.append(GridResult(grid, tuple(plans), min_memory_bytes=feasible_min, **common))
    model = meta["model"]
    return PlanSet(
        model=model,
        global_batch=int(meta.get("global_batch", grids[0].grid.global_batch if grids else 0)),
        seq_len=int(meta.get("seq_len", 0) or 0),
        dtype=str(meta.get("dtype", "")),
        cluster_name=str(meta["cluster"]),
        operator_table_sha256=str(meta["operator_table_sha256"]),
        clusters=list(meta["clusters"]),
        grids=grids,
        planner=dict(meta.get("planner", {})),
        comm_model=str(meta.get("comm_model", "")),
    )
