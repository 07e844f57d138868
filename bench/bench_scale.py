"""The scheduler at ten times the paper's scale, side by side with the paper's (issue 19), and sweeps on Ray.

Scale. The paper's 1,280-GPU cluster replicated tenfold (``arena-schedule cluster scale -x 10``: 12,800 GPUs,
the same GPU types and node shapes) and the philly trace with its iterations / 5 (examples/paper's
prepare_trace.py) replicated tenfold (``arena-schedule trace scale -x 10 --jitter 150``: 19,380 jobs), both
generated here; 2,000 rounds of 300 s (``--horizon 600000 --tick 300 --skip-bad-rows``). Arena and Sia each
run as a whole ``arena-schedule simulate`` process (interpreter start, reading, simulating, writing; an empty
stage cache) at 1x and at 10x right after each other, the order alternating between rounds; per policy the
median whole-process wall time at each scale, the median of the rounds' 10x/1x ratios, and the simulator's
decision times per scheduling tick (median and worst, 10x) are kept.

Targets at 10x: Arena and Sia <= 60 s each (whole process), Arena median decision <= 5 ms per tick and worst
tick <= 500 ms, 10x/1x wall-time ratio <= 12 (close to linear) for both.

Sweeps. The comparison of examples/paper (philly, venus and pai with iterations / 5, all six policies, the
1,280-GPU cluster, with figures) made the old way (three ``arena-schedule compare`` processes one after the
other) and as one ``arena-schedule sweep``: in process (``--sequential``) and on the embedded Ray with 1, 2 ...
all CPUs; wall times, speed-ups, and a check that every mode reports the same numbers. No target: the
speed-up follows the cores Ray has, less Ray's start (seconds).

The performance table is the pipeline's (``arena-schedule perf build`` over philly's pairs plus venus's
and pai's, bench/results/perf-arena-ae.parquet, built on the first run: a few minutes with empty operator
caches). Writes bench/results/scale.json.

    python -m bench scale
    python -m bench.bench_scale [--scale 10] [--rounds 3] [--policies arena,sia] [--max-jobs N] [--skip-sweep]
                                [--perf PATH] [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.paper_inputs import (CLUSTER, DEFAULT_PERF, ITERATION_DIVISOR, PAPER_TRACES as SWEEP_TRACES,
                                POLICIES as SWEEP_POLICIES, REPO, SIM_FLAGS, TRACES, machine_record, perf_table,
                                prepare, schedule_tool, timed)
from libarena.artifacts import read_json_document

JITTER_S = 150.0
TARGETS = {"wall_s_at_scale": 60.0, "arena_median_decision_s_at_scale": 0.005, "arena_max_decision_s_at_scale": 0.5,
           "wall_ratio": 12.0}
ROUNDS = 3


def _simulate(trace: Path, cluster: Path, perf: Path, policy: str, work: Path) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{policy}-", dir=work))
    record = timed([*schedule_tool(), "simulate", "--trace", str(trace), "--perf", str(perf), "--cluster", str(cluster),
                     "--policy", policy, *SIM_FLAGS, "--no-cache", "--cache-dir", str(run_dir / "cache"), "--json", "-q",
                     "-o", str(run_dir / "run")], run_dir / "stderr.log")
    stdout = record.pop("stdout")
    if record["exit_code"] == 0:
        m = json.loads(stdout)
        record.update({k: m[k] for k in ("submitted_jobs", "finished_jobs", "simulation_wall_s", "ticks",
                                          "scheduled_ticks", "decision_time_per_tick_median_s",
                                          "decision_time_per_tick_p99_s", "decision_time_per_tick_max_s")})
    return record


def _scale(work: Path, perf: Path, scale: int, rounds: int, policies: tuple[str, ...], max_jobs: int | None) -> dict[str, Any]:
    base_trace, big_trace, big_cluster = work / "1x" / "trace.csv", work / f"{scale}x" / "trace.csv", work / f"{scale}x" / "cluster.yaml"
    prepare(TRACES / "simulate_trace_philly.csv", base_trace, max_jobs)
    big_trace.parent.mkdir(parents=True, exist_ok=True)
    generate = {
        "trace_scale": timed([*schedule_tool(), "trace", "scale", str(base_trace), "-x", str(scale), "--jitter",
                               str(JITTER_S), "--seed", "0", "-o", str(big_trace)], work / "trace-scale.log"),
        "cluster_scale": timed([*schedule_tool(), "cluster", "scale", str(CLUSTER), "-x", str(scale), "-o",
                                 str(big_cluster)], work / "cluster-scale.log"),
    }
    for name, record in generate.items():
        record.pop("stdout")
        if record["exit_code"] != 0:
            raise RuntimeError(f"bench_scale: {name} failed: {record.get('error')}")
    settings = {"1x": (base_trace, CLUSTER), f"{scale}x": (big_trace, big_cluster)}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {p: {s: [] for s in settings} for p in policies}
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    for round_index in range(rounds):
        for k, policy in enumerate(policies):
            order = list(settings) if (round_index + k) % 2 == 0 else list(settings)[::-1]
            for label in order:
                trace, cluster = settings[label]
                record = _simulate(trace, cluster, perf, policy, work)
                runs[policy][label].append(record)
                print(f"bench_scale: round {round_index + 1}/{rounds} {policy:>6} {label:>4}: {record['wall_s']:6.1f} s "
                      f"whole process ({record.get('simulation_wall_s', float('nan')):.1f} s simulating), median "
                      f"decision {1000 * record.get('decision_time_per_tick_median_s', float('nan')):.2f} ms, worst "
                      f"{1000 * record.get('decision_time_per_tick_max_s', float('nan')):.0f} ms"
                      f"{'' if record['exit_code'] == 0 else '  FAILED: ' + str(record.get('error'))}",
                      file=sys.stderr, flush=True)
            walls = {label: runs[policy][label][-1]["wall_s"] for label in settings}
            ratios[policy].append(walls[f"{scale}x"] / walls["1x"])
    out: dict[str, Any] = {"scale": scale, "jitter_s": JITTER_S, "iteration_divisor": ITERATION_DIVISOR,
                           "simulator_flags": list(SIM_FLAGS), "rounds": rounds, "generate": generate, "policies": {}}
    for policy in policies:
        entry: dict[str, Any] = {}
        for label in settings:
            rs = runs[policy][label]
            ok_runs = [r for r in rs if r["exit_code"] == 0]
            entry[label] = {
                "wall_s": round(statistics.median(r["wall_s"] for r in rs), 3),
                "wall_s_runs": [r["wall_s"] for r in rs],
                "simulation_wall_s": round(statistics.median(r["simulation_wall_s"] for r in ok_runs), 3) if ok_runs else None,
                "decision_time_per_tick_median_s": statistics.median(r["decision_time_per_tick_median_s"] for r in ok_runs) if ok_runs else None,
                "decision_time_per_tick_max_s": max(r["decision_time_per_tick_max_s"] for r in ok_runs) if ok_runs else None,
                "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rs),
                "jobs": ok_runs[0]["submitted_jobs"] if ok_runs else None,
                "finished_jobs": ok_runs[0]["finished_jobs"] if ok_runs else None,
                "runs": rs,
            }
        big = entry[f"{scale}x"]
        entry["wall_ratio"] = round(statistics.median(ratios[policy]), 3)
        entry["wall_ratio_runs"] = [round(x, 3) for x in ratios[policy]]
        met = (all(r["exit_code"] == 0 for s in settings for r in runs[policy][s])
               and max(big["wall_s_runs"]) <= TARGETS["wall_s_at_scale"] and entry["wall_ratio"] <= TARGETS["wall_ratio"])
        if policy == "arena":
            met = met and (big["decision_time_per_tick_median_s"] or 1e9) <= TARGETS["arena_median_decision_s_at_scale"] \
                and (big["decision_time_per_tick_max_s"] or 1e9) <= TARGETS["arena_max_decision_s_at_scale"]
        entry["target_met"] = met
        out["policies"][policy] = entry
    out["all_targets_met"] = all(e["target_met"] for e in out["policies"].values())
    return out


def _compare_numbers(root: Path, traces: tuple[str, ...], layout: str) -> dict[str, Any]:
    """Every comparison's numbers (no timings), to check that every mode reports the same."""
    keep = ("submitted_jobs", "finished_jobs", "unfinished_jobs", "dropped_jobs", "avg_jct_s", "avg_queuing_s",
            "avg_throughput", "peak_throughput", "reschedules_per_job")
    out = {}
    for trace in traces:
        doc = read_json_document(root / layout.format(trace=trace) / "compare.json", "comparison").data
        out[trace] = {p: {k: m.get(k) for k in keep} for p, m in doc["policies"].items()}
    return out


def _sweep(work: Path, perf: Path, rounds: int, max_jobs: int | None) -> dict[str, Any]:
    for trace in SWEEP_TRACES:
        prepare(TRACES / f"simulate_trace_{trace}.csv", work / "inputs" / trace / "trace.csv", max_jobs)
    common = ["--cluster", str(CLUSTER), *SIM_FLAGS, "--plot"]
    cpus = os.cpu_count() or 1
    modes: dict[str, list[str] | None] = {"compare x3 (before)": None, "sweep --sequential": ["--sequential"]}
    for n in sorted({1, 2, cpus}):
        modes[f"sweep on Ray, {n} CPU{'s' if n > 1 else ''}"] = ["--num-cpus", str(n)]
    results: dict[str, Any] = {"traces": list(SWEEP_TRACES), "policies": list(SWEEP_POLICIES), "cpus": cpus,
                               "rounds": rounds, "modes": {}}
    numbers = {}
    for round_index in range(rounds):
        for mode, flags in modes.items():
            out = Path(tempfile.mkdtemp(prefix="sweep-", dir=work))
            cache = ["--no-cache", "--cache-dir", str(out / "cache")]
            if flags is None:  # the Make pipeline before: one compare process per trace, one after another
                for t in SWEEP_TRACES:  # compare writes into an existing directory only (as make's rules do)
                    (out / t).mkdir(parents=True, exist_ok=True)
                start = time.perf_counter()
                records = [timed([*schedule_tool(), "compare", "--policies", ",".join(SWEEP_POLICIES), "--trace",
                                   str(work / "inputs" / t / "trace.csv"), "--perf", str(perf), *common, *cache,
                                   "-o", str(out / t / "compare")], out / f"{t}.log") for t in SWEEP_TRACES]
                record = {"wall_s": round(time.perf_counter() - start, 3),
                          "cpu_s": round(sum(r["cpu_s"] for r in records), 2),
                          "exit_code": max((r["exit_code"] for r in records), key=abs),
                          "error": next((r["error"] for r in records if r.get("error")), None)}
            else:
                argv = [*schedule_tool(), "sweep", *(a for t in SWEEP_TRACES for a in (
                    "--trace", f"{t}={work / 'inputs' / t / 'trace.csv'}")), "--perf", str(perf), "--policies",
                    ",".join(SWEEP_POLICIES), *common, *cache, "--layout", "{trace}/compare", *flags, "-o", str(out)]
                record = timed(argv, out / "sweep.log")
                record.pop("stdout")
            if record["exit_code"] == 0:
                numbers[mode] = _compare_numbers(out, SWEEP_TRACES, "{trace}/compare")
            results["modes"].setdefault(mode, []).append(record)
            print(f"bench_scale: sweep round {round_index + 1}/{rounds} {mode:>24}: {record['wall_s']:6.1f} s"
                  f"{'' if record['exit_code'] == 0 else '  FAILED: ' + str(record.get('error'))}", file=sys.stderr,
                  flush=True)
    walls = {mode: statistics.median(r["wall_s"] for r in rs) for mode, rs in results["modes"].items()}
    results["wall_s"] = {mode: round(w, 3) for mode, w in walls.items()}
    before, sequential = walls["compare x3 (before)"], walls["sweep --sequential"]
    results["speedup_vs_compare_x3"] = {m: round(before / w, 3) for m, w in walls.items()}
    results["speedup_vs_sequential_sweep"] = {m: round(sequential / w, 3) for m, w in walls.items()}
    reference = numbers.get("compare x3 (before)")
    results["same_numbers_in_every_mode"] = bool(reference) and len(numbers) == len(modes) and all(
        n == reference for n in numbers.values())
    return results


def run(results_dir: Path, *, scale: int = 10, rounds: int = ROUNDS, policies: tuple[str, ...] = ("arena", "sia"),
        max_jobs: int | None = None, sweep: bool = True, sweep_rounds: int = 1, perf: Path | None = None) -> bool:
    from libarena.artifacts import write_json

    if not TRACES.is_dir():
        print(f"bench_scale: traces not found at {TRACES}", file=sys.stderr)
        return False
    perf = perf_table(perf)
    load_before = os.getloadavg()
    doc: dict[str, Any] = {"benchmark": "the scheduler at ten times the paper's scale, side by side with 1x; "
                           "examples/paper's comparison as three compare processes and as one sweep (in process, on Ray)",
                           "perf_table": str(perf), "cluster": str(CLUSTER), "targets": TARGETS,
                           "max_jobs": max_jobs}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        doc["scale"] = _scale(Path(tmp), perf, scale, rounds, policies, max_jobs)
        if sweep:
            doc["sweep"] = _sweep(Path(tmp), perf, sweep_rounds, max_jobs)
    doc["machine"] = {**machine_record(load_before),
                      "note": "wall times carry whatever else runs on the machine: run this benchmark alone"}
    ok = doc["scale"]["all_targets_met"] and (not sweep or doc["sweep"]["same_numbers_in_every_mode"])
    doc["ok"] = ok
    write_json(Path(results_dir) / "scale.json", doc)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=10, help="copies of the trace and of the cluster")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--policies", default="arena,sia")
    parser.add_argument("--max-jobs", type=int, default=None, help="only the first N jobs of each trace (smoke runs)")
    parser.add_argument("--skip-sweep", action="store_true", help="only the scale part")
    parser.add_argument("--sweep-rounds", type=int, default=1)
    parser.add_argument("--perf", type=Path, default=None, help=f"performance table (default: {DEFAULT_PERF}, built if missing)")
    parser.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    return 0 if run(args.results, scale=args.scale, rounds=args.rounds,
                    policies=tuple(p for p in args.policies.split(",") if p), max_jobs=args.max_jobs,
                    sweep=not args.skip_sweep, sweep_rounds=args.sweep_rounds, perf=args.perf) else 1


if __name__ == "__main__":
    raise SystemExit(main())
