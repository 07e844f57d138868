"""The profiler's view of a ``plans`` artifact: typed plan records and their stages as unit ranges."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from libarena.errors import ArenaError
from libarena.models import ModelDef, get_model
from libarena.profile.stage import EXPERT_AXIS, StageSpec

#: Plan id of the pure data-parallel plan the profiler adds for every grid (view ``dp``).
DP_PLAN_ID = "dp"


@dataclass(frozen=True)
class GridKey:
    model: str
    global_batch: int
    gpu_type: str
    num_gpus: int
    num_nodes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "global_batch": self.global_batch,
            "gpu_type": self.gpu_type,
            "num_gpus": self.num_gpus,
            "num_nodes": self.num_nodes,
        }


@dataclass(frozen=True)
class PlanRecord:
    """One parallel plan: stage s covers clusters [stage_boundaries[s], stage_boundaries[s+1])."""

    grid: GridKey
    plan_id: str
    pipeline_degree: int
    num_microbatches: int
    stage_boundaries: tuple[int, ...]
    gpus_per_stage: tuple[int, ...]
    dp_per_stage: tuple[int, ...]
    tp_per_stage: tuple[int, ...]
    zero_per_stage: tuple[int, ...]
    is_proxy: bool = False
    on_frontier: bool = True
    feasible: bool = True
    gpus_per_node: int = 0
    stage_gpu_offsets: tuple[int, ...] = field(default=())

    def offsets(self) -> tuple[int, ...]:
        if self.stage_gpu_offsets:
            return self.stage_gpu_offsets
        out, acc = [], 0
        for g in self.gpus_per_stage:
            out.append(acc)
            acc += g
        return tuple(out)


@dataclass
class PlanInputs:
    """Plans plus what is needed to rebuild their stages: the model and its clusters' unit names."""

    plans: list[PlanRecord]
    infeasible_grids: list[GridKey]
    clusters: list[list[str]]
    model: ModelDef
    dtype: str
    seq_len: int | None
    source: str
    operator_table_sha256: str = ""
    #: per-cluster records of the operator table (flops, bytes, tp_allreduce_bytes, ...), when present
    cluster_records: list[dict[str, Any]] = field(default_factory=list)

    def cluster_unit_range(self, first: int, stop: int) -> tuple[int, int]:
        """Unit index range [start, stop) covered by clusters [first, stop)."""
        names = [u.name for u in self.model.units]
        index = {n: i for i, n in enumerate(names)}
        units = [index[u] for c in self.clusters[first:stop] for u in c]
        return min(units), max(units) + 1

    def stage_specs(self, plan: PlanRecord) -> list[StageSpec]:
        num_clusters = len(self.clusters)
        bounds = list(plan.stage_boundaries) + [num_clusters]
        has_experts = _has_expert_axis(self.model)
        specs = []
        for j in range(plan.pipeline_degree):
            start, stop = self.cluster_unit_range(bounds[j], bounds[j + 1])
            dp, tp, zero = plan.dp_per_stage[j], plan.tp_per_stage[j], plan.zero_per_stage[j]
            micro_batch = max(1, math.ceil(plan.grid.global_batch / (plan.num_microbatches * dp)))
            specs.append(
                StageSpec(
                    model=self.model.name,
                    start=start,
                    stop=stop,
                    micro_batch=micro_batch,
                    tp=tp,
                    ep=dp if has_experts else 1,
                    zero_shards=dp if zero else 1,
                    dtype=self.dtype,
                    seq_len=self.seq_len,
                )
            )
        return specs

    def dp_plan(self, grid: GridKey) -> PlanRecord:
        """Pure data parallelism on the grid's GPUs: one stage, no micro-batching."""
        n = grid.num_gpus
        return PlanRecord(grid, DP_PLAN_ID, 1, 1, (0,), (n,), (n,), (1,), (0,), False, False, True, 0, (0,))


def _has_expert_axis(model: ModelDef) -> bool:
    def walk(tree: Any) -> bool:
        if isinstance(tree, dict):
            return any(walk(v) for v in tree.values())
        if isinstance(tree, tuple):
            return EXPERT_AXIS in tree
        if isinstance(tree, list):
            return any(walk(v) for v in tree)
        return False

    return any(walk(model.param_axes(i)) for i in range(len(model.units)))


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in (value or ()))


def load_plan_inputs(artifact: Any) -> PlanInputs:
    """Typed plans from a ``plans`` TableArtifact; bad input raises ArenaError naming the row."""
    from libarena.plan.io import check_plans

    check_plans(artifact, costs=False)  # the plans' shape (stage lists, positive counts), shared with arena-plan
    meta = artifact.metadata or {}
    source = artifact.source
    rows = artifact.table.to_pylist()
    if not rows:
        raise ArenaError(f"{source}: the plans table is empty")
    models = sorted({r["model"] for r in rows})
    if len(models) != 1:
        raise ArenaError(f"{source}: plans of several models ({', '.join(models)}); profile one model per table")
    model = get_model(models[0])
    record = meta.get("model") or {}
    if record and record.get("name", model.name) != model.name:
        raise ArenaError(f"{source}: plans for {model.name} but the operator table in metadata is for {record.get('name')}")
    cluster_records = list(meta.get("clusters") or [])
    if not cluster_records:
        raise ArenaError(f"{source}: the plans carry no 'clusters' metadata (not made from an operator table by arena-plan)")
    unit_names = {u.name for u in model.units}
    clusters = []
    for i, rec in enumerate(cluster_records):
        units = list(rec.get("units") or [])
        unknown = [u for u in units if u not in unit_names]
        if not units or unknown:
            raise ArenaError(
                f"{source}: cluster {i} names units {unknown or units} that {model.name} does not have "
                "(the plans do not match this model's operator table)"
            )
        clusters.append(units)
    plans, infeasible = [], []
    for i, r in enumerate(rows):
        grid = GridKey(r["model"], int(r["global_batch"]), str(r["gpu_type"]), int(r["num_gpus"]), int(r.get("num_nodes") or 1))
        if not r.get("feasible", True):
            infeasible.append(grid)
            continue
        s = int(r["pipeline_degree"])
        lists = {name: _ints(r.get(name)) for name in ("stage_boundaries", "gpus_per_stage", "dp_per_stage", "tp_per_stage", "zero_per_stage")}
        for name, values in lists.items():
            if len(values) != s:
                raise ArenaError(f"{source}: row {i}, column {name}: {len(values)} entries for {s} stages")
        for j in range(s):
            if lists["dp_per_stage"][j] * lists["tp_per_stage"][j] != lists["gpus_per_stage"][j]:
                raise ArenaError(f"{source}: row {i}: stage {j} has dp x tp != its GPUs")
        bounds = lists["stage_boundaries"]
        if bounds[0] != 0 or any(b >= c for b, c in zip(bounds, bounds[1:])) or bounds[-1] >= len(clusters):
            raise ArenaError(f"{source}: row {i}, column stage_boundaries: {list(bounds)} is not an increasing split of {len(clusters)} clusters")
        b = int(r.get("num_microbatches") or 1)
        if b < 1:
            raise ArenaError(f"{source}: row {i}, column num_microbatches: must be >= 1")
        plans.append(
            PlanRecord(
                grid=grid,
                plan_id=str(r["plan_id"]),
                pipeline_degree=s,
                num_microbatches=b,
                stage_boundaries=bounds,
                gpus_per_stage=lists["gpus_per_stage"],
                dp_per_stage=lists["dp_per_stage"],
                tp_per_stage=lists["tp_per_stage"],
                zero_per_stage=lists["zero_per_stage"],
                is_proxy=bool(r.get("is_proxy", False)),
                on_frontier=bool(r.get("on_frontier", True) if r.get("on_frontier") is not None else True),
                feasible=True,
                gpus_per_node=int(r.get("gpus_per_node") or 0),
                stage_gpu_offsets=_ints(r.get("stage_gpu_offsets")),
            )
        )
    seq_len = int(meta.get("seq_len") or 0) or None
    return PlanInputs(
        plans=plans,
        infeasible_grids=infeasible,
        clusters=clusters,
        model=model,
        dtype=str(meta.get("dtype") or "fp32"),
        seq_len=seq_len,
        source=source,
        operator_table_sha256=str(meta.get("operator_table_sha256") or ""),
        cluster_records=cluster_records,
    )
