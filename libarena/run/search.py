"""Runtime adaptive-parallelism search (§3.6): the full space (Alpa-style baseline) and the pruned space.

For allocated resources (GPU type m, GPU count n) the full space is every plan of every grid: pipeline
degree s, contiguous partition of the O clusters into s stages, power-of-two GPU assignment summing to n
and per-stage (dp, tp, ZeRO). Each candidate is *measured* (a few real training steps); search cost is the
measurement wall time times the n devices held.

Pruning rules, from arena-plan's Pareto frontiers of the grids:
  1. take the best grid's pipeline degree s_b (given, or the grid whose proxy plan measures fastest);
  2. drop (partition, assignment) pairs more imbalanced than the most imbalanced Pareto plan of G_b;
  3. a stage whose cluster range matches a stage of a Pareto plan of G_b takes that stage's GPU count and
     intra-stage choice (dp, tp, ZeRO, recomputation) instead of trying all.

Imbalance is the paper's computation bias b_comp (eq. 3): Euclidean distance of the GPU assignment from
the load-proportional one, with cluster loads from the plans metadata (roofline of each cluster's FLOPs
and bytes on the GPU type), computed the same way for the frontier plans and the candidates.
Planning and pruning are numpy only; ``measure`` is whatever times a plan (``measure_plan`` in-process, or
a Ray actor).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from libarena.checks import MAX_BATCH, MAX_SEED, Range, check_fields
from libarena.errors import ArenaError
from libarena.models import ModelDef
from libarena.hardware import get_gpu
from libarena.plan import (MICROBATCHES_PER_STAGE, Grid, ParallelPlan, StageLayout, make_plan, planned_microbatch_count,
                           runnable_microbatch_count, stage_offsets)
from libarena.plan.costs import intra_stage_options
from libarena.plan.partition import computation_bias, partitions, power_of_two_compositions
from libarena.run.plan import RunPlan


@dataclass(frozen=True)
class SearchConfig:
    #: Measure at most this many candidates per search (a seeded uniform sample beyond it); 0 = all.
    max_candidates: int = 0
    sample_seed: int = 0
    #: Untimed steps (the first compiles) and timed steps per candidate.
    warmup_steps: int = 1
    timed_steps: int = 2
    #: Micro-batches B = microbatches_per_stage x s, as arena-plan does, reduced until B divides the batch
    #: (``num_microbatches``: a fixed B instead). The pruned search takes both from the plans file's planner
    #: settings, so that its candidates run at the B the frontier plans were priced at.
    microbatches_per_stage: int = MICROBATCHES_PER_STAGE
    num_microbatches: int | None = None
    allow_zero: bool = True
    #: Also try activation recomputation in every stage of the full space and of the stages the Pareto plans
    #: do not fix (rule 3 keeps a Pareto stage's own choice, recomputation included). Off by default: the
    #: runtime only recomputes where the planner found it needed.
    allow_remat: bool = False

    def __post_init__(self) -> None:
        check_fields(self, {
            "max_candidates": Range("--search-max", 0, 1_000_000, integer=True),
            "sample_seed": Range("sample_seed", 0, MAX_SEED, integer=True),
            "warmup_steps": Range("warmup_steps", 0, 1000, integer=True),
            "timed_steps": Range("--search-steps", 1, 1000, integer=True),
            "microbatches_per_stage": Range("microbatches_per_stage", 1, 1024, integer=True),
            "num_microbatches": Range("num_microbatches", 1, MAX_BATCH, integer=True, optional=True),
        })

    def microbatches(self, global_batch: int, stages: int) -> int:
        """B of a candidate with ``stages`` stages."""
        return planned_microbatch_count(global_batch, stages, self.microbatches_per_stage, self.num_microbatches)

    def as_planned(self, planner: Mapping[str, Any]) -> SearchConfig:
        """This search with the micro-batch settings a plans file's planner used (``PlanSet.planner``)."""
        per_stage = planner.get("microbatches_per_stage", self.microbatches_per_stage)
        fixed = planner.get("num_microbatches", self.num_microbatches)
        for name, value in (("microbatches_per_stage", per_stage), ("num_microbatches", fixed)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ArenaError(f"the plans file's planner setting {name!r} is damaged (not an integer: {str(value):.40})")
        # (ranges: this config's own checks)
        return replace(self, microbatches_per_stage=per_stage, num_microbatches=fixed)


@dataclass
class Trial:
    plan: RunPlan
    step_time_s: float
    cost_device_s: float
    error: str = ""


@dataclass
class SearchResult:
    mode: str
    gpu_type: str
    num_gpus: int
    candidates_total: int
    candidates_measured: int
    trials: list[Trial] = field(default_factory=list)
    #: Pipeline degree used (pruned search: rule 1); None for the full search.
    pipeline_degree: int | None = None
    #: Device-seconds spent choosing the pipeline degree (rule 1 measuring proxies), included in cost.
    grid_selection_cost_device_s: float = 0.0
    wall_s: float = 0.0

    @property
    def best(self) -> Trial:
        ok = [t for t in self.trials if not t.error and math.isfinite(t.step_time_s)]
        if not ok:
            raise ArenaError(f"{self.mode} search: no candidate plan ran ({self.trials[0].error if self.trials else 'no candidates'})")
        return min(ok, key=lambda t: (t.step_time_s, t.plan.plan_id))

    @property
    def cost_device_s(self) -> float:
        return self.grid_selection_cost_device_s + sum(t.cost_device_s for t in self.trials)

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "mode": self.mode, "gpu_type": self.gpu_type, "num_gpus": self.num_gpus, "pipeline_degree": self.pipeline_degree,
            "candidates_total": self.candidates_total, "candidates_measured": self.candidates_measured,
            "cost_device_s": self.cost_device_s, "grid_selection_cost_device_s": self.grid_selection_cost_device_s,
            "best_plan": best.plan.describe(), "best_step_time_s": best.step_time_s, "wall_s": self.wall_s,
            "trials": [{"plan_id": t.plan.plan_id, "step_time_s": t.step_time_s, "cost_device_s": t.cost_device_s, "error": t.error}
                       for t in self.trials],
        }


# -- the space -------------------------------------------------------------------------------------------


def cluster_loads(clusters: Sequence[Mapping[str, Any]], gpu_type: str, dtype: str) -> np.ndarray:
    """Roofline seconds (eq. 2) of each cluster's forward+backward on one GPU, from its FLOPs and bytes."""
    flops = np.array([float(c.get("flops", 0.0)) for c in clusters])
    moved = np.array([float(c.get("bytes", 0.0)) for c in clusters])
    loads = get_gpu(gpu_type).roofline_seconds(flops, moved, dtype or "fp32")
    if not np.all(loads > 0):
        loads = np.where(loads > 0, loads, max(float(loads.max(initial=0.0)), 1.0) * 1e-6)
    return loads


def runnable_plan(plan: ParallelPlan, global_batch: int) -> ParallelPlan:
    """``plan`` with as many micro-batches as the runtime can split ``global_batch`` into. arena-plan's plans
    already divide it (:func:`libarena.plan.planned_microbatch_count`); a plans file written before that rule,
    or by hand, may not."""
    if global_batch % plan.num_microbatches == 0:
        return plan
    return replace(plan, num_microbatches=runnable_microbatch_count(global_batch, plan.num_microbatches))


@dataclass(frozen=True)
class SearchSpace:
    """The allocated resources of one job and the model's clusters (from the plans metadata)."""

    model: ModelDef
    global_batch: int
    gpu_type: str
    num_gpus: int
    clusters: tuple[Mapping[str, Any], ...]
    dtype: str = "fp32"

    @property
    def num_clusters(self) -> int:
        return len(self.clusters)

    @property
    def layout(self) -> StageLayout:
        return StageLayout.from_cluster_records(self.clusters)

    def grid(self, stages: int) -> Grid:
        per_node = get_gpu(self.gpu_type).default_gpus_per_node
        nodes = max(1, -(-self.num_gpus // per_node))
        return Grid(self.model.name, self.global_batch, self.gpu_type, self.num_gpus, nodes, per_node, stages)

    def make_plan(self, bounds: Sequence[int], choices: Sequence[tuple[int, int, int, bool, bool]], num_microbatches: int,
                  tag: str) -> RunPlan:
        """A candidate plan: stage j starts at cluster ``bounds[j]`` with ``choices[j]`` = (GPUs, dp, tp, zero, remat),
        its stages placed on the grid's GPUs as the planner places them (buddy: largest first, each at a multiple
        of its size, so a stage that fits a node stays in one)."""
        spec = "_".join(f"{a}:{g}g{dp}x{tp}{'z' if z else ''}{'r' if r else ''}" for a, (g, dp, tp, z, r) in zip(bounds, choices))
        gpus = [c[0] for c in choices]
        plan = make_plan(self.grid(len(bounds)), bounds, gpus, [c[1] for c in choices],
                         [c[2] for c in choices], [int(c[3]) for c in choices], num_microbatches, self.num_clusters,
                         f"{tag}-s{len(bounds)}-{spec}", offsets=stage_offsets(np.array([gpus]))[0].tolist(),
                         remat=[int(c[4]) for c in choices])
        return RunPlan.from_plan(plan, self.layout, self.model)

    def valid(self, plan: RunPlan) -> bool:
        return all(plan.microbatch_size % st.dp == 0 for st in plan.stages)


def full_space(space: SearchSpace, config: SearchConfig) -> list[RunPlan]:
    """Every plan of every grid of the resources."""
    out = []
    n, O = space.num_gpus, space.num_clusters
    for s in range(1, min(n, O) + 1):
        B = config.microbatches(space.global_batch, s)
        starts, _ = partitions(O, s)
        for bounds in starts.tolist():
            for gpus in power_of_two_compositions(n, s):
                for intra in itertools.product(*[intra_stage_options(g, config.allow_zero, config.allow_remat) for g in gpus]):
                    choices = [(g, *option) for g, option in zip(gpus, intra)]
                    plan = space.make_plan(bounds, choices, B, "full")
                    if space.valid(plan):
                        out.append(plan)
    return out


def pruned_space(space: SearchSpace, frontier: Sequence[Any], pipeline_degree: int, config: SearchConfig) -> list[RunPlan]:
    """Rules 2 and 3 inside the grid of pipeline degree ``pipeline_degree`` (``frontier``: its Pareto
    ParallelPlans from arena-plan)."""
    if not frontier:
        raise ArenaError(f"no Pareto plans for {space.gpu_type} x{space.num_gpus} with {pipeline_degree} stages in the plans file")
    loads = cluster_loads(space.clusters, space.gpu_type, space.dtype)
    # Rule 2: the most imbalanced Pareto plan bounds the imbalance we try.
    threshold = max(computation_bias(loads, p.stage_boundaries, p.gpus_per_stage) for p in frontier) + 1e-9
    # Rule 3: stage compositions (cluster ranges) seen on the frontier, with their intra-stage choices.
    fixed: dict[tuple[int, int], set[tuple[int, int, int, bool, bool]]] = {}
    for p in frontier:
        for st in p.stages:
            fixed.setdefault((st.first_cluster, st.end_cluster), set()).add(st.intra)
    s, n, O = pipeline_degree, space.num_gpus, space.num_clusters
    B = config.microbatches(space.global_batch, s)
    out, seen = [], set()
    starts, _ = partitions(O, s)
    for bounds in starts.tolist():
        ends = bounds[1:] + [O]
        for gpus in power_of_two_compositions(n, s):
            if computation_bias(loads, bounds, gpus) > threshold:
                continue
            per_stage = []
            for a, b, g in zip(bounds, ends, gpus):
                if (a, b) in fixed:
                    per_stage.append(sorted(c for c in fixed[(a, b)] if c[0] == g))
                else:
                    per_stage.append([(g, *option) for option in intra_stage_options(g, config.allow_zero, config.allow_remat)])
            for choices in itertools.product(*per_stage):
                key = (tuple(bounds), choices)
                if key in seen:
                    continue
                seen.add(key)
                plan = space.make_plan(bounds, choices, B, "pruned")
                if space.valid(plan):
                    out.append(plan)
    # The frontier plans themselves always belong to the pruned space.
    for p in frontier:
        plan = space.make_plan(p.stage_boundaries, [st.intra for st in p.stages], B, "pruned")
        key = (tuple(p.stage_boundaries), tuple(st.intra for st in p.stages))
        if key not in seen and space.valid(plan):
            seen.add(key)
            out.append(plan)
    return out


def _sample(plans: list[RunPlan], config: SearchConfig) -> list[RunPlan]:
    if config.max_candidates <= 0 or len(plans) <= config.max_candidates:
        return plans
    rng = random.Random(config.sample_seed)
    return sorted(rng.sample(plans, config.max_candidates), key=plans.index)


MeasureFn = Callable[[RunPlan], float]


def _run_trials(plans: list[RunPlan], measure: MeasureFn, num_gpus: int) -> list[Trial]:
    trials = []
    for plan in plans:
        t0 = time.perf_counter()
        try:
            step_time = float(measure(plan))
            error = ""
        except ArenaError as exc:
            step_time, error = math.inf, exc.message
        trials.append(Trial(plan, step_time, (time.perf_counter() - t0) * num_gpus, error))
    return trials


def full_search(space: SearchSpace, measure: MeasureFn, config: SearchConfig) -> SearchResult:
    t0 = time.perf_counter()
    plans = full_space(space, config)
    chosen = _sample(plans, config)
    result = SearchResult("full", space.gpu_type, space.num_gpus, len(plans), len(chosen), _run_trials(chosen, measure, space.num_gpus))
    result.wall_s = time.perf_counter() - t0
    return result


def grid_frontiers(planset: Any, gpu_type: str, num_gpus: int) -> dict[int, Any]:
    """Feasible grids (pipeline degree -> GridResult) of the resources in an arena-plan PlanSet."""
    out = {}
    for g in planset.grids:
        if g.grid.gpu_type == gpu_type and g.grid.num_gpus == num_gpus and g.feasible:
            out[g.grid.pipeline_degree] = g
    if not out:
        raise ArenaError(f"the plans file has no feasible grid for {gpu_type} x{num_gpus}")
    return out


def pruned_search(space: SearchSpace, planset: Any, measure: MeasureFn, config: SearchConfig,
                  pipeline_degree: int | None = None) -> SearchResult:
    """Rules 1-3. Without ``pipeline_degree`` the best grid is found by measuring each grid's proxy plan
    (counted in the search cost)."""
    t0 = time.perf_counter()
    grids = grid_frontiers(planset, space.gpu_type, space.num_gpus)
    selection_cost = 0.0
    selection_trials: list[Trial] = []
    if pipeline_degree is None:
        proxies = []
        for g in grids.values():
            if g.proxy is None:
                continue
            proxies.append(RunPlan.from_plan(runnable_plan(g.proxy, space.global_batch), space.layout, space.model))
        if not proxies:  # a plans file written elsewhere need not mark one (is_proxy)
            raise ArenaError(f"no grid of {space.gpu_type} x{space.num_gpus} has a proxy plan in the plans file: give "
                             f"--grid {space.gpu_type},{space.num_gpus},S for the pipeline degree S to search")
        selection_trials = _run_trials(proxies, measure, space.num_gpus)
        selection_cost = sum(t.cost_device_s for t in selection_trials)
        ok = [t for t in selection_trials if not t.error]
        if not ok:
            raise ArenaError(f"no proxy plan of {space.gpu_type} x{space.num_gpus} ran: {selection_trials[0].error}")
        pipeline_degree = min(ok, key=lambda t: t.step_time_s).plan.pipeline_degree
    if pipeline_degree not in grids:
        raise ArenaError(f"the plans file has no feasible {space.gpu_type} x{space.num_gpus} grid with {pipeline_degree} stages")
    plans = pruned_space(space, grids[pipeline_degree].frontier, pipeline_degree, config.as_planned(planset.planner))
    chosen = _sample(plans, config)
    result = SearchResult("pruned", space.gpu_type, space.num_gpus, len(plans), len(chosen), _run_trials(chosen, measure, space.num_gpus),
                          pipeline_degree, selection_cost)
    result.wall_s = time.perf_counter() - t0
    return result


def measure_in_process(model: ModelDef, config: SearchConfig, dtype: str = "fp32", devices: Sequence[Any] | None = None) -> MeasureFn:
    """A MeasureFn timing candidates with :func:`libarena.run.train.measure_plan` on this process's devices."""
    import jax

    from libarena.run.train import measure_plan

    def measure(plan: RunPlan) -> float:
        try:
            return measure_plan(model, plan, warmup=config.warmup_steps, steps=config.timed_steps, devices=devices, dtype=dtype,
                                profile_stages=False).step_time_s
        except jax.errors.JaxRuntimeError as exc:
            # a candidate that does not fit the devices' memory is a failed trial, not the end of the search
            if "RESOURCE_EXHAUSTED" not in str(exc):
                raise
            first = str(exc).strip().splitlines()[0]  # not empty: it holds RESOURCE_EXHAUSTED
            raise ArenaError(f"plan {plan.plan_id} ran out of device memory: {first[:300]}") from None

    return measure

