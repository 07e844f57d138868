"""Each training dtype's matmul precision: left to JAX, float32 matmuls run on TensorFloat-32 tensor cores on Ampere
and later GPUs, so an "fp32" job ran (and was profiled) as tf32 while the catalogue priced it at the fp32 peak."""

from __future__ import annotations

import re

import pytest

MODEL = "gpt__tiny"


def _precisions(text: str) -> set[str]:
    """The precision of every dot_general of a lowered module's text (DEFAULT where none is written)."""
    dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
    assert dots
    return {(re.search(r"precision = \[(\w+), \w+\]", line) or re.search("()", "")).group(1) or "DEFAULT" for line in dots}


@pytest.mark.parametrize(("dtype", "expected"), [("fp32", {"HIGHEST"}), ("tf32", {"HIGH"}), ("bf16", {"DEFAULT"})])
def test_the_whole_step_runs_each_dtypes_precision(dtype, expected):
    import jax

    from libarena.models import get_model
    from libarena.models.training import abstract_optimizer_state, abstract_params, batch_spec, make_train_step

    model = get_model(MODEL)
    params = abstract_params(model)
    lowered = jax.jit(make_train_step(model, dtype)).lower(params, abstract_optimizer_state(params), batch_spec(model, 4))
    assert _precisions(lowered.as_text()) == expected
    # the caller's own setting does not leak in: the step keeps its dtype's
    with jax.default_matmul_precision("bfloat16"):
        again = jax.jit(make_train_step(model, dtype)).lower(params, abstract_optimizer_state(params), batch_spec(model, 4))
    assert _precisions(again.as_text()) == (expected if dtype != "bf16" else {"DEFAULT"})


def test_profiled_stages_and_the_runtimes_stages_run_the_dtypes_precision(monkeypatch):
    """The profiler's stage executables (forward and backward, recomputing or not) and arena-run's stages are built
    from one StagePass, which enters the dtype's precision."""
    from libarena.models import get_model, training
    from libarena.profile.stage import StageSpec, lower_stage

    n = len(get_model(MODEL).units)
    for remat in (False, True):
        lowered = lower_stage(StageSpec(MODEL, 1, n, 4, dtype="fp32", remat=remat), with_optimizer=False)
        assert _precisions(lowered.forward.as_text()) == _precisions(lowered.backward.as_text()) == {"HIGHEST"}
    assert _precisions(lower_stage(StageSpec(MODEL, 0, 2, 4, dtype="tf32"), with_optimizer=False).backward.as_text()) == {"HIGH"}

    import jax

    from collections import OrderedDict

    from libarena.run import executor
    from libarena.run.executor import PipelineExecutor
    from libarena.run.plan import simple_plan

    monkeypatch.setattr(executor, "_STAGE_CACHE", OrderedDict())  # (stages another test built are not rebuilt)
    wrapped = []
    real = training.with_matmul_precision
    monkeypatch.setattr(training, "with_matmul_precision",
                        lambda fn, precision: wrapped.append((fn.__name__, precision)) or real(fn, precision))
    model = get_model(MODEL)
    PipelineExecutor(model, simple_plan(model, 8, [0, 3], [1, 1], [1, 1], 4), [jax.devices()[0]] * 2, dtype="fp32")
    assert wrapped == [("forward", "float32"), ("backward", "float32")] * 2
