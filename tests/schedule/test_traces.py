"""Trace readers: real files from ../shared, bad rows, adaptation rule."""

from __future__ import annotations

import pytest

from libarena.errors import ArenaError
from libarena.schedule.traces import read_trace, trace_stats
from libarena.workloads import GLOBAL_BATCHES, PAPER_SIZES, TEST_SIZES, is_zoo_model, zoo_model_names

HEADER = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
GOOD = "a,0,100,gpt__1.3B,5000,256,2,a100\n"


def test_reads_the_paper_philly_trace(traces_dir):
    tr = read_trace(traces_dir / "arena-ae" / "simulate_trace_philly.csv")
    assert tr.format == "arena-ae" and not tr.adapted
    assert len(tr.jobs) == 1938
    assert {j.requested_type for j in tr.jobs} == {"a100", "a40", "a10", "v100"}
    assert all(is_zoo_model(j.model) for j in tr.jobs)
    stats = trace_stats(tr)
    assert stats["jobs"] == 1938 and stats["span_days"] > 19


@pytest.mark.parametrize("path,fmt", [("elasticflow/195job.csv", "elasticflow"), ("itp-raw/cluster01.csv", "itp-raw")])
def test_adapts_elasticflow_and_raw_traces(traces_dir, path, fmt):
    tr = read_trace(traces_dir / path, gpu_types=["a40", "a10"], seed=3)
    assert tr.format == fmt and tr.adapted
    for j in tr.jobs:
        family, size = j.model.split("__")
        assert size in PAPER_SIZES[family] and j.global_batch in GLOBAL_BATCHES[family]
        assert j.requested_type in ("a40", "a10")
        assert j.requested_gpus & (j.requested_gpus - 1) == 0 and j.requested_gpus <= 16
        assert j.num_iterations >= 1 and j.deadline is not None
    again = read_trace(traces_dir / path, gpu_types=["a40", "a10"], seed=3)
    assert again.jobs == tr.jobs
    other = read_trace(traces_dir / path, gpu_types=["a40", "a10"], seed=4)
    assert [j.model for j in other.jobs] != [j.model for j in tr.jobs]


def test_adaptation_does_not_depend_on_row_order(tmp_path):
    rows = ["x1,10,100,1", "x2,20,200,2", "x3,30,300,3"]
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("job_id,submission_time,duration,num_gpu\n" + "\n".join(rows) + "\n")
    b.write_text("job_id,submission_time,duration,num_gpu\n" + "\n".join(reversed(rows)) + "\n")
    ja = {j.job_id: (j.model, j.global_batch, j.requested_type, j.requested_gpus) for j in read_trace(a).jobs}
    jb = {j.job_id: (j.model, j.global_batch, j.requested_type, j.requested_gpus) for j in read_trace(b).jobs}
    assert ja == jb
    assert ja["x3"][3] == 4  # 3 GPUs rounded up to a power of two


def test_adapted_iterations_follow_the_execution_rate(tmp_path):
    p = tmp_path / "raw.csv"
    p.write_text("job_id,submission_time,duration,num_gpu\nx,0,1000,2\n")
    tr = read_trace(p, rate=lambda m, b, t, n: 0.5)
    assert tr.jobs[0].num_iterations == 500
    assert 500 <= tr.jobs[0].deadline <= 1500



def test_an_adapted_job_out_of_a_traces_ranges_is_a_bad_row(tmp_path):
    """A raw row whose duration adapts to a deadline or an iteration count that a written trace may not hold
    is refused where it is read (row and column named), so ``trace scale`` never writes a trace its reader
    refuses; the rest of the trace is kept with --skip-bad-rows."""
    from libarena.schedule.traces import TraceScale, write_scaled_trace
    from tests.schedule.perf_fixtures import write_perf, zoo_pairs

    p = tmp_path / "raw.csv"
    p.write_text("job_id,submission_time,duration,num_gpu\nok,0,1000,1\nlong,3100000000,200000000,1\n")
    with pytest.raises(ArenaError, match=r"row 2, column 'duration': 200000000 s adapts to a deadline of .* after"):
        read_trace(p)
    p.write_text("job_id,submission_time,duration,num_gpu\nok,0,1000,1\nfast,0,1000000,1\n")
    with pytest.raises(ArenaError, match=r"row 2, column 'duration': 1000000 s adapts to 1e\+12 iterations .* more than"):
        read_trace(p, rate=lambda m, b, t, n: 1e6 + 1)
    out = tmp_path / "scaled.csv"
    p.write_text("job_id,submission_time,duration,num_gpu\nok,0,1000,1\nlong,3100000000,200000000,1\n")
    with pytest.raises(ArenaError, match="column 'duration'"):
        write_scaled_trace(p, out, TraceScale(copies=1))
    assert not out.exists()
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("name: c\nnode_groups: [{gpu_type: a100, nodes: 1, gpus_per_node: 8}]\n")
    perf = tmp_path / "perf.parquet"
    write_perf(perf, zoo_pairs(), ["a100"])
    written = write_scaled_trace(p, out, TraceScale(copies=1), cluster=cluster_file, perf=perf, skip_bad_rows=True)
    assert [j.job_id for j in written.jobs] == ["ok"] and [j.job_id for j in read_trace(out).jobs] == ["ok"]

@pytest.mark.parametrize("row,column,problem", [
    ("a,-5,100,gpt__1.3B,5000,256,2,a100", "submission_time", "out of range"),
    ("a,1e18,100,gpt__1.3B,5000,256,2,a100", "submission_time", "out of range"),
    ("a,0,1e300,gpt__1.3B,5000,256,2,a100", "num_iteration", "out of range"),
    ("a,0,100,gpt__1.3B,inf,256,2,a100", "deadline", "not a finite number"),
    ("a,600,100,gpt__1.3B,500,256,2,a100", "deadline", "deadline 500 s is not after the submission time 600 s"),
    ("a,600,100,gpt__1.3B,600,256,2,a100", "deadline", "is not after the submission time"),
    ("a,1035.7301,100,gpt__1.3B,1035.73,256,2,a100", "deadline", "deadline 1035.73 s is not after the submission time 1035.7301 s"),
    ("a,0,100,gpt__1.3B,5000,256,0,a100", "num_gpu", "expected an integer in [1, "),
    ("a,0,100,llama__7B,5000,256,2,a100", "model_name", "unknown model"),
    ("a,0,100,gpt__1.3B,5000,256,2,tpu9", "gpu_type", "unknown GPU type"),
    ("a,0,abc,gpt__1.3B,5000,256,2,a100", "num_iteration", "not a number"),
    ("a,0,100,gpt__1.3B,5000,256", "num_gpu", "missing value"),
    ("j" * 300 + ",0,100,gpt__1.3B,5000,256,2,a100", "job_id", "longer than 256 characters"),
    ("a,0,100," + "m" * 100_000 + ",5000,256,2,a100", "model_name", "unknown model 'mmm"),
])
def test_bad_rows_name_file_row_and_column(tmp_path, row, column, problem):
    p = tmp_path / "t.csv"
    p.write_text(HEADER + GOOD + row + "\n")
    with pytest.raises(ArenaError) as err:
        read_trace(p)
    msg = str(err.value)
    assert str(p) in msg and "row 2" in msg and repr(column) in msg and problem in msg
    assert "\n" not in msg and len(msg) < len(str(p)) + 300  # a huge value is not echoed whole
    tr = read_trace(p, skip_bad_rows=True)
    assert len(tr.jobs) == 1 and len(tr.skipped) == 1


def test_missing_column_and_duplicate_ids(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("job_id,submission_time,num_gpu,gpu_type\na,0,1,a100\n")
    with pytest.raises(ArenaError, match="column 'num_iteration' is missing"):
        read_trace(p)
    p.write_text(HEADER + GOOD + GOOD)
    with pytest.raises(ArenaError, match="row 2, column 'job_id': duplicate"):
        read_trace(p)
    p.write_text(HEADER.replace(",gpu_type", ",gpu_type,num_gpu") + GOOD.replace("\n", ",4\n"))
    with pytest.raises(ArenaError, match="row 0 \\(header\\): column 'num_gpu' is given twice"):
        read_trace(p)


def test_a_byte_order_mark_and_an_oversized_field(tmp_path):
    """A spreadsheet's UTF-8 byte-order mark is not part of the first column's name; a field over the csv
    module's limit is a one-line error naming the row, not an internal error."""
    p = tmp_path / "t.csv"
    p.write_bytes(b"\xef\xbb\xbf" + (HEADER + GOOD).encode())
    assert [j.job_id for j in read_trace(p).jobs] == ["a"]
    p.write_text(HEADER + GOOD + "b,0,100," + "m" * 200_000 + ",5000,256,2,a100\n")
    for skip in (False, True):
        with pytest.raises(ArenaError, match=r"row 2: malformed CSV \(field larger than field limit") as err:
            read_trace(p, skip_bad_rows=skip)
        assert len(str(err.value)) < 200


def test_an_oversized_trace_is_refused_before_it_is_read(tmp_path, monkeypatch):
    import libarena.schedule.traces as traces

    monkeypatch.setattr(traces, "MAX_TRACE_BYTES", 1000)
    p = tmp_path / "t.csv"
    p.write_text(HEADER + GOOD * 40)
    with pytest.raises(ArenaError, match="refused as a trace: larger than"):
        read_trace(p)


def test_the_catalogue_names_the_model_registry():
    # the scheduler knows the zoo from libarena.workloads, never from the (JAX) model code
    from libarena.models import list_models

    assert {e.name for e in list_models(include_test_sizes=False)} == zoo_model_names(include_test_sizes=False)
    everything = {e.name for e in list_models()}
    assert everything == zoo_model_names() == {f"{f}__{s}" for f in PAPER_SIZES for s in TEST_SIZES} | zoo_model_names(False)
    assert all(is_zoo_model(name) for name in everything) and not is_zoo_model("gpt__3B") and not is_zoo_model("gpt")
    assert set(GLOBAL_BATCHES) == set(PAPER_SIZES)


def test_the_zoo_refuses_to_load_when_the_catalogue_disagrees():
    import subprocess
    import sys

    code = ("import libarena.workloads as w\n"
            "w.PAPER_SIZES['gpt'] += ('3B',)\n"
            "from libarena.models import list_models\n"
            "list_models()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "catalogued only ['gpt__3B']" in r.stderr


def test_an_elasticflow_row_due_before_its_submission_is_refused(tmp_path):
    p = tmp_path / "ef.csv"
    header = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
    p.write_text(header + "a,100,500,resnet50,5000,64,2,600\nb,900,500,resnet50,800,64,2,600\n")
    with pytest.raises(ArenaError, match="row 2, column 'deadline': deadline 800 s is not after the submission time 900 s"):
        read_trace(p)
    assert [j.job_id for j in read_trace(p, skip_bad_rows=True).jobs] == ["a"]


def test_a_trace_names_the_columns_its_format_does_not_read():
    header = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type"
    row = "j1,0,100,gpt__1.3B,,256,4,a100"
    assert read_trace("t", text=f"{header}\n{row}\n").ignored_columns == []
    assert read_trace("t", text=f"{header},priority\n{row},2\n").ignored_columns == []
    tr = read_trace("t", text=f"{header},priorty,user\n{row},2,alice\n")
    assert tr.ignored_columns == ["priorty", "user"] and tr.jobs[0].priority is None
    assert tr.ignored_columns_note().startswith("t: ignored column(s) 'priorty', 'user': the arena-ae format reads job_id")


@pytest.mark.parametrize("value", ["1_000", "\u0661\u0660\u0660", "１００"])
def test_numbers_in_other_notations_than_ascii_decimal_are_bad_rows(value):
    """float() reads "1_000" and other scripts' digits; a trace means neither."""
    header = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type"
    with pytest.raises(ArenaError, match="column 'num_iteration': not a number"):
        read_trace("t", text=f"{header}\nj1,0,{value},gpt__1.3B,,256,4,a100\n")
    assert read_trace("t", text=f"{header}\nj1,0,1e3,gpt__1.3B,,256,4,a100\n").jobs[0].num_iterations == 1000


def test_a_header_of_more_columns_than_any_trace_has_is_refused_at_once():
    """Thousands of columns are a damaged file: refused in one line (before, the duplicate-column check took
    time growing with the square of their count: minutes for 100,000)."""
    import time

    header = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type"
    text = header + "," + ",".join(f"c{i}" for i in range(100_000)) + "\nj1,0,100,gpt__1.3B,,256,4,a100\n"
    start = time.perf_counter()
    with pytest.raises(ArenaError, match="100008 columns, more than 1000"):
        read_trace("t", text=text)
    assert time.perf_counter() - start < 10


def test_scaling_an_adapted_trace_refuses_jobs_the_table_cannot_rate(tmp_path):
    """trace scale --perf adapts an ElasticFlow or raw trace with the table's rates: a job whose (model, batch)
    the table lacks would get 1 iteration per second, so it is refused, or left out with --skip-bad-rows, as
    simulate does (before, it was written with the invented count)."""
    from libarena.schedule.traces import TraceScale, write_scaled_trace
    from tests.schedule.perf_fixtures import write_perf

    cluster = tmp_path / "c.yaml"
    cluster.write_text("name: c\nnode_groups:\n  - {gpu_type: a100, nodes: 2, gpus_per_node: 8}\n")
    raw = tmp_path / "raw.csv"
    raw.write_text("job_id,submission_time,duration,num_gpu\n" + "\n".join(f"j{i},{60 * i},3600,2" for i in range(30)) + "\n")
    perf = tmp_path / "perf.parquet"
    write_perf(perf, [("gpt__1.3B", 256)], ["a100"])  # one pair of the many the adaptation draws
    with pytest.raises(ArenaError, match="lacks .* \\(model, global batch\\) used by"):
        write_scaled_trace(raw, tmp_path / "out.csv", TraceScale(2), cluster=cluster, perf=perf)
    assert not (tmp_path / "out.csv").exists()
    kept = write_scaled_trace(raw, tmp_path / "out.csv", TraceScale(2), cluster=cluster, perf=perf, skip_bad_rows=True)
    assert kept.skipped and all(j.model == "gpt__1.3B" and j.global_batch == 256 for j in kept.jobs)
    assert len(kept.jobs) == 2 * (30 - len(kept.skipped))


def test_an_unclosed_quote_ends_the_read_instead_of_taking_the_rows_after_it():
    """An unclosed quote takes every line after it, to the next quote or the end, into one field: with
    --skip-bad-rows that was one skipped row and every later job silently gone. It ends the read, naming the row."""
    rows = [f"j{i},{i},100,gpt__1.3B,,256,2,a100" for i in range(6)]
    rows[2] = rows[2].replace(",a100", ',"a100')
    text = HEADER + "\n".join(rows) + "\n"
    for skip in (False, True):
        with pytest.raises(ArenaError, match=r"^t: row 3: a quoted field runs over a line break \(an unclosed quote\?\)"):
            read_trace("t", text=text, skip_bad_rows=skip)
    # a closed quote is a field like any other; a form feed or a vertical tab in a row does not split it in two
    quoted = HEADER + '"j0",0,100,gpt__1.3B,,256,2,a100\n'
    assert [j.job_id for j in read_trace("t", text=quoted).jobs] == ["j0"]
    split = HEADER + "j0,0,100,gpt__1.3B,,256,2,a100\x0bj1,0,100,gpt__1.3B,,256,2,a100\n"
    with pytest.raises(ArenaError, match=r"^t: row 1, column 'gpu_type': more fields than the header"):
        read_trace("t", text=split)
    with pytest.raises(ArenaError, match=r"^t: row 0 \(header\): a quoted field runs over a line break"):
        read_trace("t", text='job_id,"submission_time\n' + HEADER)


def test_a_trace_of_more_rows_than_the_limit_is_refused(monkeypatch):
    """Short rows (an itp-raw row can be 15 bytes) would put tens of millions of jobs inside the byte limit."""
    import libarena.schedule.traces as traces

    monkeypatch.setattr(traces, "MAX_TRACE_ROWS", 3)
    text = HEADER + "".join(f"j{i},{i},100,gpt__1.3B,,256,2,a100\n" for i in range(5))
    for skip in (False, True):
        with pytest.raises(ArenaError, match=r"^t: row 4: more than 3 rows$"):
            read_trace("t", text=text, skip_bad_rows=skip)
    assert len(read_trace("t", text=HEADER + "".join(f"j{i},{i},100,gpt__1.3B,,256,2,a100\n" for i in range(3))).jobs) == 3


def test_an_elasticflow_rows_batch_size_is_checked_like_its_other_numbers():
    header = "job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration\n"
    for value, problem in (("nan", "nan is not"), ("-5", "-5 is out of range"), ("abc", "not a number")):
        with pytest.raises(ArenaError, match=rf"row 1, column 'batch_size': {problem}"):
            read_trace("ef", text=header + f"a,100,500,resnet50,5000,{value},2,600\n")


def test_trace_stats_give_no_arrival_rate_for_one_instant():
    stats = trace_stats(read_trace("t", text=HEADER + GOOD + GOOD.replace("a,", "b,", 1)))
    assert stats["jobs"] == 2 and stats["span_s"] == 0 and stats["arrivals_per_hour"] is None
    stats = trace_stats(read_trace("t", text=HEADER + GOOD + GOOD.replace("a,0,", "b,3600,", 1)))
    assert stats["arrivals_per_hour"] == 2.0
