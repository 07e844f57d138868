"""arena-schedule's simulation runs (``simulate``, ``compare``), cached by the workload's inputs, the policies'
configurations and the simulator's."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from libarena.artifacts.stage_cache import StageOutcome, library_versions
from libarena.errors import ArenaError
from libarena.pipeline.cache import CacheSettings
from libarena.progress import Report, SilentReport


def _policy_parameters(policy: Any) -> dict[str, str]:
    return {k: str(v) for k, v in policy.config.__dict__.items()}


def _report_skipped(skipped: list[str], report: Report) -> None:
    if skipped:
        report.warn(f"skipped {len(skipped)} bad row(s); first: {skipped[0]}")


def simulate(trace: Path, perf: Path, cluster: Path, policy: Any, config: Any, output: Path, *,
             skip_bad_rows: bool = False, plot: bool = False, cache: CacheSettings = CacheSettings(),
             report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, Any]]:
    """``arena-schedule simulate``: one policy (a made Policy) on the workload into the directory ``output``;
    returns the run's metrics (from the cache on a hit)."""
    from libarena.artifacts.io import refuse_overwriting_inputs
    from libarena.schedule.api import is_output_file, load_workload, run_policy, write_run
    from libarena.schedule.metrics import read_metrics, summary_line

    refuse_overwriting_inputs(output, {"--trace": trace, "--perf": perf, "--cluster": cluster}, directory=True)
    workload, refs, key_inputs = load_workload(trace, perf, cluster, seed=config.seed, skip_bad_rows=skip_bad_rows)
    _report_skipped(workload.skipped, report)
    params = {"policy": policy.name, "view": policy.view, "tick_s": config.tick_s, "horizon_s": config.horizon_s,
              "seed": config.seed, "overheads": config.overheads.__dict__, "policy_config": _policy_parameters(policy)}
    stage = cache.stage("arena-schedule simulate", report)
    key = stage.key({**params, "simulator": asdict(config), "skip_bad_rows": skip_bad_rows, "plot": plot}, key_inputs,
                    library_versions("matplotlib") if plot else None)

    def produce(directory: Path) -> None:
        res = run_policy(workload, policy, config, progress=report.progress)
        write_run(directory, res, workload, config, params, refs, plot)

    outcome = stage.produce_tree(key, output, produce, is_output_file)
    metrics = read_metrics(output / "metrics.json")
    if outcome.cache_hit:
        report.log(f"cached: {output}/ from {outcome.entry} ({len(outcome.files)} files; --no-cache simulates again)")
    report.log(summary_line(metrics))
    return outcome, metrics


def compare(trace: Path, perf: Path, cluster: Path, policies: dict[str, Any], config: Any, output: Path, *,
            skip_bad_rows: bool = False, plot: bool = False, cache: CacheSettings = CacheSettings(),
            report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, dict[str, Any]]]:
    """``arena-schedule compare``: every policy of ``policies`` (name -> made Policy) on the same workload,
    into ``output`` (one sub-directory each, compare.json); returns the metrics by policy."""
    from libarena.artifacts.io import refuse_overwriting_inputs
    from libarena.schedule.api import is_output_file, load_workload
    from libarena.schedule.compare import run_comparison
    from libarena.schedule.metrics import read_metrics, summary_line

    if not policies:
        raise ArenaError("no policies to compare")
    refuse_overwriting_inputs(output, {"--trace": trace, "--perf": perf, "--cluster": cluster}, directory=True)
    workload, inputs, key_inputs = load_workload(trace, perf, cluster, seed=config.seed, skip_bad_rows=skip_bad_rows)
    _report_skipped(workload.skipped, report)
    stage = cache.stage("arena-schedule compare", report)
    key = stage.key({"policies": list(policies), "policy_configs": {n: _policy_parameters(p) for n, p in policies.items()},
                     "tick_s": config.tick_s, "horizon_s": config.horizon_s, "seed": config.seed,
                     "simulator": asdict(config), "skip_bad_rows": skip_bad_rows, "plot": plot}, key_inputs,
                    library_versions("matplotlib") if plot else None)
    outcome = stage.produce_tree(key, output, lambda directory: run_comparison(workload, policies, config, directory,
                                                                               inputs, plot, report), is_output_file)
    metrics = {name: read_metrics(output / name / "metrics.json") for name in policies}
    if outcome.cache_hit:
        report.log(f"cached: {output}/ from {outcome.entry} ({len(outcome.files)} files; --no-cache simulates again)")
        for name in policies:
            report.log(summary_line(metrics[name]))
    return outcome, metrics
