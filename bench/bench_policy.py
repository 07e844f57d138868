"""Arena against its baselines on the paper's traces, measured fairly (issue 16).

Setting: examples/paper's defaults, the artifact's (philly, venus and pai from ../shared/traces/arena-ae with
iterations / 5, 2,000 rounds of 300 s on the 1,280-GPU cluster, ``--skip-bad-rows``), on the performance table
the pipeline makes (``arena-schedule perf build``, bench/paper_inputs.py). Every policy runs as a whole
``arena-schedule simulate`` process (so its wall time is what a user waits, interpreter start and writing
included), one after another, alone on the machine. Per trace and policy: finished, never placed and dropped
jobs, average JCT over all jobs and over finished jobs, and, against Arena, the average, p50 and p90 JCT over
the jobs both finished, also per class of the jobs' isolated duration (alone on their fastest configuration:
under 1 h, 1-3 h, 3-10 h, 10-30 h, longer); average and peak throughput, GPU utilisation, reschedules; Arena's
decision time per scheduling tick.

Beside the defaults, sensitivity runs on every trace: Arena with the paper's eq. 5 objective
(``--objective throughput``) instead of its default JCT objective, Arena without in-flight trades
(``--trade-margin 0``), and every policy with AP-search plans reused too (``--overhead reuse_plans=true``) and
with no reuse at all (``reuse_profiles=false``: the paper's accounting, every job profiles). And one ablation of
the workload, not of a policy (``arena-without-jobs-sia-never-places``): Arena on the trace without the jobs
that Sia's view finds no configuration for (they wait in Sia's run until the end), against the default runs'
baselines, which shows how much the work only Arena can do weighs on the jobs both finish. And one of the
performance table (``fp16-table``): every policy, and that ablation, on the table of the same pairs trained in
fp16 (``perf build --dtype fp16``: the V100s run at their fp16 tensor-core rate, about half an A100's, instead of
bf16's fp32 fallback at 5-14%), which shows how the comparison moves when the slow type is worth using (made
only with the default tables, not with ``--perf``).

Targets (issue 16): on every trace Arena finishes at least as many jobs as each baseline, and its average JCT
over the jobs both finished is at least 15% below Sia's and Gavel's; philly <= 10 s whole process per policy
and Arena's median decision <= 5 ms per tick. Writes bench/results/policy.json.

    python -m bench policy
    python -m bench.bench_policy [--traces philly,venus] [--perf PATH] [--skip-sensitivity]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.paper_inputs import (CLUSTER, PAPER_TRACES, POLICIES, REPO, SIM_FLAGS, TRACES, machine_record, perf_table,
                                prepare, schedule_tool, timed)

TARGETS = {"jct_reduction_vs_sia_and_gavel": 0.15, "philly_wall_s": 10.0, "arena_median_decision_s": 0.005}
#: sensitivity settings: name -> (extra simulate flags for every policy, policies)
SETTINGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "arena-throughput-objective": (("--objective", "throughput"), ("arena",)),
    "arena-no-trade": (("--trade-margin", "0"), ("arena",)),
    "plans-reused": (("--overhead", "reuse_plans=true"), POLICIES),
    "no-reuse": (("--overhead", "reuse_profiles=false"), POLICIES),
}
METRICS = ("submitted_jobs", "finished_jobs", "unfinished_jobs", "unschedulable_jobs", "dropped_jobs", "avg_jct_s",
           "avg_jct_finished_s", "avg_queuing_s", "avg_throughput", "peak_throughput", "avg_gpu_utilization",
           "reschedules_per_job", "decision_time_per_tick_median_s", "decision_time_per_tick_max_s",
           "simulation_wall_s", "ilp_time_limit_hits")


def _log(message: str) -> None:
    print(f"bench_policy: {message}", file=sys.stderr, flush=True)


def _simulate(trace: Path, perf: Path, policy: str, flags: tuple[str, ...], work: Path) -> tuple[dict[str, Any], Path]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{policy}-", dir=work))
    record = timed([*schedule_tool(), "simulate", "--trace", str(trace), "--perf", str(perf), "--cluster", str(CLUSTER),
                    "--policy", policy, *SIM_FLAGS, *flags, "--no-cache", "--cache-dir", str(run_dir / "cache"), "--json",
                    "-q", "-o", str(run_dir / "run")], run_dir / "stderr.log")
    stdout = record.pop("stdout")
    if record["exit_code"] != 0:
        raise RuntimeError(f"{policy} on {trace.name} failed: {record.get('error')}")
    m = json.loads(stdout)
    record.update({k: m.get(k) for k in METRICS})
    return record, run_dir / "run" / "jobs.parquet"


def _comparison(trace: Path, perf: Path, policies: tuple[str, ...], flags: tuple[str, ...], work: Path,
                reference_jobs: Path | None = None) -> tuple[dict[str, Any], dict[str, Path]]:
    """Every policy on one trace; each baseline's JCT over the jobs it and Arena both finished."""
    from libarena.artifacts import read_table
    from libarena.schedule.compare import jobs_both_finished

    out: dict[str, Any] = {}
    jobs: dict[str, Path] = {}
    for policy in policies:
        record, jobs[policy] = _simulate(trace, perf, policy, flags, work)
        out[policy] = record
        _log(f"{trace.parent.name} {policy}{' ' + ' '.join(flags) if flags else ''}: {record['wall_s']:.1f} s, "
             f"{record['finished_jobs']}/{record['submitted_jobs']} finished, avg JCT {record['avg_jct_s'] / 3600:.2f} h")
    reference = reference_jobs or jobs.get("arena")
    if reference is not None:
        ref_table = read_table(reference, "job_records").table
        isolated = _isolated(ref_table, perf)
        for policy, path in jobs.items():
            if path != reference:
                out[policy]["vs_arena"] = jobs_both_finished(ref_table, read_table(path, "job_records").table, isolated)
    return out, jobs


@functools.lru_cache(maxsize=None)
def _perf_lookup(perf: Path) -> Any:
    """The performance table as the simulator reads it, loaded once per benchmark (every comparison asks)."""
    from libarena.hardware.cluster import load_cluster
    from libarena.schedule.perf import load_perf

    return load_perf(perf, load_cluster(CLUSTER))


def _isolated(records: Any, perf: Path) -> dict[str, float]:
    """Each job's seconds alone on its fastest configuration (the simulator's execution truth, at most the
    simulator's GPUs per job): the classes of the jobs-both-finished breakdown by length."""
    from libarena.schedule.compare import isolated_durations
    from libarena.schedule.config import PolicyConfig

    return isolated_durations(records, _perf_lookup(perf), PolicyConfig().max_gpus_per_job)


def _reduction(entry: dict[str, Any]) -> float | None:
    return _pair_reduction(entry.get("vs_arena"))


def _pair_reduction(pair: dict[str, Any] | None) -> float | None:
    """1 - the reference's average JCT / the policy's, over the jobs both finished (None: no such job)."""
    if not pair or not pair["jobs"]:
        return None
    return 1.0 - pair["reference"]["avg_jct_s"] / pair["policy"]["avg_jct_s"]


def _vs_baselines(arena_jobs: Path, jobs: dict[str, Path], perf: Path, baselines: tuple[str, ...] | None = None) -> dict[str, Any]:
    """An Arena run (its jobs.parquet) against each baseline of the default runs (or ``baselines``), over the jobs
    both finished."""
    from libarena.artifacts import read_table
    from libarena.schedule.compare import jobs_both_finished

    mine = read_table(arena_jobs, "job_records").table
    isolated = _isolated(mine, perf)
    chosen = baselines if baselines is not None else tuple(p for p in POLICIES if p != "arena")
    return {p: jobs_both_finished(mine, read_table(jobs[p], "job_records").table, isolated) for p in chosen}


def _unplaced(jobs: Path) -> set[str]:
    from libarena.artifacts import read_table

    table = read_table(jobs, "job_records").table
    return {j for j, s in zip(table.column("job_id").to_pylist(), table.column("status").to_pylist()) if s == "unschedulable"}


def _run_start(jobs: Path) -> float:
    """Where a run's window began: its first submission (the trace's, less any row it skipped)."""
    from libarena.artifacts import read_table

    return min(read_table(jobs, "job_records").table.column("submit_time_s").to_pylist())


def _judge(name: str, runs: dict[str, Any]) -> dict[str, Any]:
    arena = runs["arena"]
    verdict: dict[str, Any] = {"finishes_at_least_as_many": all(arena["finished_jobs"] >= r["finished_jobs"]
                                                                 for p, r in runs.items() if p != "arena")}
    for baseline in ("sia", "gavel"):
        red = _reduction(runs[baseline])
        verdict[f"jct_reduction_vs_{baseline}_on_jobs_both_finished"] = red
        verdict[f"vs_{baseline}_met"] = red is not None and red >= TARGETS["jct_reduction_vs_sia_and_gavel"]
    if name == "philly":
        verdict["wall_s_per_policy_met"] = all(r["wall_s"] <= TARGETS["philly_wall_s"] for r in runs.values())
        verdict["arena_median_decision_met"] = arena["decision_time_per_tick_median_s"] <= TARGETS["arena_median_decision_s"]
    verdict["met"] = all(v for k, v in verdict.items() if k.endswith("_met") or k == "finishes_at_least_as_many")
    return verdict


#: the workload ablation: Arena on the trace without the jobs Sia's view can never place
WITHOUT_UNPLACED = "arena-without-jobs-sia-never-places"
#: the table sensitivity: every policy on the pairs' table trained in fp16
FP16_TABLE = "fp16-table"


def _without_unplaced(trace: Path, perf: Path, jobs: dict[str, Path], work: Path) -> dict[str, Any]:
    """Arena on ``trace`` less the jobs the default Sia run never placed, compared with the default runs of the
    baselines that never placed any of them either (Sia's, and any other whose run is the same without them:
    it never started them); a baseline that ran some of them ran another workload."""
    import csv

    unplaced = _unplaced(jobs["sia"])
    like_for_like = tuple(p for p in POLICIES if p != "arena" and unplaced <= _unplaced(jobs[p]))
    reduced = work / WITHOUT_UNPLACED / trace.parent.name / "trace.csv"
    reduced.parent.mkdir(parents=True, exist_ok=True)
    with trace.open(newline="") as src, reduced.open("w", newline="") as dst:
        rows = csv.DictReader(src)
        out = csv.DictWriter(dst, fieldnames=rows.fieldnames)
        out.writeheader()
        out.writerows(r for r in rows if r["job_id"] not in unplaced)
    # the baselines' window and tick grid, also where the trace's first job is one of those left out
    start = _run_start(jobs["sia"])
    record, path = _simulate(reduced, perf, "arena", ("--start", repr(start)), work)
    record["jobs_left_out"] = len(unplaced)
    record["start_s"] = start
    record["vs_baselines"] = _vs_baselines(path, jobs, perf, like_for_like)
    red = _pair_reduction(record["vs_baselines"]["sia"])
    _log(f"{trace.parent.name} arena without the {len(unplaced)} jobs Sia never places: {record['finished_jobs']} finished, "
         f"JCT {'-' if red is None else f'{red:.1%}'} below Sia's on the jobs both finish")
    return {"arena": record}


def run(results_dir: Path, *, traces: tuple[str, ...] = PAPER_TRACES, perf: Path | None = None,
        sensitivity: bool = True) -> bool:
    from libarena.artifacts import write_json

    if not TRACES.is_dir():
        _log(f"traces not found at {TRACES}")
        return False
    t0 = time.perf_counter()
    fp16_table = sensitivity and perf is None
    perf = perf_table(perf)
    perf16 = perf_table(None, "fp16") if fp16_table else None
    load_before = os.getloadavg()
    doc: dict[str, Any] = {"setup": {"cluster": str(CLUSTER.relative_to(REPO)), "simulate_flags": list(SIM_FLAGS),
                                     "iteration_divisor": 5, "deadline_factor": 5.0, "perf_table": str(perf), "targets": TARGETS,
                                     "policies": list(POLICIES)},
                           "traces": {}, "sensitivity": {}}
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-policy-") as tmp:
        work = Path(tmp)
        for name in traces:
            trace = work / name / "trace.csv"
            prepare(TRACES / f"simulate_trace_{name}.csv", trace, None)
            runs, jobs = _comparison(trace, perf, POLICIES, (), work)
            verdict = _judge(name, runs)
            ok = ok and verdict["met"]
            doc["traces"][name] = {"policies": runs, "verdict": verdict}
            _log(f"{name}: " + ", ".join(f"{k} {v:.1%}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in verdict.items()))
            if not sensitivity:
                continue
            for setting, (flags, policies) in SETTINGS.items():
                # an Arena-only setting is compared with the default run's baselines
                reference = None if "arena" in policies and len(policies) > 1 else jobs["arena"]
                runs_s, jobs_s = _comparison(trace, perf, policies, flags, work, reference)
                if policies == ("arena",):
                    runs_s["arena"]["vs_baselines"] = _vs_baselines(jobs_s["arena"], jobs, perf)
                    runs_s["arena"].pop("vs_arena", None)
                doc["sensitivity"].setdefault(setting, {"flags": list(flags)})[name] = runs_s
            doc["sensitivity"].setdefault(WITHOUT_UNPLACED, {"flags": [], "trace": "the trace less the jobs Sia never places"})[
                name] = _without_unplaced(trace, perf, jobs, work)
            if perf16 is not None:
                runs16, jobs16 = _comparison(trace, perf16, POLICIES, (), work)
                verdict16 = _judge(name, runs16)
                _log(f"{name} on the fp16 table: " + ", ".join(f"{k} {v:.1%}" if isinstance(v, float) else f"{k} {v}"
                                                               for k, v in verdict16.items()))
                doc["sensitivity"].setdefault(FP16_TABLE, {"flags": [], "perf_table": str(perf16)})[name] = {
                    "policies": runs16, "verdict": verdict16,
                    WITHOUT_UNPLACED: _without_unplaced(trace, perf16, jobs16, work)}
    doc["all_targets_met"] = ok
    doc["machine"] = machine_record(load_before)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    write_json(Path(results_dir) / "policy.json", doc)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=",".join(PAPER_TRACES))
    parser.add_argument("--perf", type=Path, default=None)
    parser.add_argument("--skip-sensitivity", action="store_true")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    traces = tuple(t for t in args.traces.split(",") if t)
    return 0 if run(args.results, traces=traces, perf=args.perf, sensitivity=not args.skip_sensitivity) else 1


if __name__ == "__main__":
    raise SystemExit(main())
