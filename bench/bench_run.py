"""arena-run's runtime pruning (§3.6) on CPU host devices: search cost of the pruned vs the full AP search
and the pruned winner's step time relative to the full search's winner (the paper: 5.48x lower cost at
96.2% of the optimum).

For each device count (2, 4; one subprocess each, XLA host devices) and small zoo model: arena-analyze and
arena-plan (their libraries) give the grids' Pareto frontiers; the full search measures every plan of every
grid of the resources (a seeded sample where the space is larger than FULL_SAMPLE); the pruned search
measures the grids' proxy plans to pick the pipeline degree (rule 1), then the candidates left by rules 2-3.
Every candidate runs real training steps (compilation included in its cost). Results: results/run.json.

    python -m bench.bench_run            # all, writes bench/results/run.json
    python -m bench.bench_run --worker 4 # one device count, JSON on stdout (used by run())
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = ("gpt__tiny", "moe__tiny")
DEVICE_COUNTS = (2, 4)
GLOBAL_BATCH = 16
NUM_CLUSTERS = 6
#: Largest number of full-space candidates measured (uniform seeded sample beyond it).
FULL_SAMPLE = 8
#: Targets: pruning must cut the search cost at least this much while its winner keeps this fraction of
#: the full search's winner throughput (averaged over the cases).
TARGET_COST_REDUCTION = 2.0
TARGET_RELATIVE_PERFORMANCE = 0.85
REPO = Path(__file__).resolve().parents[1]


def _plans(model: str, root: Path) -> Path:
    from libarena.analyze.api import analyze_model
    from libarena.artifacts import Provenance, read_table
    from libarena.hardware import load_cluster
    from libarena.plan import PlannerConfig, plan_job, write_plans

    cluster = root / "local.yaml"
    cluster.write_text("name: local-a100\nnode_groups:\n  - {gpu_type: a100, nodes: 1, gpus_per_node: 8}\n")
    ops = root / f"{model}.ops.parquet"
    analyze_model(model, GLOBAL_BATCH, dtype="fp32", num_clusters=NUM_CLUSTERS).write(ops)
    planset = plan_job(read_table(ops, "operator_table"), load_cluster(cluster), PlannerConfig(max_gpus=max(DEVICE_COUNTS)))
    out = root / f"{model}.plans.parquet"
    write_plans(out, planset, Provenance(tool="bench/bench_run", parameters={"model": model}))
    return out


def worker(num_devices: int, models: tuple[str, ...] = MODELS) -> list[dict]:
    """Both searches for every model on this process's ``num_devices`` devices; each case is also printed
    as one JSON line on stdout as soon as it is done."""
    import jax

    from libarena.models import get_model
    from libarena.plan import read_plans
    from libarena.run.search import SearchConfig, SearchSpace, full_search, measure_in_process, pruned_search

    assert len(jax.devices()) == num_devices
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            planset = read_plans(_plans(name, Path(tmp)))
            model = get_model(name)
            space = SearchSpace(model, GLOBAL_BATCH, "a100", num_devices, tuple(planset.clusters), "fp32")
            config = SearchConfig(max_candidates=FULL_SAMPLE, warmup_steps=1, timed_steps=5)
            inner = measure_in_process(model, config)

            def measure(plan, inner=inner, name=name):
                t = inner(plan)
                print(f"bench_run: {name} x{num_devices} {plan.plan_id}: {t * 1e3:.1f} ms/step", file=sys.stderr, flush=True)
                return t
            # Pruned first: the full search would otherwise have warmed shared stage compilations for it.
            pruned = pruned_search(space, planset, measure, SearchConfig(warmup_steps=1, timed_steps=5))
            from libarena.run import executor

            executor._STAGE_CACHE.clear()  # each search pays its own compilations
            full = full_search(space, measure, config)
            executor._STAGE_CACHE.clear()
            # Re-time both winners side by side (same process state) for the relative performance.
            best_full, best_pruned = full.best.plan, pruned.best.plan
            retime = {p.plan_id: measure(p) for p in (best_full, best_pruned)}
            out.append({
                "model": name, "num_devices": num_devices, "global_batch": GLOBAL_BATCH,
                "full": full.to_dict(), "pruned": pruned.to_dict(),
                "full_winner_step_s": retime[best_full.plan_id], "pruned_winner_step_s": retime[best_pruned.plan_id],
                "relative_performance": retime[best_full.plan_id] / retime[best_pruned.plan_id],
            })
            print(json.dumps(out[-1]), flush=True)
    return out


def run_worker(num_devices: int) -> list[dict]:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={num_devices}", JAX_PLATFORMS="cpu", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-m", "bench.bench_run", "--worker", str(num_devices)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_run worker ({num_devices} devices) failed: {proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def write_results(results_dir: Path, cases: list[dict], wall_s: float) -> bool:
    from libarena.artifacts import write_json

    for c in cases:
        full = c["full"]
        # A sampled full search measured only part of the space: its whole-space cost is estimated as the
        # mean measured cost per candidate times the space size (compilation sharing makes this an upper bound).
        c["full_space_cost_estimate_device_s"] = full["cost_device_s"] / full["candidates_measured"] * full["candidates_total"]
        c["cost_reduction_sampled"] = full["cost_device_s"] / c["pruned"]["cost_device_s"]
        c["cost_reduction"] = c["full_space_cost_estimate_device_s"] / c["pruned"]["cost_device_s"]
    reductions = [c["cost_reduction"] for c in cases]
    relative = [c["relative_performance"] for c in cases]
    summary = {
        "mean_cost_reduction": sum(reductions) / len(reductions),
        "mean_relative_performance": sum(relative) / len(relative),
        "mean_cost_reduction_sampled": sum(c["cost_reduction_sampled"] for c in cases) / len(cases),
        "paper": {"cost_reduction": 5.48, "relative_performance": 0.962},
        "targets": {"cost_reduction": TARGET_COST_REDUCTION, "relative_performance": TARGET_RELATIVE_PERFORMANCE},
    }
    ok = summary["mean_cost_reduction"] >= TARGET_COST_REDUCTION and summary["mean_relative_performance"] >= TARGET_RELATIVE_PERFORMANCE
    write_json(results_dir / "run.json", {
        "benchmark": "runtime pruning (arena-run --search pruned vs full)", "device": "CPU host devices (XLA)",
        "full_sample": FULL_SAMPLE, "cases": cases, "summary": summary, "targets_met": ok, "wall_s": wall_s,
    })
    return ok


def run(results_dir: Path) -> bool:
    t0 = time.perf_counter()
    cases = [case for n in DEVICE_COUNTS for case in run_worker(n)]
    return write_results(results_dir, cases, time.perf_counter() - t0)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), tuple(sys.argv[3:]) or MODELS)
    else:
        results = REPO / "bench" / "results"
        results.mkdir(parents=True, exist_ok=True)
        print("targets met" if run(results) else "targets NOT met")
