"""The planner's memory model against XLA's own memory analysis of the stage executables the profiler and the
runtime run, with and without activation recomputation (tiny and small models of every family, CPU).

What is compared: the activation memory a stage keeps per micro-batch in flight, the term of the memory
model that grows with the 1F1B in-flight micro-batches and that recomputation shrinks -- the planner's
(plan.costs.StageCostModel.memory at one micro-batch in flight minus at none) against XLA's
(compiled.memory_analysis() of the stage's forward executable: its outputs, the stage's own output activation
left out, are what the runtime keeps until the micro-batch's backward). And XLA's temporary memory of the
model's forward and backward in one executable falls with recomputation."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

GLOBAL_BATCH, MICROBATCHES = 16, 4


def _bytes(tree) -> int:
    import jax

    return int(sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def stage_memory(name: str) -> list[dict]:
    """Per stage (a few blocks, the whole model) and recomputation: planner vs XLA kept bytes per micro-batch,
    and XLA's temporary bytes of the fused forward and backward. Also the figures bench_remat records."""
    import jax

    from libarena.analyze import AnalyzeConfig, analyze_model
    from libarena.hardware import get_gpu
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.models import get_model
    from libarena.models.training import abstract_params, apply_units, batch_spec, compute_dtype
    from libarena.plan import load_model_profile
    from libarena.plan.costs import StageCostModel
    from libarena.profile.stage import StageSpec, compile_stage, lower_stage

    model = get_model(name)
    n = len(model.units)
    # one unit per cluster, so a stage can be any run of units
    profile = load_model_profile(analyze_model(AnalyzeConfig(name, GLOBAL_BATCH, num_clusters=n)))
    costs = StageCostModel(profile, get_gpu("a100"), 8, AlphaBetaCommModel(), 0.9)
    dtype = compute_dtype("bf16")
    out = []
    for start, stop in ((1, 1 + max(1, (n - 2) // 2)), (0, n)):
        row = {"model": name, "units": [start, stop]}
        state = float(costs.memory(start, stop, 1, 1, False, 0, MICROBATCHES, False))  # weights, Adam, buffers
        for remat in (False, True):
            def planned(inflight: int) -> float:
                return float(costs.memory(start, stop, 1, 1, False, inflight, MICROBATCHES, remat))

            spec = StageSpec(name, start, stop, GLOBAL_BATCH // MICROBATCHES, dtype="bf16", remat=remat)
            compiled = compile_stage(lower_stage(spec, with_optimizer=False))
            forward = compiled.forward.memory_analysis()
            stage_output = _bytes(compiled.lowered.forward.out_info[0])
            key = "remat" if remat else "plain"
            row[key] = {
                "planned_kept_bytes": planned(1) - planned(0),
                "xla_kept_bytes": float(forward.output_size_in_bytes - stage_output),
                "xla_backward_temp_bytes": float(compiled.backward.memory_analysis().temp_size_in_bytes),
                # what the model adds besides the kept activations: one unit's recomputation (remat only)
                "planned_transient_bytes": planned(0) - state,
            }
            if (start, stop) == (0, n):  # the whole model's forward and backward in one executable
                fused = jax.jit(jax.grad(lambda p, b: apply_units(model, p, None, b, 0, n, dtype, remat=remat)))
                lowered = fused.lower(abstract_params(model), batch_spec(model, GLOBAL_BATCH // MICROBATCHES))
                row[key]["xla_fused_temp_bytes"] = float(lowered.compile().memory_analysis().temp_size_in_bytes)
        out.append(row)
    return out


@pytest.mark.parametrize("name", ["gpt__tiny", "gpt__small", "bert__tiny", "bert__small", "moe__tiny", "moe__small",
                                  "wide_resnet__tiny", "wide_resnet__small"])
def test_memory_model_matches_xla_with_and_without_recomputation(name: str) -> None:
    for row in stage_memory(name):
        plain, remat = row["plain"], row["remat"]
        for key, figures in (("plain", plain), ("remat", remat)):
            assert figures["planned_kept_bytes"] == pytest.approx(figures["xla_kept_bytes"], rel=0.2), (row["units"], key, figures)
        # recomputation keeps only the units' inputs: a small fraction of their activations
        assert remat["xla_kept_bytes"] < 0.2 * plain["xla_kept_bytes"], row
        if "xla_fused_temp_bytes" in plain:
            assert remat["xla_fused_temp_bytes"] < plain["xla_fused_temp_bytes"], row
