"""arena-analyze's run: a model's training step lowered into its operator table, cached by its configuration."""

from __future__ import annotations

import tempfile
from typing import Any

from libarena.artifacts import Provenance
from libarena.artifacts.stage_cache import StageCache, StageOutcome, library_versions
from libarena.pipeline.cache import CacheSettings
from libarena.progress import ProgressUpdate, Report, SilentReport

STAGE = "arena-analyze"


def _key(stage: StageCache, config: Any) -> str:
    return stage.key(config.parameters(), versions=library_versions("jax", "jaxlib", "optax"))


def _producer(config: Any, report: Report, where: str):
    """Analyze ``config`` and write its operator table to a path (with the phases as progress)."""
    task = f"analyzing {config.model} at global batch {config.global_batch}"
    phases: list[str] = []

    def phase(message: str) -> None:  # analyze_model reports its phases (lowering, costs, clustering)
        phases.append(message)
        report.log(message)
        report.progress(ProgressUpdate(task, len(phases), None, message))

    def produce(path: str) -> None:
        from libarena.analyze import analyze_model

        report.progress(ProgressUpdate(task, 0, None, "lowering the training step"))
        ops = analyze_model(config, log=phase)
        ops.write(path, Provenance(tool="arena-analyze", parameters=config.parameters()))
        report.log(f"wrote {ops.num_rows} instructions, {len(ops.clusters)} clusters to {where}")

    return produce


def analyze(config: Any, output: str, cache: CacheSettings = CacheSettings(), report: Report = SilentReport()) -> StageOutcome:
    """``arena-analyze``: the operator table of ``config`` (an AnalyzeConfig) to ``output`` (a file or ``-``)."""
    stage = cache.stage(STAGE, report)
    where = "stdout" if output == "-" else output
    return stage.produce_table(_key(stage, config), output, _producer(config, report, where))


def operator_table(config: Any, cache: CacheSettings = CacheSettings(), report: Report = SilentReport()) -> Any:
    """The operator table of ``config`` for a later stage: the same cache entry ``arena-analyze`` writes and
    serves (analyzed and stored on a miss)."""
    from libarena.analyze import read_operator_table

    stage = cache.stage(STAGE, report)
    inner = _producer(config, SilentReport(), "the stage cache")

    def produce(path: str) -> None:
        report.log(f"analyzing {config.model} at global batch {config.global_batch}")
        inner(path)

    with tempfile.TemporaryDirectory(prefix="arena-analyze-") as scratch:
        return read_operator_table(stage.table(_key(stage, config), produce, scratch))
