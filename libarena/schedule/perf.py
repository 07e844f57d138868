"""Fast performance lookup built from a ``perf_table``: (model, batch) -> throughput per view, GPU type, count.

Allocations are powers of two (buddy allocation), so a model's numbers are a small dense matrix per view,
indexed ``[gpu_type_index, count_index]`` with ``num_gpus = 2 ** count_index``; 0 means "cannot run that
way" (absent from the table, or not fitting in memory). Rules:

- Several rows for the same (model, batch, type, count, view) (several grids or plans): the best one is kept,
  as Arena "traverses relevant grids for the best-performing one" (§3.5).
- Node layout: the simulator always places a job on the fewest nodes (buddy allocation), so only rows with
  ``num_nodes`` 0 (unspecified) or equal to that fewest-nodes layout are used.
- Rows of GPU types absent from the cluster, or with a count that is not a power of two, are ignored.
- Execution truth is the best known runnable plan of a config: the largest of its ``ap``, ``arena`` and ``dp``
  rows. AP's search space contains the other two plans, so ``ap`` is the truth where it is the largest (in
  the shipped tables, everywhere it is present); a proxy or DP row above it is a plan the search missed, and
  a job running it does at least that well.
- ``dp-linear`` (Sia's bootstrapped estimate, §2.3): per GPU type, the dp throughput at the smallest count
  that fits, extrapolated linearly (thr_n = thr_n0 x n / n0), offered only where the table has the config.
- ``truth``: the execution truth itself, for a policy that profiles nothing and learns only from running a
  job whether its configuration fits (FCFS executing with adaptive parallelism).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec
from libarena.schedule.entities.allocation import count_index

TABLE_VIEWS = ("arena", "dp", "ap")
DECISION_VIEWS = ("arena", "dp", "ap", "dp-linear", "truth")


@dataclass
class ModelPerf:
    model: str
    global_batch: int
    #: view -> array [num_types, num_counts] of samples/s (0 = cannot run)
    views: dict[str, np.ndarray]
    truth: np.ndarray

    def view(self, name: str) -> np.ndarray:
        return self.views[name]


class PerfLookup:
    def __init__(self, table: pa.Table, cluster: ClusterSpec, source: str = "perf table"):
        self.source = source
        self.gpu_types: list[str] = list(cluster.gpu_types)
        self.type_index = {t: i for i, t in enumerate(self.gpu_types)}
        self.capacity = np.array([cluster.num_gpus(t) for t in self.gpu_types], dtype=np.int64)
        self.gpus_per_node = np.array([cluster.gpus_per_node(t) for t in self.gpu_types], dtype=np.int64)
        max_cap = int(self.capacity.max())
        self.num_counts = max(1, int(np.floor(np.log2(max_cap))) + 1)
        self.counts = np.array([1 << c for c in range(self.num_counts)], dtype=np.int64)
        #: [type, count index]: whether the type has that many GPUs (a type's columns run to the largest type's counts)
        self.usable = self.counts[None, :] <= self.capacity[:, None]
        self._models: dict[tuple[str, int], ModelPerf] = {}
        self._views_present: dict[tuple[str, int], set[str]] = {}
        #: (model, batch, type index, count index, view) -> the pipeline degree of the row that gave its throughput
        self._pipeline_degree: dict[tuple[str, int, int, int, str], int] = {}
        from libarena.artifacts import get_kind
        from libarena.artifacts.io import conform_table

        self._build(conform_table(get_kind("perf_table"), table, source=source, fill_defaults=True))

    # ------------------------------------------------------------------------------------------------
    def _build(self, table: pa.Table) -> None:
        cols = {name: table.column(name).to_pylist() for name in (
            "model", "global_batch", "gpu_type", "num_gpus", "num_nodes", "view", "iter_time_s", "throughput",
            "fits_in_memory", "pipeline_degree")}
        n_rows = table.num_rows
        from libarena.hardware import get_gpu

        type_names: dict[str, int | None] = {}
        for r in range(n_rows):
            raw_type = cols["gpu_type"][r]
            if raw_type not in type_names:
                try:
                    type_names[raw_type] = self.type_index.get(get_gpu(str(raw_type)).name)
                except ArenaError as exc:
                    # a problem of the table, not of the trace rows that will find no configuration
                    raise ArenaError(f"{self.source}: row {r + 1}, column 'gpu_type': {exc}") from None
            ti = type_names[raw_type]
            view = cols["view"][r]
            if view not in TABLE_VIEWS:
                raise ArenaError(f"{self.source}: row {r + 1}, column 'view': unknown view {view!r} "
                                 f"(known: {', '.join(TABLE_VIEWS)})")
            key = (str(cols["model"][r]), int(cols["global_batch"][r]))
            self._views_present.setdefault(key, set()).add(view)
            if key not in self._models:
                self._models[key] = ModelPerf(key[0], key[1], {
                    v: np.zeros((len(self.gpu_types), self.num_counts)) for v in TABLE_VIEWS}, np.zeros(0))
            if ti is None:
                continue
            n = cols["num_gpus"][r]
            if n is None or n < 1 or n & (n - 1):
                continue
            c = count_index(n)
            if c >= self.num_counts:
                continue
            gpn = int(self.gpus_per_node[ti])
            fewest_nodes = max(1, -(-n // gpn))
            nodes = cols["num_nodes"][r] or 0
            if nodes not in (0, fewest_nodes):
                continue
            if cols["fits_in_memory"][r] is False:
                continue
            thr = cols["throughput"][r]
            if thr is None or not np.isfinite(thr):
                it = cols["iter_time_s"][r]
                if it is None or not it > 0:
                    raise ArenaError(f"{self.source}: row {r + 1}, column 'iter_time_s': must be > 0 "
                                     f"when throughput is absent, got {it!r}")
                thr = key[1] / it
            if thr < 0:
                raise ArenaError(f"{self.source}: row {r + 1}, column 'throughput': negative value {thr}")
            arr = self._models[key].views[view]
            if thr > arr[ti, c]:
                arr[ti, c] = thr
                self._pipeline_degree[(*key, ti, c, view)] = int(cols["pipeline_degree"][r] or 1)
        for perf in self._models.values():
            perf.truth = np.maximum.reduce([perf.views[v] for v in TABLE_VIEWS])
            perf.views["dp-linear"] = self._linear_estimate(perf.views["dp"], perf.truth)
            perf.views["truth"] = perf.truth

    def _linear_estimate(self, dp: np.ndarray, truth: np.ndarray) -> np.ndarray:
        est = np.zeros_like(dp)
        for t in range(dp.shape[0]):
            fits = np.flatnonzero(dp[t] > 0)
            if fits.size == 0:
                continue
            c0 = int(fits[0])
            for c in range(c0, dp.shape[1]):
                if truth[t, c] > 0:
                    est[t, c] = dp[t, c0] * (1 << (c - c0))
        return est

    def extend(self, table: pa.Table) -> None:
        """Add rows measured after construction (the live scheduler profiles a new (model, batch) on arrival).
        Rows of a (model, batch) already present only raise its numbers where they are better."""
        import copy

        from libarena.artifacts import get_kind
        from libarena.artifacts.io import conform_table

        # all or nothing: a row refused part-way would leave a pair half built (present, without its views)
        kept = copy.deepcopy((self._models, self._views_present, self._pipeline_degree))
        try:
            self._build(conform_table(get_kind("perf_table"), table, source=self.source, fill_defaults=True))
        except BaseException:
            self._models, self._views_present, self._pipeline_degree = kept
            raise

    # ------------------------------------------------------------------------------------------------
    def pairs(self) -> list[tuple[str, int]]:
        """Every (model, global batch) the table has, sorted."""
        return sorted(self._models)

    def has(self, model: str, global_batch: int) -> bool:
        return (model, global_batch) in self._models

    def get(self, model: str, global_batch: int) -> ModelPerf:
        return self._models[(model, global_batch)]

    def submitted_rate(self, model: str, global_batch: int, gpu_type: str, num_gpus: int) -> float | None:
        """Iterations/s of a job as submitted: the execution truth on its type at the smallest count of at least
        ``num_gpus`` that runs (None where none does): what an adapted trace's iteration counts are made from."""
        from libarena.schedule.entities import count_index_at_least

        if not self.has(model, global_batch) or gpu_type not in self.type_index:
            return None
        truth = self.get(model, global_batch).truth[self.type_index[gpu_type]]
        runnable = [k for k in range(count_index_at_least(num_gpus), truth.size) if truth[k] > 0]
        return float(truth[runnable[0]]) / global_batch if runnable else None

    def pipeline_degree(self, model: str, global_batch: int, gpu_type: str, num_gpus: int, view: str = "arena") -> int | None:
        """The pipeline degree of the plan behind a view's throughput on (type, count) (None: no such row)."""
        ti = self.type_index.get(gpu_type)
        if ti is None or num_gpus < 1 or num_gpus & (num_gpus - 1):
            return None
        return self._pipeline_degree.get((model, global_batch, ti, count_index(num_gpus), view))

    def lacking(self, jobs: Sequence[Any], trace_source: str, *, skip: bool = False) -> set[tuple[str, int]]:
        """The (model, global batch) pairs of ``jobs`` (trace job specs) that the table lacks entirely. Unless
        ``skip``, any is an error listing every such pair and its trace rows; with ``skip`` (--skip-bad-rows) the
        caller leaves those jobs out, each with :meth:`lacking_message`."""
        missing: dict[tuple[str, int], list[int]] = {}
        for job in jobs:
            if (job.model, job.global_batch) not in self._models:
                missing.setdefault((job.model, job.global_batch), []).append(job.row)
        if missing and not skip:
            listed = ", ".join(f"{m} (batch {b}; rows {_row_list(r)})" for (m, b), r in sorted(missing.items()))
            raise ArenaError(f"{self.source} lacks {len(missing)} (model, global batch) used by {trace_source}: {listed}")
        return set(missing)

    def lacking_message(self, job: Any, trace_source: str) -> str:
        """The skipped-row line of a job whose (model, global batch) the table lacks."""
        return (f"{trace_source}: row {job.row}, column 'model_name': {job.model} (batch {job.global_batch}) "
                f"is not in {self.source}")

    def check_view(self, view: str, pairs: list[tuple[str, int]]) -> None:
        if view == "truth":
            return  # every row is part of the truth
        base = "dp" if view == "dp-linear" else view
        lacking = sorted({p for p in pairs if base not in self._views_present.get(p, set())})
        if lacking:
            listed = ", ".join(f"{m} (batch {b})" for m, b in lacking[:20])
            more = f" and {len(lacking) - 20} more" if len(lacking) > 20 else ""
            raise ArenaError(f"{self.source} has no '{base}' view rows for {listed}{more} "
                             f"(needed by the decision view {view!r})")


def _row_list(rows: list[int]) -> str:
    shown = ", ".join(map(str, rows[:5]))
    return shown + (f" and {len(rows) - 5} more" if len(rows) > 5 else "")


def load_perf(path: str | os.PathLike[str], cluster: ClusterSpec) -> PerfLookup:
    from libarena.artifacts import read_table

    from libarena.artifacts.kinds.perf_table import check_perf_table

    art = read_table(path, "perf_table")
    check_perf_table(art.table, art.source)
    return PerfLookup(art.table, cluster, source=art.source)
