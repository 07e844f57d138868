"""How XLA:CPU host devices share a host: the evidence behind bench_profile's 2-device error.

The profiler times each stage in a process with one device pinned to one core; a 2-device plan is measured in
a process whose two devices share two cores (the ``pinned`` layout). Fresh interpreters under that layout: one
device on one core (the profiler's condition), and two devices pinned to one core and to two:

* every distinct stage of the 2-device plans, its micro-batch (forward + backward) alone on device 0 (in each
  interpreter): the same stage takes longer in a 2-device process than in the profiler's 1-device one; with
  two cores it runs faster than on one -- a device's computation is not confined to one core, it spreads over
  the process's intra-op pool -- which a pipeline's lone bottleneck stage enjoys and the profile does not see;
* the 2-device data-parallel plan's forward + backward through the runtime's executor (both devices busy at
  once, one call each, no per-micro-batch host work), against its stage in the profiler's process.

No target: the file records what the host does (bench_profile's results are read against it).

    .venv/bin/python -m bench sharing          # alone; results in bench/results/sharing.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from libarena.artifacts import write_json
from libarena.errors import ArenaError

MODELS = ("gpt__tiny", "gpt__small")
DEVICES = 2
#: lower quartile of SAMPLES timed runs of BURST back-to-back dispatches each, after WARMUP runs
SAMPLES, BURST, WARMUP = 15, 2, 2
REFUSALS = (ArenaError,)


def _log(message: str) -> None:
    print(f"[bench_sharing] {message}", file=sys.stderr, flush=True)


def _timed(region: Any) -> dict[str, float]:
    """Lower quartile of per-dispatch wall seconds, and process CPU over wall (all samples), of ``region``."""
    from libarena.profile.profiler import _time_burst
    from libarena.profile.timers import HostTimer

    timing = _time_burst(HostTimer(), region, WARMUP, SAMPLES, BURST)
    return {"seconds": timing.lower_quartile, "cpu_per_wall": sum(timing.cpu_samples) / sum(timing.samples)}


def stage_times(finder: Any) -> list[dict[str, Any]]:
    """Every distinct stage of the plan set's 2-device plans (and of its 2-device data-parallel plan), its
    micro-batch alone on this process's first device."""
    import jax

    from libarena.plan import DP_PLAN_ID
    from libarena.profile.stage import build_stage_executables

    grid = next(g for g in finder.grids.values() if g.num_gpus == DEVICES)
    plans = [p for p in finder.planset.plans() if p.grid.num_gpus == DEVICES]
    plans.append(finder.find(grid.resources.to_dict(), DP_PLAN_ID))
    in_plans: dict[Any, set[str]] = {}  # insertion order: stages in the order the plans first use them
    for plan in plans:
        for spec in finder.job.stage_specs(plan):
            in_plans.setdefault(spec, set()).add(plan.plan_id)
    out = []
    for spec, plan_ids in in_plans.items():
        execs = build_stage_executables(spec, device=jax.devices()[0], with_optimizer=False)
        out.append({"units": [spec.start, spec.stop], "micro_batch": spec.micro_batch, "in_plans": sorted(plan_ids),
                    **_timed(execs.run_microbatch)})
    return out


def data_parallel_forward_backward(finder: Any) -> dict[str, float]:
    """The 2-device data-parallel plan's forward + backward (one micro-batch, both devices at once) through the
    runtime's executor."""
    import jax
    import numpy as np

    from libarena.plan import DP_PLAN_ID
    from libarena.profile.measure import _run_plan
    from libarena.run import distributed
    from libarena.run.executor import PipelineExecutor
    from libarena.run.train import batch_for_step

    job = finder.job
    grid = next(g for g in finder.grids.values() if g.num_gpus == DEVICES)
    run_plan = _run_plan(job, finder.find(grid.resources.to_dict(), DP_PLAN_ID), jax.devices())
    executor = PipelineExecutor(job.model, run_plan, jax.devices()[:DEVICES], job.dtype)
    executor.init_state(0)
    stage = executor.stages[0]
    batch = batch_for_step(job.model, 0, run_plan.global_batch, 0)
    placed = distributed.place_tree(batch, {k: stage.batch_sharding for k in batch})
    cotangent = distributed.place(np.float32(1.0), stage.replicated)
    state = {"grads": stage.zero_grads()}

    def forward_backward() -> Any:
        _, residuals = stage.forward(executor.params[0], placed)
        state["grads"] = stage.backward(executor.params[0], placed, residuals, cotangent, state["grads"])  # donated
        return state["grads"]

    return _timed(forward_backward)


def _child(request: dict[str, Any]) -> dict[str, Any]:
    from libarena.profile.host import host_window, snapshot
    from libarena.profile.measure import _PlanFinder

    before = snapshot()
    out: dict[str, Any] = {}
    for model, plans_path in request["plans"].items():
        finder = _PlanFinder(plans_path)
        out[model] = {"stages": stage_times(finder)}
        if request["devices"] >= DEVICES:
            out[model]["data_parallel"] = data_parallel_forward_backward(finder)
        _log(f"{model} on {request['cores']} core(s): {len(out[model]['stages'])} stages")
    return {"models": out, "host": host_window(before, snapshot())}


def compare(one_device: dict[str, Any], one_core: dict[str, Any], two_cores: dict[str, Any]) -> dict[str, Any]:
    """Per model and stage: its time alone in the profiler's 1-device process and in the 2-device process on one
    and on two cores; the data-parallel plan's forward + backward on two devices at once against its stage in
    the profiler's process."""
    out = {}
    for model, two in two_cores["models"].items():
        stages = []
        for p, a, b in zip(one_device["models"][model]["stages"], one_core["models"][model]["stages"], two["stages"], strict=True):
            stages.append({"units": a["units"], "micro_batch": a["micro_batch"], "in_plans": a["in_plans"],
                           "profiler_process_s": p["seconds"], "one_core_s": a["seconds"], "two_cores_s": b["seconds"],
                           "two_cores_cpu_per_wall": b["cpu_per_wall"], "speedup_two_cores": a["seconds"] / b["seconds"],
                           "two_cores_over_profiler": b["seconds"] / p["seconds"]})
        dp_stage = next(s for s in stages if "dp" in s["in_plans"])
        together = two["data_parallel"]["seconds"]
        out[model] = {"stages": stages, "data_parallel": {
            "two_devices_at_once_s": together, "stage_alone_two_cores_s": dp_stage["two_cores_s"],
            "stage_in_profiler_process_s": dp_stage["profiler_process_s"], "ratio": together / dp_stage["profiler_process_s"]}}
    return out


def run(results_dir: Path, models: tuple[str, ...] = MODELS) -> bool:
    from bench.laid_out import laid_out_run, run_laid_out_child
    from libarena.profile.host import STARTING_CORES

    with laid_out_run("bench_sharing", models, DEVICES, _log) as (timed, request, tmp):
        profiler = run_laid_out_child("bench.bench_sharing", request, STARTING_CORES[:1], 1, tmp)
        one = run_laid_out_child("bench.bench_sharing", request, STARTING_CORES[:1], DEVICES, tmp)
        two = run_laid_out_child("bench.bench_sharing", request, STARTING_CORES[:DEVICES], DEVICES, tmp)
    results = compare(profiler, one, two)
    payload = {"models": results, "setup": {"devices": DEVICES, "layout": "pinned", "samples": SAMPLES, "burst": BURST,
                                            "statistic": "lower quartile"},
               "protocol": timed.protocol(profiler_process=profiler["host"], one_core=one["host"], two_cores=two["host"])}
    write_json(results_dir / "sharing.json", payload)
    for model, r in results.items():
        speedups = [s["speedup_two_cores"] for s in r["stages"]]
        over = [s["two_cores_over_profiler"] for s in r["stages"]]
        _log(f"{model}: stages alone {min(speedups):.2f}-{max(speedups):.2f}x faster on two cores than on one, "
             f"{min(over):.2f}-{max(over):.2f}x the profiler's time; data-parallel forward + backward on two devices at once "
             f"{r['data_parallel']['ratio']:.2f}x its stage in the profiler's process")
    return True


if __name__ == "__main__":
    from bench.laid_out import laid_out_main

    laid_out_main(_child, run)
