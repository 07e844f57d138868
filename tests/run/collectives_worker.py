"""Compile one whole-model stage of a zoo model as arena-run's executor builds it (dp x tp on host devices) and
print the collectives XLA's SPMD partition emits in its forward, backward and update, as one JSON line."""

from __future__ import annotations

import json
import re
import sys

import numpy as np


def main(model_name: str, dp: int, tp: int) -> None:
    import jax

    from libarena.models import get_model
    from libarena.models.training import OptimizerConfig
    from libarena.plan.types import StagePlan
    from libarena.run import distributed
    from libarena.run.executor import stage_runtime

    model = get_model(model_name)
    stage = StagePlan(index=0, first_cluster=0, end_cluster=1, num_gpus=dp * tp, dp=dp, tp=tp, zero=False, gpu_offset=0)
    runtime = stage_runtime(model, stage, range(len(model.units)), jax.devices()[: dp * tp], 8, "bf16", OptimizerConfig(),
                            True, True)
    params = runtime.fresh_params(model, 0)
    batch = distributed.place_tree(dict(model.synthetic_samples(np.arange(8), 0)),
                                   {k: runtime.batch_sharding for k in model.synthetic_samples(np.arange(8), 0)})
    _, kept = runtime.forward(params, batch)
    grads = runtime.zero_grads()
    cotangent = distributed.place(np.float32(1.0), runtime.replicated)
    texts = {
        "forward": runtime.forward.lower(params, batch).compile().as_text(),
        "backward": runtime.backward.lower(params, batch, kept, cotangent, grads).compile().as_text(),
        "update": runtime.update.lower(params, runtime.init_opt(params), grads, np.float32(1.0)).compile().as_text(),
    }
    kinds = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    counts = {phase: {k: len(re.findall(rf"\s{k}(?:-start)?\(", text)) for k in kinds} for phase, text in texts.items()}
    print(json.dumps({"model": model_name, "dp": dp, "tp": tp, "collectives": counts}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
