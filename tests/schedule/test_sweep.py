"""arena-schedule sweep: the spec, the same results as the sequential runs (on Ray and in process), the
stage cache shared with simulate, and a failed simulation that does not take the others down."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from libarena.artifacts import read_document, read_json_document, read_table
from libarena.errors import ArenaError
from libarena.pipeline import CacheSettings
from libarena.pipeline.sweep import SequentialExecutor, sweep
from libarena.schedule.sweep import SweepSpec, SweepTrace, SweepVariant, build_sweep_spec
from libarena.schedule.traces import read_trace, trace_csv
from tests.schedule.perf_fixtures import write_perf
from tests.schedule.trace_fixtures import first_jobs

POLICIES = ("arena", "fcfs", "gavel", "elasticflow", "elasticflow-ls", "sia")


def cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("arena-schedule")
    return subprocess.run([str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, repo_root):
    """Two small traces (the first jobs of the real philly and venus traces, iterations / 50 so that they
    finish; without ../shared, traces of their format built in code), a performance table for their models, and
    a trace with a malformed row."""
    d = tmp_path_factory.mktemp("sweep")
    pairs = set()
    for seed, (name, count, iterations) in enumerate((("philly", 40, (2000, 8000)), ("venus", 30, (40, 200)))):
        jobs, real = first_jobs(name, count, d, seed, iterations)
        if real:
            jobs = [dataclasses.replace(j, num_iterations=max(1, j.num_iterations // 50)) for j in jobs]
        pairs |= {(j.model, j.global_batch) for j in jobs}
        (d / f"{name}.csv").write_text(trace_csv(jobs))
    write_perf(d / "perf.parquet", sorted(pairs), ["a100", "v100", "a40", "a10"])
    lines = (d / "venus.csv").read_text().splitlines()
    lines[3] = lines[3].replace(",a40", ",no-such-gpu").replace(",a100", ",no-such-gpu").replace(",v100", ",no-such-gpu") \
        .replace(",a10", ",no-such-gpu")
    (d / "broken.csv").write_text("\n".join(lines) + "\n")
    return d, repo_root / "examples" / "clusters" / "paper-sim-1280.yaml"


def _records(run_dir: Path):
    """A run's job records and decisions, without the timing metadata."""
    jobs = read_table(run_dir / "jobs.parquet", "job_records")
    decisions = read_document(run_dir / "decisions.msgpack", "decisions")
    return repr(jobs.table.to_pydict()), decisions.data


def _compare(d: Path, cluster: Path, trace: str, out: str, cache: str) -> None:
    r = cli("compare", "--policies", ",".join(POLICIES), "--trace", str(d / f"{trace}.csv"), "--perf",
            str(d / "perf.parquet"), "--cluster", str(cluster), "--horizon", "400000", "--cache-dir", cache, "--plot", "-o", out,
            cwd=d)
    assert r.returncode == 0, r.stderr


# -- the spec -------------------------------------------------------------------------------------------------


def test_spec_file_options_and_layouts(tmp_path):
    for name in ("a.csv", "b.csv", "p.parquet", "c.yaml"):
        (tmp_path / name).write_text("")
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(
        "cluster: c.yaml\n"
        "traces: {a: {trace: a.csv, perf: p.parquet}, b: {trace: b.csv, perf: p.parquet}}\n"
        "policies: [arena, sia]\n"
        "seeds: [0, 1]\n"
        "variants: {default: {}, no-hetero: {options: {hetero: false}, policies: [arena]}, d1: {search_depth: 1}}\n"
        "simulator: {tick: 600, horizon: 86400, skip_bad_rows: true, overheads: {checkpoint_resume_s: 60}}\n")
    spec = build_sweep_spec(spec_file)
    assert spec.traces[0].trace == tmp_path / "a.csv"  # relative to the spec file
    assert spec.tick_s == 600 and spec.horizon_s == 86400 and spec.skip_bad_rows
    assert spec.overheads.checkpoint_resume_s == 60
    assert spec.group_layout == "{trace}/{variant}/seed-{seed}"
    points = spec.points()
    # no-hetero applies to arena only; d1's options are given in the short form
    assert len(points) == 2 * 2 * (2 + 1 + 2)
    assert [p.label for p in points[:5]] == ["a/default/seed-0/arena", "a/default/seed-0/sia", "a/default/seed-1/arena",
                                            "a/default/seed-1/sia", "a/no-hetero/seed-0/arena"]
    assert spec.simulator_config(1).seed == 1
    # options replace the file's fields
    one = build_sweep_spec(spec_file, traces=["a.csv"], perfs=["p.parquet"], policies="fcfs", seeds="3")
    assert [t.name for t in one.traces] == ["a"] and one.policies == ("fcfs",) and one.seeds == (3,)
    assert one.group_layout == "{variant}"  # only the variants still vary
    assert {p.group for p in one.points()} == {"default", "no-hetero", "d1"} - {"no-hetero"}


@pytest.mark.parametrize("change,needle", [
    ({"policies": "arena,nope"}, "nope"),
    ({"layout": "{trace}"}, "lacks {seed}"),
    ({"layout": "{trace}/{seed}/{oops}"}, "{oops}"),
    ({"layout": "../{trace}/{seed}"}, "inside the output"),
    # a format spec fails ({trace:d}) or pads without bound ({trace:>400000000}): refused before anything runs
    ({"layout": "{trace:d}/{seed}"}, "formats a field ({trace:d}); use the plain {trace}, {variant}, {seed}"),
    ({"layout": "{trace:>400000000}/{seed}"}, "formats a field ({trace:>400000000})"),
    ({"layout": "{trace!r}/{seed}"}, "formats a field ({trace!r})"),
    ({"seeds": "0,x"}, "--seeds"),
    ({"perfs": ["zz=p.parquet"]}, "no trace named 'zz'"),
])
def test_spec_errors_name_the_problem(tmp_path, change, needle):
    (tmp_path / "a.csv").write_text("")
    args = {"traces": ["a.csv"], "perfs": ["p.parquet"], "cluster": "c.yaml", "seeds": "0,1", **change}
    with pytest.raises(ArenaError, match=re.escape(needle)):
        build_sweep_spec(**args)


def test_unknown_policy_option_fails_before_anything_runs(tmp_path, inputs):
    d, cluster = inputs
    spec = SweepSpec(cluster, (SweepTrace("philly", d / "philly.csv", d / "perf.parquet"),), ("arena",),
                     variants=(SweepVariant("x", {"no_such": 1}),))
    with pytest.raises(ArenaError, match="no_such"):
        sweep(spec, tmp_path / "out", SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert not (tmp_path / "out" / "sweep.json").exists()
    spec = dataclasses.replace(spec, variants=(SweepVariant("x", {"hetero": "yes"}),))  # YAML's "yes" quoted
    with pytest.raises(ArenaError, match="option hetero: expected true or false, got 'yes'"):
        sweep(spec, tmp_path / "out", SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,needle", [
    # an alias bomb: a few hundred bytes that expand to ~10^8 nodes when walked
    ("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\ncluster: c.yaml\n", "YAML aliases"),
    ("cluster: c.yaml\ntraces: hello\npolicies: [arena]\n", "traces: expected a mapping, got str"),
    ("cluster: c.yaml\ntraces: [a, b]\npolicies: [arena]\n", "traces: expected a mapping, got list"),
    ("x: " + "y" * (1 << 20) + "\n", "larger than 1024 KiB"),
])
def test_spec_file_limits(tmp_path, text, needle):
    """A sweep spec is a hand-written file: refused in bounded time and memory, with a one-line error (with or
    without a --perf for its traces)."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(text)
    for perfs in ([], ["p.parquet"]):
        with pytest.raises(ArenaError, match=re.escape(needle)):
            build_sweep_spec(spec_file, perfs=perfs)


@pytest.mark.parametrize("text,options,needle", [
    # a trace given as a path where {trace, perf} belongs, with --perf for all or for it
    ("traces: {a: a.csv}\n", {"perfs": ["p.parquet"]}, "spec.yaml: traces.a: expected a mapping, got str"),
    ("traces: {a: a.csv}\n", {"perfs": ["a=p.parquet"]}, "spec.yaml: traces.a: expected a mapping, got str"),
    ("traces: {a: }\n", {"perfs": ["p.parquet"]}, "spec.yaml: traces.a: expected a mapping, got NoneType"),
    ("traces: {a: {trace: a.csv}}\nsimulator: {overheads: [1]}\n", {"perfs": ["p.parquet"], "overheads": ["checkpoint_resume_s=1"]},
     "spec.yaml: simulator.overheads: expected a mapping, got list"),
    ("traces: {a: {trace: a.csv}}\nvariants: {v: {options: {1: 2}}}\n", {"perfs": ["p.parquet"]},
     "spec.yaml: variants.v.options: 1 is not an option name"),
    ("traces: {a: {trace: a.csv}}\nvariants: {v: {1: 2}}\n", {"perfs": ["p.parquet"]},
     "spec.yaml: variants.v.options: 1 is not an option name"),
])
def test_malformed_spec_fields_beside_options_are_named(tmp_path, text, options, needle):
    """A spec field of the wrong shape that an option would fill in or merge with is the spec's one-line error,
    not a TypeError."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text("cluster: c.yaml\npolicies: [arena]\n" + text)
    with pytest.raises(ArenaError, match=re.escape(needle)):
        build_sweep_spec(spec_file, **options)


def test_a_specs_whole_numbers_run_as_their_options_types():
    """YAML reads 3.0 as a float and 5 as an int: an integer option given as a whole float runs (a slice or
    range() of 3.0 would fail every simulation), and a float option given as an int is the same policy, keyed and
    recorded alike, as the float; a fractional count is refused by name."""
    from libarena.schedule.api import make_policy, policy_parameters

    arena = make_policy("arena", search_depth=3.0, num_queues=2.0, trade_margin=5)
    assert type(arena.config.search_depth) is int and list(range(arena.config.search_depth)) == [0, 1, 2]
    assert type(arena.config.num_queues) is int and type(arena.config.trade_margin) is float
    assert policy_parameters(arena) == policy_parameters(make_policy("arena", num_queues=2, trade_margin=5.0))
    sia = make_policy("sia", ilp_max_queued=64.0, max_gpus_per_job=8.0)
    assert sia.config.ilp_max_queued == 64 and type(sia.config.ilp_max_queued) is int
    assert type(sia.config.max_gpus_per_job) is int
    with pytest.raises(ArenaError, match=re.escape("--search-depth: 2.5 is not an integer in [1, 10]")):
        make_policy("arena", search_depth=2.5)


def test_a_sweep_never_writes_over_its_inputs(tmp_path, inputs):
    """An input where the sweep writes (its summary, a comparison's files, a run's folder) is refused before
    anything runs, and is left as it was; an input elsewhere under the output is fine."""
    d, cluster = inputs
    trace_text = (d / "philly.csv").read_text()
    for where, layout in (("sweep.json", None), ("t/compare.json", "{trace}"), ("arena/jobs.parquet", None)):
        out = tmp_path / where.replace("/", "-")
        target = out / where
        target.parent.mkdir(parents=True)
        target.write_text(trace_text)
        spec = SweepSpec(cluster, (SweepTrace("t", target, d / "perf.parquet"),), ("arena",), layout=layout)
        with pytest.raises(ArenaError, match="would write over its input"):
            sweep(spec, out, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
        assert target.read_text() == trace_text
        assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == sorted(
            {where, *(str(q.as_posix()) for q in Path(where).parents if str(q) != ".")})
    # the spec file itself, where the summary goes: refused, and left as it was
    spec_dir = tmp_path / "spec-here"
    spec_dir.mkdir()
    spec_file = spec_dir / "sweep.json"
    spec_text = json.dumps({"cluster": str(cluster), "policies": ["fcfs"],
                            "traces": {"t": {"trace": str(d / "philly.csv"), "perf": str(d / "perf.parquet")}}})
    spec_file.write_text(spec_text)
    with pytest.raises(ArenaError, match=r"would write over its input \(spec\)"):
        sweep(build_sweep_spec(spec_file), spec_dir, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert spec_file.read_text() == spec_text
    beside = tmp_path / "beside"
    (beside / "t").mkdir(parents=True)
    (beside / "t" / "trace.csv").write_text(trace_text)
    spec = SweepSpec(cluster, (SweepTrace("t", beside / "t" / "trace.csv", d / "perf.parquet"),), ("fcfs",),
                     layout="{trace}", horizon_s=400000)
    summary = sweep(spec, beside, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert summary.count("failed") == 0 and (beside / "t" / "compare.json").is_file()
    assert (beside / "t" / "trace.csv").read_text() == trace_text


def test_a_run_folder_holding_other_files_is_refused_before_running(tmp_path, inputs):
    d, cluster = inputs
    out = tmp_path / "out"
    (out / "fcfs").mkdir(parents=True)
    (out / "fcfs" / "notes.txt").write_text("mine")
    spec = SweepSpec(cluster, (SweepTrace("philly", d / "philly.csv", d / "perf.parquet"),), ("fcfs",))
    with pytest.raises(ArenaError, match=r"holds files a simulation does not write \(notes.txt\)"):
        sweep(spec, out, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["fcfs", "fcfs/notes.txt"]


def test_a_sweep_that_fails_before_running_leaves_no_folders(tmp_path, inputs):
    d, cluster = inputs

    class Unreachable(SequentialExecutor):
        def map_unordered(self, fn, items):
            raise ArenaError("cannot reach the Ray cluster at nohost:1")

    spec = SweepSpec(cluster, (SweepTrace("philly", d / "philly.csv", d / "perf.parquet"),), ("arena", "fcfs"),
                     seeds=(5, 6), horizon_s=400000)
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "new" / "sweep", tmp_path / "kept"):
        with pytest.raises(ArenaError, match="cannot reach"):
            sweep(spec, out, Unreachable(), cache=CacheSettings(tmp_path / "empty-cache"))
    assert not (tmp_path / "new").exists()  # every folder it made, up to the first that existed
    assert list((tmp_path / "kept").iterdir()) == []


def _an_earlier_sweep(inputs, tmp_path) -> tuple[SweepSpec, Path, Callable[[], dict[str, str]]]:
    """philly swept (arena and fcfs, seeds 0 and 1) into tmp_path/out: its spec, the output, and a snapshot of the
    output's files (path -> sha256)."""
    import hashlib

    d, cluster = inputs
    first = SweepSpec(cluster, (SweepTrace("philly", d / "philly.csv", d / "perf.parquet"),), ("arena", "fcfs"),
                      seeds=(0, 1), horizon_s=400000)
    out = tmp_path / "out"
    sweep(first, out, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))

    def snapshot() -> dict[str, str]:
        return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(out.rglob("*")) if p.is_file()}

    return first, out, snapshot


def test_an_interrupted_sweep_leaves_the_previous_results_whole(tmp_path, inputs):
    """Interrupted after some of its simulations (Ctrl-C, SIGTERM), a sweep over an earlier one leaves that one
    exactly as it was (no mix of new runs and old comparisons) and no staging folder; run again, it completes."""
    first, out, snapshot = _an_earlier_sweep(inputs, tmp_path)
    before = snapshot()
    assert "sweep.json" in before and "seed-0/compare.json" in before

    class InterruptedAfterOne(SequentialExecutor):
        def map_unordered(self, fn, items):
            for n, pair in enumerate(super().map_unordered(fn, items)):
                if n == 1:
                    raise KeyboardInterrupt
                yield pair

    second = dataclasses.replace(first, tick_s=600.0)  # other results, same folders
    with pytest.raises(KeyboardInterrupt):
        sweep(second, out, InterruptedAfterOne(), cache=CacheSettings(tmp_path / "cache"))
    assert snapshot() == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    summary = sweep(second, out, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert summary.count("cached") == 1 and summary.count("failed") == 0
    after = snapshot()
    assert after.keys() == before.keys() and after["seed-0/compare.json"] != before["seed-0/compare.json"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_a_sweep_that_cannot_move_its_results_into_place_leaves_the_previous_ones_whole(tmp_path, inputs, monkeypatch):
    """A move into place that fails halfway (here the second new run's folder, as a group folder on another file
    system fails with EXDEV) is undone: the previous summary, comparisons and runs are exactly as they were, the
    error is one line, and the next sweep completes from the cache."""
    import errno
    import os

    import libarena.pipeline.sweep as sweep_module

    first, out, snapshot = _an_earlier_sweep(inputs, tmp_path)
    before = snapshot()
    real_move, real_rename, new_runs_moved = sweep_module._move_into_place, os.rename, []

    def rename(source, target):
        moving_in = Path(source).is_dir() and ".replaced" not in str(target) and ".sweep." in str(source)
        if moving_in and len(new_runs_moved) < 2:  # a new run's folder, from the staging folder into place
            new_runs_moved.append(target)
            if len(new_runs_moved) == 2:
                raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_rename(source, target)  # (then the undoing, which moves the old folders back)

    def failing_move(*args):
        os.rename = rename  # only while the results move into place
        try:
            real_move(*args)
        finally:
            os.rename = real_rename

    monkeypatch.setattr(sweep_module, "_move_into_place", failing_move)
    second = dataclasses.replace(first, tick_s=600.0)  # other results, same folders
    with pytest.raises(ArenaError, match=r"^sweep: cannot move its results into .*out \(Invalid cross-device link\): "
                                         r"the previous results are left as they were$"):
        sweep(second, out, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert len(new_runs_moved) == 2  # one new run had replaced its old one before the failure
    assert snapshot() == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(sweep_module, "_move_into_place", real_move)
    summary = sweep(second, out, SequentialExecutor(), cache=CacheSettings(tmp_path / "cache"))
    assert summary.count("cached") == 4 and snapshot()["seed-0/compare.json"] != before["seed-0/compare.json"]


def test_an_input_rewritten_while_the_sweep_runs_fails_its_simulations_and_caches_nothing(tmp_path, inputs):
    """A simulation's output is stored under the key of the inputs the sweep hashed when it began: a table
    rewritten in place meanwhile (or another node's different copy) would be simulated and cached as the original."""
    import shutil

    d, cluster = inputs
    perf = tmp_path / "perf.parquet"
    shutil.copyfile(d / "perf.parquet", perf)
    pairs = sorted({(j.model, j.global_batch) for j in read_trace(d / "philly.csv").jobs})
    # (two simulations: a sweep of one runs it in this process, whatever the executor)
    spec = SweepSpec(cluster, (SweepTrace("philly", d / "philly.csv", perf),), ("arena", "fcfs"), horizon_s=400000)

    class RewritesTheTable(SequentialExecutor):
        def map_unordered(self, fn, items):
            write_perf(perf, pairs, ["a100", "v100", "a40", "a10"], max_gpus=8)  # another table, the same path
            yield from super().map_unordered(fn, items)

    summary = sweep(spec, tmp_path / "out", RewritesTheTable(), cache=CacheSettings(tmp_path / "cache"))
    assert len(summary.records) == 2
    for record in summary.records:
        assert record.status == "failed" and "is not the file the sweep started with" in record.error
    assert not (tmp_path / "cache" / "stages" / "arena-schedule-simulate").exists() or not [
        p for p in (tmp_path / "cache" / "stages" / "arena-schedule-simulate").iterdir() if not p.name.startswith(".")]


# -- results ---------------------------------------------------------------------------------------------------


def test_spec_with_variants_and_seeds(inputs, tmp_path):
    """A YAML spec: a variant for Arena only and two seeds, laid out by variant and seed; the variant's run is
    the one ``simulate --no-hetero`` makes (a cache hit)."""
    d, cluster = inputs
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"cluster: {cluster}\n"
                    f"traces: {{philly: {{trace: {d / 'philly.csv'}, perf: {d / 'perf.parquet'}}}}}\n"
                    "policies: [arena, fcfs]\nseeds: [0, 1]\n"
                    "variants: {default: {}, no-hetero: {options: {hetero: false}, policies: [arena]}}\n"
                    "simulator: {horizon: 400000}\n")
    cache = str(tmp_path / "cache")
    r = cli("sweep", str(spec), "--sequential", "--cache-dir", cache, "-o", str(tmp_path / "out"), cwd=d)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    assert sorted(p.relative_to(out).as_posix() for p in out.glob("*/*/*/jobs.parquet")) == [
        "default/seed-0/arena/jobs.parquet", "default/seed-0/fcfs/jobs.parquet", "default/seed-1/arena/jobs.parquet",
        "default/seed-1/fcfs/jobs.parquet", "no-hetero/seed-0/arena/jobs.parquet", "no-hetero/seed-1/arena/jobs.parquet"]
    assert _records(out / "no-hetero" / "seed-0" / "arena") != _records(out / "default" / "seed-0" / "arena")
    # each comparison's compare.json is headed: its runs' parameters (the variant's option) and inputs, once each
    header = json.loads((out / "no-hetero" / "seed-1" / "compare.json").read_text())["arena"]
    assert header["kind"] == "comparison" and header["schema_version"] == 1
    assert header["provenance"]["parameters"]["policies"]["arena"]["seed"] == 1
    assert str(header["provenance"]["parameters"]["policies"]["arena"]["policy_config"]["hetero"]) == "False"
    assert header["provenance"]["tool"] == "arena-schedule sweep"
    spec_input, *run_inputs = header["provenance"]["inputs"]
    assert spec_input["kind"] == "sweep_spec" and spec_input["path"].endswith("spec.yaml")
    assert sorted(i["path"] for i in run_inputs) == sorted(str(x) for x in (cluster, d / "philly.csv", d / "perf.parquet"))
    s = cli("simulate", "--trace", str(d / "philly.csv"), "--perf", str(d / "perf.parquet"), "--cluster", str(cluster),
            "--policy", "arena", "--no-hetero", "--seed", "1", "--horizon", "400000", "--cache-dir", cache,
            "-o", str(tmp_path / "one"), "--json", cwd=d)
    assert s.returncode == 0 and json.loads(s.stdout)["cache"]["hit"], s.stderr
    assert _records(tmp_path / "one") == _records(out / "no-hetero" / "seed-1" / "arena")



def test_a_sweep_warns_of_runs_whose_ilp_solves_hit_the_time_limit(inputs, tmp_path):
    """As simulate and compare do: a run whose decisions depended on the host's speed says so."""
    d, cluster = inputs
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"cluster: {cluster}\n"
                    f"traces: {{philly: {{trace: {d / 'philly.csv'}, perf: {d / 'perf.parquet'}}}}}\n"
                    "policies: [sia]\nvariants: {default: {options: {ilp_time_limit_s: 600}}, rushed: {options: {ilp_time_limit_s: 1.0e-9}}}\n"
                    "simulator: {horizon: 100000}\n")
    r = cli("sweep", str(spec), "--sequential", "--cache-dir", str(tmp_path / "cache"), "-o", str(tmp_path / "out"), cwd=d)
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "stopped at the time limit" in line]
    assert len(warned) == 1 and "rushed" in warned[0] and "sia: " in warned[0], r.stderr


def test_a_cached_sweep_repeats_its_traces_warnings(inputs, tmp_path):
    """A simulation served from the cache reads no trace, yet the sweep still says which columns the trace does
    not read and how many rows were skipped (before, only the run that simulated said so)."""
    d, cluster = inputs
    lines = (d / "broken.csv").read_text().splitlines()
    (tmp_path / "extra.csv").write_text("\n".join([lines[0] + ",priorty"] + [line + ",1" for line in lines[1:]]) + "\n")
    args = ("sweep", "--trace", f"extra={tmp_path / 'extra.csv'}", "--perf", "perf.parquet", "--cluster", str(cluster),
            "--policies", "fcfs,arena", "--horizon", "400000", "--sequential", "--skip-bad-rows",
            "--cache-dir", str(tmp_path / "cache"))
    for run, status in (("first", "simulated"), ("again", "cached")):
        r = cli(*args, "-o", str(tmp_path / run), cwd=d)
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / run / "sweep.json").read_text())[status] == 2
        ignored = [line for line in r.stderr.splitlines() if "ignored column(s) 'priorty'" in line]
        skipped = [line for line in r.stderr.splitlines() if "trace extra: skipped 1 bad row(s)" in line]
        assert len(ignored) == 1 and len(skipped) == 1, r.stderr  # once per trace, not once per run
    assert "served from the cache" in skipped[0] and "first:" not in skipped[0]


@pytest.mark.slow
def test_sequential_sweep_equals_compare_and_shares_the_cache(inputs, tmp_path):
    d, cluster = inputs
    cache = str(tmp_path / "cache")
    r = cli("sweep", "--trace", "philly=philly.csv", "--trace", "venus=venus.csv", "--perf", "perf.parquet",
            "--cluster", str(cluster), "--policies", ",".join(POLICIES), "--horizon", "400000", "--sequential",
            "--plot", "--cache-dir", cache, "-o", "seq", cwd=d)
    assert r.returncode == 0, r.stderr
    assert "[12/12]" in r.stderr and "== philly" in r.stdout
    for trace in ("philly", "venus"):
        _compare(d, cluster, trace, f"cmp-{trace}", str(tmp_path / "cache-compare"))
        for policy in POLICIES:
            assert _records(d / "seq" / trace / policy) == _records(d / f"cmp-{trace}" / policy), (trace, policy)
        assert sorted(json.loads((d / "seq" / trace / "compare.json").read_text())["policies"]) == sorted(POLICIES)
        for png in ("throughput.png", "jct_cdf.png", "queue_length.png"):  # the same figures as compare's
            assert (d / "seq" / trace / png).read_bytes() == (d / f"cmp-{trace}" / png).read_bytes()
        assert "policies compared" in (d / "seq" / trace / "table.txt").read_text()
    written = read_json_document(d / "seq" / "sweep.json", "sweep_summary")  # a registered artifact: kind, version, inputs
    summary, inputs = written.data, written.provenance.inputs
    assert (summary["total"], summary["simulated"], summary["cached"], summary["failed"]) == (12, 12, 0, 0)
    assert written.schema_version == 2 and all(len(ref["sha256"]) == 64 for ref in inputs)
    assert {Path(ref["path"]).name for ref in inputs} >= {"philly.csv", "venus.csv", "perf.parquet"}
    assert written.provenance.tool == "arena-schedule sweep"

    # simulate of one of them is a cache hit (the same key), and so is the whole sweep again
    s = cli("simulate", "--trace", str(d / "venus.csv"), "--perf", str(d / "perf.parquet"), "--cluster", str(cluster),
            "--policy", "gavel", "--horizon", "400000", "--cache-dir", cache, "-o", "one", "--json", cwd=d)
    assert s.returncode == 0 and json.loads(s.stdout)["cache"]["hit"], s.stderr
    again = cli("sweep", "--trace", "philly=philly.csv", "--trace", "venus=venus.csv", "--perf", "perf.parquet",
                "--cluster", str(cluster), "--policies", ",".join(POLICIES), "--horizon", "400000", "--cache-dir",
                cache, "-o", "seq2", "--json", cwd=d)  # Ray by default, but nothing is left to run
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert doc["cached"] == 12 and doc["simulated"] == 0
    for policy in POLICIES:
        assert _records(d / "seq2" / "philly" / policy) == _records(d / "seq" / "philly" / policy)


def test_a_failed_simulation_is_reported_and_the_others_complete(inputs, tmp_path):
    d, cluster = inputs
    r = cli("sweep", "--trace", "good=philly.csv", "--trace", "broken=broken.csv", "--perf", "perf.parquet",
            "--cluster", str(cluster), "--policies", "arena,fcfs", "--horizon", "400000", "--sequential",
            "--cache-dir", str(tmp_path / "cache"), "-o", "failing", cwd=d)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("arena-schedule: error: 2 of 4 simulations failed (first: broken/") and "Traceback" not in r.stderr
    assert "no-such-gpu" in last
    assert "broken/arena: failed:" in r.stderr
    summary = json.loads((d / "failing" / "sweep.json").read_text())
    status = {s["label"]: s["status"] for s in summary["simulations"]}
    assert status == {"good/arena": "simulated", "good/fcfs": "simulated", "broken/arena": "failed", "broken/fcfs": "failed"}
    assert summary["incomplete_comparisons"] == ["broken"]
    assert (d / "failing" / "good" / "compare.json").is_file() and (d / "failing" / "good" / "arena" / "jobs.parquet").is_file()
    assert not (d / "failing" / "broken" / "compare.json").exists()


def test_a_worker_with_other_code_or_libraries_than_the_driver_fails_its_simulation(inputs):
    """A Ray worker on a node with another install (another HiGHS build can choose another of several optimal
    rounds) would store its result under the driver's key: it fails the simulation instead."""
    from libarena.pipeline.schedule import simulation_build
    from libarena.pipeline.sweep import SimulationFailure, SimulationFiles, SimulationTask, run_simulation_task
    from libarena.schedule.config import SimulatorConfig

    d, cluster = inputs
    build = simulation_build()
    task = SimulationTask(str(d / "philly.csv"), str(d / "perf.parquet"), str(cluster), "fcfs", {},
                          SimulatorConfig(horizon_s=400000), False, (), build)
    assert isinstance(run_simulation_task(task), SimulationFiles)
    for other, named in (({**build, "code": "0" * 64}, "code"),
                         ({**build, "libraries": {**build["libraries"], "highspy": "0.0"}}, "libraries"),
                         ({"code": "0" * 64, "libraries": {}}, "code and libraries")):
        failed = run_simulation_task(dataclasses.replace(task, expected_build=other))
        assert isinstance(failed, SimulationFailure)
        assert failed.message.startswith(f"this worker runs other {named} than the sweep's driver (libraries here: ")


def test_a_sweeps_summary_lists_its_comparisons_in_the_specs_order(inputs, tmp_path):
    """Not in the order the simulations ended (Ray's, or cached ones first): the same spec gives the same
    sweep.json and the same tables on stdout."""
    d, cluster = inputs

    class LastFirst(SequentialExecutor):
        def map_unordered(self, fn, items):
            for i in reversed(range(len(items))):
                yield i, fn(items[i])

    traces = tuple(SweepTrace(name, d / csv, d / "perf.parquet")
                   for name, csv in (("a", "broken.csv"), ("b", "philly.csv"), ("c", "broken.csv"), ("d", "venus.csv")))
    spec = SweepSpec(cluster, traces, ("fcfs",), horizon_s=400000, skip_bad_rows=False)
    summary = sweep(spec, tmp_path / "out", LastFirst(), cache=CacheSettings(tmp_path / "cache"))
    assert summary.incomplete_groups == ["a", "c"] and list(summary.groups) == ["b", "d"] == list(summary.paired)
    assert json.loads((tmp_path / "out" / "sweep.json").read_text())["incomplete_comparisons"] == ["a", "c"]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_sweep_equals_the_sequential_runs(inputs, tmp_path):
    """On the embedded Ray (two workers) the sweep writes what compare writes, and a failing trace fails only
    its own simulations."""
    d, cluster = inputs
    r = cli("sweep", "--trace", "philly=philly.csv", "--trace", "venus=venus.csv", "--trace", "broken=broken.csv",
            "--perf", "perf.parquet", "--cluster", str(cluster), "--policies", ",".join(POLICIES), "--horizon", "400000",
            "--num-cpus", "2", "--cache-dir", str(tmp_path / "cache"), "-o", "ray", cwd=d, timeout=600)
    assert r.returncode == 2, r.stderr
    assert "6 of 18 simulations failed" in r.stderr.strip().splitlines()[-1]
    assert r.stderr.count("failed: ") == 6
    for trace in ("philly", "venus"):
        if not (d / f"cmp-{trace}").is_dir():
            _compare(d, cluster, trace, f"cmp-{trace}", str(tmp_path / "cache-compare"))
        for policy in POLICIES:
            assert _records(d / "ray" / trace / policy) == _records(d / f"cmp-{trace}" / policy), (trace, policy)
        assert (d / "ray" / trace / "compare.json").is_file()
    summary = json.loads((d / "ray" / "sweep.json").read_text())
    assert summary["simulated"] == 12 and summary["failed"] == 6


def test_signals_during_ray_start_stay_the_tools_own():
    """What Ray's driver handler does with a SIGTERM while Ray starts (``sys.exit(15)``) becomes the tools'
    interrupt, and the handlers set before are back afterwards."""
    import signal

    from libarena.run.cluster import _own_signal_handlers

    def mine(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _own_signal_handlers():
                signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as ray.init does
                raise SystemExit(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is mine
        with pytest.raises(SystemExit):
            with _own_signal_handlers():
                raise SystemExit(3)  # any other exit goes through
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.ray
@pytest.mark.slow
def test_the_embedded_ray_keeps_the_tools_signal_handlers():
    import signal

    import ray

    from libarena.cli import _raise_interrupt
    from libarena.run.cluster import LocalClusterConfig, connect

    if ray.is_initialized():
        pytest.skip("Ray already runs in this process")
    saved = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert connect(None, LocalClusterConfig(num_cpus=1, num_devices=0))
        assert signal.getsignal(signal.SIGTERM) is _raise_interrupt
        assert signal.getsignal(signal.SIGINT) is _raise_interrupt
    finally:
        ray.shutdown()
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.mark.parametrize("traces,layout,needle", [
    # trace a1 at seed 1 and trace a at seed 11 are both a11: the later comparison would overwrite the earlier's
    (["a1=a.csv", "a=b.csv"], "{trace}{seed}", "puts trace 'a1', variant 'default', seed 1 and trace 'a', variant "
                                              "'default', seed 11 in one folder ('a11')"),
    (["a\x00b=a.csv", "b=b.csv"], None, "trace name 'a\\x00b' cannot name a folder"),
    (["a=a.csv", "b=b.csv"], "{trace}\x00/{seed}", "cannot name folders (a character that is not printable"),
    ([f"{'a' * 200}=a.csv", f"{'b' * 200}=b.csv"], "{trace}-{trace}/{seed}", "a part of more than 255 bytes"),
    (["a=a.csv", "b=b.csv"], "{trace}/" + "x" * 256 + "{seed}", "cannot name folders"),
])
def test_layouts_and_names_that_cannot_give_each_comparison_a_folder_of_its_own_are_refused(tmp_path, traces, layout,
                                                                                           needle):
    """Two comparisons in one folder, or a name no file system takes (a NUL byte made mkdir fail with an internal
    error), are refused before anything runs."""
    with pytest.raises(ArenaError, match=re.escape(needle)):
        build_sweep_spec(traces=traces, perfs=["p.parquet"], cluster="c.yaml", seeds="1,11", layout=layout)
