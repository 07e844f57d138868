"""The runtime's view of a plan: an arena-plan :class:`~libarena.plan.ParallelPlan` bound to the model units
its stages execute (through the plan set's :class:`~libarena.plan.StageLayout`), checked against the model
and the devices it will run on.

No JAX here: the search enumerates and prunes plans without touching devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from libarena.errors import ArenaError
from libarena.models import ModelDef
from libarena.plan import Grid, ParallelPlan, StageLayout, StagePlan, make_plan, replica_microbatch


@dataclass(frozen=True)
class RunPlan:
    plan: ParallelPlan
    #: Model units [start, stop) each stage executes.
    unit_ranges: tuple[tuple[int, int], ...]

    @classmethod
    def from_plan(cls, plan: ParallelPlan, layout: StageLayout, model: ModelDef) -> RunPlan:
        """Bind ``plan`` to ``model``'s units; ArenaError (one line) when the plan or its clusters are not the model's."""
        if plan.grid.model != model.name:
            raise ArenaError(f"plan {plan.plan_id} is a plan for model {plan.grid.model!r}, not {model.name!r}")
        layout.check_units([u.name for u in model.units], model.name)
        return cls(plan, layout.stage_unit_ranges(plan))

    # -- the plan's numbers ----------------------------------------------------------------------------
    @property
    def model(self) -> str:
        return self.plan.grid.model

    @property
    def global_batch(self) -> int:
        return self.plan.grid.global_batch

    @property
    def gpu_type(self) -> str:
        return self.plan.grid.gpu_type

    @property
    def plan_id(self) -> str:
        return self.plan.plan_id

    @property
    def num_microbatches(self) -> int:
        return self.plan.num_microbatches

    @property
    def stages(self) -> tuple[StagePlan, ...]:
        return self.plan.stages

    @property
    def num_gpus(self) -> int:
        return self.plan.num_gpus

    @property
    def pipeline_degree(self) -> int:
        return self.plan.pipeline_degree

    @property
    def microbatch_size(self) -> int:
        """Samples per micro-batch (whole: ``validate`` checks that the micro-batches split the batch evenly)."""
        return replica_microbatch(self.global_batch, self.num_microbatches)

    def units(self, stage: int) -> range:
        return range(*self.unit_ranges[stage])

    def offsets(self) -> list[int]:
        return self.plan.stage_gpu_offsets

    def describe(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "model": self.model,
            "gpu_type": self.gpu_type,
            "global_batch": self.global_batch,
            "num_microbatches": self.num_microbatches,
            "num_gpus": self.num_gpus,
            "pipeline_degree": self.pipeline_degree,
            "unit_boundaries": [start for start, _ in self.unit_ranges],
            "gpus_per_stage": self.plan.gpus_per_stage,
            "dp_per_stage": self.plan.dp_per_stage,
            "tp_per_stage": self.plan.tp_per_stage,
            "zero_per_stage": self.plan.zero_per_stage,
            "remat_per_stage": self.plan.remat_per_stage,
            "is_proxy": self.plan.is_proxy,
        }

    @property
    def label(self) -> str:
        parts = [f"[{a}:{b}) {st.num_gpus}g dp{st.dp} tp{st.tp}{' z' if st.zero else ''}{' r' if st.remat else ''}"
                 for (a, b), st in zip(self.unit_ranges, self.stages)]
        return f"{self.plan_id or 'plan'} B={self.num_microbatches}: " + " | ".join(parts)

    def validate(self, model: ModelDef, num_devices: int | None = None) -> None:
        """Raise ArenaError (one line) unless the plan can run ``model`` on ``num_devices`` devices."""
        name = self.plan_id or "plan"
        if self.model != model.name:
            raise ArenaError(f"{name} is a plan for model {self.model!r}, not {model.name!r}")
        if not self.stages:
            raise ArenaError(f"{name} has no stages")
        expected = 0
        for j, (start, stop) in enumerate(self.unit_ranges):
            if start != expected or stop <= start:
                raise ArenaError(f"{name}: stage {j} covers units [{start}, {stop}), expected to start at unit {expected}")
            expected = stop
        for j, st in enumerate(self.stages):
            if st.dp < 1 or st.tp < 1 or st.dp * st.tp != st.num_gpus:
                raise ArenaError(f"{name}: stage {j} has {st.num_gpus} GPUs but dp={st.dp} x tp={st.tp}")
        if expected != len(model.units):
            raise ArenaError(f"{name}: stages cover {expected} of the model's {len(model.units)} units")
        if self.num_microbatches < 1 or self.global_batch % self.num_microbatches:
            raise ArenaError(f"{name}: global batch {self.global_batch} is not divisible into {self.num_microbatches} micro-batches")
        for j, st in enumerate(self.stages):
            if self.microbatch_size % st.dp:
                raise ArenaError(f"{name}: micro-batch of {self.microbatch_size} samples cannot be split over stage {j}'s dp={st.dp}")
        used: set[int] = set()
        for st, off in zip(self.stages, self.offsets()):
            span = set(range(off, off + st.num_gpus))
            if used & span:
                raise ArenaError(f"{name}: stages overlap on devices {sorted(used & span)}")
            used |= span
        if num_devices is not None and max(used) + 1 > num_devices:
            raise ArenaError(f"{name} needs {max(used) + 1} devices but only {num_devices} exist")


def simple_plan(
    model: ModelDef, global_batch: int, unit_boundaries: Sequence[int], dp: Sequence[int], tp: Sequence[int],
    num_microbatches: int = 1, zero: Sequence[int] | None = None, plan_id: str = "", gpu_type: str = "cpu",
    remat: Sequence[int] | None = None,
) -> RunPlan:
    """A plan written directly in model units (every unit its own cluster): first unit of each stage and
    per-stage (dp, tp), optionally ZeRO and activation recomputation per stage."""
    zero = list(zero) if zero else [0] * len(unit_boundaries)
    remat = list(remat) if remat else [0] * len(unit_boundaries)
    gpus = [int(d) * int(t) for d, t in zip(dp, tp)]
    if not plan_id:
        plan_id = ("u" + "-".join(map(str, unit_boundaries)) + "_"
                   + "-".join(f"{d}x{t}{'z' if z else ''}{'r' if r else ''}" for d, t, z, r in zip(dp, tp, zero, remat))
                   + f"_B{num_microbatches}")
    n = sum(gpus)
    grid = Grid(model.name, int(global_batch), gpu_type, n, 1, n, len(unit_boundaries))
    layout = StageLayout.per_unit([u.name for u in model.units])
    plan = make_plan(grid, unit_boundaries, gpus, dp, tp, zero, num_microbatches, layout.num_clusters, plan_id, remat=remat)
    return RunPlan.from_plan(plan, layout, model)
