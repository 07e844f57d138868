"""The layer-clustered view: the model's units grouped contiguously into O clustered operators.

The paper's planner works on O clustered operators (default 16). Units are grouped in model order, so
a cluster boundary is always a unit boundary and a pipeline stage is a run of clusters. Groups balance
forward + backward FLOPs: first the smallest possible largest cluster (a min-max linear partition, by
dynamic programming), then, among partitions achieving it, the one with the least sum of squared cluster
FLOPs (so the other clusters are balanced too rather than arbitrarily lopsided). Ties go to the earliest
boundary, so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def balanced_partition(weights: Sequence[float], num_clusters: int) -> list[tuple[int, int]]:
    """Split ``weights`` into ``min(num_clusters, len(weights))`` contiguous non-empty groups.

    Returns [start, stop) ranges covering every index in order.
    """
    w = [float(x) for x in weights]
    n = len(w)
    if n == 0:
        return []
    k = max(1, min(int(num_clusters), n))
    prefix = np.concatenate([[0.0], np.cumsum(w)])

    def span(i: int, j: int) -> float:
        return float(prefix[j] - prefix[i])

    inf = float("inf")
    # Pass 1: best[c][j] = smallest possible largest group when the first j units form c groups.
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for c in range(1, k + 1):
        for j in range(c, n - (k - c) + 1):
            best[c][j] = min(max(best[c - 1][i], span(i, j)) for i in range(c - 1, j))
    bound = best[k][n]
    # Relative slack for float sums compared against the bound.
    limit = bound * (1 + 1e-12) + 1e-9
    # Pass 2: least sum of squares with every group <= bound.
    cost = [[inf] * (n + 1) for _ in range(k + 1)]
    choice = [[-1] * (n + 1) for _ in range(k + 1)]
    cost[0][0] = 0.0
    for c in range(1, k + 1):
        for j in range(c, n - (k - c) + 1):
            for i in range(c - 1, j):
                s = span(i, j)
                if s > limit or cost[c - 1][i] == inf:
                    continue
                value = cost[c - 1][i] + s * s
                # Strictly better (beyond float noise) replaces; otherwise the earliest boundary stays.
                if choice[c][j] < 0 or value < cost[c][j] * (1 - 1e-12):
                    cost[c][j] = value
                    choice[c][j] = i
    ranges = []
    j = n
    for c in range(k, 0, -1):
        i = choice[c][j]
        ranges.append((i, j))
        j = i
    ranges.reverse()
    return ranges


@dataclass(frozen=True)
class UnitRecord:
    """Per-unit totals the clusters are summed from (also stored in the artifact's ``units`` metadata)."""

    index: int
    name: str
    kind: str
    num_ops: int
    forward_flops: float
    backward_flops: float
    flops: float
    bytes: float
    forward_bytes: float
    optimizer_flops: float
    optimizer_bytes: float
    param_count: int
    param_bytes: float
    input_activation_bytes: float
    activation_bytes: float
    #: what the unit keeps for its backward pass: the part that grows with the batch, and the rest
    saved_activation_bytes: float
    saved_constant_bytes: float
    tp_allreduce_bytes: float
    alltoall_bytes: float

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


_SUMMED = (
    "flops", "bytes", "optimizer_flops", "optimizer_bytes", "param_bytes",
    "saved_activation_bytes", "saved_constant_bytes", "tp_allreduce_bytes", "alltoall_bytes",
    "input_activation_bytes", "forward_flops", "forward_bytes",
)
#: A recomputing stage holds one unit's saved activations at a time (during that unit's backward).
_LARGEST = {"max_unit_saved_activation_bytes": "saved_activation_bytes", "max_unit_saved_constant_bytes": "saved_constant_bytes"}


def cluster_records(units: Sequence[UnitRecord], ranges: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """One record per cluster with every CLUSTER_FIELDS entry (see libarena.artifacts.kinds.operator_table)."""
    records = []
    for index, (start, stop) in enumerate(ranges):
        members = units[start:stop]
        record: dict[str, Any] = {
            "index": index,
            "units": [u.name for u in members],
            "num_ops": int(sum(u.num_ops for u in members)),
            "param_count": int(sum(u.param_count for u in members)),
            # What crosses the boundary to the next cluster: the last unit's output.
            "activation_bytes": float(members[-1].activation_bytes),
        }
        for name in _SUMMED:
            record[name] = float(sum(getattr(u, name) for u in members))
        for name, unit_field in _LARGEST.items():
            record[name] = float(max(getattr(u, unit_field) for u in members))
        records.append(record)
    return records
