"""Typed planner configuration, and the micro-batch rule every stage of the pipeline shares."""

from __future__ import annotations

import math
from dataclasses import dataclass

from libarena.checks import MAX_BATCH, MAX_GPUS, Range, check_fields, check_range

#: The paper's micro-batches per pipeline stage (§5.1: "4x the number of pipeline stages").
MICROBATCHES_PER_STAGE = 4


def microbatch_count(stages: int, per_stage: int = MICROBATCHES_PER_STAGE, fixed: int | None = None) -> int:
    """The nominal micro-batch count: ``fixed``, or ``per_stage`` x the pipeline degree (the paper's 4 x s).

    Plans run (and are priced at) :func:`planned_microbatch_count`, this count lowered until it splits the global
    batch evenly; :func:`too_few_microbatches` says when that leaves too few for the grid.
    """
    return fixed if fixed else per_stage * stages


def runnable_microbatch_count(global_batch: int, count: int) -> int:
    """The largest micro-batch count <= ``count`` that splits ``global_batch`` evenly (what the runtime runs)."""
    b = max(1, min(count, global_batch))
    while b > 1 and global_batch % b:
        b -= 1
    return b


def planned_microbatch_count(global_batch: int, stages: int, per_stage: int = MICROBATCHES_PER_STAGE,
                             fixed: int | None = None) -> int:
    """B, the micro-batches of one iteration of a plan with ``stages`` stages: the nominal count, lowered to the
    largest one that splits ``global_batch`` evenly. The runtime needs whole micro-batches, so the planner, the
    profiler and the runtime all use this B: a fractional G / B would price smaller micro-batches (less
    activation memory, a smaller pipeline bubble) than the ones that run."""
    return runnable_microbatch_count(global_batch, microbatch_count(stages, per_stage, fixed))


def too_few_microbatches(global_batch: int, stages: int, per_stage: int = MICROBATCHES_PER_STAGE,
                         fixed: int | None = None) -> str:
    """Why a grid of ``stages`` stages cannot run ``global_batch`` ("" when it can).

    The grid runs :func:`planned_microbatch_count` micro-batches; it needs one per stage at least (or, with a fixed
    count below the stages, that count), else a stage never has work while another does. The rule is on the count
    that runs, not the nominal one: a batch of 32 runs 32 micro-batches of 9 stages (more per stage than the 16 of
    7 stages, 28 lowered to a divisor) and is accepted as those are.
    """
    nominal = microbatch_count(stages, per_stage, fixed)
    runs = runnable_microbatch_count(global_batch, nominal)
    if runs >= min(stages, nominal):
        return ""
    if global_batch < stages:
        return f"global batch {global_batch} is smaller than the {stages} stages (one micro-batch each at least)"
    return (f"global batch {global_batch} splits evenly into {runs} micro-batches at most {nominal}, fewer than the "
            f"{stages} stages")


def replica_microbatch(global_batch: int, num_microbatches: int, dp: int = 1) -> int:
    """Samples one data-parallel replica processes per micro-batch (rounded up; at least one)."""
    return max(1, math.ceil(global_batch / (num_microbatches * dp)))


#: Fraction of a GPU's memory a plan may use, for every stage that judges whether a plan fits (planner,
#: profiler, roofline estimate): the rest is the CUDA context, allocator fragmentation and workspace.
USABLE_MEMORY_FRACTION = 0.9


@dataclass(frozen=True)
class PlannerConfig:
    #: Largest GPU count of a grid (grids use powers of two up to it and up to what the cluster has).
    max_gpus: int = 16
    #: Micro-batches per iteration B = microbatches_per_stage x s (the paper uses 4 x s), lowered until B
    #: divides the global batch ...
    microbatches_per_stage: int = MICROBATCHES_PER_STAGE
    #: ... unless fixed here.
    num_microbatches: int | None = None
    #: Frontier size cap per grid (the paper's threshold); 0 = no cap.
    frontier_cap: int = 8
    #: Fraction of a GPU's memory plans may use (the rest: CUDA context, allocator fragmentation, workspace).
    usable_memory_fraction: float = USABLE_MEMORY_FRACTION
    #: Consider ZeRO-1 (optimizer state sharded across the data-parallel group) as an intra-stage option.
    allow_zero: bool = True
    #: Consider activation recomputation (each unit recomputes its activations in the backward pass) as an
    #: intra-stage option: chosen where it is needed to fit in memory or lets the stage communicate less.
    allow_remat: bool = True
    #: Restrict grids (None = all).
    gpu_types: tuple[str, ...] | None = None
    num_gpus: tuple[int, ...] | None = None
    pipeline_degrees: tuple[int, ...] | None = None
    #: Enumerate every plan of each grid (all partitions x all power-of-two assignments x all intra-stage
    #: choices) and output all feasible ones, frontier marked; reference for judging the proxy.
    exhaustive: bool = False
    #: Refuse (with a one-line error) exhaustive grids with more candidate plans than this.
    exhaustive_limit: int = 2_000_000

    def __post_init__(self) -> None:
        check_fields(self, {
            "max_gpus": Range("--max-gpus", 1, MAX_GPUS, integer=True),
            "microbatches_per_stage": Range("--microbatches-per-stage", 1, 1024, integer=True),
            "num_microbatches": Range("--num-microbatches", 1, MAX_BATCH, integer=True, optional=True),
            "frontier_cap": Range("--frontier-cap", 0, 100_000, integer=True),
            "usable_memory_fraction": Range("--memory-fraction", 0, 1, lo_open=True),
            "exhaustive_limit": Range("--exhaustive-limit", 1, 10**9, integer=True),
        })
        for value in self.num_gpus or ():
            check_range(value, "--num-gpus", 1, MAX_GPUS, integer=True)
        for value in self.pipeline_degrees or ():
            check_range(value, "--stages", 1, 1024, integer=True)

    def nominal_microbatches(self, stages: int) -> int:
        """The nominal count (4 x s unless fixed), before it is lowered to split the global batch."""
        return microbatch_count(stages, self.microbatches_per_stage, self.num_microbatches)

    def too_few_microbatches(self, stages: int, global_batch: int) -> str:
        """Why a grid of ``stages`` stages cannot run ``global_batch`` ("" when it can): :func:`too_few_microbatches`."""
        return too_few_microbatches(global_batch, stages, self.microbatches_per_stage, self.num_microbatches)

    def microbatches(self, stages: int, global_batch: int) -> int:
        """B, the micro-batches plans of ``stages`` stages run and are priced at (:func:`planned_microbatch_count`)."""
        return planned_microbatch_count(global_batch, stages, self.microbatches_per_stage, self.num_microbatches)
