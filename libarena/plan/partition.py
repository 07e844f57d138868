"""Stage partitions and power-of-two GPU assignments (§3.3, eq. 3).

Partitions are enumerated exhaustively -- C(O-1, s-1) contiguous splits, at most C(15, 7) = 6,435 for
O = 16 -- as index arrays (cached per (O, s)). The power-of-two normalisation of each partition's
load-proportional assignment D is solved exactly by **dynamic programming over (stage, GPUs used)**,
vectorised across all partitions at once: cost[u] = min over the stage's power p of
cost_prev[u - p] + (p - D_j)^2, so one grid costs s * log2(n) numpy operations on (P, n+1) arrays
instead of P * (#compositions) distance evaluations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache
from itertools import combinations

import numpy as np


@lru_cache(maxsize=64)
def partitions(num_clusters: int, stages: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every contiguous partition of ``num_clusters`` clusters into ``stages`` stages,
    each an int16 array of shape (P, stages) (compact: cached), in lexicographic order of the cut points."""
    combos = list(combinations(range(1, num_clusters), stages - 1))
    cuts = np.array(combos, dtype=np.int16).reshape(len(combos), stages - 1)
    count = cuts.shape[0]
    starts = np.concatenate([np.zeros((count, 1), dtype=np.int16), cuts], axis=1)
    ends = np.concatenate([cuts, np.full((count, 1), num_clusters, dtype=np.int16)], axis=1)
    starts.flags.writeable = False
    ends.flags.writeable = False
    return starts, ends


def load_proportional_assignment(loads: np.ndarray, num_gpus: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """D_j = sum of d_i over the stage, with d_i = L_i / sum(L) * n (the paper's load-proportional share)."""
    d = loads / loads.sum() * num_gpus
    cum = np.concatenate([[0.0], np.cumsum(d)])
    return cum[ends] - cum[starts]


def computation_bias(loads: np.ndarray, boundaries: list[int] | np.ndarray, gpus: list[int] | np.ndarray) -> float:
    """b_comp (eq. 3) of one plan: Euclidean distance of its GPU assignment ``gpus`` to the stages starting at
    clusters ``boundaries`` from the load-proportional assignment."""
    starts = np.asarray(boundaries, dtype=np.int64)[None, :]
    ends = np.asarray([*list(boundaries)[1:], len(loads)], dtype=np.int64)[None, :]
    ideal = load_proportional_assignment(np.asarray(loads, dtype=np.float64), int(sum(gpus)), starts, ends)[0]
    return float(np.sqrt(((np.asarray(gpus, dtype=np.float64) - ideal) ** 2).sum()))


def _stage_moves(num_gpus: int, stages: int) -> Iterator[tuple[int, list[tuple[int, int, int, int]]]]:
    """For each stage j, the moves of the DP over (stage, GPUs used): (k, p = 2**k, lo, hi) where giving the
    stage p GPUs reaches the states lo..hi. Reachable states: after j stages at least j GPUs are used and at
    least (stages - j) remain."""
    powers = [1 << k for k in range(num_gpus.bit_length()) if (1 << k) <= num_gpus]
    for j in range(stages):
        prev_lo, prev_hi = j, num_gpus - (stages - j)
        next_lo, next_hi = j + 1, num_gpus - (stages - j - 1)
        moves = [(k, p, max(prev_lo + p, next_lo), min(prev_hi + p, next_hi)) for k, p in enumerate(powers)]
        yield j, [(k, p, lo, hi) for k, p, lo, hi in moves if lo <= hi]


def normalize_power_of_two(ideal: np.ndarray, num_gpus: int, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Powers of two per stage summing to ``num_gpus`` closest (Euclidean) to each row of ``ideal``.

    Returns (assignment int64 (P, s), computation bias b_comp (P,)). Exact, by DP (see module doc).
    Ties go to the first-found choice in a fixed order, so results are deterministic. ``allowed`` (P, s,
    levels; bool): whether stage j of row p may hold 2**level GPUs (e.g. whether any of its options fits in
    memory there); a row with no allowed assignment gets bias inf and an assignment of zeros.
    """
    ideal = np.atleast_2d(np.asarray(ideal, dtype=np.float64))
    count, stages = ideal.shape
    n = int(num_gpus)
    # States are laid out (GPUs used, partition) so that every shifted slice is one contiguous block;
    # updates go in place (copyto with a mask) -- no temporaries beyond the candidate block.
    cost = np.full((n + 1, count), np.inf)
    cost[0] = 0.0
    choices = np.zeros((stages, n + 1, count), dtype=np.int8)
    mask = np.empty((n + 1, count), dtype=bool)
    for j, moves in _stage_moves(n, stages):
        new = np.full((n + 1, count), np.inf)
        choice = choices[j]
        col = ideal[:, j]
        for k, p, lo, hi in moves:
            step = (p - col) ** 2 if allowed is None else np.where(allowed[:, j, k], (p - col) ** 2, np.inf)
            cand = cost[lo - p : hi - p + 1] + step
            better = mask[: hi - lo + 1]
            np.less(cand, new[lo : hi + 1], out=better)  # strict: the smaller power wins ties
            np.copyto(new[lo : hi + 1], cand, where=better)
            np.copyto(choice[lo : hi + 1], k, where=better)
        cost = new
    bias = np.sqrt(cost[n])
    assignment = np.empty((count, stages), dtype=np.int64)
    used = np.full(count, n, dtype=np.int64)
    cols = np.arange(count)
    for j in range(stages - 1, -1, -1):
        k = choices[j][np.clip(used, 0, n), cols].astype(np.int64)  # (clipped: rows with no allowed assignment)
        assignment[:, j] = 1 << k
        used -= assignment[:, j]
    assignment[~np.isfinite(bias)] = 0
    return assignment, bias


def least_peak_over_assignments(values: np.ndarray, num_gpus: int) -> np.ndarray:
    """min over the power-of-two assignments of ``num_gpus`` GPUs to a row's stages of the largest
    ``values[p, j, log2 c_j]`` (P, s, levels): e.g. the least peak memory per GPU any assignment of a
    partition needs. The same DP as :func:`normalize_power_of_two`, with max for the sum."""
    values = np.asarray(values, dtype=np.float64)
    count, stages, _ = values.shape
    n = int(num_gpus)
    cost = np.full((n + 1, count), np.inf)
    cost[0] = -np.inf
    for j, moves in _stage_moves(n, stages):
        new = np.full((n + 1, count), np.inf)
        for k, p, lo, hi in moves:
            np.minimum(new[lo : hi + 1], np.maximum(cost[lo - p : hi - p + 1], values[:, j, k]), out=new[lo : hi + 1])
        cost = new
    return cost[n]


def weighted_composition_count(num_gpus: int, stages: int, weight: Callable[[int], int]) -> float:
    """The sum over every ordered tuple of ``stages`` powers of two summing to ``num_gpus`` of the product of
    ``weight(part)``, counted without listing them (a grid of 64 GPUs in 16 stages has 835 million): the
    coefficient of x**num_gpus in (sum_p weight(p) x**p)**stages. A float, exact below 2**53 (inf beyond 1e308)."""
    powers = [1 << k for k in range(num_gpus.bit_length()) if (1 << k) <= num_gpus]
    weights = [(p, float(weight(p))) for p in powers]
    ways = np.zeros(num_gpus + 1)
    ways[0] = 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        for _ in range(stages):
            following = np.zeros_like(ways)
            for p, w in weights:
                if w:
                    following[p:] += w * ways[:-p]
            ways = following
    return float(ways[num_gpus])


@lru_cache(maxsize=256)
def power_of_two_compositions(num_gpus: int, stages: int) -> tuple[tuple[int, ...], ...]:
    """Every ordered tuple of ``stages`` powers of two summing to ``num_gpus`` (exhaustive mode)."""
    if stages == 0:
        return ((),) if num_gpus == 0 else ()
    out = []
    p = 1
    while p <= num_gpus - (stages - 1):
        for rest in power_of_two_compositions(num_gpus - p, stages - 1):
            out.append((p, *rest))
        p *= 2
    return tuple(out)
