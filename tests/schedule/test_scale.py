"""Ten times the paper's scale: scaled traces and clusters, and the indexes that keep Arena's rounds short
decide exactly as the exhaustive scans they replace."""

from __future__ import annotations

import random
import re

import pytest

from libarena.errors import ArenaError
from libarena.hardware import load_cluster
from libarena.schedule.api import make_policy, run_policy
from libarena.schedule.config import SimulatorConfig
from libarena.schedule.metrics import job_records
from libarena.schedule.policies.arena import ArenaPolicy
from libarena.schedule.traces import TraceScale, read_trace, scale_trace, trace_csv, write_scaled_trace
from tests.schedule.helpers import cluster, job, workload
from tests.schedule.perf_fixtures import synthetic_perf_table

MODELS = [("gpt__760M", 128), ("gpt__1.3B", 256), ("moe__2.4B", 256), ("wide_resnet__1B", 512), ("bert__2.6B", 256)]
TYPES = ["a100", "a40", "v100"]


def _generated_trace(n: int, seed: int = 7) -> list:
    rng = random.Random(seed)
    specs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / 240)
        model, batch = rng.choice(MODELS)
        specs.append(job(f"j{i}", model, rng.randint(2000, 60000), rng.choice([1, 2, 4, 8]), rng.choice(TYPES),
                         submit=round(t, 1), batch=batch, row=i + 1, priority=None,
                         deadline=round(t + rng.uniform(3600, 40000), 1)))
    return specs


# -- trace scale --------------------------------------------------------------------------------------------


def test_scaled_trace_is_deterministic_and_valid(tmp_path):
    specs = _generated_trace(60)
    src = tmp_path / "t.csv"
    src.write_text(trace_csv(specs))
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    write_scaled_trace(src, a, TraceScale(4, 150.0, seed=3))
    write_scaled_trace(src, b, TraceScale(4, 150.0, seed=3))
    write_scaled_trace(src, c, TraceScale(4, 150.0, seed=4))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    scaled = read_trace(a).jobs  # a valid arena-ae trace: unique ids, every row parses
    assert len(scaled) == 4 * len(specs)
    assert len({j.job_id for j in scaled}) == len(scaled)
    assert [j.submit_time for j in scaled] == sorted(j.submit_time for j in scaled)
    by_id = {j.job_id: j for j in scaled}
    for s in specs:
        assert by_id[s.job_id].submit_time == s.submit_time  # copy 0 is the trace itself
        for k in (1, 2, 3):
            copy = by_id[f"{s.job_id}-x{k}"]
            shift = copy.submit_time - s.submit_time
            assert abs(shift) <= 150.0 + 1e-3
            assert copy.deadline - copy.submit_time == pytest.approx(s.deadline - s.submit_time, abs=2e-3)
            assert (copy.model, copy.global_batch, copy.num_iterations, copy.requested_gpus, copy.requested_type) == \
                (s.model, s.global_batch, s.num_iterations, s.requested_gpus, s.requested_type)
    shifts = [by_id[f"{s.job_id}-x1"].submit_time - s.submit_time for s in specs]
    assert min(shifts) < -50 and max(shifts) > 50  # spread over the whole window


def test_a_copy_of_a_job_due_just_after_submission_reads_back(tmp_path):
    """A deadline 0.1 ms after submission is a valid row; its copies keep at least the 1 ms the written trace can
    tell apart (rounded to 3 decimals, a shorter gap would make a row the reader refuses)."""
    src = tmp_path / "t.csv"
    src.write_text(trace_csv([job("a", "gpt__760M", 100, 2, "a100", submit=1035.7301, deadline=1035.7302, row=1,
                                  priority=None)]))
    out = tmp_path / "x.csv"
    write_scaled_trace(src, out, TraceScale(20, 150.0, seed=0))
    copies = read_trace(out).jobs
    assert len(copies) == 20 and all(j.deadline > j.submit_time for j in copies)


def test_a_copy_does_not_depend_on_row_order():
    specs = _generated_trace(30)
    forward = {j.job_id: j.submit_time for j in scale_trace(specs, TraceScale(3, 100.0, seed=1))}
    backward = {j.job_id: j.submit_time for j in scale_trace(specs[::-1], TraceScale(3, 100.0, seed=1))}
    assert forward == backward


def test_scaling_the_paper_trace(traces_dir, tmp_path):
    out = tmp_path / "philly10.csv"
    scaled = write_scaled_trace(traces_dir / "arena-ae" / "simulate_trace_philly.csv", out, TraceScale(10, 150.0))
    original = read_trace(traces_dir / "arena-ae" / "simulate_trace_philly.csv").jobs
    assert len(scaled.jobs) == 10 * len(original) == len(read_trace(out).jobs)


def test_an_adapted_trace_is_scaled_with_the_rates_simulate_adapts_it_with(tmp_path):
    """An ITP or ElasticFlow trace's iteration counts come from the performance table (the job runs for its
    recorded duration as submitted): ``trace scale -x 1`` with that table writes the jobs ``simulate`` would run,
    and without it is refused rather than written at 1 iteration per second."""
    from libarena.schedule.api import prepare_workload
    from tests.schedule.perf_fixtures import write_perf, zoo_pairs

    raw = tmp_path / "raw.csv"
    raw.write_text("job_id,submission_time,duration,num_gpu\n"
                   + "".join(f"j{i},{600 * i},{1800 + 900 * i},{1 + i % 5}\n" for i in range(12)))
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text("name: c\nnode_groups: [{gpu_type: a100, nodes: 2, gpus_per_node: 8}, "
                            "{gpu_type: v100, nodes: 2, gpus_per_node: 8}]\n")
    perf = tmp_path / "perf.parquet"
    write_perf(perf, zoo_pairs(), ["a100", "v100"])
    out = tmp_path / "scaled.csv"
    with pytest.raises(ArenaError, match=r"raw.csv is an itp-raw trace: .* give --perf and --cluster"):
        write_scaled_trace(raw, out, TraceScale(1), cluster=cluster_file)
    with pytest.raises(ArenaError, match="--perf needs --cluster"):
        write_scaled_trace(raw, out, TraceScale(1), perf=perf)
    assert not out.exists()

    write_scaled_trace(raw, out, TraceScale(1, seed=5), cluster=cluster_file, perf=perf)
    simulated = prepare_workload(raw, perf, cluster_file, seed=5).jobs
    written = read_trace(out).jobs
    assert [(j.job_id, j.model, j.global_batch, j.num_iterations, j.requested_gpus, j.requested_type) for j in written] \
        == [(j.job_id, j.model, j.global_batch, j.num_iterations, j.requested_gpus, j.requested_type) for j in simulated]
    assert [j.deadline for j in written] == pytest.approx([j.deadline for j in simulated], abs=1e-3)
    durations = [1800 + 900 * i for i in range(12)]
    assert sum(j.num_iterations != d for j, d in zip(written, durations)) >= 10  # not 1 iteration per second


def test_scale_refuses_bad_input(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text(trace_csv(_generated_trace(3)))
    with pytest.raises(ArenaError, match="copies"):
        TraceScale(0)
    with pytest.raises(ArenaError, match="jitter"):
        TraceScale(2, -1.0)
    with pytest.raises(ArenaError, match="overwrite"):
        write_scaled_trace(src, src, TraceScale(2))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: c\nnode_groups: [{gpu_type: a100, nodes: 1, gpus_per_node: 8}]\n")
    before = cluster.read_bytes()
    with pytest.raises(ArenaError, match="is the input --cluster"):
        write_scaled_trace(src, cluster, TraceScale(2), cluster=cluster)
    assert cluster.read_bytes() == before
    clash = _generated_trace(2)
    clash[1] = job("j0-x1", "gpt__760M", 10, 1, "a100", submit=5.0, row=2)
    with pytest.raises(ArenaError, match="already in the trace"):
        scale_trace(clash, TraceScale(2))
    late = _generated_trace(1)
    late[0] = job("j0", "gpt__760M", 10, 1, "a100", submit=3_153_000_000.0, row=1)
    with pytest.raises(ArenaError, match="smaller --jitter"):  # some copy lands past the reader's 100 years
        scale_trace(late, TraceScale(40, 3_000_000.0))
    # nor a copy's id the reader refuses (256 characters at most), nor a file larger than it reads
    long_id = [job("j" * 253, "gpt__760M", 10, 1, "a100", submit=0.0, row=1)]
    assert [j.job_id for j in scale_trace(long_id, TraceScale(2))][1] == "j" * 253 + "-x1"  # 256: still read
    with pytest.raises(ArenaError, match=r"of copy 1 of .* would be longer than 256 characters"):
        scale_trace([job("j" * 254, "gpt__760M", 10, 1, "a100", submit=0.0, row=1)], TraceScale(2))
    import libarena.schedule.traces as traces

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(traces, "MAX_TRACE_BYTES", 400)
        with pytest.raises(ArenaError, match=r"^3 copies of .*t\.csv would be a trace of [\d,]+ bytes, more than the 400 a trace may have$"):
            write_scaled_trace(src, tmp_path / "t3.csv", TraceScale(3))
    assert not (tmp_path / "t3.csv").exists()


def test_scaled_cluster(repo_root):
    base = load_cluster(repo_root / "examples" / "clusters" / "paper-sim-1280.yaml")
    big = base.scaled(10)
    assert big.total_gpus == 12800
    assert [(g.gpu_type, g.gpus_per_node) for g in big.node_groups] == [(g.gpu_type, g.gpus_per_node) for g in base.node_groups]
    assert all(b.nodes == 10 * g.nodes for b, g in zip(big.node_groups, base.node_groups))
    with pytest.raises(ArenaError):
        base.scaled(0)


# -- the indexes decide as the scans ---------------------------------------------------------------------------


class ScanningArena(ArenaPolicy):
    """Arena with its indexes switched off: every round scores every in-flight job (the code before them)."""

    def attach(self, sim) -> None:
        super().attach(sim)
        self._upgrades = None
        self._victim_index = None
        self._switches = None


def _run(policy, specs, spec, tick_s=300.0, overheads=None):
    table = synthetic_perf_table(MODELS, TYPES, max_gpus=16)
    config = SimulatorConfig(tick_s=tick_s) if overheads is None else SimulatorConfig(tick_s=tick_s, overheads=overheads)
    res = run_policy(workload(specs, table, spec), policy, config)
    return res.decisions, repr((job_records(res).to_pydict(), res.ts_throughput))  # repr: NaN equals NaN


# (not the fairness objective: its scores move with time, so Arena keeps no index for it and scans as this does)
@pytest.mark.parametrize("options", [{}, {"objective": "throughput"}, {"objective": "deadline"},
                                     {"hetero": False}, {"search_depth": 1}, {"elastic": False}, {"reuse_plans": True}])
def test_arena_with_indexes_decides_as_the_exhaustive_scan(options):
    """A busy small cluster (queues, scale-downs, scale-ups, migrations): every decision and every job's
    JCT equal with and without the indexes (with searched plans reused too, so overheads move with time)."""
    from libarena.schedule.config import OverheadConfig

    options = dict(options)
    overheads = OverheadConfig(reuse_plans=True) if options.pop("reuse_plans", False) else None
    specs = _generated_trace(220)
    spec = cluster([("a100", 6, 4), ("a40", 8, 2), ("v100", 2, 8)])
    base = make_policy("arena", **options)
    scanning = ScanningArena(base.config)
    fast = _run(base, specs, spec, overheads=overheads)
    assert base._upgrades is not None  # an index this compares with the scan
    slow = _run(scanning, specs, spec, overheads=overheads)
    assert fast[0]["action"].count("rescale") > 10  # the handlers were exercised
    assert fast == slow


def test_running_job_index_drops_moved_jobs_and_stays_bounded():
    """Entries of a job that moved or finished are never walked, and are swept out as the lists grow."""
    from types import SimpleNamespace

    from libarena.schedule.entities import JobState
    from libarena.schedule.policies.arena import RunningJobIndex

    jobs = [SimpleNamespace(index=i, state=JobState.RUNNING, version=0) for i in range(50)]
    sim = SimpleNamespace(active={j.index: j for j in jobs})
    index = RunningJobIndex(sim, lambda job: [(job.index % 3, (job.index % 7, job.index))])
    assert [e[1] for e in index.walk(0)] == sorted((j.index for j in jobs if j.index % 3 == 0), key=lambda i: (i % 7, i))
    for step in range(3000):  # jobs restart on new allocations again and again
        job = jobs[step % 50]
        job.version += 1
        index.add(job)
    jobs[3].state = JobState.FINISHED
    assert index.entries <= 1025  # swept at 1,024 (live entries: 50)
    walked = [e for key in index.keys() for e in index.walk(key)]
    assert sorted(e[1] for e in walked) == [j.index for j in jobs if j.index != 3]
    assert all(e[-2] == e[-1].version for e in walked)
    sim.active = dict(sim.active)  # a live cluster restoring its order: rebuilt from the running jobs
    assert sum(1 for key in index.keys() for _ in index.walk(key)) == 49


@pytest.mark.parametrize("groups,needle", [
    ("  - {gpu_type: a100, nodes: 2, gpus_per_node: 3}\n", "3 GPUs per node is not a power of two"),
    ("  - {gpu_type: a100, nodes: 2, gpus_per_node: 8}\n  - {gpu_type: a100, nodes: 1, gpus_per_node: 4}\n",
     "node groups of a100 differ in GPUs per node (4, 8)"),
])
def test_cluster_scale_refuses_specs_simulate_refuses(tmp_path, groups, needle):
    """cluster scale writes specs for the simulator: one it cannot place jobs on is refused before anything is
    written (before, it was scaled and written, and only simulate refused it)."""
    from libarena.schedule.api import scale_cluster

    (tmp_path / "c.yaml").write_text("name: c\nnode_groups:\n" + groups)
    with pytest.raises(ArenaError, match=re.escape(needle)):
        scale_cluster(tmp_path / "c.yaml", tmp_path / "c2.yaml", 2)
    assert not (tmp_path / "c2.yaml").exists()
    (tmp_path / "ok.yaml").write_text("name: ok\nnode_groups:\n  - {gpu_type: a100, nodes: 2, gpus_per_node: 4}\n")
    assert scale_cluster(tmp_path / "ok.yaml", tmp_path / "ok2.yaml", 3).total_gpus == 24
    assert load_cluster(tmp_path / "ok2.yaml").total_gpus == 24
    # written as YAML, which a .toml name would have read as TOML (and refused)
    with pytest.raises(ArenaError, match=r"ok2\.toml: a scaled cluster is written as YAML; name the output \.yaml$"):
        scale_cluster(tmp_path / "ok.yaml", tmp_path / "ok2.toml", 3)
    assert not (tmp_path / "ok2.toml").exists()


@pytest.mark.slow
def test_scale_commands(tmp_path, repo_root):
    import subprocess
    import sys
    from pathlib import Path

    exe = str(Path(sys.executable).with_name("arena-schedule"))
    (tmp_path / "t.csv").write_text(trace_csv(_generated_trace(20)))
    done = subprocess.run([exe, "trace", "scale", "t.csv", "-x", "3", "--seed", "5", "-o", "t3.csv"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert len(read_trace(tmp_path / "t3.csv").jobs) == 60 and "60 jobs" in done.stderr
    cluster_file = repo_root / "examples" / "clusters" / "paper-sim-1280.yaml"
    done = subprocess.run([exe, "cluster", "scale", str(cluster_file), "-x", "10", "-o", "c.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert load_cluster(tmp_path / "c.yaml").total_gpus == 12800
    for argv, needle in ((["trace", "scale", "t.csv", "-x", "0", "-o", "x.csv"], "copies must be a positive integer"),
                         (["trace", "scale", "missing.csv", "-x", "2", "-o", "x.csv"], "no such trace file"),
                         (["trace", "scale", "t.csv", "-x", "2", "-o", "t.csv"], "refusing to overwrite an input"),
                         (["cluster", "scale", "c.yaml", "-x", "2", "-o", "c.yaml"], "refusing to overwrite an input"),
                         (["cluster", "scale", "c.yaml", "-x", "0", "-o", "d.yaml"], "positive integer"),
                         # results no tool would read back, or beyond bounded memory, are refused before writing
                         (["cluster", "scale", "c.yaml", "-x", "100000000", "-o", "d.yaml"], "out of range"),
                         (["trace", "scale", "t.csv", "-x", "3000000", "-o", "x.csv"], "more than 2000000"),
                         (["trace", "scale", "t.csv", "-x", "2", "--jitter", "1e12", "-o", "x.csv"], "jitter must be"),
                         (["trace", "scale", "t.csv", "-x", "2", "--seed=-1", "-o", "x.csv"], "--seed: -1 is out of range"),
                         (["trace", "scale", "t.csv", "-x", "2", "--seed", str(2**64), "-o", "x.csv"], "--seed: ")):
        done = subprocess.run([exe, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "d.yaml").exists()
