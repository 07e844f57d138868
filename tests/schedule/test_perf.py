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


HEAD = "model,global_batch,gpu_type,num_gpus,view,iter_time_s,fits_in_memory\n"


@pytest.mark.parametrize("rows, message", [
    # problems of the table are reported as problems of the table (row and column of the perf file), never as
    # trace rows that find no configuration
    ("bert__760M,128,a400,2,ap,0.5,true\n", r"perf.csv: row 1, column 'gpu_type': unknown GPU type 'a400'"),
    ("bert__760M,128,a10,2,ap,inf,true\n", r"perf.csv: row 1, column 'iter_time_s': inf is not a finite number in \(0, 86400\]"),
    ("bert__760M,128,a10,2,ap,1e300,true\n", r"row 1, column 'iter_time_s': 1e\+300 is out of range"),
    ("bert__760M,128,a10,2,ap,0,true\n", r"row 1, column 'iter_time_s': 0 is out of range"),
    ("bert__760M,128,a10,2,ap,nan,true\n", r"row 1, column 'iter_time_s': missing value"),
    ("bert__760M,0,a10,2,ap,0.5,true\n", r"row 1, column 'global_batch': 0 is out of range"),
    ("bert__760M,128,a10,2.5,ap,0.5,true\n", r"row 1, column 'num_gpus': .* is not an integer|column 'num_gpus' has type"),
    # conflicting duplicates (same key, different values): which would win is arbitrary
    ("bert__760M,128,a10,2,ap,0.5,true\nbert__760M,128,a10,2,ap,0.7,true\n",
     r"row 2, column 'iter_time_s': conflicts with row 1 .*0.5 against 0.7"),
])
def test_bad_perf_tables_blame_the_table(tmp_path, rows, message):
    spec = cluster([("a10", 1, 2)])
    p = tmp_path / "perf.csv"
    p.write_text(HEAD + rows)
    with pytest.raises(ArenaError, match=message):
        load_perf(p, spec)


def test_a_perf_row_of_more_stages_than_gpus_or_no_fits_flag_is_refused(tmp_path):
    """A pipeline of more stages than GPUs is no plan; a fits_in_memory that is neither true nor false was shown as
    not fitting by `show` and counted as fitting by `simulate`."""
    spec = cluster([("a10", 1, 2)])
    p = tmp_path / "perf.csv"
    p.write_text("model,global_batch,gpu_type,num_gpus,pipeline_degree,view,iter_time_s,fits_in_memory\n"
                 "bert__760M,128,a10,2,999,ap,0.5,true\n")
    with pytest.raises(ArenaError, match=r"row 1, column 'pipeline_degree': 999 stages on 2 GPUs"):
        load_perf(p, spec)
    p.write_text(HEAD + "bert__760M,128,a10,2,ap,0.5,true\nbert__760M,128,a10,1,ap,0.9,\n")
    with pytest.raises(ArenaError, match=r"row 2, column 'fits_in_memory': missing value"):
        load_perf(p, spec)


@pytest.mark.parametrize("header, row, message", [
    ("num_nodes", "5", r"row 1, column 'num_nodes': 5 nodes for 2 GPUs"),
    ("pipeline_degree", "0", r"row 1, column 'pipeline_degree': 0 is out of range"),
])
def test_a_perf_row_of_more_nodes_than_gpus_or_no_stage_is_refused(tmp_path, header, row, message):
    """Accepted before by every reader (``arena-profile show`` listed them), and then dropped by the simulator
    without a word."""
    from libarena.artifacts.kinds.perf_table import check_perf_table
    from libarena.artifacts.io import read_table

    p = tmp_path / "perf.csv"
    p.write_text(f"model,global_batch,gpu_type,num_gpus,{header},view,iter_time_s,fits_in_memory\n"
                 f"bert__760M,128,a10,2,{row},ap,0.5,true\n")
    art = read_table(p, "perf_table")
    with pytest.raises(ArenaError, match=message):
        check_perf_table(art.table, art.source)


def test_a_perf_row_of_an_unknown_view_is_refused_by_every_reader(tmp_path):
    from libarena.artifacts.kinds.perf_table import check_perf_table
    from libarena.artifacts.io import read_table

    p = tmp_path / "perf.csv"
    p.write_text(HEAD + "bert__760M,128,a10,2,foo,0.5,true\n")
    art = read_table(p, "perf_table")
    with pytest.raises(ArenaError, match=r"row 1, column 'view': unknown view 'foo' \(known: arena, dp, ap\)"):
        check_perf_table(art.table, art.source)


def test_throughput_must_agree_with_the_iteration_time(tmp_path):
    """A row giving both says the same thing twice; where they disagree, which to believe would be a guess."""
    spec = cluster([("a10", 1, 2)])
    p = tmp_path / "perf.csv"
    head = "model,global_batch,gpu_type,num_gpus,view,iter_time_s,throughput\n"
    p.write_text(head + "bert__760M,128,a10,2,ap,0.5,256.5\n")  # rounding is fine
    assert load_perf(p, spec).get("bert__760M", 128).truth[0, 1] == pytest.approx(256.5)
    p.write_text(head + "bert__760M,128,a10,2,ap,0.5,300\n")
    with pytest.raises(ArenaError, match=r"row 1, column 'throughput': 300 samples/s disagrees with global_batch / "
                                         r"iter_time_s = 256"):
        load_perf(p, spec)


def test_perf_rows_that_do_not_fit_may_have_unknown_times_and_duplicates_may_repeat(tmp_path):
    spec = cluster([("a10", 1, 2)])
    p = tmp_path / "perf.csv"
    p.write_text(HEAD + "bert__760M,128,a10,1,ap,inf,false\nbert__760M,128,a10,2,ap,0.5,true\n"
                        "bert__760M,128,a10,2,ap,0.5,true\n")
    lookup = load_perf(p, spec)
    assert list(lookup.get("bert__760M", 128).truth[0, :2]) == pytest.approx([0, 256])


def test_extending_with_a_table_refused_part_way_changes_nothing():
    """The live scheduler adds each newly profiled (model, batch): a table whose later row is refused must not
    leave the pair half built (present, without its views), or the next job of the pair would crash the server."""
    spec = cluster([("a100", 1, 4)])
    lookup = PerfLookup(_table([("gpt__1.3B", 256, "a100", 1, 0, "ap", 256 / 10, True)]), spec)
    bad = _table([("gpt__760M", 128, "a100", 1, 0, "ap", 128 / 10, True),
                  ("gpt__760M", 128, "a100", 2, 0, "tp", 128 / 20, True)])
    with pytest.raises(ArenaError, match=r"row 2, column 'view': unknown view 'tp'"):
        lookup.extend(bad)
    assert not lookup.has("gpt__760M", 128) and lookup.pairs() == [("gpt__1.3B", 256)]
    lookup.extend(bad.slice(0, 1))
    assert lookup.get("gpt__760M", 128).truth[0, 0] == pytest.approx(10)
