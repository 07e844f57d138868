"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=N: one training step of
every plan of the N-device grid vs the single-device step; prints one JSON line per plan."""

from __future__ import annotations

import json
import sys

from libarena.run.plan import simple_plan
from libarena.run.verify import check_plans
from tests.run.micro import MICRO_MODELS, TEST_OPTIMIZER

GLOBAL_BATCH = 8

#: Per device count: (model, unit boundaries, dp per stage, tp per stage, micro-batches, zero per stage).
#: Pure DP, pure TP, pure PP and hybrids; every model has 4 units.
GRIDS = {
    1: [("gpt", [0], [1], [1], 4, [0])],
    2: [("gpt", [0], [2], [1], 1, [0]), ("gpt", [0], [1], [2], 1, [0]), ("gpt", [0, 2], [1, 1], [1, 1], 2, [0, 0]),
        ("wide_resnet", [0], [1], [2], 1, [0])],
    4: [("gpt", [0, 3], [2, 1], [1, 2], 2, [1, 0]), ("moe", [0, 2], [1, 2], [2, 1], 2, [0, 1])],
    8: [("gpt", [0, 1, 2, 3], [2, 1, 1, 2], [1, 2, 2, 1], 4, [1, 0, 0, 0]), ("moe", [0, 2], [2, 1], [2, 4], 2, [1, 0])],
}


def main(num_devices: int) -> None:
    import jax

    assert len(jax.devices()) == num_devices, jax.devices()
    by_model: dict[str, list] = {}
    for name, bounds, dp, tp, micro, zero in GRIDS[num_devices]:
        by_model.setdefault(name, []).append((bounds, dp, tp, micro, zero))
    for name, specs in by_model.items():
        model = MICRO_MODELS[name]()
        plans = [simple_plan(model, GLOBAL_BATCH, b, d, t, m, z) for b, d, t, m, z in specs]
        for check in check_plans(model, plans, GLOBAL_BATCH, optimizer=TEST_OPTIMIZER):
            print(json.dumps({"model": name, "plan": check.plan_id, "loss": check.loss, "reference_loss": check.reference_loss,
                              "param_error": check.max_param_error, "moment_error": check.max_moment_error}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
