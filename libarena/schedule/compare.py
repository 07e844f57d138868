"""Run several policies on one workload and compare them relative to Arena (or the first policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from libarena.progress import ProgressUpdate, Report, SilentReport

#: metrics in the --json output, per policy
JSON_METRICS = ("avg_jct_s", "avg_throughput", "peak_throughput", "finished_jobs", "unfinished_jobs", "dropped_jobs",
                "avg_queuing_s", "p90_jct_s", "deadline_satisfaction_ratio", "reschedules_per_job",
                "decision_time_per_tick_median_s", "submitted_jobs", "simulation_wall_s")


def compare_json(metrics: dict[str, dict[str, Any]]) -> dict:
    from libarena.schedule.metrics import json_safe

    return {"policies": {name: json_safe({k: m.get(k) for k in JSON_METRICS}) for name, m in metrics.items()}}


def reference_policy(names: list[str]) -> str:
    return "arena" if "arena" in names else names[0]


def compare_table(metrics: dict[str, dict[str, Any]]) -> Table:
    ref_name = reference_policy(list(metrics))
    ref = metrics[ref_name]
    table = Table(title=f"policies compared (relative to {ref_name})")
    for col in ("policy", "avg JCT (h)", f"{ref_name} JCT reduction", "avg queuing (h)", "finished",
                "unfinished", "avg thr (samples/s)", f"{ref_name} thr gain", "peak thr", "resched/job",
                "decision ms (median)"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    for name, m in metrics.items():
        jct, rjct = m["avg_jct_s"], ref["avg_jct_s"]
        red = f"{100 * (1 - rjct / jct):.1f}%" if jct > 0 and name != ref_name else "-"
        gain = f"{ref['avg_throughput'] / m['avg_throughput']:.2f}x" if m["avg_throughput"] > 0 and name != ref_name else "-"
        table.add_row(name, f"{jct / 3600:.2f}", red, f"{m['avg_queuing_s'] / 3600:.2f}", str(m["finished_jobs"]),
                      str(m["unfinished_jobs"]), f"{m['avg_throughput']:.1f}", gain, f"{m['peak_throughput']:.1f}",
                      f"{m['reschedules_per_job']:.2f}", f"{1000 * m['decision_time_per_tick_median_s']:.2f}")
    return table


def run_comparison(workload: Any, policies: dict[str, Any], config: Any, output: Path, inputs: list[dict[str, Any]],
                   plot: bool = False, report: Report = SilentReport()) -> dict[str, dict[str, Any]]:
    """Simulate every policy on ``workload`` one after another: one sub-directory of ``output`` per policy,
    ``compare.json`` and (``plot``) the comparison's figures. Returns the metrics by policy."""
    from libarena.artifacts import write_json
    from libarena.schedule.api import run_policy, write_run
    from libarena.schedule.metrics import summary_line

    output.mkdir(exist_ok=True)
    metrics, runs = {}, {}
    for i, (name, policy) in enumerate(policies.items()):
        report.progress(ProgressUpdate("policies", i, len(policies), name))
        res = run_policy(workload, policy, config, progress=report.progress)
        params = {"policy": name, "view": policy.view, "tick_s": config.tick_s, "horizon_s": config.horizon_s,
                  "seed": config.seed}
        metrics[name] = write_run(output / name, res, workload, config, params, inputs)
        runs[name] = res
        report.log(summary_line(metrics[name]))
    report.progress(ProgressUpdate("policies", len(policies), len(policies)))
    write_json(output / "compare.json", compare_json(metrics))
    if plot:
        from libarena.schedule.plots import plot_runs

        plot_runs(runs, output)
    return metrics
