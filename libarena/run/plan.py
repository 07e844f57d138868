"""The runtime's typed view of a parallel plan: stages as unit ranges of the model, with their GPU count,
data/tensor-parallel degrees and ZeRO flag.

arena-plan speaks in clustered operators (``stage_boundaries`` are first CLUSTER indices); the plans
metadata lists each cluster's units, which maps every stage onto a contiguous range of model units.
A :class:`RunPlan` can be built from a ``plans`` row, from :class:`libarena.plan.ParallelPlan`, or
directly from unit boundaries (tests, full-space search).

No JAX here: the search enumerates and prunes plans without touching devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from libarena.errors import ArenaError
from libarena.models import ModelDef


@dataclass(frozen=True)
class RunStage:
    #: Model units [first_unit, end_unit) the stage executes.
    first_unit: int
    end_unit: int
    num_gpus: int
    dp: int
    tp: int
    zero: bool = False
    #: First device of the stage within the job's devices (None: stages laid out in order).
    gpu_offset: int | None = None
    #: Clusters [first_cluster, end_cluster) of the operator table when the plan came from arena-plan.
    first_cluster: int | None = None
    end_cluster: int | None = None

    @property
    def units(self) -> range:
        return range(self.first_unit, self.end_unit)

    @property
    def intra(self) -> tuple[int, int, int, bool]:
        """(GPU count, dp, tp, zero): the stage's intra-stage parallelism."""
        return (self.num_gpus, self.dp, self.tp, self.zero)


@dataclass(frozen=True)
class RunPlan:
    model: str
    global_batch: int
    num_microbatches: int
    stages: tuple[RunStage, ...]
    plan_id: str = ""
    gpu_type: str = "cpu"
    is_proxy: bool = False

    @property
    def num_gpus(self) -> int:
        return sum(st.num_gpus for st in self.stages)

    @property
    def pipeline_degree(self) -> int:
        return len(self.stages)

    @property
    def microbatch_size(self) -> int:
        return self.global_batch // self.num_microbatches

    def offsets(self) -> list[int]:
        if all(st.gpu_offset is not None for st in self.stages):
            return [int(st.gpu_offset) for st in self.stages]
        out, start = [], 0
        for st in self.stages:
            out.append(start)
            start += st.num_gpus
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "model": self.model,
            "gpu_type": self.gpu_type,
            "global_batch": self.global_batch,
            "num_microbatches": self.num_microbatches,
            "num_gpus": self.num_gpus,
            "pipeline_degree": self.pipeline_degree,
            "unit_boundaries": [st.first_unit for st in self.stages],
            "gpus_per_stage": [st.num_gpus for st in self.stages],
            "dp_per_stage": [st.dp for st in self.stages],
            "tp_per_stage": [st.tp for st in self.stages],
            "zero_per_stage": [int(st.zero) for st in self.stages],
            "is_proxy": self.is_proxy,
        }

    @property
    def label(self) -> str:
        parts = [f"[{st.first_unit}:{st.end_unit}) {st.num_gpus}g dp{st.dp} tp{st.tp}{' z' if st.zero else ''}" for st in self.stages]
        return f"{self.plan_id or 'plan'} B={self.num_microbatches}: " + " | ".join(parts)

    def validate(self, model: ModelDef, num_devices: int | None = None) -> None:
        """Raise ArenaError (one line) unless the plan can run ``model`` on ``num_devices`` devices."""
        name = self.plan_id or "plan"
        if self.model != model.name:
            raise ArenaError(f"{name} is a plan for model {self.model!r}, not {model.name!r}")
        if not self.stages:
            raise ArenaError(f"{name} has no stages")
        expected = 0
        for j, st in enumerate(self.stages):
            if st.first_unit != expected or st.end_unit <= st.first_unit:
                raise ArenaError(f"{name}: stage {j} covers units [{st.first_unit}, {st.end_unit}), expected to start at unit {expected}")
            expected = st.end_unit
            if st.dp < 1 or st.tp < 1 or st.dp * st.tp != st.num_gpus:
                raise ArenaError(f"{name}: stage {j} has {st.num_gpus} GPUs but dp={st.dp} x tp={st.tp}")
        if expected != len(model.units):
            raise ArenaError(f"{name}: stages cover {expected} of the model's {len(model.units)} units")
        if self.num_microbatches < 1 or self.global_batch % self.num_microbatches:
            raise ArenaError(f"{name}: global batch {self.global_batch} is not divisible into {self.num_microbatches} micro-batches")
        for j, st in enumerate(self.stages):
            if self.microbatch_size % st.dp:
                raise ArenaError(f"{name}: micro-batch of {self.microbatch_size} samples cannot be split over stage {j}'s dp={st.dp}")
        offsets = self.offsets()
        used: set[int] = set()
        for st, off in zip(self.stages, offsets):
            span = set(range(off, off + st.num_gpus))
            if used & span:
                raise ArenaError(f"{name}: stages overlap on devices {sorted(used & span)}")
            used |= span
        if num_devices is not None and max(used) + 1 > num_devices:
            raise ArenaError(f"{name} needs {max(used) + 1} devices but only {num_devices} exist")


def cluster_unit_ranges(model: ModelDef, clusters: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """[first_unit, end_unit) of each cluster record (records list their unit names in order)."""
    index = {u.name: i for i, u in enumerate(model.units)}
    ranges = []
    expected = 0
    for c, record in enumerate(clusters):
        names = list(record.get("units") or [])
        if not names:
            raise ArenaError(f"plans metadata: cluster {c} lists no units")
        unknown = [n for n in names if n not in index]
        if unknown:
            raise ArenaError(f"plans metadata: cluster {c} names unit {unknown[0]!r}, which model {model.name} does not have")
        ids = sorted(index[n] for n in names)
        if ids[0] != expected or ids != list(range(ids[0], ids[-1] + 1)):
            raise ArenaError(f"plans metadata: cluster {c} units {names} are not the contiguous units after unit {expected - 1}")
        ranges.append((ids[0], ids[-1] + 1))
        expected = ids[-1] + 1
    if expected != len(model.units):
        raise ArenaError(f"plans metadata: clusters cover {expected} of model {model.name}'s {len(model.units)} units")
    return ranges


def _stages_from_clusters(
    ranges: list[tuple[int, int]], boundaries: Sequence[int], gpus: Sequence[int], dp: Sequence[int], tp: Sequence[int],
    zero: Sequence[int], offsets: Sequence[int] | None, where: str,
) -> tuple[RunStage, ...]:
    s = len(boundaries)
    if not (len(gpus) == len(dp) == len(tp) == s) or (zero and len(zero) != s):
        raise ArenaError(f"{where}: per-stage lists have different lengths")
    ends = list(boundaries[1:]) + [len(ranges)]
    stages = []
    for j in range(s):
        a, b = int(boundaries[j]), int(ends[j])
        if not 0 <= a < b <= len(ranges):
            raise ArenaError(f"{where}: stage {j} spans clusters [{a}, {b}) outside the {len(ranges)} clusters")
        stages.append(
            RunStage(
                first_unit=ranges[a][0], end_unit=ranges[b - 1][1], num_gpus=int(gpus[j]), dp=int(dp[j]), tp=int(tp[j]),
                zero=bool(zero[j]) if zero else False, gpu_offset=int(offsets[j]) if offsets else None,
                first_cluster=a, end_cluster=b,
            )
        )
    return tuple(stages)


def plan_from_row(row: Mapping[str, Any], model: ModelDef, clusters: Sequence[Mapping[str, Any]]) -> RunPlan:
    """A ``plans`` artifact row (a dict) as a RunPlan."""
    where = f"plan {row.get('plan_id', '?')}"
    if row.get("model") != model.name:
        raise ArenaError(f"{where} is a plan for model {row.get('model')!r}, not {model.name!r}")
    if not row.get("feasible", True):
        raise ArenaError(f"{where} is an infeasible grid: {row.get('infeasible_reason', '')}")
    stages = _stages_from_clusters(
        cluster_unit_ranges(model, clusters), row["stage_boundaries"], row["gpus_per_stage"], row["dp_per_stage"],
        row["tp_per_stage"], row.get("zero_per_stage") or [], row.get("stage_gpu_offsets") or None, where,
    )
    return RunPlan(
        model=model.name, global_batch=int(row["global_batch"]), num_microbatches=int(row["num_microbatches"]),
        stages=stages, plan_id=str(row["plan_id"]), gpu_type=str(row.get("gpu_type", "cpu")), is_proxy=bool(row.get("is_proxy", False)),
    )


def plan_from_parallel_plan(plan: Any, model: ModelDef, clusters: Sequence[Mapping[str, Any]]) -> RunPlan:
    """A :class:`libarena.plan.ParallelPlan` (arena-plan's typed plan) as a RunPlan."""
    where = f"plan {plan.plan_id}"
    if plan.grid.model != model.name:
        raise ArenaError(f"{where} is a plan for model {plan.grid.model!r}, not {model.name!r}")
    stages = _stages_from_clusters(
        cluster_unit_ranges(model, clusters), plan.stage_boundaries, plan.gpus_per_stage, plan.dp_per_stage, plan.tp_per_stage,
        plan.zero_per_stage, [st.gpu_offset for st in plan.stages], where,
    )
    return RunPlan(
        model=model.name, global_batch=int(plan.grid.global_batch), num_microbatches=int(plan.num_microbatches), stages=stages,
        plan_id=plan.plan_id, gpu_type=plan.grid.gpu_type, is_proxy=bool(plan.is_proxy),
    )


def as_run_plan(plan: Any, model: ModelDef, clusters: Sequence[Mapping[str, Any]] | None = None) -> RunPlan:
    """Accept a RunPlan, a ``plans`` row (dict) or a libarena.plan.ParallelPlan."""
    if isinstance(plan, RunPlan):
        return plan
    if clusters is None:
        raise ArenaError("a plan from arena-plan needs the plans metadata's clusters to map stages onto units")
    if isinstance(plan, Mapping):
        return plan_from_row(plan, model, clusters)
    return plan_from_parallel_plan(plan, model, clusters)


def simple_plan(
    model: ModelDef, global_batch: int, unit_boundaries: Sequence[int], dp: Sequence[int], tp: Sequence[int],
    num_microbatches: int = 1, zero: Sequence[int] | None = None, plan_id: str = "", gpu_type: str = "cpu",
) -> RunPlan:
    """A plan from unit boundaries (first unit of each stage) and per-stage (dp, tp)."""
    ends = list(unit_boundaries[1:]) + [len(model.units)]
    zero = zero or [0] * len(unit_boundaries)
    stages = tuple(
        RunStage(int(a), int(b), int(d) * int(t), int(d), int(t), bool(z))
        for a, b, d, t, z in zip(unit_boundaries, ends, dp, tp, zero)
    )
    if not plan_id:
        plan_id = "u" + "-".join(map(str, unit_boundaries)) + "_" + "-".join(f"{d}x{t}{'z' if z else ''}" for d, t, z in zip(dp, tp, zero)) + f"_B{num_microbatches}"
    return RunPlan(model.name, int(global_batch), int(num_microbatches), stages, plan_id, gpu_type)
