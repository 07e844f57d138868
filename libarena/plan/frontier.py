"""Pareto frontier over (b_comp, l_comm), the frontier cap, and the proxy plan (§3.3)."""

from __future__ import annotations

import numpy as np

#: Relative tolerance under which two computation biases count as equal when picking the proxy.
BIAS_TOLERANCE = 1e-9


def pareto_front(bias: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """Indices of the non-dominated points (minimising both), sorted by bias then comm.

    A point is dropped when another is no worse on both metrics and better on one; of exact duplicates
    the first (lowest index) is kept. Sort + running minimum, O(P log P).
    """
    bias = np.asarray(bias, dtype=np.float64)
    comm = np.asarray(comm, dtype=np.float64)
    if bias.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(bias.size), comm, bias))
    sorted_comm = comm[order]
    best_before = np.concatenate([[np.inf], np.minimum.accumulate(sorted_comm)[:-1]])
    return order[sorted_comm < best_before]


def choose_proxy(bias: np.ndarray, comm: np.ndarray) -> int:
    """Position (into the given arrays) of the proxy: minimum b_comp, then the lowest l_comm."""
    bias = np.asarray(bias, dtype=np.float64)
    comm = np.asarray(comm, dtype=np.float64)
    lowest = bias.min()
    tied = np.flatnonzero(bias <= lowest + BIAS_TOLERANCE * max(1.0, abs(lowest)))
    return int(tied[np.lexsort((tied, comm[tied]))[0]])


def cap_frontier(boundaries: list[list[int]], comm: list[float], bias: list[float], cap: int, keep: int) -> list[int]:
    """Positions to keep when the frontier exceeds ``cap``: repeatedly take the pair with the most similar
    stage partition (smallest L1 distance between cut points; ties by position) and drop the plan with
    the higher l_comm (ties: higher b_comp, then later position). ``keep`` (the proxy) is never dropped.
    """
    alive = list(range(len(comm)))
    if cap <= 0 or len(alive) <= cap:
        return alive
    cuts = [np.asarray(b[1:], dtype=np.int64) for b in boundaries]
    while len(alive) > max(cap, 1):
        best = None
        for x in range(len(alive)):
            for y in range(x + 1, len(alive)):
                i, j = alive[x], alive[y]
                dist = int(np.abs(cuts[i] - cuts[j]).sum()) if cuts[i].shape == cuts[j].shape else 1 << 30
                if best is None or dist < best[0]:
                    best = (dist, i, j)
        _, i, j = best
        if i == keep or j == keep:
            drop = j if i == keep else i
        else:
            drop = max((i, j), key=lambda k: (comm[k], bias[k], k))
        alive.remove(drop)
    return alive
