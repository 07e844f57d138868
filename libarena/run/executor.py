"""The pipeline executor: one plan, real training steps.

Each stage owns a disjoint slice of the job's devices arranged as a ``(dp, tp)`` mesh. Its parameters
are placed with ``NamedSharding``: the first parameter dimension whose logical axis is tensor-parallel
(heads, mlp, vocab, expert, conv_out) goes on mesh axis ``tp``; batch dimensions go on ``dp``. Each stage's
forward (returning its ``jax.vjp`` closure, so activations are kept, or with activation recomputation only each
unit's input: models.training.recompute_in_backward) and backward
(which also accumulates the parameter gradients) are jitted. Data parallelism is manual (``jax.shard_map``
over ``dp``, tensor parallelism left to GSPMD, which inserts its collectives): each replica accumulates its own
gradients over the micro-batches, and the update reduces them once per step.
A 1F1B schedule drives the micro-batches; activations and their gradients move between stage meshes with
``jax.device_put``. The optimizer updates each stage in place; with ZeRO the Adam moments are sharded over
``dp`` as well.

The same code runs as one process per host over the global device list of a multi-process JAX runtime
(``libarena.run.distributed``): every process issues every stage's computations, which run where the
stage's devices are; activations crossing processes are relayed by ``distributed.transfer``.

The optimizer state is kept per model unit (Adam is element-wise, so per-unit state is the same as one
state for the whole model): a checkpoint is then independent of the plan and resumes onto any other.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from libarena.errors import ArenaError
from libarena.hardware.catalogue import normalize_dtype
from libarena.models import ModelDef
from libarena.models.training import (
    OptimizerConfig,
    StagePass,
    abstract_optimizer_state,
    init_params,
    update_units,
)
from libarena.run import distributed, schedstat
from libarena.plan import StagePlan
from libarena.run.plan import RunPlan

#: Logical parameter axes split by tensor (and expert) parallelism.
TP_LOGICAL_AXES = ("heads", "mlp", "vocab", "expert", "conv_out")
DP_AXIS = "dp"
TP_AXIS = "tp"


def param_partition(axes: Sequence[str | None] | None, shape: Sequence[int], tp: int) -> tuple[str | None, ...]:
    """Mesh axis per parameter dimension: the first tensor-parallel logical axis divisible by ``tp``."""
    spec: list[str | None] = [None] * len(shape)
    if tp > 1 and axes is not None:
        for d, (name, size) in enumerate(zip(axes, shape)):
            if name in TP_LOGICAL_AXES and size % tp == 0:
                spec[d] = TP_AXIS
                break
    return tuple(spec)


def zero_partition(spec: tuple[str | None, ...], shape: Sequence[int], dp: int) -> tuple[str | None, ...]:
    """ZeRO-1: additionally shard an optimizer-state leaf over ``dp`` on its first free divisible dimension."""
    if dp <= 1:
        return spec
    out = list(spec)
    for d, size in enumerate(shape):
        if out[d] is None and size % dp == 0 and size >= dp:
            out[d] = DP_AXIS
            break
    return tuple(out)


def _is_axes_leaf(x: Any) -> bool:
    return x is None or (isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x))


def stage_mesh(devices: Sequence[Any], dp: int, tp: int) -> Any:
    """A stage's (dp, tp) device mesh."""
    from jax.sharding import Mesh

    return Mesh(np.array(list(devices), dtype=object).reshape(dp, tp), (DP_AXIS, TP_AXIS))


def carry_sharding(mesh: Any) -> Any:
    """How a stage takes its input activation (and gives back its gradient): split by replica over ``dp``."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(DP_AXIS))


class StageRuntime:
    """Meshes, shardings and compiled functions of one pipeline stage (cached: plans share stages)."""

    def __init__(self, model: ModelDef, stage: StagePlan, units: range, devices: Sequence[Any], microbatch: int,
                 dtype: str, optimizer: OptimizerConfig, first: bool, last: bool):
        import jax
        import jax.numpy as jnp
        import optax
        from jax.sharding import NamedSharding, PartitionSpec

        self.stage = stage
        self.units = units
        self.first, self.last = first, last
        self.devices = list(devices)
        self.mesh = stage_mesh(self.devices, stage.dp, stage.tp)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.carry_sharding = carry_sharding(self.mesh)
        self.batch_sharding = self.carry_sharding
        self.uses_batch = first or last
        start, stop = units.start, units.stop
        tx = optimizer.build()

        from libarena.models.training import unit_key

        shapes = [jax.eval_shape(lambda i=i: model.init_unit(i, unit_key(0, i))) for i in units]
        self.param_shardings = []
        for i, shape_tree in zip(units, shapes):
            axes = model.param_axes(i)
            specs = jax.tree.map(
                lambda ax, leaf: param_partition(ax, leaf.shape, stage.tp), axes, shape_tree, is_leaf=_is_axes_leaf
            )
            self.param_shardings.append(
                jax.tree.map(lambda sp: NamedSharding(self.mesh, PartitionSpec(*sp)), specs, is_leaf=lambda x: isinstance(x, tuple))
            )
        self._opt_shapes = abstract_optimizer_state(shapes, optimizer)
        self.opt_shardings = []
        for state_shape, shard_tree in zip(self._opt_shapes, self.param_shardings):

            def moment_sharding(leaf, sharding):
                spec = tuple(sharding.spec) + (None,) * (len(leaf.shape) - len(sharding.spec))
                if stage.zero:
                    spec = zero_partition(spec, leaf.shape, stage.dp)
                return NamedSharding(self.mesh, PartitionSpec(*spec))

            self.opt_shardings.append(
                optax.tree_map_params(tx, moment_sharding, state_shape, shard_tree, transform_non_params=lambda _: self.replicated)
            )

        # Data parallelism is manual (shard_map over ``dp``; ``tp`` stays with GSPMD): every replica runs its
        # share of the micro-batch and adds its own gradient to its own slot of the accumulator (leading ``dp``
        # dimension), so micro-batches need no communication; the replicas' gradients are summed once per
        # step, in the update. Every model computes per sample (GroupNorm, routing groups within samples), so
        # this is the single-device step.
        P = PartitionSpec
        dp = stage.dp
        manual = frozenset({DP_AXIS})
        by_replica = P(DP_AXIS)
        # what a micro-batch's forward keeps for its backward (the vjp closure less the parameters, or with
        # recomputation the units' inputs) leaves the manual region stacked by replica: each keeps its own
        stage_pass = StagePass(model, start, stop, dtype, stage.remat, first)

        def local_forward(params, carry, batch):
            out, kept = stage_pass.forward(params, carry, batch)
            return (out[None] if last else out), kept

        def local_backward(params, batch, residuals, cotangent, accumulated):
            # The step's loss is the mean of the replicas' losses: each replica's share of the cotangent.
            cotangent = cotangent / dp if last else cotangent
            param_grads, carry_grad = stage_pass.backward(params, batch, residuals, cotangent)
            accumulated = jax.tree.map(lambda acc, g: acc + g[None].astype(acc.dtype), accumulated, param_grads)
            return (accumulated,) if first else (accumulated, carry_grad)

        sharded_forward = jax.shard_map(local_forward, mesh=self.mesh, in_specs=(P(), by_replica, by_replica),
                                        out_specs=(by_replica, by_replica), axis_names=manual, check_vma=False)
        backward_out = (by_replica,) if first else (by_replica, by_replica)
        sharded_backward = jax.shard_map(local_backward, mesh=self.mesh,
                                         in_specs=(P(), by_replica, by_replica, P() if last else by_replica, by_replica),
                                         out_specs=backward_out, axis_names=manual, check_vma=False)

        def forward(params, carry, batch):
            out, residuals = sharded_forward(params, carry, batch)
            return (jnp.mean(out) if last else out), residuals

        def backward(params, batch, residuals, cotangent, accumulated):
            result = sharded_backward(params, batch, residuals, cotangent, accumulated)
            return result[0] if first else result

        if first:
            self.forward = jax.jit(lambda params, batch: forward(params, None, batch))
        else:
            self.forward = jax.jit(forward)
        self.backward = jax.jit(backward, donate_argnums=(4,))

        # Adam's initial state and the first gradient accumulators are zeros: built on the host and placed once,
        # which saves two compilations per stage.
        self._grad_shapes = jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((dp, *leaf.shape), leaf.dtype), shapes)
        self.grad_shardings = jax.tree.map(lambda sh: NamedSharding(self.mesh, P(DP_AXIS, *sh.spec)), self.param_shardings)

        def update(params, opt_state, accumulated, inv_scale):
            # The one data-parallel reduction of the step: the replicas' gradient sums (times 1 / the loss scale:
            # 1 but in fp16, whose gradients were taken of the scaled loss).
            grads = jax.lax.with_sharding_constraint(
                jax.tree.map(lambda acc: jnp.sum(acc, axis=0) * inv_scale.astype(acc.dtype), accumulated),
                self.param_shardings)
            params, opt_state = update_units(optimizer, params, opt_state, grads)
            # The next step's accumulators, zeroed on the devices in the donated buffers: resetting them from the
            # host instead would copy dp x the stage's parameters to the devices every step.
            return params, opt_state, jax.tree.map(jnp.zeros_like, accumulated)

        self.update = jax.jit(update, out_shardings=(self.param_shardings, self.opt_shardings, self.grad_shardings),
                              donate_argnums=(0, 1, 2))
        #: whether every gradient the accumulators hold is finite (a replicated scalar on the stage's devices)
        self.finite = jax.jit(lambda accumulated: jnp.all(jnp.stack(
            [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(accumulated)])), out_shardings=self.replicated)

    def fresh_params(self, model: ModelDef, seed: int) -> list[Any]:
        """Fresh parameters of the stage's units (unit i's depend on (seed, i) only: identical under every plan),
        compiled and written straight into the stage's shardings."""
        import jax

        return jax.jit(lambda units=tuple(self.units): init_params(model, seed, units), out_shardings=self.param_shardings)()

    def zero_grads(self) -> list[Any]:
        return distributed.place_tree(_host_zeros(self._grad_shapes), self.grad_shardings)

    def init_opt(self, params: list[Any]) -> list[Any]:
        """Adam's initial state (zero moments, zero count) for this stage's units."""
        return distributed.place_tree(_host_zeros(self._opt_shapes), self.opt_shardings)

    def place_params(self, params: list[Any]) -> list[Any]:
        return [distributed.place_tree(p, s) for p, s in zip(params, self.param_shardings)]

    def place_opt_state(self, state: list[Any]) -> list[Any]:
        return [distributed.place_tree(s, sh) for s, sh in zip(state, self.opt_shardings)]


def _host_zeros(shapes: Any) -> Any:
    import jax

    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


#: compiled stages, shared by the plans of a search that place the same stage on the same devices; the least
#: recently used go first (a full search builds hundreds, each holding its executables)
_STAGE_CACHE: OrderedDict[tuple, StageRuntime] = OrderedDict()
STAGE_CACHE_SIZE = 64


def stage_runtime(model: ModelDef, stage: StagePlan, units: range, devices: Sequence[Any], microbatch: int, dtype: str,
                  optimizer: OptimizerConfig, first: bool, last: bool) -> StageRuntime:
    # A stage's executables depend on everything here and on nothing of the rest of the plan (the number of
    # micro-batches is the executor's: it scales the loss's cotangent, not the stage).
    key = (type(model), model.name, model.config, units.start, units.stop, stage.dp, stage.tp, stage.zero, stage.remat,
           microbatch, dtype, optimizer, tuple(d.id for d in devices), first, last)
    runtime = _STAGE_CACHE.pop(key, None)
    if runtime is None:
        runtime = StageRuntime(model, stage, units, devices, microbatch, dtype, optimizer, first, last)
    _STAGE_CACHE[key] = runtime
    while len(_STAGE_CACHE) > STAGE_CACHE_SIZE:
        _STAGE_CACHE.popitem(last=False)
    return runtime


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[tuple[int, str, int]]:
    """A dispatch order of (stage, "F"|"B", micro-batch) that follows each stage's 1F1B order:
    ``min(S - 1 - j, B)`` warm-up forwards, then alternating forward/backward, then the remaining backwards."""
    S, B = num_stages, num_microbatches
    queues = []
    for j in range(S):
        warm = min(S - 1 - j, B)
        q: list[tuple[str, int]] = [("F", i) for i in range(warm)]
        for i in range(B - warm):
            q += [("F", warm + i), ("B", i)]
        q += [("B", i) for i in range(B - warm, B)]
        queues.append(q)
    done: set[tuple[int, str, int]] = set()
    order = []
    heads = [0] * S
    while len(order) < 2 * S * B:
        progressed = False
        for j in range(S):
            while heads[j] < len(queues[j]):
                kind, i = queues[j][heads[j]]
                if kind == "F":
                    ready = j == 0 or (j - 1, "F", i) in done
                else:
                    ready = (j, "F", i) in done and (j == S - 1 or (j + 1, "B", i) in done)
                if not ready:
                    break
                done.add((j, kind, i))
                order.append((j, kind, i))
                heads[j] += 1
                progressed = True
        if not progressed:  # cannot happen for a valid 1F1B schedule; guards against an endless loop
            raise RuntimeError("1F1B schedule deadlocked")
    return order


@dataclass
class StepStats:
    step: int
    loss: float
    step_time_s: float
    #: Busy seconds of each stage (forwards, backwards, transfers out, optimizer update); only measured on
    #: steps run with ``profile_stages`` (each task is waited for, so stages do not overlap).
    stage_time_s: list[float] = field(default_factory=list)
    #: Peak bytes of live arrays on the most loaded device of each stage, sampled after every task of a
    #: ``profile_stages`` step (params, optimizer state, gradients, kept activations, in-flight transfers).
    stage_peak_memory_bytes: list[int] = field(default_factory=list)
    #: CPU seconds of the calling thread during the step: it issues every call (dispatch and host work)
    dispatch_cpu_s: float = 0.0
    #: seconds that thread was runnable but waiting for a core during the step (None where the kernel does
    #: not say: libarena.run.schedstat); on a host the devices' threads compete with it for the same cores
    dispatch_wait_s: float | None = None


@dataclass
class LossScale:
    """Dynamic loss scaling for fp16, as mixed-precision training does it: the loss's cotangent is multiplied by
    ``scale`` so that small gradients stay within fp16's range (unscaled, a large batch's logit gradients fall
    below its smallest subnormal and become 0), the update divides it out; a step whose gradients overflow is
    skipped (its batch consumed) and the scale halved; after ``growth_interval`` good steps in a row it doubles."""

    scale: float = 2.0 ** 15
    good_steps: int = 0
    growth_interval: int = 2000

    def after_step(self, finite: bool) -> None:
        if finite:
            self.good_steps += 1
            if self.good_steps >= self.growth_interval:
                self.scale, self.good_steps = self.scale * 2.0, 0
        else:
            self.scale, self.good_steps = max(1.0, self.scale / 2.0), 0

    def state(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LossScale:
        """A checkpoint's loss scale (an empty record: a fresh one)."""
        if not state:
            return cls()
        scale, good = state.get("scale"), state.get("good_steps")
        if (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 1.0 <= scale <= 2.0 ** 64
                or isinstance(good, bool) or not isinstance(good, int) or good < 0):
            raise ArenaError(f"a checkpoint's loss scale is damaged: {str(state)[:80]}")
        return cls(float(scale), good)


class PipelineExecutor:
    """Runs training steps of ``model`` under ``plan`` on ``devices`` (default: the first devices of JAX)."""

    def __init__(self, model: ModelDef, plan: RunPlan, devices: Sequence[Any] | None = None, dtype: str = "fp32",
                 optimizer: OptimizerConfig | None = None):
        import jax

        all_devices = list(jax.devices()) if devices is None else list(devices)
        plan.validate(model, len(all_devices))
        # "float16" and "half" train as fp16 does, with its loss scale (before, only the spelling "fp16" had one)
        dtype = normalize_dtype(dtype)
        self.model, self.plan, self.dtype = model, plan, dtype
        self.optimizer = optimizer or OptimizerConfig()
        offsets = plan.offsets()
        S = plan.pipeline_degree
        self.stages = [
            stage_runtime(model, st, plan.units(j), all_devices[off: off + st.num_gpus], plan.microbatch_size, dtype,
                          self.optimizer, j == 0, j == S - 1)
            for j, (st, off) in enumerate(zip(plan.stages, offsets))
        ]
        self.order = one_f_one_b(S, plan.num_microbatches)
        self.params: list[list[Any]] = []
        self.opt_state: list[list[Any]] = []
        #: per stage, the gradient accumulators the last update zeroed for the next step (None: none yet)
        self.grads: list[Any] = []
        self.step_count = 0
        #: d(mean loss over the B micro-batches)/d(one micro-batch's loss), times the loss scale, on the last
        #: stage's devices (placed again when the scale changes)
        self.loss_cotangent: Any = None
        self._cotangent_scale = 1.0
        #: fp16's dynamic loss scale (None in other dtypes, whose range needs none)
        self.loss_scale: LossScale | None = LossScale() if dtype == "fp16" else None
        #: whether the last step's update was made (False: fp16 gradients overflowed, the step was skipped)
        self.last_step_updated = True

    # -- state ------------------------------------------------------------------------------------------

    def init_state(self, seed: int) -> None:
        """Fresh parameters (unit i's depend on (seed, i) only: identical under every plan) and Adam state."""
        self.params = [rt.fresh_params(self.model, seed) for rt in self.stages]
        self.opt_state = [rt.init_opt(p) for rt, p in zip(self.stages, self.params)]
        self.grads = [None] * len(self.stages)
        self.step_count = 0
        if self.loss_scale is not None:
            self.loss_scale = LossScale()

    def load_state(self, unit_params: Sequence[Any], unit_opt_state: Sequence[Any], step: int,
                   loss_scale: dict[str, Any] | None = None) -> None:
        """Place per-unit host state (from a checkpoint or another plan) onto this plan's stages, and fp16's loss
        scale as it was (``loss_scale``: LossScale.state(); none: a fresh one)."""
        import jax

        if len(unit_params) != len(self.model.units) or len(unit_opt_state) != len(self.model.units):
            raise ArenaError(f"state has {len(unit_params)} units, model {self.model.name} has {len(self.model.units)}")
        # Host copies first: placing fresh buffers means the donating update never deletes the caller's arrays.
        unit_params, unit_opt_state = jax.device_get((list(unit_params), list(unit_opt_state)))
        self.params = [rt.place_params([unit_params[i] for i in rt.units]) for rt in self.stages]
        self.opt_state = [rt.place_opt_state([unit_opt_state[i] for i in rt.units]) for rt in self.stages]
        self.grads = [None] * len(self.stages)
        self.step_count = int(step)
        if self.loss_scale is not None:
            self.loss_scale = LossScale.from_state(loss_scale or {})

    def host_state(self) -> tuple[list[Any], list[Any]]:
        """Per-unit parameters and optimizer state as host numpy arrays (plan-independent)."""
        import jax

        if not distributed.multi_process():
            params = [u for stage in jax.device_get(self.params) for u in stage]
            opt = [u for stage in jax.device_get(self.opt_state) for u in stage]
            return params, opt
        # Every process takes part (the stages' owners broadcast their units).
        params, opt = [], []
        for rt, p, o in zip(self.stages, self.params, self.opt_state):
            host_p, host_o = distributed.fetch_tree((p, o), rt.mesh)
            params += list(host_p)
            opt += list(host_o)
        return params, opt

    # -- one step ----------------------------------------------------------------------------------------

    def microbatches(self, batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        mb = self.plan.microbatch_size
        for name, value in batch.items():
            if value.shape[0] != self.plan.global_batch:
                raise ArenaError(f"batch entry {name!r} has {value.shape[0]} samples, the plan's global batch is {self.plan.global_batch}")
        return [{k: v[i * mb:(i + 1) * mb] for k, v in batch.items()} for i in range(self.plan.num_microbatches)]

    def step(self, batch: dict[str, np.ndarray], profile_stages: bool = False) -> StepStats:
        """One training step on the global batch ``batch`` (host arrays); returns the mean loss."""
        import jax

        if not self.params:
            raise RuntimeError("init_state() or load_state() first")
        # the wait is read inside the step's clock, so the wait it reports is never longer than the step
        t0, d0, w0 = time.perf_counter(), time.thread_time(), schedstat.run_queue_wait_s()
        S, B = self.plan.pipeline_degree, self.plan.num_microbatches
        pieces = self.microbatches(batch)
        stage_time = [0.0] * S
        stage_peak = [0] * S
        stage_batches = []
        for rt in self.stages:
            stage_batches.append([distributed.place_tree(p, {k: rt.batch_sharding for k in p}) for p in pieces] if rt.uses_batch else [{}] * B)
        last = self.stages[-1]
        scale = self.loss_scale.scale if self.loss_scale is not None else 1.0
        if self.loss_cotangent is None or scale != self._cotangent_scale:
            self.loss_cotangent = distributed.place(np.float32(scale / B), last.replicated)
            self._cotangent_scale = scale
        # the zeroed accumulators the last update returned (placed from the host on the first step, or after a
        # step that did not finish: its buffers may have been donated)
        grads = [rt.zero_grads() if g is None else g for rt, g in zip(self.stages, self.grads)]
        self.grads = [None] * len(self.stages)
        activations: dict[tuple[int, int], Any] = {}
        cotangents: dict[tuple[int, int], Any] = {}
        vjps: dict[tuple[int, int], Any] = {}
        losses = []
        for j, kind, i in self.order:
            rt = self.stages[j]
            t_task = time.perf_counter()
            if kind == "F":
                if rt.first:
                    out, vjp = rt.forward(self.params[j], stage_batches[j][i])
                else:
                    out, vjp = rt.forward(self.params[j], activations.pop((j - 1, i)), stage_batches[j][i])
                vjps[(j, i)] = vjp
                if rt.last:
                    losses.append(out)
                else:
                    out = self._move(out, rt, self.stages[j + 1])
                    activations[(j, i)] = out
            else:
                cotangent = self.loss_cotangent if rt.last else cotangents.pop((j, i))
                if rt.first:
                    grads[j] = rt.backward(self.params[j], stage_batches[j][i], vjps.pop((j, i)), cotangent, grads[j])
                    out = grads[j]
                else:
                    grads[j], carry_grad = rt.backward(self.params[j], stage_batches[j][i], vjps.pop((j, i)), cotangent, grads[j])
                    out = cotangents[(j - 1, i)] = self._move(carry_grad, rt, self.stages[j - 1])
            if profile_stages:
                jax.block_until_ready(out)
                stage_time[j] += time.perf_counter() - t_task
                memory = self.stage_memory_bytes(all_processes=False)
                stage_peak = [max(a, b) for a, b in zip(stage_peak, memory)]
        finite = True
        if self.loss_scale is not None:  # one look at every stage's gradients before any update
            flags = [self._to_last(rt.finite(g), rt) for rt, g in zip(self.stages, grads)]
            finite = all(v > 0 for v in distributed.fetch_scalars(flags, last.mesh))
        self.last_step_updated = finite
        inv_scale = np.float32(1.0 / scale)
        for j, rt in enumerate(self.stages):
            if not finite:
                continue  # skipped: its accumulators are zeroed afresh for the next step (self.grads[j] is None)
            t_task = time.perf_counter()
            with warnings.catch_warnings():
                # XLA may keep some donated buffers (it aliases what it can); that is not an error.
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                self.params[j], self.opt_state[j], self.grads[j] = rt.update(self.params[j], self.opt_state[j], grads[j],
                                                                           inv_scale)
            if profile_stages:
                jax.block_until_ready(self.params[j])
                stage_time[j] += time.perf_counter() - t_task
        if self.loss_scale is not None:
            self.loss_scale.after_step(finite)
        loss = float(np.mean(distributed.fetch_scalars(losses, last.mesh)))  # waits for the last stage
        jax.block_until_ready(self.params)
        self.step_count += 1
        waited = schedstat.waited_since(w0)
        elapsed, dispatch = time.perf_counter() - t0, time.thread_time() - d0
        if profile_stages and distributed.multi_process():  # each process timed the stages it holds
            stage_time = distributed.max_over_processes(stage_time)
            stage_peak = [int(v) for v in distributed.max_over_processes(stage_peak, np.int64)]
        return StepStats(self.step_count, loss, elapsed, stage_time if profile_stages else [],
                         stage_peak if profile_stages else [], dispatch, waited)

    def _to_last(self, x: Any, source: StageRuntime) -> Any:
        """A replicated scalar of ``source``'s devices onto the last stage's (where the step's scalars are read)."""
        import jax

        last = self.stages[-1]
        if source is last:
            return x
        if not distributed.multi_process():
            return jax.device_put(x, last.replicated)
        return distributed.transfer(x, source.mesh, last.replicated)

    def _move(self, x: Any, source: StageRuntime, target: StageRuntime) -> Any:
        """An activation (or its gradient) from ``source``'s mesh to ``target``'s carry layout."""
        import jax

        if not distributed.multi_process():
            return jax.device_put(x, target.carry_sharding)
        return distributed.transfer(x, source.mesh, target.carry_sharding)

    # -- memory -------------------------------------------------------------------------------------------

    def stage_memory_bytes(self, all_processes: bool = True) -> list[int]:
        """Bytes of live JAX arrays on the most loaded device of each stage (all live arrays of the process;
        with several processes, the maximum over them: a collective, every process must call it)."""
        per_device = live_bytes_per_device()
        local = [max(per_device.get(d.id, 0) for d in rt.devices) for rt in self.stages]
        if all_processes and distributed.multi_process():
            return [int(v) for v in distributed.max_over_processes(local, np.int64)]
        return local


def live_bytes_per_device() -> dict[int, int]:
    """Bytes of the process's live JAX arrays on each of its devices. Sizes come from the arrays' shardings:
    reading a shard's ``data`` would make a new array per shard, which the next call would count as well."""
    import jax

    out: dict[int, int] = defaultdict(int)
    for array in jax.live_arrays():
        if array.is_deleted():
            continue
        sharding = array.sharding
        nbytes = int(np.prod(sharding.shard_shape(array.shape))) * array.dtype.itemsize
        for device in sharding.addressable_devices:
            out[device.id] += nbytes
    return dict(out)
