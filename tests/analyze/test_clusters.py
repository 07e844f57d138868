"""Contiguous FLOP-balanced clustering of units, checked against brute force."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from libarena.analyze.clusters import UnitRecord, balanced_partition, cluster_records


def _all_partitions(n: int, k: int):
    for cuts in itertools.combinations(range(1, n), k - 1):
        bounds = (0, *cuts, n)
        yield [(bounds[i], bounds[i + 1]) for i in range(k)]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=9), st.integers(1, 12))
def test_partition_is_contiguous_minmax_optimal_then_least_squares(weights, k):
    ranges = balanced_partition(weights, k)
    n = len(weights)
    assert len(ranges) == min(k, n)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a < b for a, b in ranges) and all(ranges[i][1] == ranges[i + 1][0] for i in range(len(ranges) - 1))
    sums = [sum(weights[a:b]) for a, b in ranges]
    options = [[sum(weights[a:b]) for a, b in p] for p in _all_partitions(n, len(ranges))]
    best_max = min(max(s) for s in options)
    assert max(sums) == best_max
    assert sum(s * s for s in sums) == min(sum(s * s for s in o) for o in options if max(o) == best_max)


def test_fewer_units_than_clusters_gives_one_unit_each_and_ties_are_deterministic():
    assert balanced_partition([5, 1, 7], 16) == [(0, 1), (1, 2), (2, 3)]
    assert balanced_partition([1.0] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert balanced_partition([1.0] * 7, 3) == [(0, 2), (2, 4), (4, 7)]  # of the equal optima, the earliest boundaries
    # A heavy head: the light embedding joins the first block, the head stays alone.
    assert balanced_partition([1, 10, 10, 10, 10, 25], 4) == [(0, 2), (2, 3), (3, 5), (5, 6)]


def _unit(i: int, **values) -> UnitRecord:
    base = dict(
        index=i, name=f"u{i}", kind="k", num_ops=2, forward_flops=1.0, backward_flops=2.0, flops=3.0, bytes=4.0,
        forward_bytes=1.5, optimizer_flops=5.0, optimizer_bytes=6.0, param_count=7, param_bytes=28.0,
        input_activation_bytes=8.0, activation_bytes=9.0 + i, saved_activation_bytes=10.0 + i, saved_constant_bytes=0.5,
        tp_allreduce_bytes=11.0, alltoall_bytes=12.0,
    )
    base.update(values)
    return UnitRecord(**base)


def test_cluster_records_sum_units_and_take_the_last_units_output():
    from libarena.artifacts.kinds.operator_table import CLUSTER_FIELDS

    units = [_unit(i) for i in range(5)]
    records = cluster_records(units, [(0, 2), (2, 5)])
    assert [r["units"] for r in records] == [["u0", "u1"], ["u2", "u3", "u4"]]
    assert {f.name for f in CLUSTER_FIELDS} <= set(records[0])
    assert records[1]["flops"] == 9.0 and records[1]["param_count"] == 21 and records[1]["num_ops"] == 6
    assert records[0]["activation_bytes"] == 10.0 and records[1]["activation_bytes"] == 13.0
    assert records[1]["alltoall_bytes"] == 36.0 and records[1]["saved_activation_bytes"] == 10.0 * 3 + 2 + 3 + 4
    # what a recomputing stage keeps (its units' inputs), redoes (their forward) and holds at once (its largest unit)
    assert records[1]["input_activation_bytes"] == 24.0 and records[1]["saved_constant_bytes"] == 1.5
    assert records[1]["forward_flops"] == 3.0 and records[1]["forward_bytes"] == 4.5
    assert records[1]["max_unit_saved_activation_bytes"] == 14.0 and records[0]["max_unit_saved_activation_bytes"] == 11.0
    assert records[1]["max_unit_saved_constant_bytes"] == 0.5
