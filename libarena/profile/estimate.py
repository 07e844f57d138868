"""A plan's estimated iteration time, however it was obtained, and the performance-table rows made from them.

Two sources give :class:`PlanEstimate` objects: the disaggregated profiler (stages timed on the local device,
libarena.profile.profiler) and the execution-free roofline estimate (libarena.profile.roofline). Both then
become performance-table rows the same way (:func:`perf_rows`), so the two kinds of table differ only in
where the stage times came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from libarena.plan import ParallelPlan, Resources
from libarena.plan.io import grid_columns
from libarena.profile.pipeline import IterationEstimate


@dataclass
class PlanEstimate:
    """The estimated iteration of one plan on its grid's resources."""

    plan: ParallelPlan
    iteration: IterationEstimate
    fits_in_memory: bool
    memory_per_stage_bytes: list[float]
    timer: str
    estimated: bool
    profiling_cost_device_s: float
    #: per-stage breakdown (profiled plans: units, micro-batch, stage times, memory)
    stages: list[dict[str, Any]] = field(default_factory=list)
    comm_sources: list[str] = field(default_factory=list)

    @property
    def resources(self) -> Resources:
        return self.plan.resources

    @property
    def iter_time_s(self) -> float:
        return self.iteration.iter_time_s

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.resources.to_dict(),
            "plan_id": self.plan.plan_id,
            "pipeline_degree": self.plan.pipeline_degree,
            "num_microbatches": self.plan.num_microbatches,
            "is_proxy": self.plan.is_proxy,
            "dp_per_stage": self.plan.dp_per_stage,
            "tp_per_stage": self.plan.tp_per_stage,
            "remat_per_stage": self.plan.remat_per_stage,
            "iter_time_s": self.iter_time_s,
            "iteration": self.iteration.to_dict(),
            "fits_in_memory": self.fits_in_memory,
            "memory_per_stage_bytes": self.memory_per_stage_bytes,
            "timer": self.timer,
            "estimated": self.estimated,
            "profiling_cost_device_s": self.profiling_cost_device_s,
            "comm_sources": self.comm_sources,
            "stages": self.stages,
        }


def perf_row(estimate: PlanEstimate, view: str, cost: float) -> dict[str, Any]:
    """One performance-table row: ``estimate`` as the plan of ``view`` (arena, ap or dp)."""
    resources = estimate.resources
    t = estimate.iter_time_s
    return {
        **grid_columns(resources, estimate.plan.pipeline_degree),
        "plan_id": estimate.plan.plan_id,
        "view": view,
        "iter_time_s": t,
        "throughput": resources.global_batch / t if t > 0 else math.nan,
        "fits_in_memory": estimate.fits_in_memory,
        "recomputes": estimate.plan.recomputes,
        "timer": estimate.timer,
        "estimated": estimate.estimated,
        "profiling_cost_device_s": cost,
        "measured_iter_time_s": None,
        "measured_cost_device_s": None,
    }


def perf_rows(estimates: list[PlanEstimate], dp_estimates: dict[Resources, PlanEstimate],
              resources: list[Resources]) -> list[dict[str, Any]]:
    """Rows of the performance table, per allocation in ``resources`` order: ``arena`` for each proxy plan
    (the planner's grids split by pipeline degree, each with its own proxy; the scheduler keeps the best row
    of an allocation), ``ap`` for the fastest estimated plan that fits (the AP search's pick; its cost is
    all the plans' profiling), and ``dp`` for pure data parallelism."""
    by_resources: dict[Resources, list[PlanEstimate]] = {}
    for e in estimates:
        by_resources.setdefault(e.resources, []).append(e)
    rows = []
    for r in resources:
        plans = by_resources.get(r, [])
        if plans:
            proxies = [e for e in plans if e.plan.is_proxy] or plans[:1]
            for proxy in proxies:
                rows.append(perf_row(proxy, "arena", proxy.profiling_cost_device_s))
            fitting = [e for e in plans if e.fits_in_memory] or plans
            best = min(fitting, key=lambda e: (e.iter_time_s, e.plan.plan_id))
            rows.append(perf_row(best, "ap", sum(e.profiling_cost_device_s for e in plans)))
        if r in dp_estimates:
            e = dp_estimates[r]
            rows.append(perf_row(e, "dp", e.profiling_cost_device_s))
    return rows
