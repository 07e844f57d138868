"""``arena-schedule perf build``: the performance table a trace needs.

The work (analyze -> plan -> profile or roofline estimate, per (model, global batch) pair) lives in
libarena.profile.perf_build, which imports JAX; this module only reads the trace, so importing the scheduler
stays JAX-free.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from libarena.hardware import ClusterSpec
from libarena.progress import ProgressCallback
from libarena.schedule.traces import read_trace


def trace_pairs(trace: str | os.PathLike[str], cluster: ClusterSpec, seed: int = 0, skip_bad_rows: bool = False) -> list[tuple[str, int]]:
    """The (model, global batch) pairs a trace's jobs use (after adaptation, for ElasticFlow/ITP traces)."""
    parsed = read_trace(trace, gpu_types=cluster.gpu_types, seed=seed, skip_bad_rows=skip_bad_rows)
    return sorted({(job.model, job.global_batch) for job in parsed.jobs})


def build_perf_table_for_trace(trace: str | os.PathLike[str], cluster: ClusterSpec, output: str | os.PathLike[str],
                               config: Any = None, seed: int = 0, skip_bad_rows: bool = False,
                               inputs: list[dict[str, Any]] | None = None, log: Callable[[str], None] | None = None,
                               progress: ProgressCallback | None = None) -> Any:
    from libarena.profile.perf_build import PerfBuildConfig, build_perf_table

    pairs = trace_pairs(trace, cluster, seed, skip_bad_rows)
    return build_perf_table(pairs, cluster, output, config or PerfBuildConfig(), inputs=inputs, log=log, progress=progress)
