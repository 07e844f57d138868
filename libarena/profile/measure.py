"""Direct measurement: run plans for real through the runtime's executor, the ground truth for the estimate.

Every plan runs through ``libarena.run.measure_plan`` -- the same ``PipelineExecutor`` arena-run trains
with (per-stage meshes, GSPMD collectives, 1F1B dispatch, optimizer step) -- so the estimate is compared
with what the runtime really does per step, at the same micro-batch count, dtype and plan. The measured
iteration time is the median of ``repeats`` steady-state steps after ``warmup`` steps (the first compiles);
the cost is the measurement's whole wall time (compilation included) times the devices the plan holds,
with the compilation share reported separately.

On a host, N devices exist only when XLA is told so before JAX starts: ``measure_in_subprocess`` runs the
plans in a fresh interpreter with ``--xla_force_host_platform_device_count=N``, exchanging plain JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError
from libarena.plan import DP_PLAN_ID, ParallelPlan, Resources
from libarena.profile.subprocess_devices import run_module_with_devices


def measure_one(job: Any, plan: ParallelPlan, devices: list[Any], warmup: int = 2, repeats: int = 5, seed: int = 0) -> dict[str, Any]:
    """Run ``plan`` of ``job`` (a profiler ProfiledJob) with the runtime's executor on ``devices``: steady-state
    step time and device-seconds."""
    from libarena.run import RunPlan, measure_plan

    if plan.grid.num_gpus > len(devices):
        raise ArenaError(f"plan {plan.plan_id} needs {plan.grid.num_gpus} devices, {len(devices)} available")
    default_shapes = job.model.batch_shapes(1, None)
    if job.seq_len is not None and job.model.batch_shapes(1, job.seq_len) != default_shapes:
        raise ArenaError(f"plan {plan.plan_id}: the runtime trains at the model's own sequence length, the plans use {job.seq_len}")
    m = measure_plan(
        job.model, RunPlan.from_plan(plan, job.layout, job.model), warmup=max(1, warmup), steps=repeats,
        devices=devices[: plan.grid.num_gpus], dtype=job.dtype, seed=seed, profile_stages=False,
    )
    times = list(m.step_times_s)
    steady = statistics.median(times)
    return {
        "plan_id": plan.plan_id,
        "num_gpus": plan.grid.num_gpus,
        "iter_time_s": float(steady),
        "iter_time_min_s": float(min(times)),
        "samples_s": times,
        "first_step_s": m.first_step_s,
        # What the first step pays beyond a steady one: compilation (and first-touch allocation).
        "compile_s": max(0.0, m.first_step_s - steady),
        "wall_s": m.wall_s,
        "device_s": m.device_seconds,
        "runner": "libarena.run.measure_plan",
    }


def measure_in_subprocess(
    plans_path: str | Path,
    plan_ids: list[tuple[dict[str, Any], str]],
    num_devices: int,
    platform: str = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    timeout_s: float = 3600.0,
) -> list[dict[str, Any]]:
    """Measure plans (given as (grid dict, plan_id); plan_id ``dp`` = the grid's pure DP plan) in a fresh
    interpreter with ``num_devices`` host devices (CPU) or the machine's accelerators."""
    request = {"plans": str(plans_path), "plans_to_measure": plan_ids, "warmup": warmup, "repeats": repeats}
    return run_module_with_devices("libarena.profile.measure", request, platform=platform, num_devices=num_devices,
                                   timeout_s=timeout_s, what="direct measurement")


def _main(request_path: str, result_path: str) -> None:
    import jax

    from libarena.artifacts import write_json
    from libarena.plan import data_parallel_plan, read_plans
    from libarena.profile.profiler import ProfiledJob

    request = json.loads(Path(request_path).read_text())
    planset = read_plans(request["plans"], require_costs=False)
    job = ProfiledJob.of(planset)
    devices = jax.devices()
    by_key = {(p.resources, p.plan_id): p for p in planset.plans()}
    grids = {g.grid.resources: g.grid for g in planset.grids}
    out = []
    for resources_dict, plan_id in request["plans_to_measure"]:
        resources = Resources(**resources_dict)
        if plan_id == DP_PLAN_ID and resources in grids:
            plan = data_parallel_plan(replace(grids[resources], pipeline_degree=1), job.layout.num_clusters)
        else:
            plan = by_key.get((resources, plan_id))
        if plan is None:
            raise ArenaError(f"plan {plan_id} of grid {resources_dict} is not in {request['plans']}")
        result = measure_one(job, plan, devices, request["warmup"], request["repeats"])
        result["grid"] = resources_dict
        out.append(result)
        print(f"measured {plan_id}: {result['iter_time_s'] * 1e3:.2f} ms/iteration", file=sys.stderr, flush=True)
    write_json(result_path, out)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
