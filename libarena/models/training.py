"""JAX training-step construction shared by analyze (abstract lowering), profile (stage executables) and
run (sharded pipelines): parameter initialisation, unit ranges, the loss, the mixed-precision Adam update.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from libarena.checks import Range, check_fields
from libarena.hardware.catalogue import normalize_dtype
from libarena.models.base import Batch, Carry, ModelDef, Params

_JAX_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "tf32": "float32"}


#: JAX's matmul precision for the 32-bit matmuls of each training dtype. Left alone, JAX runs float32 matmuls on
#: TensorFloat-32 tensor cores on Ampere and later GPUs, so an "fp32" job would run (and be timed) as tf32 while
#: the catalogue prices it at the fp32 peak. 16-bit dtypes' matmuls take 16-bit inputs, which the setting leaves alone.
_MATMUL_PRECISION = {"fp32": "float32", "tf32": "tensorfloat32"}


def compute_dtype(dtype: str) -> Any:
    import jax.numpy as jnp

    return jnp.dtype(_JAX_DTYPES[normalize_dtype(dtype)])


def matmul_precision(dtype: str) -> str | None:
    """``jax_default_matmul_precision`` for training in ``dtype`` (None: JAX's default)."""
    return _MATMUL_PRECISION.get(normalize_dtype(dtype))


def with_matmul_precision(fn: Callable, precision: str | None) -> Callable:
    """``fn`` traced under ``precision`` (:func:`matmul_precision`). The setting is entered inside the traced
    function, so a jitted ``fn`` keeps it whatever the caller's setting is when it is called (and traced)."""
    if precision is None:
        return fn

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        import jax

        with jax.default_matmul_precision(precision):
            return fn(*args, **kwargs)

    return traced


@dataclass(frozen=True)
class OptimizerConfig:
    """Adam with decoupled weight decay on float32 master parameters (mixed-precision training)."""

    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_fields(self, {
            "learning_rate": Range("--lr", 0, 10, lo_open=True),
            "b1": Range("b1", 0, 1),
            "b2": Range("b2", 0, 1),
            "eps": Range("eps", 0, 1, lo_open=True),
            "weight_decay": Range("weight_decay", 0, 10),
        })

    def build(self) -> Any:
        import optax

        return optax.adamw(self.learning_rate, b1=self.b1, b2=self.b2, eps=self.eps, weight_decay=self.weight_decay)


def unit_key(seed: int, index: int) -> Any:
    import jax

    return jax.random.fold_in(jax.random.key(seed), index)


def init_params(model: ModelDef, seed: int, units: Sequence[int] | None = None) -> list[Params]:
    """Concrete parameters for ``units`` (default all); unit i's values depend only on (seed, i)."""
    indices = range(len(model.units)) if units is None else units
    return [model.init_unit(i, unit_key(seed, i)) for i in indices]


def abstract_params(model: ModelDef, units: Sequence[int] | None = None) -> list[Params]:
    """Parameter shapes/dtypes without allocating anything (jax.eval_shape)."""
    import jax

    indices = range(len(model.units)) if units is None else units
    # One trace for all units (one eval_shape per unit costs a trace's fixed overhead each).
    return jax.eval_shape(lambda: [model.init_unit(i, unit_key(0, i)) for i in indices])


def param_count(model: ModelDef) -> int:
    import jax

    return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(abstract_params(model))))


def batch_spec(model: ModelDef, batch_size: int, seq_len: int | None = None) -> dict[str, Any]:
    import jax

    return {
        name: jax.ShapeDtypeStruct(shape, np.dtype(dtype))
        for name, (shape, dtype) in model.batch_shapes(batch_size, seq_len).items()
    }


@functools.lru_cache(maxsize=64)
def _shared_unit(model: ModelDef, signature: Hashable, dtype: Any) -> Callable:
    """One jitted function for all units of ``model`` with ``signature``. JAX caches a jitted function's
    trace, derivative and lowering by argument shapes, so the repeated layers are traced once; the HLO
    module calls one computation per distinct layer."""
    import jax

    representative = next(i for i in range(len(model.units)) if model.unit_signature(i) == signature)

    def shared_unit(params: Params, carry: Carry, batch: Batch) -> Carry:
        return model.apply_unit(representative, params, carry, batch, dtype)

    shared_unit.__name__ = model.units[representative].kind  # op names read jit(<kind>), never a unit name
    return jax.jit(shared_unit)


def _shape_key(tree: Any) -> Hashable:
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(leaf.shape), str(leaf.dtype)) for leaf in leaves)


@functools.lru_cache(maxsize=16)
def _repeated_units(model: ModelDef) -> frozenset[int]:
    """Units that share their signature and parameter shapes with another unit. Only those gain from a
    jitted function: the first trace through one costs about twice a plain trace (JAX linearizes the
    call), which a unit traced only once never earns back (wide_resnet's first block of each stage)."""
    keys = [(model.unit_signature(i), _shape_key(p)) for i, p in enumerate(abstract_params(model))]
    counts = Counter(keys)
    return frozenset(i for i, key in enumerate(keys) if counts[key] > 1)


def apply_units(
    model: ModelDef, params: Sequence[Params], carry: Carry, batch: Batch, start: int, stop: int, dtype: Any,
    share_traces: bool = False, remat: bool = False,
) -> Carry:
    """Run units [start, stop) under one named scope per unit (arena-analyze attributes HLO ops by it).
    ``share_traces``: units with the same signature and parameter shapes go through one jitted function
    (see ``_shared_unit``). ``remat``: each unit keeps only its input for the backward pass and recomputes
    its activations there (see ``recompute_in_backward``)."""
    import jax

    for offset, index in enumerate(range(start, stop)):
        with jax.named_scope(model.units[index].name):
            if share_traces and index in _repeated_units(model):
                unit = _shared_unit(model, model.unit_signature(index), dtype)
            else:
                unit = functools.partial(_apply_unit, model, index, dtype)
            if remat:
                unit = recompute_in_backward(unit)
            carry = unit(params[offset], carry, batch)
    return carry


def _apply_unit(model: ModelDef, index: int, dtype: Any, params: Params, carry: Carry, batch: Batch) -> Carry:
    return model.apply_unit(index, params, carry, batch, dtype)


def recompute_in_backward(unit: Callable[[Params, Carry, Batch], Carry]) -> Callable[[Params, Carry, Batch], Carry]:
    """Activation recomputation (coarse-grained, per layer, as Alpa's remat) inside one differentiated function
    (the whole training step): the forward pass keeps only the unit's inputs; the backward pass runs the unit's
    forward again and then its backward (``recomputed_vjp``). The pipeline's stages, whose forward and backward
    are separate executables, use ``forward_keeping_inputs`` / ``backward_from_inputs`` instead, which keep the
    parameters out of what a micro-batch holds."""
    import jax

    @jax.custom_vjp
    def recomputed(params: Params, carry: Carry, batch: Batch) -> Carry:
        return unit(params, carry, batch)

    def forward(params: Params, carry: Carry, batch: Batch) -> tuple[Carry, tuple[Params, Carry, Batch]]:
        return unit(params, carry, batch), (params, carry, batch)

    def backward(saved: tuple[Params, Carry, Batch], gradient: Carry) -> tuple[Params, Carry, Batch]:
        return recomputed_vjp(unit, *saved, gradient)

    recomputed.defvjp(forward, backward)
    return recomputed


def recomputed_vjp(unit: Callable[[Params, Carry, Batch], Carry], params: Params, carry: Carry, batch: Batch,
                   gradient: Carry) -> tuple[Params, Carry, Batch]:
    """Cotangents of (params, carry, batch) for ``gradient``, running ``unit``'s forward again first.

    The recomputation is made to depend on ``gradient`` (the gradient arriving from the unit after it).
    Without that data dependency XLA's CPU scheduler hoists every unit's recomputation to the start of the
    backward pass (an optimization barrier does not survive its pipeline), and all the activations the
    recomputation was meant to avoid are alive at once again. The dependency is ``+ 0 * g[0]`` on one input:
    exact (x + 0 == x) unless the gradient is already NaN or infinite, and IEEE semantics keep XLA from
    folding it away."""
    import jax
    import jax.numpy as jnp

    first = jax.lax.stop_gradient(jax.tree.leaves(gradient)[0]).reshape(-1)[0]
    # the first floating-point input (the activation, or a parameter of the first unit) carries the tie
    leaves, treedef = jax.tree.flatten((carry, params))
    k = next(i for i, leaf in enumerate(leaves) if jnp.issubdtype(leaf.dtype, jnp.floating))
    # the zero is made in the gradient's own dtype, then cast: an fp16 cast of the loss's cotangent (the loss
    # scale / B, far above fp16's range) would be inf, and 0 * inf a NaN that skipped every such step
    leaves[k] = leaves[k] + (jnp.zeros((), first.dtype) * first).astype(leaves[k].dtype)
    carry, params = jax.tree.unflatten(treedef, leaves)
    _, vjp = jax.vjp(unit, params, carry, batch)
    return vjp(gradient)


def forward_keeping_inputs(model: ModelDef, params: Sequence[Params], carry: Carry, batch: Batch, start: int, stop: int,
                           dtype: Any) -> tuple[Carry, list[Carry]]:
    """Units [start, stop) of a recomputing pipeline stage: the output, and each unit's input activation (all
    that the stage keeps per micro-batch for its backward pass)."""
    inputs = []
    for offset, index in enumerate(range(start, stop)):
        inputs.append(carry)
        carry = apply_units(model, [params[offset]], carry, batch, index, index + 1, dtype)
    return carry, inputs


def backward_from_inputs(model: ModelDef, params: Sequence[Params], inputs: Sequence[Carry], batch: Batch, start: int,
                         stop: int, dtype: Any, cotangent: Carry) -> tuple[list[Params], Carry]:
    """The backward pass of a recomputing stage (see ``forward_keeping_inputs``): last unit first, each unit's
    forward runs again from its saved input just before its own backward, so one unit's activations are alive
    at a time. Returns the parameters' gradients and the gradient of the stage's input activation."""
    grads: list[Params] = [None] * (stop - start)
    gradient = cotangent
    for offset in reversed(range(stop - start)):
        index = start + offset
        unit = functools.partial(_apply_named_unit, model, index, dtype)
        grads[offset], gradient, _ = recomputed_vjp(unit, params[offset], inputs[offset], batch, gradient)
    return grads, gradient


class StagePass:
    """The forward and backward pass of pipeline stage [start, stop) on one worker, as the runtime's executor runs
    them and the profiler times them: what the forward keeps for the backward leaves it as flat arrays with a
    leading axis of 1 (stacked by data-parallel replica in the runtime), from which the backward rebuilds it.

    Without recomputation that is the stage's vjp closure, minus the parameters themselves (a matmul's saved
    weight in fp32): the backward is given the parameters again, where stacking them would copy them per
    micro-batch in flight (memory the planner does not count, and bytes every forward moves). In a 16-bit
    compute dtype what is saved is the weight's cast copy, kept per micro-batch, which the planner counts
    (``saved_constant_bytes``). With recomputation only the units' input activations are kept
    (``forward_keeping_inputs``)."""

    def __init__(self, model: ModelDef, start: int, stop: int, dtype: str, remat: bool, first: bool):
        self.model, self.start, self.stop, self.remat, self.first = model, start, stop, remat, first
        self.dtype = compute_dtype(dtype)
        self.forward = with_matmul_precision(self.forward, matmul_precision(dtype))
        self.backward = with_matmul_precision(self.backward, matmul_precision(dtype))
        # how the kept arrays fold back, recorded when the forward is traced (the backward is traced after it)
        self._treedef: Any = None
        self._from_params: list[int | None] = []

    def forward(self, params: Sequence[Params], carry: Carry, batch: Batch) -> tuple[Carry, list[Any]]:
        """(the stage's output, the arrays kept for the backward, each with a leading axis of 1)."""
        import jax

        model, start, stop, dtype = self.model, self.start, self.stop, self.dtype
        if self.remat:
            out, kept = forward_keeping_inputs(model, params, carry, batch, start, stop, dtype)
        elif self.first:
            out, kept = jax.vjp(lambda p: apply_units(model, p, None, batch, start, stop, dtype), params)
        else:
            out, kept = jax.vjp(lambda p, c: apply_units(model, p, c, batch, start, stop, dtype), params, carry)
        leaves, self._treedef = jax.tree.flatten(kept)
        param_index = {id(leaf): i for i, leaf in enumerate(jax.tree.leaves(params))}
        self._from_params = [param_index.get(id(leaf)) for leaf in leaves]
        return out, [leaf[None] for leaf in leaves if id(leaf) not in param_index]

    def backward(self, params: Sequence[Params], batch: Batch, kept: Sequence[Any],
                 cotangent: Carry) -> tuple[Any, Carry | None]:
        """(the parameters' gradients, the gradient of the stage's input; None for the first stage)."""
        import jax

        param_leaves, stacked = jax.tree.leaves(params), iter(kept)
        leaves = [next(stacked)[0] if i is None else param_leaves[i] for i in self._from_params]
        if next(stacked, None) is not None:  # the layout is the last traced forward's: it must be this one's
            raise AssertionError("StagePass.backward: more kept arrays than its forward's layout")
        rebuilt = jax.tree.unflatten(self._treedef, leaves)
        if self.remat:
            return backward_from_inputs(self.model, params, rebuilt, batch, self.start, self.stop, self.dtype, cotangent)
        grads = rebuilt(cotangent)
        return grads[0], (None if self.first else grads[1])


def _apply_named_unit(model: ModelDef, index: int, dtype: Any, params: Params, carry: Carry, batch: Batch) -> Carry:
    return apply_units(model, [params], carry, batch, index, index + 1, dtype)


def unit_outputs(
    model: ModelDef, params: Sequence[Params], batch: Batch, dtype: Any, share_traces: bool = False
) -> list[Carry]:
    """Shape of every unit's output at ``batch`` (shape evaluation only; ``share_traces`` as in apply_units)."""
    import jax

    outputs = []
    carry = None
    for index in range(len(model.units)):
        carry = jax.eval_shape(
            lambda p, c, b, i=index: apply_units(model, [p], c, b, i, i + 1, dtype, share_traces), params[index], carry, batch
        )
        outputs.append(carry)
    return outputs


@dataclass(frozen=True)
class SavedActivations:
    """Bytes a unit keeps for its backward pass (its vjp residuals, without the parameters and the batch entries it
    merely references), split into the part that grows with the batch and the part that does not (compute-dtype
    copies of parameters)."""

    per_batch: int
    constant: int


def saved_activations(model: ModelDef, params: Sequence[Params], batch_size: int, seq_len: int | None, dtype: Any,
                      outputs: Sequence[Carry], outputs_doubled: Sequence[Carry]) -> list[SavedActivations]:
    """What every unit keeps for its backward at ``batch_size`` (``outputs``: unit_outputs at that batch,
    ``outputs_doubled`` at twice it): JAX's own residuals of the unit's vjp, which are exactly what the runtime
    holds per in-flight micro-batch. Shape evaluation only; identical units are evaluated once."""
    import jax

    def residual_leaves(index: int, carry: Carry, batch: Batch) -> list[Any]:
        unit = functools.partial(_apply_unit, model, index, dtype)
        if carry is None:
            res = jax.eval_shape(lambda p, b: jax.vjp(lambda q: unit(q, None, b), p)[1], params[index], batch)
        else:
            res = jax.eval_shape(lambda p, c, b: jax.vjp(lambda q, d: unit(q, d, b), p, c)[1], params[index], carry, batch)
        referenced = Counter((tuple(x.shape), str(x.dtype)) for x in jax.tree.leaves((params[index], batch)))
        kept = []
        for leaf in jax.tree.leaves(res):
            key = (tuple(leaf.shape), str(leaf.dtype))
            if referenced[key] > 0:  # the unit's own parameters or batch entries: referenced, not copied
                referenced[key] -= 1
            else:
                kept.append(leaf)
        return kept

    batch = batch_spec(model, batch_size, seq_len)
    doubled = batch_spec(model, 2 * batch_size, seq_len)
    cache: dict[Hashable, SavedActivations] = {}
    out = []
    for i in range(len(model.units)):
        carry = outputs[i - 1] if i else None
        key = (model.unit_signature(i), _shape_key(params[i]), _shape_key(carry))
        if key not in cache:
            at_batch = residual_leaves(i, carry, batch)
            at_double = residual_leaves(i, outputs_doubled[i - 1] if i else None, doubled)
            # a residual whose shape does not change with the batch is a constant (e.g. a bf16 copy of a weight)
            constant = sum(_leaf_bytes(a) for a, b in zip(at_batch, at_double) if tuple(a.shape) == tuple(b.shape))
            cache[key] = SavedActivations(sum(_leaf_bytes(a) for a in at_batch) - constant, constant)
        out.append(cache[key])
    return out


def _leaf_bytes(leaf: Any) -> int:
    return int(np.prod(leaf.shape, dtype=np.int64)) * np.dtype(leaf.dtype).itemsize


def tree_bytes(tree: Any) -> int:
    """Bytes of every array (or shape) in a pytree."""
    import jax

    return sum(_leaf_bytes(leaf) for leaf in jax.tree.leaves(tree))


def loss_fn(model: ModelDef, dtype: Any, share_traces: bool = False, remat: bool = False) -> Callable[[list[Params], Batch], Any]:
    def loss(params: list[Params], batch: Batch) -> Any:
        return apply_units(model, params, None, batch, 0, len(model.units), dtype, share_traces, remat)

    return loss


@functools.lru_cache(maxsize=8)
def _shared_update(optimizer: OptimizerConfig) -> Callable:
    """One jitted per-unit update: JAX reuses its trace for every unit with the same parameter shapes."""
    import jax

    return jax.jit(functools.partial(_unit_update, optimizer.build()))


def _unit_update(tx: Any, params: Params, opt_state: Any, grads: Params) -> tuple[Params, Any]:
    import optax

    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def update_units(
    optimizer: OptimizerConfig, params: Sequence[Params], opt_state: Sequence[Any], grads: Sequence[Params],
    share_traces: bool = False,
) -> tuple[list[Params], list[Any]]:
    """Adam on each unit with that unit's own state (see ``init_optimizer_state``). ``share_traces``:
    one jitted update per distinct parameter shape, so the optimizer is traced once per distinct layer."""
    tx = None if share_traces else optimizer.build()
    new_params, new_state = [], []
    for p, s, g in zip(params, opt_state, grads, strict=True):
        # Every unit through the jitted update, even one whose shapes no other unit has: its constants
        # then stay its own (XLA would share them between plain updates, leaving them to no unit).
        p, s = _shared_update(optimizer)(p, s, g) if share_traces else _unit_update(tx, p, s, g)
        new_params.append(p)
        new_state.append(s)
    return new_params, new_state


def make_train_step(
    model: ModelDef, dtype: str = "bf16", optimizer: OptimizerConfig | None = None, share_traces: bool = False,
    remat: bool = False,
) -> Callable:
    """(params, opt_state, batch) -> (params, opt_state, loss): forward, backward and the optimizer update.
    ``share_traces``: trace each distinct layer (and its update) once; the computation is the same.
    ``remat``: every unit recomputes its activations in the backward pass (same results)."""
    import jax

    optimizer = optimizer or OptimizerConfig()
    loss = loss_fn(model, compute_dtype(dtype), share_traces, remat)

    def train_step(params: list[Params], opt_state: list[Any], batch: Batch) -> tuple[list[Params], list[Any], Any]:
        value, grads = jax.value_and_grad(loss)(params, batch)
        with jax.named_scope("optimizer"):
            params, opt_state = update_units(optimizer, params, opt_state, grads, share_traces)
        return params, opt_state, value

    return with_matmul_precision(train_step, matmul_precision(dtype))


def init_optimizer_state(params: Sequence[Params], optimizer: OptimizerConfig | None = None) -> list[Any]:
    """One Adam state per unit (moments and step count), the layout pipeline stages hold and checkpoints store."""
    tx = (optimizer or OptimizerConfig()).build()
    return [tx.init(p) for p in params]


def abstract_optimizer_state(abstract: Sequence[Params], optimizer: OptimizerConfig | None = None) -> list[Any]:
    import jax

    tx = (optimizer or OptimizerConfig()).build()
    return jax.eval_shape(lambda units: [tx.init(p) for p in units], list(abstract))
