"""The performance-table lookup: views, rules for duplicates, node layouts, memory, and imported CSVs."""

from __future__ import annotations

import pyarrow as pa
import pytest

from libarena.errors import ArenaError
from libarena.schedule.perf import PerfLookup, load_perf
from tests.schedule.helpers import cluster


def _table(rows):
    keys = ("model", "global_batch", "gpu_type", "num_gpus", "num_nodes", "view", "iter_time_s", "fits_in_memory")
    return pa.table({k: [r[i] for r in rows] for i, k in enumerate(keys)})


def test_views_truth_and_linear_estimate():
    spec = cluster([("a100", 2, 4), ("a40", 2, 2)])
    t = _table([
        ("gpt__1.3B", 256, "a100", 1, 0, "dp", 256 / 10, False),  # does not fit
        ("gpt__1.3B", 256, "a100", 2, 0, "dp", 256 / 16, True),
        ("gpt__1.3B", 256, "a100", 4, 1, "dp", 256 / 24, True),
        ("gpt__1.3B", 256, "a100", 4, 2, "dp", 256 / 99, True),  # not the fewest-nodes layout: ignored
        ("gpt__1.3B", 256, "a100", 2, 0, "ap", 256 / 20, True),
        ("gpt__1.3B", 256, "a100", 2, 0, "ap", 256 / 21, True),  # a second plan: the best one counts
        ("gpt__1.3B", 256, "a100", 8, 0, "arena", 256 / 40, True),
        ("gpt__1.3B", 256, "a100", 3, 0, "ap", 256 / 50, True),  # not a power of two: ignored
        ("gpt__1.3B", 256, "h100", 1, 0, "ap", 256 / 50, True),  # not in the cluster: ignored
    ])
    lookup = PerfLookup(t, spec)
    mp = lookup.get("gpt__1.3B", 256)
    a100 = lookup.type_index["a100"]
    assert list(mp.views["dp"][a100, :4]) == pytest.approx([0, 16, 24, 0])
    assert mp.views["ap"][a100, 1] == pytest.approx(21)
    # truth = best known runnable plan: ap where present, else the arena proxy plan or dp
    assert list(mp.truth[a100, :4]) == pytest.approx([0, 21, 24, 40])
    # Sia's estimate: dp at the smallest fitting count (2 GPUs), linear, only where the table has the config
    assert list(mp.views["dp-linear"][a100, :4]) == pytest.approx([0, 16, 32, 64])
    assert not mp.truth[lookup.type_index["a40"]].any()


def test_imported_csv_and_errors(tmp_path):
    spec = cluster([("a10", 1, 2)])
    p = tmp_path / "perf.csv"
    p.write_text("model,global_batch,gpu_type,num_gpus,view,iter_time_s\nbert__760M,128,A10,2,ap,0.5\n")
    lookup = load_perf(p, spec)
    assert lookup.get("bert__760M", 128).truth[0, 1] == pytest.approx(256)
    p.write_text("model,global_batch,gpu_type,num_gpus,view,iter_time_s\nbert__760M,128,a10,2,best,0.5\n")
    with pytest.raises(ArenaError, match=r"row 1, column 'view': unknown view 'best'"):
        load_perf(p, spec)
    p.write_text("model,global_batch,gpu_type,view\nbert__760M,128,a10,ap\n")
    with pytest.raises(ArenaError, match="missing column"):
        load_perf(p, spec)
