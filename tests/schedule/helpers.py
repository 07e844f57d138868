"""Shared helpers for the scheduler tests: tiny clusters, hand-built perf tables, generated traces."""

from __future__ import annotations

import pyarrow as pa

from libarena.hardware import ClusterSpec, cluster_from_dict
from libarena.schedule.api import Workload, make_policy, run_policy
from libarena.schedule.config import OverheadConfig, SimulatorConfig
from libarena.schedule.entities import JobSpec
from libarena.schedule.perf import PerfLookup
from libarena.schedule.traces import Trace

NO_OVERHEADS = OverheadConfig(0, 0, 0, 0, 0, 0)


def cluster(groups: list[tuple[str, int, int]], name: str = "test") -> ClusterSpec:
    return cluster_from_dict({"name": name, "node_groups": [
        {"gpu_type": t, "nodes": n, "gpus_per_node": g} for t, n, g in groups]})


def hand_table(entries: dict[tuple[str, str], dict[str, dict[int, float]]], batch: int = 256) -> pa.Table:
    """entries[(model, gpu_type)][view][num_gpus] = samples/s; a missing count means it does not fit."""
    rows: dict[str, list] = {k: [] for k in ("model", "global_batch", "gpu_type", "num_gpus", "view", "iter_time_s", "throughput")}
    for (model, gpu), views in entries.items():
        for view, by_count in views.items():
            for n, thr in by_count.items():
                rows["model"].append(model)
                rows["global_batch"].append(batch)
                rows["gpu_type"].append(gpu)
                rows["num_gpus"].append(n)
                rows["view"].append(view)
                rows["iter_time_s"].append(batch / thr)
                rows["throughput"].append(thr)
    return pa.table(rows)


def workload(specs: list[JobSpec], table: pa.Table, spec: ClusterSpec) -> Workload:
    lookup = PerfLookup(table, spec)
    return Workload(Trace("generated", "arena-ae", specs), lookup, spec, specs)


def simulate(specs, table, spec, policy: str, overheads: OverheadConfig = NO_OVERHEADS, tick_s: float = 300.0, **opts):
    w = workload(specs, table, spec)
    return run_policy(w, make_policy(policy, **opts), SimulatorConfig(tick_s=tick_s, overheads=overheads))


def job(job_id: str, model: str, iters: int, gpus: int, gpu_type: str, submit: float = 0.0, batch: int = 256,
        deadline: float | None = None, row: int = 1, priority: int | None = 1) -> JobSpec:
    return JobSpec(job_id, row, submit, model, batch, iters, gpus, gpu_type, deadline, priority)
