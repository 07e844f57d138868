"""Every policy on a slice of a real trace (../shared; without it, one of its format built in code) and on generated
traces; perf-table coverage rules."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from libarena.errors import ArenaError
from libarena.schedule.api import Workload, make_policy, prepare_workload, run_policy
from libarena.schedule.config import Objective, SimulatorConfig
from libarena.schedule.metrics import job_records, summarize
from libarena.schedule.perf import PerfLookup
from libarena.schedule.policies import policy_names
from libarena.schedule.traces import Trace
from tests.schedule.helpers import cluster, job
from tests.schedule.perf_fixtures import synthetic_perf_table, zoo_pairs
from tests.schedule.trace_fixtures import first_jobs

PAPER_TYPES = ["a100", "v100", "a40", "a10"]
ALL = ["arena", "fcfs", "gavel", "elasticflow", "elasticflow-ls", "sia"]


def test_all_policies_registered():
    assert sorted(ALL) == policy_names()


@pytest.fixture(scope="module")
def philly_slice(paper_cluster, tmp_path_factory):
    """The first 150 jobs of the real philly trace (without ../shared, 150 jobs of its format built in code)."""
    jobs, _ = first_jobs("philly", 150, tmp_path_factory.mktemp("philly"), 0, iterations=(20000, 300000),
                         max_size_billions=10.0)
    table = synthetic_perf_table(zoo_pairs(), PAPER_TYPES)
    return Workload(Trace("philly", "arena-ae", jobs), PerfLookup(table, paper_cluster), paper_cluster, jobs)


@pytest.mark.parametrize("policy", ALL)
def test_policy_on_real_trace_slice(philly_slice, policy):
    res = run_policy(philly_slice, make_policy(policy), SimulatorConfig())
    m = summarize(res)
    assert m["submitted_jobs"] == 150
    assert m["finished_jobs"] + m["unfinished_jobs"] + m["dropped_jobs"] == 150
    if policy != "elasticflow":
        assert m["dropped_jobs"] == 0
        assert m["finished_jobs"] == 150 - m["unschedulable_jobs"]
    assert m["finished_jobs"] > 0 and m["avg_throughput"] > 0
    assert m["peak_throughput"] >= m["avg_throughput"]
    rec = job_records(res)
    # homogeneous allocations on types of the cluster only
    assert set(rec.column("final_gpu_type").to_pylist()) <= set(PAPER_TYPES) | {""}
    if policy == "fcfs":
        fin = pc.equal(rec.column("status"), "finished")
        assert rec.filter(fin).column("reschedules").to_pylist() == [0] * pc.sum(fin).as_py()


def test_arena_objectives_and_ablations_run(philly_slice):
    base_run = run_policy(philly_slice, make_policy("arena"), SimulatorConfig())
    base = summarize(base_run)
    for opts in ({"objective": Objective.DEADLINE}, {"objective": Objective.FAIRNESS}, {"hetero": False},
                 {"elastic": False}, {"pruning": False}, {"profiler": False}, {"view": "dp"}, {"search_depth": 1, "num_queues": 1}):
        res = run_policy(philly_slice, make_policy("arena", **opts), SimulatorConfig())
        m = summarize(res)
        assert m["finished_jobs"] > 0 and m["submitted_jobs"] == 150, opts
        if "pruning" in opts or "profiler" in opts:  # the whole search, or whole profiling, costs the jobs more
            assert sum(j.overhead_s for j in res.jobs) > sum(j.overhead_s for j in base_run.jobs), opts
    nohet = run_policy(philly_slice, make_policy("arena", hetero=False), SimulatorConfig())
    for j in nohet.jobs:
        if j.alloc is not None:
            assert j.alloc.type_index == j.requested_type_index
    assert base["finished_jobs"] > 0


def test_elastic_policies_rescale_and_rigid_do_not():
    spec = cluster([("a100", 2, 4), ("a40", 2, 2)])
    table = synthetic_perf_table([("gpt__760M", 256), ("gpt__1.3B", 256)], ["a100", "a40"])
    jobs = [job(f"j{i}", "gpt__760M" if i % 2 else "gpt__1.3B", 20000, 1, "a100" if i % 3 else "a40",
                submit=600.0 * i, row=i + 1, deadline=600.0 * i + 400000) for i in range(8)]
    w = Workload(Trace("gen", "arena-ae", jobs), PerfLookup(table, spec), spec, jobs)
    for policy in ALL:
        res = run_policy(w, make_policy(policy), SimulatorConfig())
        m = summarize(res)
        assert m["finished_jobs"] == 8, policy
        actions = set(res.decisions["action"])
        if policy in ("fcfs",):
            assert actions == {"launch", "finish"}
        if policy in ("arena", "elasticflow-ls", "sia"):
            assert "rescale" in actions or any(n > 1 for n in res.decisions["num_gpus"]), policy


def test_missing_model_is_an_error_listing_everything(tmp_path, paper_cluster):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
                     "a,0,10,gpt__1.3B,,256,1,a100\nb,0,10,moe__10B,,512,1,a40\nc,0,10,bert__760M,,128,1,a10\n")
    table = synthetic_perf_table([("gpt__1.3B", 256)], PAPER_TYPES)
    lookup = PerfLookup(table, paper_cluster, source="perf.parquet")
    with pytest.raises(ArenaError) as err:
        prepare_workload(trace, lookup, paper_cluster)
    assert "moe__10B (batch 512; rows 2)" in str(err.value) and "bert__760M (batch 128; rows 3)" in str(err.value)
    w = prepare_workload(trace, lookup, paper_cluster, skip_bad_rows=True)
    assert len(w.jobs) == 1 and len(w.skipped) == 2


def test_absent_configuration_means_cannot_run_that_way(paper_cluster):
    table = synthetic_perf_table([("gpt__1.3B", 256)], PAPER_TYPES)
    no_a100 = table.filter(pc.invert(pc.equal(table.column("gpu_type"), "a100")))
    jobs = [job(f"j{i}", "gpt__1.3B", 500, 4, "a100", submit=10.0 * i, row=i + 1) for i in range(6)]
    w = Workload(Trace("gen", "arena-ae", jobs), PerfLookup(no_a100, paper_cluster), paper_cluster, jobs)
    res = run_policy(w, make_policy("arena"), SimulatorConfig())
    assert "a100" not in set(res.decisions["gpu_type"]) and summarize(res)["finished_jobs"] == 6
    # rigid FCFS asked for a100, which the table cannot run: the jobs are unschedulable
    res = run_policy(w, make_policy("fcfs"), SimulatorConfig())
    m = summarize(res)
    assert m["unschedulable_jobs"] == 6 and m["finished_jobs"] == 0
    why = res.jobs[0].unschedulable  # and each says why
    assert why.startswith("fcfs: no configuration it may use (at most 16 GPUs per job, on a100 only; the cluster has ")
    assert why.endswith("the performance table runs gpt__1.3B at global batch 256 only on v100 (1, 2, 4, 8, 16 GPUs), "
                        "a40 (1, 2, 4, 8, 16 GPUs), a10 (1, 2, 4, 8, 16 GPUs)")


def test_cluster_too_small_names_the_row(tmp_path):
    spec = cluster([("a10", 1, 2)])
    table = synthetic_perf_table([("moe__27B", 1024)], ["a10"])
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,gpu_type\n"
                     "a,0,10,moe__27B,,1024,1,a10\n")
    with pytest.raises(ArenaError, match=r"row 1, column 'model_name': moe__27B .* cannot run on any configuration"):
        prepare_workload(trace, PerfLookup(table, spec), spec)


def test_horizon_reports_unfinished(philly_slice):
    res = run_policy(philly_slice, make_policy("fcfs"), SimulatorConfig(horizon_s=6 * 3600))
    m = summarize(res)
    assert res.stopped_by == "horizon" and m["unfinished_jobs"] > 0
    assert m["makespan_s"] == pytest.approx(6 * 3600)
    rec = job_records(res)
    unf = rec.filter(pc.equal(rec.column("status"), "unfinished"))
    ends = pa.compute.add(unf.column("submit_time_s"), unf.column("jct_s")).to_pylist()
    assert all(e == pytest.approx(res.end_time) for e in ends)


@pytest.mark.parametrize("policy", ["arena", "sia"])
def test_makespan_ends_at_the_last_finish_not_at_stale_events(philly_slice, policy):
    # Rescaled jobs leave completion events of superseded versions in the heap; they must not extend the run.
    config = SimulatorConfig()
    res = run_policy(philly_slice, make_policy(policy), config)
    m = summarize(res)
    rec = job_records(res)
    fin = rec.filter(pc.equal(rec.column("status"), "finished"))
    last_finish = max(pa.compute.add(fin.column("submit_time_s"), fin.column("jct_s")).to_pylist())
    assert m["reschedules_per_job"] > 0 or policy == "sia"
    assert res.stopped_by == "completion"
    assert last_finish <= res.end_time <= last_finish + config.tick_s + 1e-6


def test_jobs_both_finished_compares_the_same_jobs():
    import pyarrow as pa

    from libarena.schedule.compare import jobs_both_finished

    arena = pa.table({"job_id": ["a", "b", "c", "d"], "status": ["finished", "finished", "finished", "unfinished"],
                      "jct_s": [10.0, 20.0, 30.0, 99.0]})
    other = pa.table({"job_id": ["a", "b", "c", "d"], "status": ["finished", "unschedulable", "finished", "finished"],
                      "jct_s": [14.0, 50.0, 40.0, 5.0]})
    pair = jobs_both_finished(arena, other)
    assert pair["jobs"] == 2
    assert pair["reference"]["avg_jct_s"] == 20.0 and pair["policy"]["avg_jct_s"] == 27.0
    assert pair["policy"]["p50_jct_s"] == 27.0 and pair["reference"]["p90_jct_s"] == pytest.approx(28.0)
    assert jobs_both_finished(arena, other.filter(pa.compute.equal(other["job_id"], "d")))["policy"]["avg_jct_s"] is None


def test_jobs_both_finished_by_isolated_length_splits_the_same_jobs_by_how_long_they_take_alone():
    import pyarrow as pa

    from libarena.schedule.compare import isolated_durations, jobs_both_finished
    from tests.schedule.helpers import hand_table

    spec = cluster([("a100", 4, 8), ("v100", 4, 8)])
    # gpt__1.3B: 256 samples/s at best (16 A100s; 32 would be faster but is over the 16-GPU limit), 10 on V100s
    table = hand_table({("gpt__1.3B", "a100"): {"ap": {1: 20.0, 8: 160.0, 16: 256.0, 32: 500.0}},
                        ("gpt__1.3B", "v100"): {"ap": {4: 10.0}}})
    lookup = PerfLookup(table, spec)
    records = pa.table({"job_id": ["short", "long", "never"], "model": ["gpt__1.3B"] * 2 + ["gpt__2.6B"],
                        "global_batch": [256, 256, 256], "num_iterations": [1800, 36000, 10],
                        "status": ["finished"] * 3, "jct_s": [3600.0, 40000.0, 1.0]})
    isolated = isolated_durations(records, lookup, max_gpus=16)
    assert isolated["short"] == pytest.approx(1800.0) and isolated["long"] == pytest.approx(36000.0)
    assert isolated["never"] == float("inf")  # no row of that model: it runs nowhere
    other = pa.table({"job_id": ["short", "long", "never"], "status": ["finished"] * 3, "jct_s": [7200.0, 38000.0, 2.0]})
    classes = jobs_both_finished(records, other, isolated)["by_isolated_length"]
    assert [c["from_h"] for c in classes] == [0.0, 1.0, 3.0, 10.0, 30.0] and classes[-1]["to_h"] is None
    by_start = {c["from_h"]: c for c in classes}
    assert by_start[0.0]["jobs"] == 1 and by_start[0.0]["reference_jct_sum_s"] == 3600.0 and by_start[0.0]["policy_jct_sum_s"] == 7200.0
    assert by_start[10.0]["jobs"] == 1 and by_start[10.0]["policy_jct_sum_s"] == 38000.0
    assert by_start[30.0]["jobs"] == 1  # the one that runs nowhere counts as the longest
    assert sum(c["jobs"] for c in classes) == 3
    assert "by_isolated_length" not in jobs_both_finished(records, other)
    # a type's rows run to the largest type's counts: with only 2 A100s the fastest real option is one A100 (20 samples/s)
    small = PerfLookup(table, cluster([("a100", 1, 2), ("v100", 4, 8)]))
    assert isolated_durations(records, small, max_gpus=16)["short"] == pytest.approx(1800 * 256 / 20.0)


def test_output_files_are_recognised_by_place_not_by_name_alone():
    from libarena.schedule.api import is_output_file

    ours = ["metrics.json", "throughput.png", "compare.json", "arena/jobs.parquet", "sia/jct_cdf.png",
            ".jobs.parquet.123.abcd.tmp", "arena/.metrics.json.1.a.tmp"]
    theirs = ["photos.png", "2024/holiday.png", "draft.tmp", "mine/metrics.json", "arena/compare.json", "a/b/metrics.json",
              "arena/notes.txt", ".notes.txt.1.a.tmp"]
    assert all(is_output_file(r) for r in ours)
    assert not any(is_output_file(r) for r in theirs)
