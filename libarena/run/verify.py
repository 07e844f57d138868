"""Check plans against the single-device training step: same loss, same updated parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from libarena.models import ModelDef
from libarena.models.training import OptimizerConfig, init_optimizer_state, init_params, make_train_step
from libarena.run.executor import PipelineExecutor
from libarena.run.plan import RunPlan


@dataclass(frozen=True)
class PlanCheck:
    plan_id: str
    loss: float
    reference_loss: float
    #: Largest absolute difference of any updated parameter / Adam moment from the single-device step.
    max_param_error: float
    max_moment_error: float


def _max_abs_diff(a: Any, b: Any) -> float:
    import jax

    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(la) != len(lb):
        raise ValueError(f"trees differ: {len(la)} vs {len(lb)} leaves")
    return max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) if np.size(x) else 0.0)
               for x, y in zip(la, lb))


def check_plans(model: ModelDef, plans: Sequence[RunPlan], global_batch: int, seed: int = 0, data_seed: int = 0,
                dtype: str = "fp32", optimizer: OptimizerConfig | None = None,
                plan_devices: Sequence[Sequence[Any] | None] | None = None) -> list[PlanCheck]:
    """One training step of every plan vs the single-device ``make_train_step`` from the same state
    (``plan_devices[k]``: the devices plan k runs on; default the process's devices)."""
    import jax

    optimizer = optimizer or OptimizerConfig()
    batch = model.synthetic_samples(np.arange(global_batch), data_seed)
    # One compiled initialisation instead of op-by-op random calls (same values: unit i depends on (seed, i)).
    params = jax.device_get(jax.jit(lambda: init_params(model, seed))())
    opt_state = jax.device_get(init_optimizer_state(params, optimizer))
    step = jax.jit(make_train_step(model, dtype, optimizer))
    ref_params, ref_opt, ref_loss = jax.device_get(step(params, opt_state, batch))
    out = []
    for k, plan in enumerate(plans):
        devices = plan_devices[k] if plan_devices is not None else None
        executor = PipelineExecutor(model, plan, devices, dtype=dtype, optimizer=optimizer)
        executor.load_state(params, opt_state, 0)
        stats = executor.step(batch)
        new_params, new_opt = executor.host_state()
        out.append(
            PlanCheck(plan.plan_id, stats.loss, float(ref_loss), _max_abs_diff(new_params, ref_params), _moment_error(new_opt, ref_opt))
        )
    return out


def _adam_moments(state: Any) -> tuple[list[Any], list[Any]]:
    """(mu leaves, nu leaves) of every Adam state in ``state`` (one per unit, in the units' order)."""
    import jax

    mus, nus = [], []
    for node in jax.tree.leaves(state, is_leaf=lambda x: hasattr(x, "mu") and hasattr(x, "nu")):
        if hasattr(node, "mu"):
            mus += jax.tree.leaves(node.mu)
            nus += jax.tree.leaves(node.nu)
    return mus, nus


def _moment_error(new_opt: Any, ref_opt: Any) -> float:
    new_mu, new_nu = _adam_moments(new_opt)
    ref_mu, ref_nu = _adam_moments(ref_opt)
    if not ref_mu:
        raise ValueError("the optimizer state has no Adam moments")
    return max(_max_abs_diff(new_mu, ref_mu), _max_abs_diff(new_nu, ref_nu))
