"""Run several policies on one workload and compare them relative to Arena (or the first policy)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from libarena.progress import ProgressUpdate, Report, SilentReport

#: metrics in the --json output, per policy
JSON_METRICS = ("avg_jct_s", "avg_throughput", "peak_throughput", "finished_jobs", "unfinished_jobs", "dropped_jobs",
                "avg_queuing_s", "p90_jct_s", "deadline_satisfaction_ratio", "reschedules_per_job",
                "decision_time_per_tick_median_s", "submitted_jobs", "simulation_wall_s")


def compare_json(metrics: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]]) -> dict:
    """The fields of compare.json (a comparison document, libarena.artifacts.kinds.comparison): ``{"reference":
    name, "policies": {name: {metric: value, "vs_reference": jobs both finished}}}``."""
    from libarena.schedule.metrics import json_safe

    doc: dict[str, Any] = {"reference": reference_policy(list(metrics)), "policies": {}}
    for name, m in metrics.items():
        entry = json_safe({k: m.get(k) for k in JSON_METRICS})
        if name in paired:
            entry["vs_reference"] = paired[name]
        doc["policies"][name] = entry
    return doc


def write_comparison(path: Path, metrics: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]],
                     runs: dict[str, Path], tool: str, inputs: Sequence[dict[str, Any]] = ()) -> None:
    """compare.json of the runs in ``runs`` (policy -> its run's directory), its provenance gathered from the
    runs' own (each policy's parameters, every input once) after ``inputs`` of the comparison's own (a sweep's
    spec), naming ``tool``."""
    from libarena.artifacts import write_json_document

    write_json_document(path, "comparison", compare_json(metrics, paired), comparison_provenance(runs, tool, inputs))


def comparison_provenance(runs: dict[str, Path], tool: str, inputs: Sequence[dict[str, Any]] = ()) -> Any:
    """Where a comparison came from: ``inputs``, then each policy's run parameters and the runs' inputs (each
    once, in order), from the runs' metrics.json."""
    import json

    from libarena.artifacts import Provenance, read_json_document

    parameters, gathered, seen, runs_inputs = {}, [], set(), []
    for name, path in runs.items():
        provenance = read_json_document(path / "metrics.json", "run_metrics").provenance
        parameters[name] = provenance.parameters
        runs_inputs += provenance.inputs
    for item in [*inputs, *runs_inputs]:
        key = json.dumps(item, sort_keys=True)
        if key not in seen:
            seen.add(key)
            gathered.append(item)
    return Provenance(tool=tool, parameters={"policies": parameters}, inputs=gathered)


def reference_policy(names: list[str]) -> str:
    """The compared policy the others are measured against: the registered comparison reference (Arena) if
    it is among them, else the first."""
    from libarena.schedule.policies.base import POLICIES

    return next((n for n in names if n in POLICIES and POLICIES.get(n).comparison_reference), names[0])


#: edges (hours) of the isolated-duration classes in a jobs-both-finished breakdown; the last class is open
LENGTH_CLASSES_H = (0.0, 1.0, 3.0, 10.0, 30.0)


def jobs_both_finished(reference: Any, other: Any, isolated_s: dict[str, float] | None = None) -> dict[str, Any]:
    """JCT statistics over the jobs that both runs finished (job_records tables): the fair comparison, since
    an average over each policy's own finished jobs rewards leaving the hard jobs unfinished. With
    ``isolated_s`` (job id -> seconds alone on its fastest configuration) also ``by_isolated_length``: the same
    per class of that duration (``LENGTH_CLASSES_H``), which shows where a lead comes from -- a policy that
    favours short jobs wins on them and loses on the long ones."""
    import numpy as np

    def finished(table: Any) -> dict[str, float]:
        ids, status, jct = (table.column(c).to_pylist() for c in ("job_id", "status", "jct_s"))
        return {j: t for j, s, t in zip(ids, status, jct) if s == "finished"}

    ref, mine = finished(reference), finished(other)
    common = sorted(set(ref) & set(mine))

    def stats(values: list[float]) -> dict[str, float | None]:
        if not values:
            return {"avg_jct_s": None, "p50_jct_s": None, "p90_jct_s": None}
        arr = np.asarray(values, dtype=float)
        return {"avg_jct_s": float(arr.mean()), "p50_jct_s": float(np.percentile(arr, 50)),
                "p90_jct_s": float(np.percentile(arr, 90))}

    out: dict[str, Any] = {"jobs": len(common), "reference": stats([ref[j] for j in common]),
                           "policy": stats([mine[j] for j in common])}
    if isolated_s is not None:
        edges = [h * 3600.0 for h in LENGTH_CLASSES_H] + [float("inf")]
        classes = []
        for low, high in zip(edges, edges[1:]):
            jobs = [j for j in common if low <= isolated_s[j] and (isolated_s[j] < high or high == float("inf"))]
            classes.append({"from_h": low / 3600.0, "to_h": None if high == float("inf") else high / 3600.0,
                            "jobs": len(jobs), "reference_jct_sum_s": float(sum(ref[j] for j in jobs)),
                            "policy_jct_sum_s": float(sum(mine[j] for j in jobs))})
        out["by_isolated_length"] = classes
    return out


def isolated_durations(records: Any, perf: Any, max_gpus: int) -> dict[str, float]:
    """Seconds each job of a job_records table takes alone on its fastest configuration of at most ``max_gpus``
    GPUs that the cluster has (the performance table's execution truth; inf where none runs it)."""
    import numpy as np

    ids, models, batches, iterations = (records.column(c).to_pylist() for c in ("job_id", "model", "global_batch", "num_iterations"))
    levels = max_gpus.bit_length()
    usable = perf.usable[:, :levels]  # only the counts each type's GPUs can hold
    out = {}
    for job_id, model, batch, iters in zip(ids, models, batches, iterations):
        truth = perf.get(model, batch).truth[:, :levels] if perf.has(model, batch) else None
        best = float(np.where(usable, truth, 0.0).max()) if truth is not None and truth.size else 0.0
        out[job_id] = iters * batch / best if best > 0 else float("inf")
    return out


def paired_comparison(runs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Per policy (name -> its run directory, in comparison order): the jobs it and the reference policy both
    finished (from each run's jobs.parquet)."""
    from libarena.artifacts import read_table

    ref = reference_policy(list(runs))
    records = {name: read_table(path / "jobs.parquet", "job_records").table for name, path in runs.items()}
    return {name: jobs_both_finished(records[ref], records[name]) for name in runs if name != ref}


def paired_from_json(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The jobs-both-finished entries of a compare.json document, by policy."""
    return {name: entry["vs_reference"] for name, entry in doc["policies"].items() if "vs_reference" in entry}


def compare_table(metrics: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]] | None = None) -> Table:
    ref_name = reference_policy(list(metrics))
    ref = metrics[ref_name]
    table = Table(title=f"policies compared (relative to {ref_name})")
    # The average over every job counts a dropped job until it was dropped, and an unfinished one until the run
    # ended: the jobs both finished are the fair comparison, beside it.
    for col in ("policy", "avg JCT (h)", f"{ref_name} JCT reduction", "both finished", f"JCT both ({ref_name} / it, h)",
                f"{ref_name} reduction (both)", "avg queuing (h)", "finished", "unfinished", "dropped",
                "avg thr (samples/s)", f"{ref_name} thr gain", "peak thr", "resched/job", "decision ms (median)"):
        table.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col == "policy")
    for name, m in metrics.items():
        jct, rjct = m["avg_jct_s"], ref["avg_jct_s"]
        red = f"{100 * (1 - rjct / jct):.1f}%" if jct > 0 and name != ref_name else "-"
        gain = f"{ref['avg_throughput'] / m['avg_throughput']:.2f}x" if m["avg_throughput"] > 0 and name != ref_name else "-"
        pair = (paired or {}).get(name)
        both, both_jct, both_red = "-", "-", "-"
        if pair is not None:
            both = str(pair["jobs"])
            if pair["jobs"]:
                ours, theirs = pair["reference"]["avg_jct_s"], pair["policy"]["avg_jct_s"]
                both_jct = f"{ours / 3600:.2f} / {theirs / 3600:.2f}"
                both_red = f"{100 * (1 - ours / theirs):.1f}%" if theirs > 0 else "-"
        table.add_row(name, f"{jct / 3600:.2f}", red, both, both_jct, both_red, f"{m['avg_queuing_s'] / 3600:.2f}",
                      str(m["finished_jobs"]), str(m["unfinished_jobs"]), str(m["dropped_jobs"]),
                      f"{m['avg_throughput']:.1f}", gain,
                      f"{m['peak_throughput']:.1f}", f"{m['reschedules_per_job']:.2f}",
                      f"{1000 * m['decision_time_per_tick_median_s']:.2f}")
    return table


def compare_table_text(metrics: dict[str, dict[str, Any]], paired: dict[str, dict[str, Any]] | None = None,
                       width: int = 280) -> str:
    """The comparison table as plain text (what ``arena-schedule compare`` prints, and table.txt of a sweep)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=width).print(compare_table(metrics, paired))
    return buf.getvalue()


def run_comparison(workload: Any, policies: dict[str, Any], config: Any, output: Path, inputs: list[dict[str, Any]],
                   plot: bool = False, report: Report = SilentReport()) -> dict[str, dict[str, Any]]:
    """Simulate every policy on ``workload`` one after another: one sub-directory of ``output`` per policy,
    ``compare.json`` and (``plot``) the comparison's figures. Returns the metrics by policy."""
    from libarena.schedule.api import run_parameters, run_policy, write_run
    from libarena.schedule.metrics import summary_line

    output.mkdir(exist_ok=True)
    metrics, runs = {}, {}
    for i, (name, policy) in enumerate(policies.items()):
        report.progress(ProgressUpdate("policies", i, len(policies), name))
        res = run_policy(workload, policy, config, progress=report.progress)
        params = run_parameters(policy, config)
        metrics[name] = write_run(output / name, res, workload, config, params, inputs)
        runs[name] = res
        report.log(summary_line(metrics[name]))
    report.progress(ProgressUpdate("policies", len(policies), len(policies)))
    run_dirs = {n: output / n for n in policies}
    write_comparison(output / "compare.json", metrics, paired_comparison(run_dirs), run_dirs, "arena-schedule compare")
    if plot:
        from libarena.schedule.plots import plot_runs

        plot_runs(runs, output)
    return metrics
