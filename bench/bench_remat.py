"""Activation recomputation (issue 15): what it changes for the paper's traces, and how well the memory model holds.

1. Per trace (philly, venus, pai from ../shared/traces/arena-ae, the artifact's window: the first submission +
   600,000 s), before (the planner's and the dp view's recomputation off) and after (on): how many jobs each
   policy's decision view cannot place (no memory-feasible configuration of <= 16 GPUs), how many rows fit no
   configuration of the cluster at all, and per (model, batch) of the traces the fewest GPUs of a feasible grid.
2. Per stage of the tiny and small models of every family (CPU): the planner's kept activation bytes per
   micro-batch against XLA's memory analysis of the stage executables, with and without recomputation
   (libarena.pipeline.memory_check), and XLA's temporary bytes.

Writes bench/results/remat.json. The performance tables are roofline tables of the pipeline's own perf build
(operator tables from the stage cache, .arena-cache/).

    python -m bench remat
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.paper_inputs import CLUSTER, PAPER_TRACES, POLICIES, REPO, TRACES, machine_record

HORIZON_S = 600_000.0
MODELS = ("gpt__tiny", "gpt__small", "bert__tiny", "bert__small", "moe__tiny", "moe__small", "wide_resnet__tiny",
          "wide_resnet__small")


def _log(message: str) -> None:
    print(f"[bench_remat] {message}", file=sys.stderr, flush=True)


def placement(trace: Path, perf_rows: list[dict[str, Any]], cluster: Any) -> dict[str, Any]:
    """Jobs of the artifact's window that each policy's view cannot place, and rows no configuration fits."""
    import pyarrow as pa

    from libarena.artifacts import get_kind
    from libarena.schedule.api import make_policy, prepare_workload
    from libarena.schedule.perf import PerfLookup
    from libarena.schedule.simulator import Simulator

    kind = get_kind("perf_table")
    table = pa.Table.from_pylist([{c.name: r.get(c.name) for c in kind.columns} for r in perf_rows], schema=kind.arrow_schema())
    workload = prepare_workload(trace, PerfLookup(table, cluster), cluster, skip_bad_rows=True)
    start = min(j.submit_time for j in workload.jobs)
    window = [j for j in workload.jobs if j.submit_time <= start + HORIZON_S]
    out: dict[str, Any] = {"rows_fitting_no_configuration": len(workload.skipped), "jobs_in_window": len(window),
                           "never_placed": {}}
    for name in POLICIES:
        policy = make_policy(name)
        sim = Simulator(window, workload.perf, cluster, policy)
        out["never_placed"][name] = sum(not policy.runnable(job) for job in sim.jobs)
    return out


def run(results_dir: Path) -> bool:
    import csv

    from libarena.analyze import AnalyzeConfig
    from libarena.artifacts import write_json
    from libarena.hardware import load_cluster
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.analyze import operator_table
    from libarena.pipeline.memory_check import stage_memory
    from libarena.plan import PlannerConfig, load_model_profile, plan_job
    from libarena.profile.roofline import RooflineConfig, roofline_rows

    if not TRACES.is_dir():
        _log(f"traces not found at {TRACES}")
        return False
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    cluster = load_cluster(CLUSTER)
    cache = CacheSettings()
    traces = {name: TRACES / f"simulate_trace_{name}.csv" for name in PAPER_TRACES}
    pairs: dict[str, set[tuple[str, int]]] = {}
    for name, path in traces.items():
        with path.open(newline="") as f:
            pairs[name] = {(r["model_name"], int(r["batch_size"])) for r in csv.DictReader(f)}
    settings = {"before": (PlannerConfig(allow_remat=False), RooflineConfig(dp_remat=False)),
                "after": (PlannerConfig(), RooflineConfig())}
    rows: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    feasibility: dict[str, dict[str, Any]] = {}
    for model, batch in sorted(set().union(*pairs.values())):
        profile = load_model_profile(operator_table(AnalyzeConfig(model, batch), cache))
        entry = {}
        for label, (planner, roofline) in settings.items():
            planset = plan_job(profile, cluster, planner)
            rows[label] += roofline_rows(profile, planset, cluster, roofline)
            fewest = min(((g.grid.num_gpus, g.grid.gpu_type) for g in planset.grids if g.feasible), default=None)
            entry[label] = {"feasible_grids": sum(g.feasible for g in planset.grids),
                            "fewest_gpus": None if fewest is None else {"num_gpus": fewest[0], "gpu_type": fewest[1]},
                            "least_memory_gib": min(g.min_memory_bytes for g in planset.grids) / 2**30}
        feasibility[f"{model}@{batch}"] = entry
        _log(f"{model} at {batch}: {entry['before']['fewest_gpus']} -> {entry['after']['fewest_gpus']}")
    placements = {name: {label: placement(path, rows[label], cluster) for label in settings} for name, path in traces.items()}
    for name, entry in placements.items():
        _log(f"{name}: never placed before {entry['before']['never_placed']}, after {entry['after']['never_placed']}")
    memory = []
    for name in MODELS:
        memory += stage_memory(name)
        _log(f"memory model vs XLA: {name}")
    worst = max(abs(r[k]["planned_kept_bytes"] / r[k]["xla_kept_bytes"] - 1) for r in memory for k in ("plain", "remat"))
    pairs_infeasible_after = sorted(k for k, v in feasibility.items() if v["after"]["fewest_gpus"] is None)
    ok = worst <= 0.2 and not pairs_infeasible_after
    write_json(results_dir / "remat.json", {
        "setup": {"cluster": str(CLUSTER.relative_to(REPO)), "window_s": HORIZON_S, "max_gpus_per_job": 16,
                  "perf_tables": "roofline rows of perf build, recomputation off (before) and on (after)"},
        "placement": placements,
        "feasibility": feasibility,
        "pairs_with_no_feasible_configuration_after": pairs_infeasible_after,
        "memory_model_vs_xla": {"stages": memory, "worst_relative_error_kept_bytes": worst, "target": 0.2},
        "machine": machine_record(load_before),
        "wall_s": time.perf_counter() - t0,
        "ok": ok,
    })
    return ok


if __name__ == "__main__":
    raise SystemExit(0 if run(REPO / "bench" / "results") else 1)
