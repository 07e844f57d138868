"""Grids (§3.2): the job's (GPU type m, GPU count n, pipeline degree s) subspaces, and stage placement."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec, get_gpu
from libarena.plan.config import PlannerConfig


@dataclass(frozen=True)
class Resources:
    """A job on an allocation: (model, global batch) on ``num_gpus`` GPUs of one type over ``num_nodes``
    nodes -- what a performance-table row describes (a grid without its pipeline degree)."""

    model: str
    global_batch: int
    gpu_type: str
    num_gpus: int
    num_nodes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Grid:
    model: str
    global_batch: int
    gpu_type: str
    num_gpus: int
    num_nodes: int
    gpus_per_node: int
    pipeline_degree: int

    @property
    def key(self) -> tuple[str, int, str, int, int, int]:
        return (self.model, self.global_batch, self.gpu_type, self.num_gpus, self.num_nodes, self.pipeline_degree)

    @property
    def resources(self) -> Resources:
        return Resources(self.model, self.global_batch, self.gpu_type, self.num_gpus, self.num_nodes)

    @property
    def label(self) -> str:
        nodes = "node" if self.num_nodes == 1 else "nodes"
        return f"{self.gpu_type} x{self.num_gpus} ({self.num_nodes} {nodes}), s={self.pipeline_degree}"


def gpu_counts(available: int, gpus_per_node: int, max_gpus: int) -> list[tuple[int, int]]:
    """(n, nodes) pairs: n a power of two up to ``max_gpus`` and the type's capacity; once n exceeds a
    node's GPUs the grid takes whole nodes (so n must be a multiple of the node size)."""
    out = []
    n = 1
    while n <= min(max_gpus, available):
        if n <= gpus_per_node:
            out.append((n, 1))
        elif n % gpus_per_node == 0:
            out.append((n, n // gpus_per_node))
        n *= 2
    return out


def enumerate_grids(model: str, global_batch: int, num_clusters: int, cluster: ClusterSpec, config: PlannerConfig) -> list[Grid]:
    types = cluster.gpu_types
    if not types or cluster.total_gpus <= 0:
        raise ArenaError(f"cluster {cluster.name!r} has no nodes")
    if config.gpu_types:
        wanted = []
        for name in config.gpu_types:
            canonical = get_gpu(name).name
            if canonical not in types:
                raise ArenaError(f"cluster {cluster.name!r} has no {canonical} GPUs (it has: {', '.join(types)})")
            wanted.append(canonical)
        types = [t for t in types if t in wanted]
    grids = []
    for gpu_type in types:
        per_node = cluster.gpus_per_node(gpu_type)
        for n, nodes in gpu_counts(cluster.num_gpus(gpu_type), per_node, config.max_gpus):
            if config.num_gpus and n not in config.num_gpus:
                continue
            for s in range(1, min(n, num_clusters) + 1):
                if config.pipeline_degrees and s not in config.pipeline_degrees:
                    continue
                grids.append(Grid(model, global_batch, gpu_type, n, nodes, per_node, s))
    return grids


def stage_offsets(gpus_per_stage: np.ndarray) -> np.ndarray:
    """First GPU of each stage within the grid's GPUs (rows = plans, columns = stages).

    Buddy placement: stages are laid out largest first, so every stage starts at a multiple of its own
    (power-of-two) size. With power-of-two nodes this keeps a stage that fits in a node inside one node
    and gives a larger stage whole nodes: stages never straddle nodes unnecessarily.
    """
    sizes = np.atleast_2d(np.asarray(gpus_per_stage, dtype=np.int64))
    order = np.argsort(-sizes, axis=1, kind="stable")
    sorted_sizes = np.take_along_axis(sizes, order, axis=1)
    starts_sorted = np.cumsum(sorted_sizes, axis=1) - sorted_sizes
    offsets = np.empty_like(sizes)
    np.put_along_axis(offsets, order, starts_sorted, axis=1)
    return offsets
