"""The performance table a workload needs: analyze -> plan -> profile for every (model, global batch).

``arena-schedule perf build`` calls :func:`build_perf_table`. Per (model, batch) pair:

1. arena-analyze's operator table, cached on disk by the content of its configuration (re-runs are instant);
2. arena-plan's grids, frontiers and proxy plans on every GPU type of the cluster;
3. rows for the views arena / ap / dp: measured on the local device by the disaggregated profiler where
   the model can run here (``local``), or from the execution-free roofline estimate (``roofline``, see
   roofline.py) for the paper-size models a laptop cannot execute. ``auto`` picks local for the zoo's
   tiny/small sizes and roofline otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from libarena.artifacts import Provenance, content_digest, write_table
from libarena.artifacts.io import TableArtifact
from libarena.artifacts.registry import get_kind
from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec
from libarena.plan import PlannerConfig, load_model_profile, plan_job, planset_metadata, planset_to_table
from libarena.profile.roofline import RooflineConfig, roofline_rows
from libarena.progress import ProgressCallback, ProgressUpdate, no_progress

MODES = ("auto", "local", "roofline")


@dataclass(frozen=True)
class PerfBuildConfig:
    mode: str = "auto"
    dtype: str = "bf16"
    num_clusters: int = 16
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    roofline: RooflineConfig = field(default_factory=RooflineConfig)
    #: Operator tables and stage profiles are cached here (content-addressed).
    cache_dir: Path = Path(".arena-cache")

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ArenaError(f"unknown perf build mode {self.mode!r} (known: {', '.join(MODES)})")


def _mode_for(model: str, mode: str) -> str:
    if mode != "auto":
        return mode
    from libarena.models import TEST_SIZES

    return "local" if model.partition("__")[2] in TEST_SIZES else "roofline"


def cached_operator_table(model: str, global_batch: int, config: PerfBuildConfig, log: Callable[[str], None]) -> Any:
    """arena-analyze's table for (model, batch), from the cache when an identical analysis exists."""
    import jax

    from libarena import __version__
    from libarena.analyze import ANALYSIS_REVISION, AnalyzeConfig, analyze_model, read_operator_table

    analyze_config = AnalyzeConfig(model, global_batch, dtype=config.dtype, num_clusters=config.num_clusters).validated()
    key = content_digest("operator_table", __version__, ANALYSIS_REVISION, jax.__version__, asdict(analyze_config))
    path = config.cache_dir / "operator-tables" / f"{key}.parquet"
    if path.is_file():
        try:
            return read_operator_table(path)
        except ArenaError:
            log(f"cache entry {path} unreadable; analyzing again")
    log(f"analyzing {model} at global batch {global_batch}")
    table = analyze_model(analyze_config)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.write(path, Provenance("arena-schedule perf build", analyze_config.parameters()))
    return table


def build_rows(model: str, global_batch: int, cluster: ClusterSpec, config: PerfBuildConfig,
               log: Callable[[str], None], progress: ProgressCallback | None = None) -> list[dict[str, Any]]:
    ops = cached_operator_table(model, global_batch, config, log)
    profile = load_model_profile(ops)
    planset = plan_job(profile, cluster, config.planner)
    if _mode_for(model, config.mode) == "roofline":
        return roofline_rows(profile, planset, cluster, config.roofline)
    from libarena.profile import ProfileConfig, profile_plans

    # Per-layer profiles: a trace needs many (model, batch) pairs profiled, so the cheaper granularity.
    result = profile_plans(planset, ProfileConfig(cache_dir=config.cache_dir / "profiles", granularity="unit"), log=log, progress=progress)
    return result.table.to_pylist()


def build_perf_table(pairs: Iterable[tuple[str, int]], cluster: ClusterSpec, output: str | os.PathLike[str],
                     config: PerfBuildConfig = PerfBuildConfig(), inputs: list[dict[str, Any]] | None = None,
                     log: Callable[[str], None] | None = None, progress: ProgressCallback | None = None) -> pa.Table:
    """``progress`` hears one update per (model, batch) pair, and the profiler's per plan."""
    log = log or (lambda message: None)
    progress = progress or no_progress
    pairs = sorted(set(pairs))
    if not pairs:
        raise ArenaError("no (model, global batch) pairs to build a performance table for")
    kind = get_kind("perf_table")
    rows: list[dict[str, Any]] = []
    for i, (model, batch) in enumerate(pairs, start=1):
        log(f"[{i}/{len(pairs)}] {model} global batch {batch}")
        progress(ProgressUpdate("building the performance table", i - 1, len(pairs), f"{model} global batch {batch}"))
        rows.extend(build_rows(model, batch, cluster, config, log, progress))
    progress(ProgressUpdate("building the performance table", len(pairs), len(pairs)))
    columns = {c.name for c in kind.columns}
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k in columns} for r in rows], schema=kind.arrow_schema())
    params = {"mode": config.mode, "dtype": config.dtype, "num_clusters": config.num_clusters,
              "achieved_fraction": config.roofline.achieved_fraction, "pairs": [list(p) for p in pairs]}
    write_table(output, "perf_table", table, Provenance("arena-schedule perf build", params, inputs or []),
                {"cluster": cluster.name})
    return table
