"""Direct measurement: run a plan for real on the available devices, the ground truth for the estimate.

Until the ``libarena.run`` executor exists, a plan runs here as a multi-device JAX pipeline: each stage
is jitted on its own (dp, tp) mesh of devices with its parameters sharded by their logical axes (XLA's
SPMD partitioner inserts the tensor-parallel and data-parallel collectives), activations move between
the stages' meshes with device_put, micro-batches are dispatched in 1F1B order per stage, and every
stage takes its optimizer step once per iteration. Iteration time is the wall clock of whole iterations
after warm-up; the cost is that run's wall time times the devices the plan occupies.

``measure_in_subprocess`` runs it in a fresh interpreter with ``--xla_force_host_platform_device_count``
set (the only way to get several host devices), reading and writing plain JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from libarena.errors import ArenaError
from libarena.profile.plans_input import PlanInputs, PlanRecord
from libarena.profile.stage import EXPERT_AXIS, TP_AXES
from libarena.profile.subprocess_devices import run_module_with_devices


def one_f_one_b_order(num_stages: int, num_microbatches: int) -> list[list[tuple[str, int]]]:
    """Per stage, the 1F1B sequence of ("F"|"B", micro-batch) operations."""
    orders = []
    for j in range(num_stages):
        warm = min(num_stages - j - 1, num_microbatches)
        ops = [("F", k) for k in range(warm)]
        f, b = warm, 0
        while b < num_microbatches:
            if f < num_microbatches:
                ops.append(("F", f))
                f += 1
            ops.append(("B", b))
            b += 1
        orders.append(ops)
    return orders


def _partition_spec(shape: tuple[int, ...], axes: tuple | None, dp: int, tp: int) -> Any:
    from jax.sharding import PartitionSpec

    if axes is None:
        return PartitionSpec()
    spec = []
    for dim, axis in zip(shape, axes, strict=True):
        if axis in TP_AXES and tp > 1 and dim % tp == 0 and "tp" not in spec:
            spec.append("tp")
        elif axis == EXPERT_AXIS and dp > 1 and dim % dp == 0 and "dp" not in spec:
            spec.append("dp")
        else:
            spec.append(None)
    return PartitionSpec(*spec)


class _Stage:
    def __init__(self, inputs: PlanInputs, plan: PlanRecord, j: int, devices: list[Any], seed: int):
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        from libarena.models.training import OptimizerConfig, apply_units, compute_dtype, init_params

        model = inputs.model
        bounds = list(plan.stage_boundaries) + [len(inputs.clusters)]
        self.start, self.stop = inputs.cluster_unit_range(bounds[j], bounds[j + 1])
        self.first, self.last = self.start == 0, self.stop == len(model.units)
        dp, tp = plan.dp_per_stage[j], plan.tp_per_stage[j]
        offset = plan.offsets()[j]
        mesh_devices = np.array(devices[offset : offset + dp * tp], dtype=object).reshape(dp, tp)
        self.mesh = Mesh(mesh_devices, ("dp", "tp"))
        self.batch_sharding = NamedSharding(self.mesh, PartitionSpec("dp"))
        dtype = compute_dtype(inputs.dtype)
        params = init_params(model, seed, range(self.start, self.stop))
        axes = [model.param_axes(i) for i in range(self.start, self.stop)]
        self.param_shardings = [
            jax.tree.map(lambda p, a: NamedSharding(self.mesh, _partition_spec(p.shape, a, dp, tp)), ps, ax)
            for ps, ax in zip(params, axes, strict=True)
        ]
        self.params = jax.device_put(params, self.param_shardings)
        self.grad_zero = jax.tree.map(lambda p: np.zeros(p.shape, p.dtype), params)
        start, stop, first = self.start, self.stop, self.first
        tx = OptimizerConfig().build()
        self.opt_state = jax.jit(tx.init)(self.params)

        def forward(p: Any, carry: Any, batch: Any) -> Any:
            if first:
                return jax.vjp(lambda q: apply_units(model, q, None, batch, start, stop, dtype), p)
            return jax.vjp(lambda q, c: apply_units(model, q, c, batch, start, stop, dtype), p, carry)

        def backward(residuals: Any, cotangent: Any, acc: Any) -> Any:
            grads = residuals(cotangent)
            acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads[0])
            return (acc, None) if first else (acc, grads[1])

        def update(p: Any, g: Any, state: Any) -> Any:
            import optax

            updates, state = tx.update(g, state, p)
            return optax.apply_updates(p, updates), state

        self.forward = jax.jit(forward)
        self.backward = jax.jit(backward, donate_argnums=(2,))
        self.update = jax.jit(update, donate_argnums=(0, 2))

    def zero_grads(self) -> Any:
        import jax

        return jax.device_put(self.grad_zero, self.param_shardings)


def measure_plan(inputs: PlanInputs, plan: PlanRecord, devices: list[Any], warmup: int = 2, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Run ``plan`` for real on ``devices``; iteration time (median of ``repeats``) and device-seconds."""
    import jax
    import jax.numpy as jnp

    if plan.grid.num_gpus > len(devices):
        raise ArenaError(f"plan {plan.plan_id} needs {plan.grid.num_gpus} devices, {len(devices)} available")
    t_start = time.perf_counter()
    s, B = plan.pipeline_degree, plan.num_microbatches
    stages = [_Stage(inputs, plan, j, devices, seed) for j in range(s)]
    mb_global = plan.grid.global_batch // B
    if mb_global * B != plan.grid.global_batch:
        raise ArenaError(f"plan {plan.plan_id}: global batch {plan.grid.global_batch} is not a multiple of {B} micro-batches")
    model = inputs.model
    samples = model.synthetic_samples(np.arange(plan.grid.global_batch), seed, inputs.seq_len)
    # Every stage reads the batch (first: inputs, last: targets), each on its own mesh.
    batches = [
        [jax.device_put({k: v[k0 : k0 + mb_global] for k, v in samples.items()}, st.batch_sharding) for k0 in range(0, plan.grid.global_batch, mb_global)]
        for st in stages
    ]
    orders = one_f_one_b_order(s, B)

    def iteration() -> Any:
        grads = [st.zero_grads() for st in stages]
        acts: dict[tuple[int, int], Any] = {}  # (stage, mb) -> activation entering the stage
        cts: dict[tuple[int, int], Any] = {}  # (stage, mb) -> gradient of the stage's output
        residuals: dict[tuple[int, int], Any] = {}
        pos = [0] * s
        remaining = sum(len(o) for o in orders)
        while remaining:
            progressed = False
            for j, st in enumerate(stages):
                if pos[j] >= len(orders[j]):
                    continue
                op, k = orders[j][pos[j]]
                if op == "F":
                    if not st.first and (j, k) not in acts:
                        continue
                    out, res = st.forward(st.params, acts.pop((j, k), None), batches[j][k])
                    residuals[(j, k)] = res
                    if not st.last:
                        acts[(j + 1, k)] = jax.device_put(out, stages[j + 1].batch_sharding)
                    else:
                        cts[(j, k)] = jnp.ones((), out.dtype)
                else:
                    if (j, k) not in cts:
                        continue
                    grads[j], dcarry = st.backward(residuals.pop((j, k)), cts.pop((j, k)), grads[j])
                    if not st.first:
                        cts[(j - 1, k)] = jax.device_put(dcarry, stages[j - 1].batch_sharding)
                pos[j] += 1
                remaining -= 1
                progressed = True
            if not progressed:
                raise RuntimeError("1F1B dispatch deadlocked (bug)")
        outs = []
        for j, st in enumerate(stages):
            st.params, st.opt_state = st.update(st.params, grads[j], st.opt_state)
            outs.append(st.params)
        return outs

    t_compile = time.perf_counter()
    # Two warm-up iterations: the second one sees the optimizer's output shardings and compiles for them.
    for _ in range(max(2, warmup)):
        jax.block_until_ready(iteration())
    warm_s = time.perf_counter() - t_compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(iteration())
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_start
    return {
        "plan_id": plan.plan_id,
        "num_gpus": plan.grid.num_gpus,
        "iter_time_s": float(statistics.median(times)),
        "iter_time_min_s": float(min(times)),
        "samples_s": times,
        "warmup_s": warm_s,
        "wall_s": wall,
        "device_s": wall * plan.grid.num_gpus,
    }


# --------------------------------------------------------------------------------------------------
# Subprocess with N host devices


def measure_in_subprocess(
    plans_path: str | Path,
    plan_ids: list[tuple[dict[str, Any], str]],
    num_devices: int,
    platform: str = "cpu",
    warmup: int = 2,
    repeats: int = 3,
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
        result = measure_plan(inputs, plan, devices, request["warmup"], request["repeats"])
        result["grid"] = grid_dict
        out.append(result)
        print(f"measured {plan_id}: {result['iter_time_s'] * 1e3:.2f} ms/iteration", file=sys.stderr, flush=True)
    write_json(result_path, out)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
