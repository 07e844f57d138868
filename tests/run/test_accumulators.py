"""The executor's gradient accumulators are zeroed on the devices by each stage's update for the next step:
they are placed from the host once, and several steps train exactly as the fused one-device step does."""

from __future__ import annotations

import numpy as np
import pytest

from libarena.errors import ArenaError
from libarena.models import get_model
from tests.run.micro import TEST_OPTIMIZER


def test_updates_zero_the_accumulators_and_steps_match_the_fused_step(monkeypatch) -> None:
    import jax

    from libarena.models.training import init_optimizer_state, init_params, make_train_step
    from libarena.run.executor import PipelineExecutor, StageRuntime
    from libarena.run.plan import simple_plan
    from libarena.run.train import batch_for_step

    placed_from_host = []
    host_zeros = StageRuntime.zero_grads
    monkeypatch.setattr(StageRuntime, "zero_grads", lambda self: placed_from_host.append(self) or host_zeros(self))

    model = get_model("gpt__tiny")
    plan = simple_plan(model, 8, [0, 3], [1, 1], [1, 1], 4)
    # a two-stage pipeline of 4 micro-batches whose stages share this process's one device
    executor = PipelineExecutor(model, plan, [jax.devices()[0]] * 2, dtype="fp32", optimizer=TEST_OPTIMIZER)
    executor.init_state(0)
    batches = [batch_for_step(model, k * 8, 8, 0) for k in range(3)]
    losses = []
    for batch in batches:
        stats = executor.step(batch)
        losses.append(stats.loss)
        # the one thread that issues every call of the step spends CPU on it, at most the step's wall time
        assert 0 < stats.dispatch_cpu_s <= stats.step_time_s
        # ... and the time it waited for a core, where the kernel says (libarena.run.schedstat)
        assert stats.dispatch_wait_s is None or 0 <= stats.dispatch_wait_s <= stats.step_time_s
        assert all(not np.any(np.asarray(leaf)) for leaf in jax.tree.leaves(executor.grads))
    assert len(placed_from_host) == 2  # one per stage, on the first step only

    step = jax.jit(make_train_step(model, "fp32", TEST_OPTIMIZER))
    params = init_params(model, 0)
    state = init_optimizer_state(params, TEST_OPTIMIZER)
    reference = []
    for batch in batches:
        params, state, loss = step(params, state, batch)
        reference.append(float(loss))
    # accumulators carried over from the last step would make steps 2 and 3 differ
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    trained, _ = executor.host_state()
    diff = max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(jax.tree.leaves(trained), jax.tree.leaves(params), strict=True))
    assert diff < 1e-5


def test_a_stage_reused_by_a_plan_of_more_microbatches_scales_the_loss_by_that_plan() -> None:
    """Compiled stages are shared by plans that place the same stage alike, whatever their number of micro-batches
    B; the loss's cotangent 1/B is the plan's: a stage first used with B = 1 must not keep 1 for a plan of B = 2."""
    from libarena.run.executor import PipelineExecutor
    from libarena.run.plan import simple_plan
    from libarena.run.train import batch_for_step
    from libarena.run.verify import check_plans
    from tests.run.micro import micro_gpt

    model = micro_gpt()
    one = simple_plan(model, 4, [0], [1], [1], 1)  # micro-batches of 4: the same stage as below
    two = simple_plan(model, 8, [0], [1], [1], 2)
    executor = PipelineExecutor(model, one, optimizer=TEST_OPTIMIZER)
    executor.init_state(0)
    executor.step(batch_for_step(model, 0, 4, 0))
    assert PipelineExecutor(model, two, optimizer=TEST_OPTIMIZER).stages[-1] is executor.stages[-1]
    (check,) = check_plans(model, [two], 8, optimizer=TEST_OPTIMIZER)
    assert check.max_param_error < 1e-5 and check.max_moment_error < 1e-4, check


def test_a_moe_whose_routing_group_is_longer_than_a_sequence_trains_alike_under_any_micro_batching() -> None:
    """The paper's MoE sizes route groups of 2,048 tokens over sequences of 1,024. A group that spans samples
    routes a sample's tokens by its micro-batch neighbours, so one-sample micro-batches would train otherwise
    than the whole batch; routing groups stay within one sample (here group 16 over sequences of 8)."""
    from libarena.models.zoo.transformer import MoEModel, TransformerConfig
    from libarena.run.plan import simple_plan
    from libarena.run.verify import check_plans

    model = MoEModel("micro", TransformerConfig(0.0, 8, 16, 2, 2, vocab_size=32, num_experts=4, expert_group_size=16))
    assert model.expert_dispatch_shape(8) == (4, 8, 4, 16)  # 8 groups of one sequence, capacity 2 x 8 / 4
    (check,) = check_plans(model, [simple_plan(model, 8, [0], [1], [1], 8)], 8, optimizer=TEST_OPTIMIZER)
    assert check.max_param_error < 1e-5 and check.max_moment_error < 1e-4, check


def test_fp16_training_scales_its_loss_and_skips_a_step_whose_gradients_overflow() -> None:
    """fp16's range is narrow: a large batch's logit gradients fall below its smallest subnormal and vanish.
    The executor scales the loss's cotangent (dynamic loss scaling) and divides the gradients back before
    Adam; a step whose scaled gradients overflow is skipped (parameters and moments as they were) and the
    scale halved. Against the fp32 step on gpt__tiny at batch 1024, the first Adam moments' relative error
    is well under what the unscaled fp16 step gives."""
    import jax

    from libarena.models import get_model
    from libarena.models.training import init_optimizer_state, init_params
    from libarena.run.executor import LossScale, PipelineExecutor
    from libarena.run.plan import simple_plan
    from libarena.run.verify import _adam_moments

    model = get_model("gpt__tiny")
    batch = model.synthetic_samples(np.arange(1024), 0)
    params = jax.device_get(jax.jit(lambda: init_params(model, 0))())
    opt = jax.device_get(init_optimizer_state(params, TEST_OPTIMIZER))
    plan = simple_plan(model, 1024, [0], [1], [1], 1)

    def first_moments(dtype: str, scale: LossScale | None):
        executor = PipelineExecutor(model, plan, dtype=dtype, optimizer=TEST_OPTIMIZER)
        executor.load_state(params, opt, 0)
        executor.loss_scale = scale
        executor.step(batch)
        return executor, [np.asarray(m, np.float64) for m in _adam_moments(executor.host_state()[1])[0]]

    _, reference = first_moments("fp32", None)

    def error(moments):
        return max(np.linalg.norm(a - b) / np.linalg.norm(b) for a, b in zip(moments, reference))

    scaled, moments = first_moments("fp16", LossScale())
    assert scaled.last_step_updated and scaled.loss_scale.state() == {"scale": 2.0 ** 15, "good_steps": 1}
    unscaled = error(first_moments("fp16", None)[1])
    assert error(moments) < 0.02 < unscaled
    # a scale that overflows: the step is skipped, nothing moves, the scale halves
    overflowing, moments = first_moments("fp16", LossScale(2.0 ** 60))
    assert not overflowing.last_step_updated and overflowing.loss_scale.scale == 2.0 ** 59
    new_params, new_opt = overflowing.host_state()
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params)))
    assert all(not np.any(m) for m in moments)  # Adam's moments still zero: no update was made
    # a checkpoint keeps it, and a damaged one is a one-line error
    assert LossScale.from_state({"scale": 1024.0, "good_steps": 7}).state() == {"scale": 1024.0, "good_steps": 7}
    assert LossScale.from_state({}).scale == 2.0 ** 15
    with pytest.raises(ArenaError, match="a checkpoint's loss scale is damaged"):
        LossScale.from_state({"scale": "big", "good_steps": 1})


def test_fp16_recomputation_keeps_a_loss_scale_beyond_fp16s_range() -> None:
    """A recomputed (remat) stage ties its recomputation to the incoming gradient by adding 0 x its first
    element. For the loss unit that element is the loss scale / B, which at 2^16 / B and more is beyond fp16's
    range: cast first, it was inf, 0 x inf a NaN in every gradient, and the step was skipped (the scale
    halved), though the same plan without remat updates. Both now update, with the same loss."""
    from libarena.run.executor import LossScale, PipelineExecutor
    from libarena.run.plan import simple_plan
    from libarena.run.train import batch_for_step

    model = get_model("gpt__tiny")
    outcomes = {}
    for remat in (0, 1):
        executor = PipelineExecutor(model, simple_plan(model, 8, [0], [1], [1], 1, remat=[remat]), dtype="fp16",
                                    optimizer=TEST_OPTIMIZER)
        executor.init_state(0)
        executor.loss_scale = LossScale(2.0 ** 17)
        loss = executor.step(batch_for_step(model, 0, 8, 0)).loss
        outcomes[remat] = (executor.last_step_updated, executor.loss_scale.scale, loss)
    assert outcomes[1][:2] == outcomes[0][:2] == (True, 2.0 ** 17)
    assert outcomes[1][2] == pytest.approx(outcomes[0][2], rel=1e-3)


@pytest.mark.parametrize("spelling", ["float16", "half", "F16"])
def test_every_spelling_of_fp16_trains_with_a_loss_scale(spelling) -> None:
    """Before, only the spelling "fp16" had a loss scale; "float16" and "half" trained in fp16 without one (their
    small gradients underflowed), and a checkpoint of "fp16" resumed under them lost its scale."""
    from libarena.run.executor import PipelineExecutor
    from libarena.run.plan import simple_plan
    from libarena.run.train import TrainConfig

    model = get_model("gpt__tiny")
    executor = PipelineExecutor(model, simple_plan(model, 8, [0], [1], [1], 1), dtype=spelling, optimizer=TEST_OPTIMIZER)
    assert executor.dtype == "fp16" and executor.loss_scale is not None
    assert TrainConfig(global_batch=8, steps=1, dtype=spelling).dtype == "fp16"
