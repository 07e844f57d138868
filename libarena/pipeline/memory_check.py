"""The planner's memory model checked against XLA's own memory analysis of the stage executables the profiler and
the runtime run, with and without activation recomputation (tests/profile/test_remat_memory.py, bench_remat).

What is compared: the activation memory a stage keeps per micro-batch in flight, the term of the memory model
that grows with the 1F1B in-flight micro-batches and that recomputation shrinks -- the planner's
(plan.costs.StageCostModel.memory at one micro-batch in flight minus at none) against XLA's
(compiled.memory_analysis() of the stage's forward executable: its outputs, the stage's own output activation
left out, are what the runtime keeps until the micro-batch's backward). Beside it: XLA's temporary memory of
the backward executable (the transient of one micro-batch's backward, which the model counts only as the one
unit a recomputing stage rebuilds at a time) and of the whole model's forward and backward in one executable.
"""

from __future__ import annotations

from typing import Any

#: The analysed step's global batch and its micro-batches (a stage runs micro-batches of 4 samples).
GLOBAL_BATCH, MICROBATCHES = 16, 4


def stage_memory(name: str) -> list[dict[str, Any]]:
    """Per stage (the first half of the layers, the whole model) and with and without recomputation: the
    planner's and XLA's kept bytes per micro-batch, and XLA's temporary bytes. Shape evaluation and compilation
    only (nothing runs); CPU."""
    from libarena.analyze import AnalyzeConfig, analyze_model
    from libarena.hardware import get_gpu
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.models import get_model
    from libarena.plan import PlannerConfig, load_model_profile
    from libarena.plan.costs import StageCostModel
    from libarena.profile.stage import StageSpec, xla_stage_memory

    n = len(get_model(name).units)
    # one unit per cluster, so a stage can be any run of units
    profile = load_model_profile(analyze_model(AnalyzeConfig(name, GLOBAL_BATCH, num_clusters=n)))
    gpu = get_gpu("a100")  # any type: the kept bytes compared do not depend on it
    costs = StageCostModel(profile, gpu, gpu.default_gpus_per_node, AlphaBetaCommModel(),
                           PlannerConfig().usable_memory_fraction)
    out = []
    for start, stop in ((1, 1 + max(1, (n - 2) // 2)), (0, n)):
        row: dict[str, Any] = {"model": name, "units": [start, stop]}
        state = float(costs.memory(start, stop, 1, 1, False, 0, MICROBATCHES, False))  # weights, Adam, buffers
        for remat in (False, True):
            def planned(inflight: int, remat: bool = remat) -> float:
                return float(costs.memory(start, stop, 1, 1, False, inflight, MICROBATCHES, remat))

            spec = StageSpec(name, start, stop, GLOBAL_BATCH // MICROBATCHES, dtype="bf16", remat=remat)
            row["remat" if remat else "plain"] = {
                "planned_kept_bytes": planned(1) - planned(0),
                # what the model adds besides the kept activations: one unit's recomputation (remat only)
                "planned_transient_bytes": planned(0) - state,
                **xla_stage_memory(spec, whole_model_step=(start, stop) == (0, n)),
            }
        out.append(row)
    return out
