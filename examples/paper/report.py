"""The last stage of examples/paper/Makefile: the figures' numbers for every trace side by side.

Reads what the earlier stages wrote under OUT (per trace: trace-stats.json and compare/<policy>/metrics.json,
in the policy order of compare/compare.json) and writes

    OUT/results.md    one Markdown table per trace (the paper's Fig. 12/13 metrics), relative to Arena
    OUT/results.json  the same numbers, machine-readable: {"cluster", "traces": [{"trace", "stats", "policies": [...]}]}
    OUT/summary.png   Fig. 12/13-style bars: average JCT, queuing, throughput and finished jobs per policy

    python examples/paper/report.py --out OUT [--cluster C.yaml] philly venus pai
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

from libarena.artifacts import read_json_document, write_bytes, write_json
from libarena.errors import ArenaError

#: metrics kept per policy in results.json
METRICS = ("submitted_jobs", "finished_jobs", "unfinished_jobs", "unschedulable_jobs", "dropped_jobs", "skipped_rows",
           "avg_jct_s", "avg_jct_finished_s", "p50_jct_s", "p90_jct_s", "avg_queuing_s", "avg_throughput",
           "peak_throughput", "avg_gpu_utilization", "deadline_satisfaction_ratio", "reschedules_per_job",
           "makespan_s", "decision_time_per_tick_median_s", "simulation_wall_s")
#: (metric, title, scale) of the summary figure's panels
PANELS = (("avg_jct_s", "average JCT (h)", 1 / 3600), ("both_finished_jct_ratio", "JCT / arena's, jobs both finished", 1.0),
          ("avg_queuing_s", "average queuing (h)", 1 / 3600), ("avg_throughput", "average throughput (samples/s)", 1.0),
          ("finished_jobs", "finished jobs", 1.0))


def _panel_value(entry: dict[str, Any], metric: str) -> float:
    if metric == "both_finished_jct_ratio":  # the policy's average JCT over the jobs it and Arena both finished
        pair = entry.get("vs_reference")
        if pair is None:
            return 1.0  # the reference itself
        if not pair["jobs"]:
            return math.nan  # no job both finished: no bar (0 would read as the best)
        return pair["policy"]["avg_jct_s"] / pair["reference"]["avg_jct_s"]
    return entry[metric] or 0.0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ArenaError(f"{path}: missing (run the stage that writes it first)") from None
    except json.JSONDecodeError as exc:
        raise ArenaError(f"{path}: not JSON ({exc})") from None


def _read_summary(path: Path, kind: str) -> dict[str, Any]:
    if not path.is_file():
        raise ArenaError(f"{path}: missing (run the stage that writes it first)")
    return read_json_document(path, kind).data


def collect(out: Path, traces: list[str], policies_order: list[str] | None = None) -> dict[str, Any]:
    """{trace: {"stats": trace stats, "policies": {policy: metrics}}} from the files the pipeline wrote.

    Policies come in ``policies_order`` (those compare.json lists) or else in compare.json's order.
    """
    results: dict[str, Any] = {}
    for trace in traces:
        compare_dir = out / trace / "compare"
        comparison = _read_summary(compare_dir / "compare.json", "comparison")["policies"]
        compared = list(comparison)
        order = [p for p in policies_order if p in compared] if policies_order else compared
        if not order:
            raise ArenaError(f"{compare_dir / 'compare.json'}: none of the policies {', '.join(policies_order or [])}")
        policies = {}
        for policy in order:
            metrics = _read_summary(compare_dir / policy / "metrics.json", "run_metrics")
            policies[policy] = {k: metrics.get(k) for k in METRICS}
            # JCT over the jobs this policy and the reference (Arena) both finished: the fair comparison
            policies[policy]["vs_reference"] = comparison[policy].get("vs_reference")
        results[trace] = {"stats": _read_json(out / trace / "trace-stats.json"), "policies": policies}
    return results


def _hours(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 3600:.2f}"


def markdown(results: dict[str, Any], cluster: str | None, setup: str | None = None) -> str:
    lines = ["# Reproduced figures (examples/paper)", ""]
    if cluster:
        lines += [f"Cluster: `{cluster}`.", ""]
    if setup:
        lines += [f"Setup: {setup}.", ""]
    for trace, entry in results.items():
        stats, policies = entry["stats"], entry["policies"]
        ref = policies.get("arena") or next(iter(policies.values()))
        ref_name = "arena" if "arena" in policies else next(iter(policies))
        first = next(iter(policies.values()))
        skipped, submitted = first.get("skipped_rows") or 0, first["submitted_jobs"]
        lines += [f"## {trace}", "",
                  f"{stats['jobs']} jobs submitted over {stats['span_days']:.2f} days; {skipped} left out (their (model, "
                  f"batch) fits no configuration of the cluster), {submitted} submitted within the simulated time "
                  f"({ref['makespan_s'] / 86400:.2f} days under {ref_name}).", "",
                  f"| policy | finished | unfinished (never placed) | dropped | avg JCT (h) | {ref_name} JCT reduction "
                  f"| finished by both | avg JCT of those ({ref_name} / policy, h) | {ref_name} JCT reduction on those "
                  f"| avg queuing (h) | avg throughput (samples/s) | {ref_name} throughput gain | peak throughput "
                  f"| GPU utilization | reschedules/job | avg JCT of finished jobs (h) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, m in policies.items():
            other = name != ref_name
            reduction = f"{100 * (1 - ref['avg_jct_s'] / m['avg_jct_s']):.1f}%" if other and m["avg_jct_s"] else "-"
            gain = f"{ref['avg_throughput'] / m['avg_throughput']:.2f}x" if other and m["avg_throughput"] else "-"
            pair = m.get("vs_reference") or {}
            both = pair.get("jobs", "-")
            both_jct, both_red = "-", "-"
            if pair.get("jobs"):
                mine, theirs = pair["policy"]["avg_jct_s"], pair["reference"]["avg_jct_s"]
                both_jct = f"{_hours(theirs)} / {_hours(mine)}"
                both_red = f"{100 * (1 - theirs / mine):.1f}%" if mine else "-"
            lines.append(
                f"| {name} | {m['finished_jobs']} | {m['unfinished_jobs']} ({m['unschedulable_jobs']}) | "
                f"{m['dropped_jobs']} | {_hours(m['avg_jct_s'])} | {reduction} | {both} | {both_jct} | {both_red} | "
                f"{_hours(m['avg_queuing_s'])} | "
                f"{m['avg_throughput']:.1f} | {gain} | {m['peak_throughput']:.1f} | "
                f"{100 * m['avg_gpu_utilization']:.1f}% | {m['reschedules_per_job']:.2f} | "
                f"{_hours(m['avg_jct_finished_s']) if m['finished_jobs'] else '-'} |")
        lines.append("")
    lines += ["Average JCT and queuing are over all submitted jobs: a job still queued or running when its policy's run "
              "ends (when its last placeable job is done, or at the horizon) counts up to that time, a dropped one up to "
              "when it was dropped; 'finished by both' compares the JCT of the jobs a policy and the reference both "
              "finished (a policy's average over its own finished jobs rewards leaving the hard ones unfinished, and an "
              "all-jobs average one that drops them or ends its run early); 'never placed': jobs the policy's view finds "
              "no memory-feasible configuration for. Average throughput is the samples trained over the run divided by "
              "its length, peak throughput the highest rate sampled after a scheduling round (5-minute ticks), GPU "
              "utilization the GPU-seconds held over GPUs x length.", ""]
    return "\n".join(lines)


def summary_figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    traces = list(results)
    fig, axes = plt.subplots(len(traces), len(PANELS), figsize=(3.2 * len(PANELS), 2.4 * len(traces)), squeeze=False)
    for row, trace in enumerate(traces):
        policies = results[trace]["policies"]
        names = list(policies)
        x = np.arange(len(names))
        for col, (metric, title, scale) in enumerate(PANELS):
            ax = axes[row][col]
            ax.bar(x, [_panel_value(policies[n], metric) * scale for n in names],
                   color=[f"C{i}" for i in range(len(names))])
            ax.set_xticks(x, names, rotation=45, ha="right", fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_title(f"{trace}: {title}", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    write_bytes(path, buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the pipeline's output folder")
    parser.add_argument("--cluster", help="cluster spec the runs used (named in results.md)")
    parser.add_argument("--setup", help="one line on how the runs were made (iteration divisor, horizon)")
    parser.add_argument("--policies", help="comma-separated policy order of the tables (default: compare.json's)")
    parser.add_argument("traces", nargs="+", help="trace names (sub-folders of --out)")
    args = parser.parse_args(argv)
    try:
        order = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else None
        results = collect(args.out, args.traces, order)
        # Lists keep the policy order (write_json sorts mapping keys).
        write_json(args.out / "results.json", {"cluster": args.cluster, "setup": args.setup, "traces": [
            {"trace": trace, "stats": entry["stats"], "policies": [{"policy": name, **metrics} for name, metrics in entry["policies"].items()]}
            for trace, entry in results.items()]})
        write_bytes(args.out / "results.md", markdown(results, args.cluster, args.setup).encode())
        summary_figure(results, args.out / "summary.png")
    except ArenaError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print(f"report: wrote {args.out}/results.md, results.json, summary.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
