"""Glue the CLI calls: direct measurement merged into a profile result, comm table writing, show."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from libarena.artifacts import Provenance, write_table
from libarena.plan import PlanSet, write_plans
from libarena.errors import ArenaError
from libarena.profile.comm_bench import CommBenchConfig, benchmark_in_subprocess
from libarena.profile.measure import measure_in_subprocess
from libarena.profile.profiler import ProfileResult


def measure_estimates(
    planset: PlanSet,
    result: ProfileResult,
    repeats: int = 3,
    warmup: int = 1,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every profiled plan of ``result`` for real with the runtime's executor (``libarena.run.measure_plan``,
    on the local devices) and record measured time and cost.

    Fills the perf table's measured_* columns and each plan's ``measured`` entry in the metadata. Plans
    of other GPU types than the local device's are not measurable here and are left unmeasured.
    """
    log = log or (lambda message: None)
    device = result.summary["device"]
    local_type, platform = device["gpu_type"], device["platform"]
    todo = [e for e in result.estimates if not e.estimated]
    if not todo:
        log("--measure: no plan targets the local device type; nothing to measure")
        return []
    by_devices: dict[int, list[Any]] = {}
    for e in todo:
        by_devices.setdefault(e.resources.num_gpus, []).append(e)
    if platform != "cpu":
        import jax

        available = len(jax.devices(platform))
        too_big = [n for n in by_devices if n > available]
        for n in too_big:
            log(f"--measure: {n}-device plans skipped ({available} {platform} devices here)")
            del by_devices[n]
    measured: dict[tuple[Any, str], dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="arena-profile-") as tmp:
        plans_path = Path(tmp) / "plans.parquet"
        write_plans(plans_path, planset, Provenance("arena-profile --measure"))
        for n, estimates in sorted(by_devices.items()):
            wanted = [(e.resources.to_dict(), e.plan.plan_id) for e in estimates]
            log(f"--measure: running {len(wanted)} plan(s) on {n} {platform} device(s) with the runtime's executor")
            for out in measure_in_subprocess(plans_path, wanted, n, platform=platform, warmup=warmup, repeats=repeats):
                measured[(tuple(sorted(out["grid"].items())), out["plan_id"])] = out
    plans_meta = result.metadata.get("plans", [])
    for entry in plans_meta:
        key = (tuple(sorted({k: entry[k] for k in ("model", "global_batch", "gpu_type", "num_gpus", "num_nodes")}.items())), entry["plan_id"])
        if key in measured:
            entry["measured"] = measured[key]
    # perf rows: the arena/dp rows are one plan each; ap is the best plan (its own measurement).
    table = result.table
    times, costs = [], []
    for row in table.to_pylist():
        key = (tuple(sorted({k: row[k] for k in ("model", "global_batch", "gpu_type", "num_gpus", "num_nodes")}.items())), row["plan_id"])
        m = measured.get(key)
        times.append(m["iter_time_s"] if m else None)
        costs.append(m["device_s"] if m else None)
    table = table.set_column(table.schema.get_field_index("measured_iter_time_s"), "measured_iter_time_s", pa.array(times, pa.float64()))
    table = table.set_column(table.schema.get_field_index("measured_cost_device_s"), "measured_cost_device_s", pa.array(costs, pa.float64()))
    result.table = table
    errors = [
        abs(e["iter_time_s"] - e["measured"]["iter_time_s"]) / e["measured"]["iter_time_s"] for e in plans_meta if "measured" in e
    ]
    if errors:
        result.summary["measured_plans"] = len(errors)
        result.summary["mean_abs_error"] = float(sum(errors) / len(errors))
        result.metadata.update({"measured_plans": len(errors), "mean_abs_error": result.summary["mean_abs_error"]})
        log(f"--measure: {len(errors)} plans, mean absolute error of the estimate {100 * result.summary['mean_abs_error']:.1f}%")
    return list(measured.values())


def write_comm_table(path: str, config: CommBenchConfig) -> int:
    """Benchmark collectives (subprocess with the devices) and write a ``comm_table``; returns rows written."""
    from libarena.artifacts.registry import get_kind

    rows, hardware = benchmark_in_subprocess(config)
    if not rows:
        raise ArenaError("the communication benchmark produced no measurements")
    kind = get_kind("comm_table")
    table = pa.Table.from_pylist(rows, schema=kind.arrow_schema())
    write_table(path, "comm_table", table, Provenance("arena-profile comm", {"config": {**config.__dict__}}), {"hardware": hardware})
    return len(rows)


def format_perf_table(artifact: Any) -> str:
    """A text rendering of a performance table (estimate and, where measured, truth side by side)."""
    rows = artifact.table.to_pylist()
    header = ["model", "batch", "gpu", "gpus", "nodes", "view", "plan", "s", "iter_ms", "samples/s", "fits", "timer", "est", "cost_dev_s", "measured_ms", "err%"]
    lines = [header]
    for r in rows:
        measured = r.get("measured_iter_time_s")
        err = "" if measured in (None,) or not measured or math.isnan(measured) else f"{100 * (r['iter_time_s'] - measured) / measured:+.1f}"
        lines.append(
            [
                r["model"],
                str(r["global_batch"]),
                r["gpu_type"],
                str(r["num_gpus"]),
                str(r.get("num_nodes", 0)),
                r["view"],
                r.get("plan_id") or "",
                str(r.get("pipeline_degree", 1)),
                f"{1e3 * r['iter_time_s']:.3f}",
                "" if r.get("throughput") is None else f"{r['throughput']:.1f}",
                "yes" if r.get("fits_in_memory", True) else "no",
                r.get("timer") or "",
                "yes" if r.get("estimated") else "",
                "" if r.get("profiling_cost_device_s") is None else f"{r['profiling_cost_device_s']:.1f}",
                "" if not measured else f"{1e3 * measured:.3f}",
                err,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    meta = artifact.metadata or {}
    if meta.get("timer"):
        out.append(
            f"timer {meta['timer']}; comm {meta.get('comm_model', '?')}; stages {meta.get('stages_needed', '?')} needed, "
            f"{meta.get('stages_profiled', '?')} profiled, {meta.get('stages_skipped', '?')} skipped"
        )
    return "\n".join(out)
