"""Direct measurement: run plans for real through the runtime's executor, the ground truth for the estimate.

Every plan runs through ``libarena.run.measure_plan`` -- the same ``PipelineExecutor`` arena-run trains
with (per-stage meshes, GSPMD collectives, 1F1B dispatch, optimizer step) -- so the estimate is compared
with what the runtime really does per step, at the same micro-batch count, dtype and plan. The measured
iteration time is the median of ``repeats`` steady-state steps after ``warmup`` steps (the first compiles);
the cost is the measurement's whole wall time (compilation included) times the devices the plan holds,
with the compilation share reported separately.

On a host, N devices exist only when XLA is told so before JAX starts: ``measure_in_subprocess`` runs the
plans in a fresh interpreter with ``--xla_force_host_platform_device_count=N``, exchanging plain JSON.
``MeasureSession`` keeps such an interpreter, and the plans' executors, alive between chunks of timed steps,
so that a benchmark can interleave them with the estimate side's timings (ABAB) on a shared host.
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
from libarena.profile.subprocess_devices import DeviceChild, run_module_with_devices, serve_requests


def _run_plan(job: Any, plan: ParallelPlan, devices: list[Any]) -> Any:
    """The runtime's RunPlan of ``plan`` (checked against the devices and the plans' sequence length)."""
    from libarena.run import RunPlan

    if plan.grid.num_gpus > len(devices):
        raise ArenaError(f"plan {plan.plan_id} needs {plan.grid.num_gpus} devices, {len(devices)} available")
    default_shapes = job.model.batch_shapes(1, None)
    if job.seq_len is not None and job.model.batch_shapes(1, job.seq_len) != default_shapes:
        raise ArenaError(f"plan {plan.plan_id}: the runtime trains at the model's own sequence length, the plans use {job.seq_len}")
    return RunPlan.from_plan(plan, job.layout, job.model)


def measure_one(job: Any, plan: ParallelPlan, devices: list[Any], warmup: int = 2, repeats: int = 5, seed: int = 0,
                stage_times: bool = False) -> dict[str, Any]:
    """Run ``plan`` of ``job`` (a profiler ProfiledJob) with the runtime's executor on ``devices``: steady-state
    step time and device-seconds; with ``stage_times`` also each stage's busy seconds in one more step run task
    by task (synchronised after each: where a step's time goes, not part of the step time)."""
    from libarena.run import measure_plan, schedstat

    m = measure_plan(
        job.model, _run_plan(job, plan, devices), warmup=max(1, warmup), steps=repeats,
        devices=devices[: plan.grid.num_gpus], dtype=job.dtype, seed=seed, profile_stages=stage_times,
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
        # the dispatching thread's CPU per step (median): the step's calls are all issued by it
        "dispatch_cpu_s": float(statistics.median(m.dispatch_cpu_s)) if m.dispatch_cpu_s else None,
        # ... and how long it waited for a core per step (median; None where the kernel does not say)
        "dispatch_wait_s": schedstat.median_wait(m.dispatch_wait_s),
        **({"stage_busy_s": list(m.stage_time_s)} if stage_times else {}),
    }


def measure_in_subprocess(
    plans_path: str | Path,
    plan_ids: list[tuple[dict[str, Any], str]],
    num_devices: int,
    platform: str = "cpu",
    warmup: int = 2,
    repeats: int = 5,
    timeout_s: float = 3600.0,
    stage_times: bool = False,
) -> list[dict[str, Any]]:
    """Measure plans (given as (grid dict, plan_id); plan_id ``dp`` = the grid's pure DP plan) in a fresh
    interpreter with ``num_devices`` host devices (CPU) or the machine's accelerators (``stage_times``: see
    :func:`measure_one`)."""
    request = {"plans": str(plans_path), "plans_to_measure": plan_ids, "warmup": warmup, "repeats": repeats,
               "stage_times": stage_times}
    return run_module_with_devices("libarena.profile.measure", request, platform=platform, num_devices=num_devices,
                                   timeout_s=timeout_s, what="direct measurement")


class _PlanFinder:
    """Plans of a plan set by (grid dict, plan id); ``dp`` is a grid's pure data-parallel plan."""

    def __init__(self, plans_path: str) -> None:
        from libarena.plan import read_plans
        from libarena.profile.profiler import ProfiledJob

        self.path = plans_path
        self.planset = read_plans(plans_path, require_costs=False)
        self.job = ProfiledJob.of(self.planset)
        self.by_key = {(p.resources, p.plan_id): p for p in self.planset.plans()}
        self.grids = {g.grid.resources: g.grid for g in self.planset.grids}

    def find(self, resources_dict: dict[str, Any], plan_id: str) -> ParallelPlan:
        from libarena.plan import data_parallel_plan

        resources = Resources(**resources_dict)
        if plan_id == DP_PLAN_ID and resources in self.grids:
            return data_parallel_plan(replace(self.grids[resources], pipeline_degree=1), self.job.layout.num_clusters)
        plan = self.by_key.get((resources, plan_id))
        if plan is None:
            raise ArenaError(f"plan {plan_id} of grid {resources_dict} is not in {self.path}")
        return plan


def _main(request_path: str, result_path: str) -> None:
    import jax

    from libarena.artifacts import write_json

    request = json.loads(Path(request_path).read_text())
    finder = _PlanFinder(request["plans"])
    job = finder.job
    devices = jax.devices()
    out = []
    for resources_dict, plan_id in request["plans_to_measure"]:
        plan = finder.find(resources_dict, plan_id)
        result = measure_one(job, plan, devices, request["warmup"], request["repeats"], stage_times=request.get("stage_times", False))
        result["grid"] = resources_dict
        out.append(result)
        print(f"measured {plan_id}: {result['iter_time_s'] * 1e3:.2f} ms/iteration", file=sys.stderr, flush=True)
    write_json(result_path, out)


class MeasureSession(DeviceChild):
    """A child interpreter with ``num_devices`` devices that keeps plans' executors between chunks of timed
    steps: ``prepare`` builds a plan's executor and runs its warm-up steps (compilation included), ``steps``
    times more steps of it (wall and process CPU seconds each), ``release`` frees it. One request at a time,
    one JSON line each way; a failing child raises a one-line ArenaError."""

    def __init__(self, plans_path: str | Path, num_devices: int, platform: str = "cpu", threading: Any = None) -> None:
        super().__init__("libarena.profile.measure", [str(plans_path)], num_devices, what="direct measurement",
                         platform=platform, threading=threading)

    def prepare(self, grid: dict[str, Any], plan_id: str, warmup: int = 2, seed: int = 0) -> dict[str, Any]:
        """Build ``plan_id``'s executor and run ``warmup`` steps (the first compiles): build_s, first_step_s,
        warmup_s, steady_step_s (the median of the warm-up steps after the first; the first's own time if it was
        the only one), wall_s (all of it)."""
        return self.ask({"op": "prepare", "grid": grid, "plan_id": plan_id, "warmup": warmup, "seed": seed})

    def steps(self, grid: dict[str, Any], plan_id: str, steps: int, warmup: int = 0) -> dict[str, Any]:
        """``steps`` more timed steps of a prepared plan, after ``warmup`` untimed ones (a plan that sat idle
        while other work ran steps slower at first): samples_s (wall), cpu_s (process CPU) and dispatch_cpu_s (the
        dispatching thread's CPU) per timed step, warmup_s (wall) per untimed one."""
        return self.ask({"op": "steps", "grid": grid, "plan_id": plan_id, "steps": steps, "warmup": warmup})

    def release(self, grid: dict[str, Any], plan_id: str) -> None:
        self.ask({"op": "release", "grid": grid, "plan_id": plan_id})

    def __enter__(self) -> MeasureSession:
        return self


def _serve(plans_path: str) -> None:
    """The child side of MeasureSession."""
    import time

    import jax

    from libarena.run.executor import PipelineExecutor
    from libarena.run.heap import frozen_heap
    from libarena.run.train import batch_for_step

    finder = _PlanFinder(plans_path)
    job = finder.job
    devices = jax.devices()
    running: dict[tuple[str, str], dict[str, Any]] = {}

    def key(request: dict[str, Any]) -> tuple[str, str]:
        return json.dumps(request["grid"], sort_keys=True), request["plan_id"]

    def step(state: dict[str, Any]) -> tuple[float, float, float, float | None]:
        executor, plan = state["executor"], state["run_plan"]
        batch = batch_for_step(job.model, state["position"], plan.global_batch, 0)
        state["position"] += plan.global_batch
        c0 = time.process_time()
        stats = executor.step(batch)
        return stats.step_time_s, time.process_time() - c0, stats.dispatch_cpu_s, stats.dispatch_wait_s

    def prepare(request: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        run_plan = _run_plan(job, finder.find(request["grid"], request["plan_id"]), devices)
        executor = PipelineExecutor(job.model, run_plan, devices[: run_plan.num_gpus], job.dtype)
        executor.init_state(int(request.get("seed", 0)))
        state = {"executor": executor, "run_plan": run_plan, "position": 0}
        build = time.perf_counter() - t0
        warm = [step(state)[0] for _ in range(max(1, int(request["warmup"])))]
        running[key(request)] = state
        return {"build_s": build, "first_step_s": warm[0], "warmup_s": sum(warm),
                "steady_step_s": statistics.median(warm[1:]) if len(warm) > 1 else warm[0], "wall_s": time.perf_counter() - t0}

    def steps(request: dict[str, Any]) -> dict[str, Any]:
        if key(request) not in running:
            raise ArenaError(f"plan {request['plan_id']} is not prepared")
        state = running[key(request)]
        with frozen_heap():  # the other prepared plans' executors are not this step's garbage to scan
            warm = [step(state)[0] for _ in range(int(request.get("warmup", 0)))]
            timed = [step(state) for _ in range(int(request["steps"]))]
        # the dispatching thread's own CPU (the runtime issues every call of a step from this one thread), and
        # how long it waited for a core (None where the kernel does not say)
        return {"samples_s": [t[0] for t in timed], "cpu_s": [t[1] for t in timed], "dispatch_cpu_s": [t[2] for t in timed],
                "dispatch_wait_s": [t[3] for t in timed], "warmup_s": warm}

    def release(request: dict[str, Any]) -> dict[str, Any]:
        running.pop(key(request), None)
        return {"ok": True}

    serve_requests({"prepare": prepare, "steps": steps, "release": release})


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve(sys.argv[2])
    else:
        _main(sys.argv[1], sys.argv[2])
