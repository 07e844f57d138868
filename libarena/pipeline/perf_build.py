"""``arena-schedule perf build``: the performance table a workload needs, analyze -> plan -> profile (or the
execution-free roofline estimate) for every (model, global batch) pair.

Per pair:

1. the operator table, from the analyze stage's cache (the entry ``arena-analyze`` itself writes and serves);
2. arena-plan's grids, frontiers and proxy plans on every GPU type of the cluster;
3. rows for the views arena / ap / dp: measured on the local device by the disaggregated profiler where the
   model can run here (``local``), or from the roofline estimate (``roofline``, libarena.profile.roofline) for
   the paper-size models a laptop cannot execute. ``auto`` picks local for the zoo's tiny/small sizes and
   roofline otherwise.

The live scheduler calls the same step for the (model, batch) of a job that arrives without rows
(``perf build --pair``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from libarena.artifacts import Provenance, write_table
from libarena.artifacts.io import check_table_output, refuse_overwriting_inputs
from libarena.artifacts.registry import get_kind
from libarena.artifacts.stage_cache import StageOutcome, library_versions
from libarena.checks import MAX_SEED, check_range
from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec, load_cluster_input
from libarena.hardware.catalogue import normalize_dtype
from libarena.pipeline.cache import CacheSettings
from libarena.plan import PlannerConfig
from libarena.profile.roofline import RooflineConfig
from libarena.progress import ProgressUpdate, Report, SilentReport

STAGE = "arena-schedule perf build"
MODES = ("auto", "local", "roofline")
GRANULARITIES = ("stage", "unit")


@dataclass(frozen=True)
class PerfBuildConfig:
    mode: str = "auto"
    #: training compute dtype of every job: bf16 (the default), fp16 (what Volta GPUs such as the V100 train in:
    #: they have fp16 tensor cores but no bf16, so their bf16 rows run at the fp32 peak), fp32 or tf32
    dtype: str = "bf16"
    num_clusters: int = 16
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    roofline: RooflineConfig = field(default_factory=RooflineConfig)
    #: what one profiled executable covers (local mode): a workload has many pairs to profile, so by default
    #: the cheaper per-layer profiles (identical layers profiled once)
    granularity: str = "unit"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ArenaError(f"unknown perf build mode {self.mode!r} (known: {', '.join(MODES)})")
        normalize_dtype(self.dtype)  # one line naming the dtype when it is unknown
        if self.granularity not in GRANULARITIES:
            raise ArenaError(f"unknown granularity {self.granularity!r} (known: {', '.join(GRANULARITIES)})")
        check_range(self.num_clusters, "num_clusters", 1, 4096, integer=True)


def mode_for(model: str, mode: str) -> str:
    if mode != "auto":
        return mode
    from libarena.workloads import TEST_SIZES

    return "local" if model.partition("__")[2] in TEST_SIZES else "roofline"


def pair_rows(model: str, global_batch: int, cluster: ClusterSpec, config: PerfBuildConfig, cache: CacheSettings,
              report: Report = SilentReport()) -> list[dict[str, Any]]:
    """The performance rows of one (model, global batch) pair on ``cluster``."""
    from libarena.analyze import AnalyzeConfig
    from libarena.pipeline.analyze import operator_table
    from libarena.plan import load_model_profile, plan_job

    ops = operator_table(AnalyzeConfig(model, global_batch, dtype=config.dtype, num_clusters=config.num_clusters),
                         cache.reuse(), report)
    profile = load_model_profile(ops)
    planset = plan_job(profile, cluster, config.planner)
    if mode_for(model, config.mode) == "roofline":
        from libarena.profile.roofline import roofline_rows

        return roofline_rows(profile, planset, cluster, config.roofline)
    from libarena.profile import ProfileConfig, profile_plans

    if not any(g.feasible for g in planset.grids):
        # nothing of the model fits anywhere: no rows (the scheduler refuses its jobs), and nothing is built here
        report.warn(f"{model} global batch {global_batch}: no feasible plan on {cluster.name} "
                    f"({planset.grids[0].infeasible_reason if planset.grids else 'no grids'}); no rows")
        return []
    result = profile_plans(planset, ProfileConfig(cache_dir=cache.root / "profiles", granularity=config.granularity),
                           log=report.log, progress=report.progress)
    return result.table.to_pylist()


def build_perf_table(pairs: Iterable[tuple[str, int]], cluster: ClusterSpec, output: str | os.PathLike[str],
                     config: PerfBuildConfig = PerfBuildConfig(), inputs: list[dict[str, Any]] | None = None,
                     cache: CacheSettings = CacheSettings(), report: Report = SilentReport()) -> pa.Table:
    """The performance table of ``pairs`` to ``output``; ``report`` hears one update per pair (and the profiler's
    per plan)."""
    pairs = sorted(set(pairs))
    if not pairs:
        raise ArenaError("no (model, global batch) pairs to build a performance table for")
    kind = get_kind("perf_table")
    rows: list[dict[str, Any]] = []
    for i, (model, batch) in enumerate(pairs, start=1):
        report.log(f"[{i}/{len(pairs)}] {model} global batch {batch}")
        report.progress(ProgressUpdate("building the performance table", i - 1, len(pairs), f"{model} global batch {batch}"))
        rows.extend(pair_rows(model, batch, cluster, config, cache, report))
    report.progress(ProgressUpdate("building the performance table", len(pairs), len(pairs)))
    columns = {c.name for c in kind.columns}
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k in columns} for r in rows], schema=kind.arrow_schema())
    params = {**asdict(config), "pairs": [list(p) for p in pairs]}  # every setting: planner, roofline, granularity
    write_table(output, "perf_table", table, Provenance(STAGE, params, inputs or []), {"cluster": cluster.name})
    return table


def trace_pairs(trace: str | os.PathLike[str], cluster: ClusterSpec, seed: int = 0, skip_bad_rows: bool = False,
                text: str | None = None) -> list[tuple[str, int]]:
    """The (model, global batch) pairs a trace's jobs use (after adaptation, for ElasticFlow/ITP traces)."""
    from libarena.schedule.traces import read_trace

    parsed = read_trace(trace, gpu_types=cluster.gpu_types, seed=seed, skip_bad_rows=skip_bad_rows, text=text)
    return sorted({(job.model, job.global_batch) for job in parsed.jobs})


def parse_pair(text: str) -> tuple[str, int]:
    """``MODEL,GLOBAL_BATCH`` (``--pair gpt__tiny,16``)."""
    from libarena.models import get_model

    model, sep, batch = str(text).partition(",")
    try:
        value = int(batch)
    except ValueError:
        value = 0
    if not sep or value < 1:
        raise ArenaError(f"--pair {text!r}: expected MODEL,GLOBAL_BATCH with a positive batch, e.g. gpt__tiny,16")
    return get_model(model.strip()).name, value


def perf_build(cluster: Path, output: str, config: PerfBuildConfig, *, trace: Path | None = None,
               pairs: list[tuple[str, int]] = (), seed: int = 0, skip_bad_rows: bool = False,
               cache: CacheSettings = CacheSettings(), report: Report = SilentReport()) -> tuple[StageOutcome, dict[str, Any]]:
    """The cache-keyed ``perf build`` run: the table of a trace's pairs (and of ``pairs``) to ``output``."""
    refuse_overwriting_inputs(output, {"--cluster": cluster, "--trace": trace})
    check_range(seed, "--seed", 0, MAX_SEED, integer=True)
    check_table_output(output)
    # each input named by the bytes that were parsed (a trace on stdin by its text)
    spec, cluster_ref = load_cluster_input(cluster)
    trace_ref, text = [], None
    if trace is not None:
        from libarena.schedule.traces import read_trace_input

        text, ref = read_trace_input(trace)
        trace_ref = [ref]
    wanted = sorted(set(pairs) | set(trace_pairs(trace, spec, seed, skip_bad_rows, text) if trace is not None else ()))
    if not wanted:
        raise ArenaError("perf build needs --trace or --pair (the (model, global batch) pairs to build rows for)")
    inputs = trace_ref + [cluster_ref]
    device = None
    if any(mode_for(model, config.mode) == "local" for model, _ in wanted):
        from libarena.profile import resolve_device  # local profiles measure this machine: its device is in the key

        device = resolve_device("local").cache_identity()
    where = "stdout" if str(output) == "-" else str(output)
    stage = cache.stage(STAGE, report)
    key = stage.key({**asdict(config), "pairs": [list(p) for p in wanted], "seed": seed, "skip_bad_rows": skip_bad_rows,
                     "device": device}, inputs, library_versions("jax", "jaxlib", "optax"))

    def produce(path: str) -> None:
        table = build_perf_table(wanted, spec, path, config, inputs, cache, report)
        report.log(f"wrote {table.num_rows} performance rows to {where}")

    return stage.produce_table(key, str(output), produce), {"pairs": [list(p) for p in wanted]}
