"""Typed planner configuration."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannerConfig:
    #: Largest GPU count of a grid (grids use powers of two up to it and up to what the cluster has).
    max_gpus: int = 16
    #: Micro-batches per iteration B = microbatches_per_stage x s (the paper uses 4 x s) ...
    microbatches_per_stage: int = 4
    #: ... unless fixed here.
    num_microbatches: int | None = None
    #: Frontier size cap per grid (the paper's threshold); 0 = no cap.
    frontier_cap: int = 8
    #: Fraction of a GPU's memory plans may use (the rest: CUDA context, allocator fragmentation, workspace).
    usable_memory_fraction: float = 0.9
    #: Consider ZeRO-1 (optimizer state sharded across the data-parallel group) as an intra-stage option.
    allow_zero: bool = True
    #: Restrict grids (None = all).
    gpu_types: tuple[str, ...] | None = None
    num_gpus: tuple[int, ...] | None = None
    pipeline_degrees: tuple[int, ...] | None = None
    #: Enumerate every plan of each grid (all partitions x all power-of-two assignments x all intra-stage
    #: choices) and output all feasible ones, frontier marked; reference for judging the proxy.
    exhaustive: bool = False
    #: Refuse (with a one-line error) exhaustive grids with more candidate plans than this.
    exhaustive_limit: int = 2_000_000

    def microbatches(self, stages: int) -> int:
        return self.num_microbatches if self.num_microbatches else self.microbatches_per_stage * stages
