"""PlanSet <-> ``plans`` artifact (one row per frontier plan, one per infeasible grid)."""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow as pa

from libarena.artifacts import Provenance, read_table, write_table
from libarena.artifacts.registry import get_kind
from libarena.checks import MAX_BATCH, MAX_GPUS, brief
from libarena.errors import ArenaError
from libarena.hardware import get_gpu
from libarena.plan.config import runnable_microbatch_count
from libarena.plan.grids import Grid
from libarena.plan.layout import StageLayout
from libarena.plan.types import GridResult, ParallelPlan, PlanSet, infeasible_plan_id, make_plan


def grid_columns(grid: Any, pipeline_degree: int) -> dict[str, Any]:
    """The columns naming a grid, shared by the ``plans`` and ``perf_table`` rows (``grid``: a Grid or
    its Resources)."""
    return {
        "model": grid.model,
        "global_batch": grid.global_batch,
        "gpu_type": grid.gpu_type,
        "num_gpus": grid.num_gpus,
        "num_nodes": grid.num_nodes,
        "pipeline_degree": pipeline_degree,
    }


def plan_columns(plan: ParallelPlan) -> dict[str, Any]:
    """A plan's shape and costs, as in a ``plans`` row (also the JSON view of ``arena-plan show``)."""
    return {
        "plan_id": plan.plan_id,
        "is_proxy": plan.is_proxy,
        "on_frontier": plan.on_frontier,
        "num_microbatches": plan.num_microbatches,
        "stage_boundaries": plan.stage_boundaries,
        "gpus_per_stage": plan.gpus_per_stage,
        "dp_per_stage": plan.dp_per_stage,
        "tp_per_stage": plan.tp_per_stage,
        "zero_per_stage": plan.zero_per_stage,
        "remat_per_stage": plan.remat_per_stage,
        "stage_gpu_offsets": [st.gpu_offset for st in plan.stages],
        "computation_bias": plan.computation_bias,
        "communication_load": plan.communication_load,
        "memory_per_gpu_bytes": plan.memory_per_gpu_bytes,
    }


def _search_columns(result: GridResult) -> dict[str, Any]:
    return {
        "gpus_per_node": result.grid.gpus_per_node,
        "plans_considered": result.plans_considered,
        "plans_out_of_memory": result.plans_out_of_memory,
        "comm_model": result.comm_model,
    }


# Row dicts only need the right keys: the column order comes from the kind's schema.
def _plan_row(result: GridResult, plan: ParallelPlan) -> dict[str, Any]:
    return {
        **grid_columns(result.grid, result.grid.pipeline_degree),
        **plan_columns(plan),
        **_search_columns(result),
        "feasible": True,
        "infeasible_reason": "",
        "memory_per_stage_bytes": [st.memory_bytes for st in plan.stages],
        "comm_per_microbatch_s": [st.comm_per_microbatch_s for st in plan.stages],
        "grad_sync_s": [st.grad_sync_s for st in plan.stages],
        "p2p_per_microbatch_s": list(plan.p2p_per_microbatch_s),
    }


def _infeasible_row(result: GridResult) -> dict[str, Any]:
    empty_stage_lists = {column: [] for column in (
        "stage_boundaries", "gpus_per_stage", "dp_per_stage", "tp_per_stage", "zero_per_stage", "remat_per_stage",
        "stage_gpu_offsets",
        "memory_per_stage_bytes", "comm_per_microbatch_s", "grad_sync_s", "p2p_per_microbatch_s")}
    return {
        **grid_columns(result.grid, result.grid.pipeline_degree),
        **_search_columns(result),
        **empty_stage_lists,
        "plan_id": infeasible_plan_id(result.grid),
        "feasible": False,
        "infeasible_reason": result.infeasible_reason,
        "num_microbatches": result.num_microbatches,
        "computation_bias": math.nan,
        "communication_load": math.nan,
        "memory_per_gpu_bytes": result.min_memory_bytes,
        "is_proxy": False,
        "on_frontier": False,
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


def read_plans(path: str | os.PathLike[str], require_costs: bool = True) -> PlanSet:
    """Read a ``plans`` artifact back into a :class:`PlanSet` (grids in file order); see
    :func:`planset_from_artifact` for ``require_costs``."""
    return planset_from_artifact(read_table(path, "plans"), require_costs)


_POSITIVE_INTS = ("global_batch", "num_gpus", "num_nodes", "pipeline_degree", "gpus_per_node", "num_microbatches")
#: per-stage lists every reader needs (the plan's shape) and those only the planner's cost view uses
_SHAPE_LISTS = ("gpus_per_stage", "dp_per_stage", "tp_per_stage", "zero_per_stage", "remat_per_stage")
_COST_LISTS = ("stage_gpu_offsets", "memory_per_stage_bytes", "comm_per_microbatch_s", "grad_sync_s")


def _finite_non_negative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _check_cluster_fields(clusters: list[Any], where: str) -> None:
    """The cluster records' index (their position, where given) and numbers the runtime search and the profiler
    read (flops, bytes, collective volumes): finite and non-negative where given."""
    from libarena.artifacts.kinds.operator_table import CLUSTER_FIELDS

    numeric = [f.name for f in CLUSTER_FIELDS if f.type in ("int", "float") and f.name != "index"]
    for i, rec in enumerate(clusters):
        if "index" in rec and (isinstance(rec["index"], bool) or rec["index"] != i):
            raise ArenaError(f"{where}: clusters[{i}].index is {brief(rec['index'])}, expected {i} (clusters in model order)")
        for name in numeric:
            value = rec.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise ArenaError(f"{where}: clusters[{i}].{name}: expected a non-negative number, got {brief(value)}")


def check_plans(artifact: Any, costs: bool = True) -> None:
    """Validate a plans artifact's metadata and rows beyond their types (one-line ArenaError naming row and
    column), so every reader (show, export, arena-profile, arena-run) can index the stage lists safely.

    ``costs=False`` checks only the plans' shape (stages, GPUs, micro-batches): what a reader that does
    not use the planner's cost estimates (arena-profile) needs, and all that plans enumerated outside the
    planner have.
    """
    source, meta = artifact.source, artifact.metadata
    if not isinstance(meta.get("clusters"), list) or not meta["clusters"]:
        raise ArenaError(f"{source}: the plans carry no 'clusters' metadata (not made from an operator table by "
                         "arena-plan)")
    for key in ("model", "operator_table_sha256", "cluster"):
        if key not in meta:
            raise ArenaError(f"{source}: plans metadata has no {key!r} entry")
    if not isinstance(meta["model"], dict) or not isinstance(meta["model"].get("name"), str):
        raise ArenaError(f"{source}: plans metadata 'model' must be a record with a 'name'")
    for key, typ in (("planner", dict), ("cluster", str), ("operator_table_sha256", str)):
        if key in meta and not isinstance(meta[key], typ):
            raise ArenaError(f"{source}: plans metadata {key!r} must be a {typ.__name__}")
    # (global_batch may be left out, the rows give it; given, it names the batch every row was planned for;
    # seq_len is None for models without sequences)
    for key, least in (("global_batch", 1), ("seq_len", 0)):
        if key not in meta or (key == "seq_len" and meta[key] is None):
            continue
        if isinstance(meta[key], bool) or not isinstance(meta[key], int) or meta[key] < least:
            raise ArenaError(f"{source}: plans metadata {key!r} must be an integer of at least {least}, got "
                             f"{brief(meta[key])}")
    StageLayout.from_cluster_records(meta["clusters"], f"{source}: plans metadata")
    _check_cluster_fields(meta["clusters"], f"{source}: plans metadata")
    num_clusters = len(meta["clusters"])
    if artifact.table.num_rows == 0:
        raise ArenaError(f"{source}: the plans table is empty")
    models = sorted({str(m) for m in artifact.table.column("model").to_pylist() if m is not None})
    if len(models) > 1:
        raise ArenaError(f"{source}: plans of several models ({', '.join(models)}); one model per plans file")
    if models and models[0] != meta["model"]["name"]:
        raise ArenaError(f"{source}: plans for {models[0]} but the operator table in metadata is for {meta['model']['name']}")
    rows = artifact.table.to_pylist()
    rows_per_grid = Counter(_grid_key(row) for row in rows)
    plan_rows: dict[tuple[str, str], int] = {}  # (GPU type, plan id): plans of the local host reuse ids across types
    for r, row in enumerate(rows, start=1):
        def bad(column: str, problem: str) -> ArenaError:
            return ArenaError(f"{source}: row {r}, column {column!r}: {problem}")

        for column in ("model", "gpu_type", "plan_id", "feasible", "is_proxy", "on_frontier"):
            if row[column] is None:
                raise bad(column, "missing value")
        for column in _POSITIVE_INTS:
            if row[column] is None or row[column] <= 0:
                raise bad(column, f"expected a positive integer, got {row[column]!r}")
        if costs:  # the planner priced the plan on a catalogue GPU (plans of the local host's devices are "cpu")
            try:
                get_gpu(row["gpu_type"])
            except ArenaError as exc:
                raise bad("gpu_type", str(exc)) from None
        n = row["num_gpus"]
        if n > MAX_GPUS or n & (n - 1) or n > row["num_nodes"] * row["gpus_per_node"]:
            raise bad("num_gpus", f"{n} is not a power of two that {row['num_nodes']} node(s) of {row['gpus_per_node']} "
                                  f"GPUs hold")
        if not str(row["plan_id"]).strip():
            raise bad("plan_id", "empty plan id")
        first = plan_rows.setdefault((row["gpu_type"], row["plan_id"]), r)
        if first != r:
            raise bad("plan_id", f"{brief(row['plan_id'])} is also row {first}'s, of the same GPU type")
        for column in ("plans_considered", "plans_out_of_memory"):
            if row[column] is not None and row[column] < 0:
                raise bad(column, f"expected a non-negative integer, got {row[column]!r}")
        batch = row["global_batch"]
        if batch > MAX_BATCH or (meta.get("global_batch") and batch != meta["global_batch"]):
            raise bad("global_batch", f"{batch} is not the plans' global batch ({meta.get('global_batch')!r}, at most "
                                      f"{MAX_BATCH})")
        if not row["feasible"]:
            # an infeasible grid is one row, its reason: beside plans of the same grid it contradicts them
            if rows_per_grid[_grid_key(row)] > 1:
                raise bad("feasible", f"an infeasible row of a grid ({row['gpu_type']} x{row['num_gpus']}, "
                                      f"{row['pipeline_degree']} stages) that also has other rows")
            continue
        count = row["num_microbatches"]
        if count > batch or batch % count:
            # what the runtime runs (whole micro-batches): a plan priced at another count describes another plan
            raise bad("num_microbatches", f"{count} micro-batches do not split the global batch of {batch} evenly (the "
                                          f"runtime would run {runnable_microbatch_count(batch, count)}): plan again "
                                          "with arena-plan")
        for column in ("computation_bias", "communication_load", "memory_per_gpu_bytes") if costs else ():
            if not _finite_non_negative(row[column]):
                raise bad(column, f"expected a finite number >= 0, got {row[column]!r}")
        bounds = row["stage_boundaries"]
        degree = row["pipeline_degree"]
        if (bounds is None or len(bounds) != degree or any(b is None for b in bounds) or bounds[0] != 0
                or any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])) or bounds[-1] >= num_clusters):
            raise bad("stage_boundaries", f"expected {degree} increasing cluster indices from 0 below {num_clusters}, "
                                          f"got {bounds!r}")
        # Without costs only the shape is needed; stage offsets then default to the stages side by side.
        lists = _SHAPE_LISTS + (_COST_LISTS if costs else ("stage_gpu_offsets",) if row["stage_gpu_offsets"] else ())
        for column in lists:
            values = row[column]
            if values is None or len(values) != degree or not all(_finite_non_negative(v) for v in values):
                raise bad(column, f"expected {degree} finite non-negative values (one per stage), got {values!r}")
        p2p = row["p2p_per_microbatch_s"]
        if costs and (p2p is None or len(p2p) != degree - 1 or not all(_finite_non_negative(v) for v in p2p)):
            raise bad("p2p_per_microbatch_s", f"expected {degree - 1} finite non-negative values (one per stage "
                                              f"boundary), got {p2p!r}")
        gpus, dp, tp = row["gpus_per_stage"], row["dp_per_stage"], row["tp_per_stage"]
        if (any(g != d * t or g <= 0 or g & (g - 1) for g, d, t in zip(gpus, dp, tp))
                or sum(gpus) != row["num_gpus"]):
            raise bad("gpus_per_stage", f"stages {gpus!r} (dp {dp!r} x tp {tp!r}) are not powers of two that use "
                                        f"the grid's {row['num_gpus']} GPUs")
        for column in ("zero_per_stage", "remat_per_stage"):
            if any(v not in (0, 1) for v in row[column]):
                raise bad(column, f"expected 0 or 1 per stage (off or on), got {row[column]!r}")
        offsets = row["stage_gpu_offsets"]
        if offsets:
            # each stage on GPUs of its own inside the grid, at a multiple of its size (the planner's buddy
            # placement; the profiler reads from them which stage boundaries cross nodes)
            spans = sorted(zip(offsets, gpus))
            if (any(o % g for o, g in spans) or any(o1 + g1 > o2 for (o1, g1), (o2, _) in zip(spans, spans[1:]))
                    or spans[-1][0] + spans[-1][1] > row["num_gpus"]):
                raise bad("stage_gpu_offsets", f"stages of {gpus!r} GPUs at {offsets!r} overlap, leave the grid's "
                                               f"{row['num_gpus']} GPUs or do not start at a multiple of their size")


def _costs(row: dict[str, Any], column: str, degree: int, default: float) -> list[float]:
    """A per-stage cost list, or ``default`` per stage where the row has none (only a reader that does not
    require costs gets here with a missing or malformed list; check_plans vets them otherwise)."""
    values = row.get(column)
    if values is None or len(values) != degree or not all(_finite_non_negative(v) for v in values):
        return [default] * degree
    return [float(v) for v in values]


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def _grid_key(row: dict[str, Any]) -> tuple:
    return (row["model"], row["global_batch"], row["gpu_type"], row["num_gpus"], row["num_nodes"], row["pipeline_degree"])


def planset_from_artifact(artifact: Any, require_costs: bool = True) -> PlanSet:
    """The :class:`PlanSet` of a plans artifact. ``require_costs=False`` accepts plans without the planner's
    cost estimates (enumerated outside arena-plan): what the profiler and the runtime read, since they
    time and run a plan's structure, never its estimates."""
    check_plans(artifact, require_costs)
    meta = artifact.metadata
    num_clusters = len(meta["clusters"])
    rows = artifact.table.to_pylist()
    order: list[tuple] = []
    by_grid: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = _grid_key(row)
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
            plans_considered=first["plans_considered"] or 0,
            plans_out_of_memory=first["plans_out_of_memory"] or 0,
            comm_model=first["comm_model"] or "",
        )
        if not first["feasible"]:
            grids.append(GridResult(grid, (), infeasible_reason=first["infeasible_reason"] or "",
                                    min_memory_bytes=_number(first["memory_per_gpu_bytes"]), **common))
            continue
        plans = []
        for row in group:
            degree = len(row["stage_boundaries"])
            shape = make_plan(grid, row["stage_boundaries"], row["gpus_per_stage"], row["dp_per_stage"], row["tp_per_stage"],
                              row["zero_per_stage"], row["num_microbatches"], num_clusters, str(row["plan_id"]),
                              row["stage_gpu_offsets"] or None, remat=row["remat_per_stage"])
            memory = _costs(row, "memory_per_stage_bytes", degree, math.nan)
            comm = _costs(row, "comm_per_microbatch_s", degree, 0.0)
            grad = _costs(row, "grad_sync_s", degree, 0.0)
            stages = tuple(replace(st, memory_bytes=memory[j], comm_per_microbatch_s=comm[j], grad_sync_s=grad[j])
                           for j, st in enumerate(shape.stages))
            plans.append(replace(
                shape,
                stages=stages,
                computation_bias=_number(row["computation_bias"]),
                communication_load=_number(row["communication_load"]),
                memory_per_gpu_bytes=_number(row["memory_per_gpu_bytes"]),
                is_proxy=bool(row["is_proxy"]),
                on_frontier=bool(row["on_frontier"]),
                p2p_per_microbatch_s=tuple(_costs(row, "p2p_per_microbatch_s", degree - 1, 0.0)),
            ))
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
