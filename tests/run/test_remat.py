"""Activation recomputation trains exactly as without it: the same losses and parameters over a few steps, in
the pipeline executor (stages keep only their units' inputs and recompute in the backward pass) and in the
fused training step (units wrapped in models.training.recompute_in_backward). Multi-device plans with
recomputing stages are in test_equivalence.py."""

from __future__ import annotations

import numpy as np
import pytest

from libarena.models import get_model
from tests.run.micro import TEST_OPTIMIZER


def _max_diff(a, b) -> float:
    import jax

    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in
               zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize("name", ["gpt__tiny", "bert__tiny", "moe__tiny"])
def test_executor_with_recomputation_trains_the_same(name: str) -> None:
    import jax

    from libarena.run.executor import PipelineExecutor
    from libarena.run.plan import simple_plan
    from libarena.run.train import batch_for_step

    model = get_model(name)
    results = []
    for remat in ([0, 0], [1, 1], [1, 0]):
        plan = simple_plan(model, 8, [0, 3], [1, 1], [1, 1], 4, remat=remat)
        # a two-stage pipeline whose stages share this process's one device (each stage is its own mesh)
        executor = PipelineExecutor(model, plan, [jax.devices()[0]] * 2, dtype="fp32", optimizer=TEST_OPTIMIZER)
        executor.init_state(0)
        losses = [executor.step(batch_for_step(model, k * 8, 8, 0)).loss for k in range(3)]
        results.append((losses, executor.host_state()))
    (base_losses, base_state), *others = results
    for losses, state in others:
        np.testing.assert_allclose(losses, base_losses, rtol=1e-5)
        assert _max_diff(state[0], base_state[0]) < 1e-5  # parameters after 3 Adam steps
        assert _max_diff(state[1], base_state[1]) < 1e-6  # Adam moments


@pytest.mark.parametrize("name", ["gpt__tiny", "bert__tiny", "moe__tiny", "wide_resnet__tiny"])
def test_fused_training_step_with_recomputation_is_the_same(name: str) -> None:
    import jax

    from libarena.models.training import init_optimizer_state, init_params, make_train_step

    model = get_model(name)
    params = init_params(model, 0)
    state = init_optimizer_state(params, TEST_OPTIMIZER)
    batch = model.synthetic_samples(np.arange(8), 0)
    plain = jax.jit(make_train_step(model, "fp32", TEST_OPTIMIZER))(params, state, batch)
    recomputing = jax.jit(make_train_step(model, "fp32", TEST_OPTIMIZER, remat=True))(params, state, batch)
    assert float(recomputing[2]) == pytest.approx(float(plain[2]), rel=1e-6)
    assert _max_diff(recomputing[0], plain[0]) < 1e-5


def test_a_stage_keeps_per_micro_batch_its_inputs_with_recomputation_and_no_parameter_copies_without() -> None:
    """What a stage's forward keeps for its backward, per micro-batch in flight: with recomputation only the
    units' inputs (a small fraction of the activations); without it, in fp32, the activations but never the
    stage's parameters (a matmul's saved weight is the parameter itself: stacked per micro-batch it would be a
    copy, which the planner's memory model does not count; in bf16 the saved weight is its cast copy, which the
    planner counts per micro-batch as a saved constant)."""
    import jax

    from libarena.run.executor import PipelineExecutor
    from libarena.run.plan import simple_plan
    from libarena.run.train import batch_for_step

    model = get_model("gpt__tiny")
    kept = {}
    for remat in (0, 1):
        plan = simple_plan(model, 8, [0, 3], [1, 1], [1, 1], 4, remat=[remat, remat])
        executor = PipelineExecutor(model, plan, [jax.devices()[0]] * 2, dtype="fp32", optimizer=TEST_OPTIMIZER)
        executor.init_state(0)
        stage = executor.stages[0]
        piece = jax.device_put(executor.microbatches(batch_for_step(model, 0, 8, 0))[0], stage.batch_sharding)
        _, residuals = stage.forward(executor.params[0], piece)
        param_shapes = {leaf.shape for leaf in jax.tree.leaves(executor.params[0]) if leaf.ndim >= 2}
        assert not [r.shape for r in residuals if r.shape[1:] in param_shapes], remat
        kept[remat] = sum(r.nbytes for r in residuals)
    assert 0 < kept[1] * 10 < kept[0], kept
