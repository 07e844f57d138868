"""Stage executables: one worker's training computation of one pipeline stage, on one device (§3.4).

A worker of a stage with (dp, tp, ep, zero) processes ``micro_batch`` samples per micro-batch (the
global batch / B / dp) and holds the tensor-parallel shard of the stage's parameters. Its computation
is rebuilt here with per-worker shapes, so compiling it for one device gives the same kernels the
worker runs in the parallel job (minus the communication, priced separately by the comm model):

* ``sharded`` view: every parameter dimension whose logical axis is tensor-parallel (heads, mlp, vocab,
  conv_out) is divided by tp, and the units run on those shapes (Megatron-style pairs of column- and
  row-parallel matmuls reduce back to the full activation, so the stage type-checks);
* ``batch-equivalent`` view, for models whose sharded shapes do not chain (a convolution's sharded
  output channels feed the next convolution's full input): the worker runs the full-width units on
  micro_batch / tp samples, the same FLOPs per worker;
* expert parallelism (MoE, experts over the dp group) keeps the expert computation per worker
  FLOP-equivalent (e/ep experts on ep x the tokens), and shards the experts' optimizer state by ep;
* ZeRO-1 shards the optimizer update of every parameter by dp.

Three executables per stage, as the runtime dispatches them: ``forward`` (returns the output and the
vjp residuals), ``backward`` (gradient accumulation into the worker's gradient buffer, and the incoming
activation's gradient for non-first stages), ``optimizer`` (AdamW on the worker's optimizer shard).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from libarena.errors import ArenaError
from libarena.models import ModelDef, get_model
from libarena.plan import replica_microbatch

#: Logical axes split by Megatron-style tensor parallelism (see libarena.models.base.LOGICAL_AXES).
TP_AXES = ("heads", "mlp", "vocab", "conv_out")
EXPERT_AXIS = "expert"

VIEW_NONE = "none"
VIEW_SHARDED = "sharded"
VIEW_BATCH_EQUIVALENT = "batch-equivalent"


@dataclass(frozen=True)
class StageSpec:
    """One worker of one stage: units [start, stop) of ``model`` under (tp, ep, zero_shards)."""

    model: str
    start: int
    stop: int
    micro_batch: int
    tp: int = 1
    #: expert-parallel degree (the dp group of an MoE stage): expert optimizer state is sharded by it.
    ep: int = 1
    #: ZeRO-1 optimizer-state shards (dp when the stage uses ZeRO, else 1).
    zero_shards: int = 1
    dtype: str = "fp32"
    seq_len: int | None = None
    #: activation recomputation: each unit keeps only its input and recomputes its activations in the backward
    remat: bool = False

    def __post_init__(self) -> None:
        if self.micro_batch < 1:
            raise ArenaError(f"stage {self.model}[{self.start}:{self.stop}]: micro-batch must be >= 1, got {self.micro_batch}")
        if not 0 <= self.start < self.stop:
            raise ArenaError(f"stage {self.model}: bad unit range [{self.start}, {self.stop})")
        for name in ("tp", "ep", "zero_shards"):
            if getattr(self, name) < 1:
                raise ArenaError(f"stage {self.model}[{self.start}:{self.stop}]: {name} must be >= 1")


@dataclass
class WorkerView:
    """Per-worker abstract shapes of a stage (jax.ShapeDtypeStruct pytrees)."""

    spec: StageSpec
    params: list[Any]
    axes: list[Any]
    carry_in: Any
    batch: dict[str, Any]
    tp_view: str
    local_batch: int
    #: Per parameter leaf (flattened order): elements of the worker's optimizer shard.
    optimizer_elements: list[int]
    #: When vocab is sharded, integer inputs index a vocab / tp table: keep them inside it.
    int_modulo: int | None = None

    @property
    def is_first(self) -> bool:
        return self.spec.start == 0

    def is_last(self, model: ModelDef) -> bool:
        return self.spec.stop == len(model.units)

    def signature(self, model: ModelDef) -> dict[str, Any]:
        """Everything the stage's kernels depend on (cache key material): unit kinds and per-worker shapes.

        Unit names are left out on purpose: two stages of identical blocks share one profile.
        """
        import jax

        def shapes(tree: Any) -> Any:
            return jax.tree.map(lambda s: [list(s.shape), str(s.dtype)], tree)

        units = model.units[self.spec.start : self.spec.stop]
        return {
            "model_family": model.family,
            "model_config": asdict(model.config),
            "units": [u.kind for u in units],
            "first": self.is_first,
            "last": self.is_last(model),
            "params": shapes(self.params),
            "carry_in": None if self.carry_in is None else shapes(self.carry_in),
            "batch": shapes(self.batch),
            "tp_view": self.tp_view,
            "optimizer_elements": self.optimizer_elements,
            "int_modulo": self.int_modulo,
            "remat": self.spec.remat,
        }


def plan_stage_specs(model: ModelDef, layout: Any, plan: Any, dtype: str, seq_len: int | None) -> list[StageSpec]:
    """One worker's StageSpec per stage of ``plan`` (a ParallelPlan; ``layout`` its plan set's StageLayout)."""
    has_experts = _has_expert_axis(model)
    specs = []
    for stage, (start, stop) in zip(plan.stages, layout.stage_unit_ranges(plan)):
        specs.append(
            StageSpec(
                model=model.name,
                start=start,
                stop=stop,
                micro_batch=replica_microbatch(plan.grid.global_batch, plan.num_microbatches, stage.dp),
                tp=stage.tp,
                ep=stage.dp if has_experts else 1,
                zero_shards=stage.dp if stage.zero else 1,
                dtype=dtype,
                seq_len=seq_len,
                remat=stage.remat,
            )
        )
    return specs


def _has_expert_axis(model: ModelDef) -> bool:
    def walk(tree: Any) -> bool:
        if isinstance(tree, dict):
            return any(walk(v) for v in tree.values())
        if isinstance(tree, tuple):
            return EXPERT_AXIS in tree
        if isinstance(tree, list):
            return any(walk(v) for v in tree)
        return False

    return any(walk(model.param_axes(i)) for i in range(len(model.units)))


def _is_axes_leaf(x: Any) -> bool:
    return x is None or (isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x))


def _shard_shape(shape: tuple[int, ...], axes: tuple | None, tp: int) -> tuple[int, ...]:
    if axes is None or tp == 1:
        return tuple(shape)
    out = []
    for dim, axis in zip(shape, axes, strict=True):
        out.append(dim // tp if axis in TP_AXES and dim % tp == 0 else dim)
    return tuple(out)


def _batch_abstract(model: ModelDef, batch_size: int, seq_len: int | None) -> dict[str, Any]:
    from libarena.models.training import batch_spec

    return batch_spec(model, batch_size, seq_len)


def _carry_in_abstract(model: ModelDef, start: int, batch: dict[str, Any], dtype: Any) -> Any:
    """Shape of the activation entering unit ``start`` (full width: TP stages exchange full activations)."""
    import jax

    from libarena.models.training import abstract_params, apply_units

    if start == 0:
        return None
    params = abstract_params(model, range(start))
    return jax.eval_shape(lambda p, b: apply_units(model, p, None, b, 0, start, dtype), params, batch)


@functools.lru_cache(maxsize=256)
def worker_view(spec: StageSpec) -> WorkerView:
    """Per-worker shapes of the stage (see the module docstring for the views). Cached per spec: the
    cache key, the executables and the record all need it, and building it traces the units before it."""
    import jax

    from libarena.models.training import abstract_params, apply_units, compute_dtype

    model = get_model(spec.model)
    if spec.stop > len(model.units):
        raise ArenaError(f"stage {spec.model}[{spec.start}:{spec.stop}]: the model has only {len(model.units)} units")
    dtype = compute_dtype(spec.dtype)
    indices = range(spec.start, spec.stop)
    full = abstract_params(model, indices)
    axes = [model.param_axes(i) for i in indices]

    def build(tp_view: str) -> WorkerView:
        local_batch = spec.micro_batch
        params = full
        int_modulo = None
        if tp_view == VIEW_SHARDED:
            params = [
                jax.tree.map(lambda s, a: jax.ShapeDtypeStruct(_shard_shape(s.shape, a, spec.tp), s.dtype), p, ax)
                for p, ax in zip(full, axes, strict=True)
            ]
            vocab_dims = [
                s.shape[k]
                for p, ax in zip(params, axes, strict=True)
                for s, a in zip(jax.tree.leaves(p), jax.tree.leaves(ax, is_leaf=_is_axes_leaf), strict=True)
                if a is not None
                for k, name in enumerate(a)
                if name == "vocab"
            ]
            int_modulo = min(vocab_dims) if vocab_dims else None
        elif tp_view == VIEW_BATCH_EQUIVALENT:
            local_batch = max(1, math.ceil(spec.micro_batch / spec.tp))
        batch = _batch_abstract(model, local_batch, spec.seq_len)
        carry = _carry_in_abstract(model, spec.start, batch, dtype)
        # Type-check the stage on these shapes (raises for sharded views that do not chain).
        jax.eval_shape(lambda p, c, b: apply_units(model, p, c, b, spec.start, spec.stop, dtype), params, carry, batch)
        elements = []
        for p, ax in zip(params, axes, strict=True):
            for s, a in zip(jax.tree.leaves(p), jax.tree.leaves(ax, is_leaf=_is_axes_leaf), strict=True):
                n = int(np.prod(s.shape))
                if a is not None and EXPERT_AXIS in a:
                    n = max(1, n // spec.ep)
                elements.append(max(1, math.ceil(n / spec.zero_shards)))
        return WorkerView(spec, params, axes, carry, batch, tp_view, local_batch, elements, int_modulo)

    try:
        if spec.tp == 1:
            return build(VIEW_NONE)
        try:
            return build(VIEW_SHARDED)
        except (TypeError, ValueError):
            return build(VIEW_BATCH_EQUIVALENT)
    except (TypeError, ValueError) as exc:
        if spec.seq_len is None:
            raise  # at the model's own shapes every stage builds: a failure is a bug, not an input's problem
        # shapes the model cannot take (a plans file's sequence length past the model's positions): the input's
        # problem, named as arena-analyze names it
        first = " ".join(str(exc).split())[:200]
        raise ArenaError(f"{spec.model} cannot be built at micro-batch {spec.micro_batch}"
                         f"{'' if spec.seq_len is None else f', seq_len {spec.seq_len}'} (units {spec.start}-{spec.stop}): "
                         f"{first}") from None


# --------------------------------------------------------------------------------------------------
# Executables


@dataclass
class StageExecutables:
    """Compiled forward / backward / optimizer of one worker, with concrete inputs to run them on."""

    view: WorkerView
    forward: Any
    backward: Any
    optimizer: Any
    inputs: dict[str, Any]
    compile_s: float
    #: XLA cost analysis of the per-worker computation (flops, bytes accessed) per executable.
    cost: dict[str, dict[str, float]] = field(default_factory=dict)
    #: XLA memory analysis: bytes of arguments, outputs, temporaries per executable.
    memory: dict[str, dict[str, float]] = field(default_factory=dict)

    def run_microbatch(self) -> Any:
        """Forward then backward of one micro-batch; returns the arrays to block on."""
        x = self.inputs
        out, residuals = self.forward(x["params"], x["carry_in"], x["batch"])
        return self.backward(x["params"], x["batch"], residuals, x["cotangent"], x["grad_acc"])

    def run_optimizer(self) -> Any:
        x = self.inputs
        return self.optimizer(x["opt_params"], x["opt_grads"], x["opt_state"])

    def state_bytes(self) -> float:
        """Bytes the worker keeps for the whole iteration: weights, gradient buffer, optimizer shard."""
        return self.weight_bytes() + self.optimizer_state_bytes()

    def weight_bytes(self) -> float:
        """Weights and gradient buffer."""
        import jax

        x = self.inputs
        return float(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves((x["params"], x["grad_acc"]))))

    def optimizer_state_bytes(self) -> float:
        """The optimizer shard: its master copy and the optimizer state (0 when built without it)."""
        import jax

        x = self.inputs
        return float(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves((x["opt_state"], x["opt_params"]))))


def _concrete(tree: Any, seed: int, device: Any = None) -> Any:
    """Small random values of the given shapes (numpy-generated: no per-shape JAX compilation)."""
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    rng = np.random.default_rng(seed)
    out = []
    for s in leaves:
        dtype = np.dtype(s.dtype)
        if np.issubdtype(dtype, np.floating) or dtype.name == "bfloat16":
            value = (0.02 * rng.standard_normal(s.shape, dtype=np.float32)).astype(dtype)
        else:
            value = np.zeros(s.shape, dtype)
        out.append(jax.device_put(value, device))
    return jax.tree.unflatten(treedef, out)


def _cost(compiled: Any) -> dict[str, float]:
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends have no cost model
        return {}
    if isinstance(analysis, list):
        analysis = analysis[0] if analysis else {}
    return {
        "flops": float(analysis.get("flops", 0.0) or 0.0),
        "bytes": float(analysis.get("bytes accessed", 0.0) or 0.0),
    }


def _memory(compiled: Any) -> dict[str, float]:
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        return {}
    if m is None:
        return {}
    return {
        name: float(getattr(m, f"{name}_size_in_bytes", 0) or 0)
        for name in ("argument", "output", "temp", "generated_code")
    }


@dataclass
class LoweredStage:
    """A worker's forward, backward and optimizer lowered from abstract shapes (no arrays allocated):
    compiling them (``compile_stage``) needs no device time and may run in parallel threads."""

    spec: StageSpec
    view: WorkerView
    forward: Any
    backward: Any
    optimizer: Any
    #: cotangent of the stage output (abstract)
    cotangent: Any
    #: the optimizer state's abstract shapes (None without the optimizer)
    opt_state: Any
    lower_s: float


@dataclass
class CompiledStage:
    lowered: LoweredStage
    forward: Any
    backward: Any
    optimizer: Any
    compile_s: float


def _stage_functions(spec: StageSpec, view: WorkerView, optimizer: Any) -> tuple[Any, Any, Any, Any]:
    """The worker's forward ``(params, carry, batch) -> (output, residuals)``, backward
    ``(params, batch, residuals, cotangent, grad_acc) -> (grad_acc, carry gradient)`` and optimizer update, as the
    runtime's executor runs them. Residuals are the stage's vjp closure, or with activation recomputation only
    its units' input activations (models.training.forward_keeping_inputs)."""
    import jax

    from libarena.models.training import OptimizerConfig, StagePass

    model = get_model(spec.model)
    first = view.is_first
    start, stop = spec.start, spec.stop

    # As the runtime's stage does (libarena.run.executor.StageRuntime): what the backward pass needs leaves the
    # forward as flat arrays stacked by replica (a leading axis of 1 per worker), the parameters among them not
    # copied.
    stage_pass = StagePass(model, start, stop, spec.dtype, spec.remat, first)

    def accumulate(grad_acc: Any, param_grads: Any) -> Any:
        return jax.tree.map(lambda acc, g: acc + g.astype(acc.dtype), grad_acc, param_grads)

    def backward(params: Any, batch: Any, residuals: Any, cotangent: Any, grad_acc: Any) -> Any:
        param_grads, carry_grad = stage_pass.backward(params, batch, residuals, cotangent)
        return (accumulate(grad_acc, param_grads),) if first else (accumulate(grad_acc, param_grads), carry_grad)

    tx = (optimizer or OptimizerConfig()).build()

    def update(params: Any, grads: Any, state: Any) -> Any:
        import optax

        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return stage_pass.forward, backward, update, tx


def _abstract(tree: Any) -> Any:
    import jax

    return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def lower_stage(spec: StageSpec, optimizer: Any = None, with_optimizer: bool = True) -> LoweredStage:
    """Trace and lower the worker's executables from abstract shapes (see ``build_stage_executables``)."""
    import time

    import jax

    view = worker_view(spec)
    model = get_model(spec.model)
    forward, backward, update, tx = _stage_functions(spec, view, optimizer)
    t0 = time.perf_counter()
    fwd = jax.jit(forward).lower(view.params, view.carry_in, view.batch)
    out, residuals = _abstract(fwd.out_info)
    cotangent = jax.ShapeDtypeStruct((), out.dtype) if view.is_last(model) else out
    grad_acc = view.params
    bwd = jax.jit(backward, donate_argnums=(4,)).lower(view.params, view.batch, residuals, cotangent, grad_acc)
    opt = opt_state = None
    if with_optimizer:
        opt_params = [jax.ShapeDtypeStruct((n,), np.float32) for n in view.optimizer_elements]
        opt_state = jax.eval_shape(tx.init, opt_params)
        opt = jax.jit(update, donate_argnums=(0, 2)).lower(opt_params, opt_params, opt_state)
    return LoweredStage(spec, view, fwd, bwd, opt, cotangent, opt_state, time.perf_counter() - t0)


def compile_stage(lowered: LoweredStage) -> CompiledStage:
    """XLA-compile a lowered stage (host work only: safe to run in a thread next to other compilations)."""
    import time

    t0 = time.perf_counter()
    fwd = lowered.forward.compile()
    bwd = lowered.backward.compile()
    opt = lowered.optimizer.compile() if lowered.optimizer is not None else None
    return CompiledStage(lowered, fwd, bwd, opt, lowered.lower_s + time.perf_counter() - t0)


def build_stage_executables(
    spec: StageSpec, device: Any = None, seed: int = 0, optimizer: Any = None, with_optimizer: bool = True,
    compiled: CompiledStage | None = None,
) -> StageExecutables:
    """Compile the worker's forward, backward and optimizer executables for ``device`` (default: first)
    and place inputs for them (``compiled``: executables compiled ahead, e.g. in parallel threads).

    ``with_optimizer=False`` leaves the optimizer out (its profile depends only on the worker's optimizer
    shard sizes, so the profiler reuses one across micro-batch sizes)."""
    import jax

    if compiled is None:
        compiled = compile_stage(lower_stage(spec, optimizer, with_optimizer))
    lowered = compiled.lowered
    with_optimizer = compiled.optimizer is not None
    model = get_model(spec.model)
    view = lowered.view
    device = device or jax.devices()[0]

    with jax.default_device(device):
        params = _concrete(view.params, seed, device)
        batch_np = model.synthetic_samples(np.arange(view.local_batch), seed, spec.seq_len)
        batch = {}
        for name, spec_arr in view.batch.items():
            value = np.asarray(batch_np[name]).astype(spec_arr.dtype)
            if view.int_modulo and np.issubdtype(value.dtype, np.integer):
                value = value % view.int_modulo
            batch[name] = jax.device_put(value, device)
        carry = None if view.carry_in is None else _concrete(view.carry_in, seed + 1, device)
        def zeros(shapes: Any) -> Any:
            return jax.tree.map(lambda s: jax.device_put(np.zeros(s.shape, s.dtype), device), shapes)

        grad_acc = zeros(view.params)
        if with_optimizer:
            opt_params = [jax.device_put(np.full((n,), 0.01, np.float32), device) for n in view.optimizer_elements]
            opt_grads = [jax.device_put(np.full((n,), 1e-3, np.float32), device) for n in view.optimizer_elements]
            # AdamW starts from zero moments and a zero count: placed from the host (no compilation).
            opt_state = zeros(lowered.opt_state)
        else:
            opt_params, opt_grads, opt_state = [], [], None
        cotangent = (
            jax.device_put(np.ones((), lowered.cotangent.dtype), device)
            if view.is_last(model)
            else _concrete(lowered.cotangent, seed + 2, device)
        )

    inputs = {
        "params": params,
        "carry_in": carry,
        "batch": batch,
        "cotangent": cotangent,
        "grad_acc": grad_acc,
        "opt_params": opt_params,
        "opt_grads": opt_grads,
        "opt_state": opt_state,
    }
    fwd, bwd, opt = compiled.forward, compiled.backward, compiled.optimizer
    execs = StageExecutables(view, fwd, None, None, inputs, compiled.compile_s)
    # Donated buffers are consumed by each call: keep the executables' outputs as the next inputs.
    execs.backward = _Rebinding(bwd, inputs, "grad_acc", position=0)
    execs.optimizer = _OptimizerRebinding(opt, inputs) if with_optimizer else None
    execs.cost = {"forward": _cost(fwd), "backward": _cost(bwd), "optimizer": _cost(opt) if with_optimizer else {}}
    execs.memory = {"forward": _memory(fwd), "backward": _memory(bwd), "optimizer": _memory(opt) if with_optimizer else {}}
    return execs


class _Rebinding:
    """Calls a compiled executable whose donated input is replaced by the matching output."""

    def __init__(self, compiled: Any, inputs: dict[str, Any], name: str, position: int):
        self.compiled, self.inputs, self.name, self.position = compiled, inputs, name, position

    def __call__(self, *args: Any) -> Any:
        out = self.compiled(*args)
        self.inputs[self.name] = out[self.position]
        return out


class _OptimizerRebinding:
    def __init__(self, compiled: Any, inputs: dict[str, Any]):
        self.compiled, self.inputs = compiled, inputs

    def __call__(self, params: Any, grads: Any, state: Any) -> Any:
        new_params, new_state = self.compiled(params, grads, state)
        self.inputs["opt_params"], self.inputs["opt_state"] = new_params, new_state
        return new_params, new_state


def xla_stage_memory(spec: StageSpec, whole_model_step: bool = False) -> dict[str, float]:
    """XLA's memory analysis of the stage executables of ``spec`` (compiled, never run): the bytes the forward
    pass keeps for the backward (its outputs without the stage's own output activation: what the runtime holds
    per micro-batch in flight) and the backward's temporary bytes; with ``whole_model_step``, also the temporary
    bytes of the whole model's forward and backward compiled as one executable."""
    import jax

    from libarena.models.training import (abstract_params, apply_units, batch_spec, compute_dtype, matmul_precision,
                                          tree_bytes, with_matmul_precision)

    compiled = compile_stage(lower_stage(spec, with_optimizer=False))
    out = {
        "xla_kept_bytes": float(compiled.forward.memory_analysis().output_size_in_bytes
                                - tree_bytes(compiled.lowered.forward.out_info[0])),
        "xla_backward_temp_bytes": float(compiled.backward.memory_analysis().temp_size_in_bytes),
    }
    if whole_model_step:
        model, dtype = get_model(spec.model), compute_dtype(spec.dtype)
        n = len(model.units)
        step = jax.jit(with_matmul_precision(jax.grad(lambda p, b: apply_units(model, p, None, b, 0, n, dtype, remat=spec.remat)),
                                             matmul_precision(spec.dtype)))
        lowered = step.lower(abstract_params(model), batch_spec(model, spec.micro_batch, spec.seq_len))
        out["xla_fused_temp_bytes"] = float(lowered.compile().memory_analysis().temp_size_in_bytes)
    return out
