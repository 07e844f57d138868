"""Buddy allocation inside nodes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libarena.schedule.entities import TypePool


def test_buddy_blocks_are_aligned_and_best_fit():
    pool = TypePool(0, "a100", 3, 4)
    a = pool.place(1)
    b = pool.place(2)
    # best fit: the 2-GPU block goes next to the 1-GPU job, leaving two whole nodes free
    assert a[0][0] == b[0][0] and pool.free_nodes == 2
    assert b[0][1] in (0b0011, 0b1100)
    c = pool.place(8)
    assert len(c) == 2 and pool.free_nodes == 0
    assert not pool.can_place(2) and pool.can_place(1)
    pool.release(c)
    assert pool.free_nodes == 2 and pool.free_total == 9


def test_grow_in_place_and_shrink():
    pool = TypePool(0, "a40", 1, 8)
    blocks = pool.place(2)
    grown = pool.try_grow_in_place(blocks)
    assert grown is not None and grown[0][1].bit_count() == 4
    keep, free = TypePool.shrink_blocks(grown)
    assert keep[0][1].bit_count() == 2 and keep[0][1] & free[0][1] == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from([1, 2, 4, 8, 16])), max_size=40))
def test_random_place_release_never_overlaps(ops):
    pool = TypePool(0, "v100", 4, 4)
    held = []
    for place, n in ops:
        if place or not held:
            blocks = pool.place(n)
            if blocks is None:
                assert not pool.can_place(n)
                continue
            assert sum(m.bit_count() for _, m in blocks) == n
            held.append(blocks)
        else:
            pool.release(held.pop(0))
        used = {}
        for blocks in held:
            for node, mask in blocks:
                assert used.get(node, 0) & mask == 0
                used[node] = used.get(node, 0) | mask
        assert all(pool.masks[i] == used.get(i, 0) for i in range(pool.num_nodes))
        assert pool.free_total == 16 - sum(m.bit_count() for m in used.values())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=10), st.integers(0, 9), st.integers(0, 4))
def test_a_tried_resize_is_undone_exactly(sizes, which, count_index):
    """The simulator's placement rule for a moved job (grow in place, halve in place, else place afresh) leaves
    the job's new GPUs taken and nothing else changed, and taking the trial back restores every node's mask:
    what ElasticFlow's and Arena's what-if placements rely on."""
    import functools
    import types

    from libarena.schedule.entities import Allocation
    from libarena.schedule.simulator import Simulator

    pool = TypePool(0, "a100", 4, 4)
    sim = types.SimpleNamespace(pools=[pool])
    allocs = []
    for n in sizes:
        blocks = pool.place(n)
        if blocks is not None:
            allocs.append(Allocation(0, n.bit_length() - 1, blocks))
    alloc = allocs[which % len(allocs)]
    before = list(pool.masks)
    blocks = Simulator.place_resized(sim, alloc, 0, count_index)
    if blocks is None:
        assert list(pool.masks) == before
        return
    assert sum(b.bit_count() for _, b in blocks) == 1 << count_index
    held = dict(alloc.blocks)
    others = [m & ~held.get(node, 0) for node, m in enumerate(before)]
    new = dict(blocks)
    assert [m for m in pool.masks] == [o | new.get(node, 0) for node, o in enumerate(others)]
    Simulator.unplace_resized(sim, alloc, 0, blocks)
    assert list(pool.masks) == before
