"""arena-schedule's simulation runs (``simulate``, ``compare``), cached by the workload's inputs, the policies'
configurations and the simulator's."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libarena.artifacts.stage_cache import StageCache, StageOutcome, code_digest, library_versions
from libarena.errors import ArenaError
from libarena.pipeline.cache import CacheSettings
from libarena.progress import Report, SilentReport

if TYPE_CHECKING:
    from libarena.schedule.api import Workload


def simulation_key(stage: StageCache, params: dict[str, Any], config: Any, key_inputs: list[dict[str, Any]], *,
                   skip_bad_rows: bool, plot: bool) -> str:
    """The ``arena-schedule simulate`` cache key of one simulation (a sweep's simulations use it too)."""
    return stage.key({**params, "simulator": asdict(config), "skip_bad_rows": skip_bad_rows, "plot": plot}, key_inputs,
                     simulation_libraries(plot))


def simulation_libraries(plot: bool) -> dict[str, str]:
    """What a simulation's outputs depend on besides Arena's code: HiGHS decides Gavel's and Sia's rounds (another
    build may return another of several optimal answers), msgpack writes the decisions, matplotlib the figures."""
    return library_versions("highspy", "msgpack", *(("matplotlib",) if plot else ()))


def simulation_build() -> dict[str, Any]:
    """What a simulation's key holds of the process that runs it (Arena's code, the libraries of a run without
    figures): a sweep's worker must match its driver's, or its result would be stored under the driver's key."""
    return {"code": code_digest(), "libraries": simulation_libraries(False)}


SIMULATE_STAGE = "arena-schedule simulate"


def _report_skipped(workload: Workload, report: Report) -> None:
    """Warn about the trace's rows left out and its columns not read."""
    note = workload.trace.ignored_columns_note()
    if note:
        report.warn(note)
    if workload.skipped:
        report.warn(f"skipped {len(workload.skipped)} bad row(s); first: {workload.skipped[0]}")


def _report_run_notes(run_dir: Path, metrics: dict[str, Any], report: Report) -> None:
    """Warn which jobs of the run in ``run_dir`` the policy could never place, and why, and when its decisions
    depended on the host's speed (cache hits too)."""
    from libarena.artifacts import read_table
    from libarena.schedule.metrics import time_limit_note, unschedulable_notes

    note = time_limit_note(metrics)
    if note:
        report.warn(note)
    if not metrics.get("unschedulable_jobs"):
        return
    for line in unschedulable_notes(read_table(run_dir / "jobs.parquet", "job_records").table):
        report.warn(line)  # each reason names the policy


def simulate(trace: Path, perf: Path, cluster: Path, policy: Any, config: Any, output: Path, *,
             skip_bad_rows: bool = False, plot: bool = False, cache: CacheSettings = CacheSettings(),
             report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, Any]]:
    """``arena-schedule simulate``: one policy (a made Policy) on the workload into the directory ``output``;
    returns the run's metrics (from the cache on a hit)."""
    from libarena.artifacts.io import refuse_overwriting_inputs
    from libarena.schedule.api import is_output_file, load_workload, run_parameters, run_policy, write_run
    from libarena.schedule.metrics import read_metrics, summary_line

    refuse_overwriting_inputs(output, {"--trace": trace, "--perf": perf, "--cluster": cluster}, directory=True)
    workload, refs, key_inputs = load_workload(trace, perf, cluster, seed=config.seed, skip_bad_rows=skip_bad_rows)
    _report_skipped(workload, report)
    params = run_parameters(policy, config)
    stage = cache.stage(SIMULATE_STAGE, report)
    key = simulation_key(stage, params, config, key_inputs, skip_bad_rows=skip_bad_rows, plot=plot)

    def produce(directory: Path) -> None:
        res = run_policy(workload, policy, config, progress=report.progress)
        write_run(directory, res, workload, config, params, refs, plot)

    outcome = stage.produce_tree(key, output, produce, is_output_file)
    metrics = read_metrics(output / "metrics.json")
    if outcome.cache_hit:
        report.log(f"cached: {output}/ from {outcome.entry} ({len(outcome.files)} files; --no-cache simulates again)")
    report.log(summary_line(metrics))
    _report_run_notes(output, metrics, report)
    return outcome, metrics


def compare(trace: Path, perf: Path, cluster: Path, policies: dict[str, Any], config: Any, output: Path, *,
            skip_bad_rows: bool = False, plot: bool = False, cache: CacheSettings = CacheSettings(),
            report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, dict[str, Any]], dict[str, Any]]:
    """``arena-schedule compare``: every policy of ``policies`` (name -> made Policy) on the same workload,
    into ``output`` (one sub-directory each, compare.json); returns the metrics by policy and compare.json's body
    (without its header)."""
    from libarena.artifacts import read_json_document
    from libarena.artifacts.io import refuse_overwriting_inputs
    from libarena.schedule.api import is_output_file, load_workload, policy_parameters
    from libarena.schedule.compare import run_comparison
    from libarena.schedule.metrics import read_metrics, summary_line

    if not policies:
        raise ArenaError("no policies to compare")
    refuse_overwriting_inputs(output, {"--trace": trace, "--perf": perf, "--cluster": cluster}, directory=True)
    workload, inputs, key_inputs = load_workload(trace, perf, cluster, seed=config.seed, skip_bad_rows=skip_bad_rows)
    _report_skipped(workload, report)
    stage = cache.stage("arena-schedule compare", report)
    key = stage.key({"policies": list(policies), "policy_configs": {n: policy_parameters(p) for n, p in policies.items()},
                     "tick_s": config.tick_s, "horizon_s": config.horizon_s, "seed": config.seed,
                     "simulator": asdict(config), "skip_bad_rows": skip_bad_rows, "plot": plot}, key_inputs,
                    simulation_libraries(plot))
    outcome = stage.produce_tree(key, output, lambda directory: run_comparison(workload, policies, config, directory,
                                                                               inputs, plot, report), is_output_file)
    metrics = {name: read_metrics(output / name / "metrics.json") for name in policies}
    if outcome.cache_hit:
        report.log(f"cached: {output}/ from {outcome.entry} ({len(outcome.files)} files; --no-cache simulates again)")
        for name in policies:
            report.log(summary_line(metrics[name]))
    for name in policies:
        _report_run_notes(output / name, metrics[name], report)
    return outcome, metrics, read_json_document(output / "compare.json", "comparison").data
