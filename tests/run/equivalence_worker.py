"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=8: one training step of every
plan of the small grids below, each on the first N devices (N = 1, 2, 4, 8), vs the single-device step;
prints one JSON line per plan. One process for every device count: the reference step of each model is
compiled once."""

from __future__ import annotations

import json

from libarena.run.plan import simple_plan
from libarena.run.verify import check_plans
from tests.run.micro import MICRO_MODELS, TEST_OPTIMIZER

GLOBAL_BATCH = 8
NUM_DEVICES = 8

#: Per device count: (model, unit boundaries, dp per stage, tp per stage, micro-batches, zero per stage,
#: activation recomputation per stage). Pure DP, pure TP, pure PP and hybrids, with and without recomputation;
#: every model has 4 units.
GRIDS = {
    1: [("gpt", [0], [1], [1], 4, [0], [0]), ("wide_resnet", [0], [1], [1], 2, [0], [1])],
    2: [("gpt", [0], [2], [1], 1, [0], [0]), ("gpt", [0], [1], [2], 1, [0], [0]), ("gpt", [0, 2], [1, 1], [1, 1], 2, [0, 0], [0, 0]),
        ("wide_resnet", [0], [1], [2], 1, [0], [0]), ("gpt", [0, 2], [1, 1], [1, 1], 2, [0, 0], [1, 1]),
        ("bert", [0, 2], [1, 1], [1, 1], 2, [0, 0], [0, 0])],
    4: [("gpt", [0, 3], [2, 1], [1, 2], 2, [1, 0], [0, 0]), ("moe", [0, 2], [1, 2], [2, 1], 2, [0, 1], [0, 0]),
        ("moe", [0, 2], [1, 2], [2, 1], 2, [0, 1], [1, 0]), ("bert", [0, 2], [1, 2], [2, 1], 2, [0, 1], [0, 0])],
    8: [("gpt", [0, 1, 2, 3], [2, 1, 1, 2], [1, 2, 2, 1], 4, [1, 0, 0, 0], [0, 0, 0, 0]),
        ("moe", [0, 2], [2, 1], [2, 4], 2, [1, 0], [0, 0]),
        ("gpt", [0, 1, 2, 3], [2, 1, 1, 2], [1, 2, 2, 1], 4, [1, 0, 0, 0], [1, 1, 0, 1])],
}


def main() -> None:
    import jax

    devices = jax.devices()
    assert len(devices) == NUM_DEVICES, devices
    by_model: dict[str, list] = {}
    for count, specs in GRIDS.items():
        for name, bounds, dp, tp, micro, zero, remat in specs:
            by_model.setdefault(name, []).append((count, bounds, dp, tp, micro, zero, remat))
    for name, specs in by_model.items():
        model = MICRO_MODELS[name]()
        plans = [simple_plan(model, GLOBAL_BATCH, b, d, t, m, z, remat=r) for _, b, d, t, m, z, r in specs]
        counts = [spec[0] for spec in specs]
        checks = check_plans(model, plans, GLOBAL_BATCH, optimizer=TEST_OPTIMIZER, plan_devices=[devices[:n] for n in counts])
        for count, plan, check in zip(counts, plans, checks):
            assert plan.num_gpus == count
            print(json.dumps({"model": name, "plan": check.plan_id, "num_devices": count, "loss": check.loss,
                              "reference_loss": check.reference_loss, "param_error": check.max_param_error,
                              "moment_error": check.max_moment_error}), flush=True)


if __name__ == "__main__":
    main()
