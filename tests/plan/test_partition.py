"""Partitions, power-of-two normalisation (eq. 3), grids and stage placement."""

from __future__ import annotations

from math import comb

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from libarena.hardware import cluster_from_dict
from libarena.plan import PlannerConfig, enumerate_grids, stage_offsets
from libarena.plan.grids import gpu_counts
from libarena.plan.partition import least_peak_over_assignments, normalize_power_of_two, partitions, power_of_two_compositions


def test_partitions_are_all_contiguous_splits():
    for O, s in ((16, 1), (16, 4), (16, 16), (5, 3)):
        starts, ends = partitions(O, s)
        assert starts.shape == (comb(O - 1, s - 1), s)
        assert (starts[:, 0] == 0).all() and (ends[:, -1] == O).all()
        assert (starts[:, 1:] == ends[:, :-1]).all() and (ends > starts).all()
        assert len({tuple(r) for r in starts}) == starts.shape[0]


def test_compositions_are_powers_of_two_summing_to_n():
    comps = power_of_two_compositions(8, 3)
    assert set(comps) == {(4, 2, 2), (2, 4, 2), (2, 2, 4)}
    assert all(sum(c) == 16 for c in power_of_two_compositions(16, 7))


@settings(max_examples=60, deadline=None)
@given(
    n_exp=st.integers(0, 4),
    data=st.data(),
)
def test_normalisation_is_the_exact_euclidean_minimum(n_exp, data):
    n = 1 << n_exp
    s = data.draw(st.integers(1, n))
    count = data.draw(st.integers(1, 5))
    ideal = np.array([data.draw(st.lists(st.floats(0, n), min_size=s, max_size=s)) for _ in range(count)])
    assignment, bias = normalize_power_of_two(ideal, n)
    comps = np.array(power_of_two_compositions(n, s), dtype=float)
    for row in range(count):
        best = np.sqrt(((comps - ideal[row]) ** 2).sum(axis=1)).min()
        assert bias[row] == np.float64(bias[row]) and abs(bias[row] - best) < 1e-9
        assert assignment[row].sum() == n
        assert all(x & (x - 1) == 0 for x in assignment[row])
        assert abs(np.sqrt(((assignment[row] - ideal[row]) ** 2).sum()) - bias[row]) < 1e-9



@settings(max_examples=60, deadline=None)
@given(n_exp=st.integers(0, 4), data=st.data())
def test_constrained_normalisation_and_least_peak_are_the_exact_optima_over_allowed_assignments(n_exp, data):
    """The DP restricted to allowed (stage, GPU count) pairs against enumerating the compositions: the closest
    allowed assignment (bias inf where none is allowed), and the least largest per-stage value of any."""
    n = 1 << n_exp
    s = data.draw(st.integers(1, n))
    count = data.draw(st.integers(1, 5))
    levels = n.bit_length()
    ideal = np.array([data.draw(st.lists(st.floats(0, n), min_size=s, max_size=s)) for _ in range(count)])
    allowed = np.array(data.draw(st.lists(st.booleans(), min_size=count * s * levels, max_size=count * s * levels))
                       ).reshape(count, s, levels)
    values = np.array(data.draw(st.lists(st.floats(0, 100), min_size=count * s * levels, max_size=count * s * levels))
                      ).reshape(count, s, levels)
    assignment, bias = normalize_power_of_two(ideal, n, allowed)
    peak = least_peak_over_assignments(values, n)
    comps = np.array(power_of_two_compositions(n, s), dtype=np.int64)
    lv = np.log2(comps).round().astype(np.int64)
    stage = np.arange(s)[None, :]
    for row in range(count):
        ok = allowed[row][stage, lv].all(axis=1)
        assert peak[row] == values[row][stage, lv].max(axis=1).min()
        if not ok.any():
            assert np.isinf(bias[row]) and (assignment[row] == 0).all()
            continue
        best = np.sqrt(((comps[ok] - ideal[row]) ** 2).sum(axis=1)).min()
        assert abs(bias[row] - best) < 1e-9 and assignment[row].sum() == n
        assert allowed[row][np.arange(s), np.log2(assignment[row]).round().astype(np.int64)].all()
        assert abs(np.sqrt(((assignment[row] - ideal[row]) ** 2).sum()) - bias[row]) < 1e-9

def test_grids_use_whole_nodes_beyond_one_node():
    assert gpu_counts(available=64, gpus_per_node=4, max_gpus=16) == [(1, 1), (2, 1), (4, 1), (8, 2), (16, 4)]
    assert gpu_counts(available=6, gpus_per_node=2, max_gpus=16) == [(1, 1), (2, 1), (4, 2)]
    # A 6-GPU node cannot give 8 or 16 GPUs as whole nodes.
    assert gpu_counts(available=60, gpus_per_node=6, max_gpus=16) == [(1, 1), (2, 1), (4, 1)]


def test_grid_enumeration_on_the_paper_cluster(paper_cluster):
    grids = enumerate_grids("m", 256, 16, paper_cluster, PlannerConfig())
    assert len(grids) == 4 * (1 + 2 + 4 + 8 + 16)
    a100_16 = [g for g in grids if g.gpu_type == "a100" and g.num_gpus == 16]
    assert {g.num_nodes for g in a100_16} == {4} and [g.pipeline_degree for g in a100_16] == list(range(1, 17))
    few = enumerate_grids("m", 256, 3, paper_cluster, PlannerConfig(gpu_types=("v100",)))
    assert max(g.pipeline_degree for g in few) == 3  # s <= O


def test_grid_enumeration_respects_capacity():
    small = cluster_from_dict({"name": "tiny", "node_groups": [{"gpu_type": "a10", "nodes": 1, "gpus_per_node": 2}]})
    grids = enumerate_grids("m", 8, 16, small, PlannerConfig())
    assert {g.num_gpus for g in grids} == {1, 2}


def test_buddy_placement_keeps_small_stages_inside_a_node():
    assert stage_offsets(np.array([2, 4, 2]))[0].tolist() == [4, 0, 6]
    assert stage_offsets(np.array([8, 8]))[0].tolist() == [0, 8]
    for sizes in ([2, 4, 2], [1, 1, 2, 4], [1, 2, 1, 4, 8]):
        offsets = stage_offsets(np.array(sizes))[0]
        for size, off in zip(sizes, offsets):
            assert off % size == 0  # aligned: with power-of-two nodes a stage that fits never straddles
        spans = sorted((int(o), int(o) + s) for o, s in zip(offsets, sizes))
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


@settings(max_examples=200, deadline=None)
@given(points=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=40))
def test_the_pareto_front_is_exactly_the_non_dominated_points(points):
    """Every point off the front is dominated by (or duplicates) a point on it; no point on it is dominated;
    of duplicates one is kept (small integer coordinates make ties and duplicates common)."""
    from libarena.plan.frontier import pareto_front

    bias = np.array([p[0] for p in points], dtype=float)
    comm = np.array([p[1] for p in points], dtype=float)
    front = [int(i) for i in pareto_front(bias, comm)]

    def dominates(i, j):
        return bias[i] <= bias[j] and comm[i] <= comm[j] and (bias[i] < bias[j] or comm[i] < comm[j])

    assert len(set(front)) == len(front)
    assert not any(dominates(j, i) for i in front for j in range(len(points)))
    assert len({points[i] for i in front}) == len(front)  # one of each set of duplicates
    for j in set(range(len(points))) - set(front):
        assert any(dominates(i, j) or points[i] == points[j] for i in front)
    assert [points[i] for i in front] == sorted(points[i] for i in front)  # by bias, then comm
