"""libarena.run.heap: timed and training loops run with the long-lived objects frozen out of the collector."""

from __future__ import annotations

import gc

import pytest

from libarena.run.heap import frozen_heap


def test_frozen_heap_freezes_what_lives_and_still_collects_what_the_loop_drops():
    class Node:
        pass

    assert gc.get_freeze_count() == 0
    with frozen_heap():
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with frozen_heap():  # nested: the outer freeze stands
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
        cycle = Node()
        cycle.self = cycle  # a reference cycle made inside: collected as usual
        del cycle
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0


def test_frozen_heap_unfreezes_when_the_loop_fails():
    with pytest.raises(RuntimeError):
        with frozen_heap():
            raise RuntimeError("step failed")
    assert gc.get_freeze_count() == 0
