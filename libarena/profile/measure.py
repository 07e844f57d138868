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
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError
from libarena.profile.plans_input import PlanInputs, PlanRecord
from libarena.profile.subprocess_devices import run_module_with_devices


def plan_row(plan: PlanRecord) -> dict[str, Any]:
    """A ``plans`` row for ``plan`` (also for the profiler's own pure data-parallel plan)."""
    return {
        **plan.grid.to_dict(),
        "plan_id": plan.plan_id,
        "pipeline_degree": plan.pipeline_degree,
        "num_microbatches": plan.num_microbatches,
        "stage_boundaries": list(plan.stage_boundaries),
        "gpus_per_stage": list(plan.gpus_per_stage),
        "dp_per_stage": list(plan.dp_per_stage),
        "tp_per_stage": list(plan.tp_per_stage),
        "zero_per_stage": list(plan.zero_per_stage),
        "stage_gpu_offsets": list(plan.offsets()),
        "is_proxy": plan.is_proxy,
        "feasible": True,
    }


def measure_one(inputs: PlanInputs, plan: PlanRecord, devices: list[Any], warmup: int = 2, repeats: int = 5, seed: int = 0) -> dict[str, Any]:
    """Run ``plan`` with the runtime's executor on ``devices``: steady-state step time and device-seconds."""
    from libarena.run import measure_plan

    if plan.grid.num_gpus > len(devices):
        raise ArenaError(f"plan {plan.plan_id} needs {plan.grid.num_gpus} devices, {len(devices)} available")
    default_shapes = inputs.model.batch_shapes(1, None)
    if inputs.seq_len is not None and inputs.model.batch_shapes(1, inputs.seq_len) != default_shapes:
        raise ArenaError(f"plan {plan.plan_id}: the runtime trains at the model's own sequence length, the plans use {inputs.seq_len}")
    clusters = [{"units": list(units)} for units in inputs.clusters]
    m = measure_plan(
        inputs.model, plan_row(plan), warmup=max(1, warmup), steps=repeats, devices=devices[: plan.grid.num_gpus],
        dtype=inputs.dtype, seed=seed, profile_stages=False, clusters=clusters,
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

    from libarena.artifacts import read_table, write_json
    from libarena.profile.plans_input import GridKey, load_plan_inputs

    request = json.loads(Path(request_path).read_text())
    inputs = load_plan_inputs(read_table(request["plans"], "plans"))
    devices = jax.devices()
    by_key = {(p.grid, p.plan_id): p for p in inputs.plans}
    out = []
    for grid_dict, plan_id in request["plans_to_measure"]:
        grid = GridKey(**grid_dict)
        plan = inputs.dp_plan(grid) if plan_id == "dp" else by_key.get((grid, plan_id))
        if plan is None:
            raise ArenaError(f"plan {plan_id} of grid {grid_dict} is not in {request['plans']}")
        result = measure_one(inputs, plan, devices, request["warmup"], request["repeats"])
        result["grid"] = grid_dict
        out.append(result)
        print(f"measured {plan_id}: {result['iter_time_s'] * 1e3:.2f} ms/iteration", file=sys.stderr, flush=True)
    write_json(result_path, out)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
