"""Training loops on one plan: ``train`` (checkpointed, resumable onto any plan) and ``measure_plan``
(time a few steps: what arena-profile --measure and the runtime search call)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from libarena.errors import ArenaError
from libarena.hardware.catalogue import normalize_dtype
from libarena.models import ModelDef
from libarena.models.training import OptimizerConfig
from libarena.run import distributed
from libarena.run.checkpoint import DEFAULT_CHECKPOINT_EVERY, CheckpointMeta, CheckpointStore, param_signature
from libarena.run.executor import PipelineExecutor, StepStats
from libarena.run.heap import frozen_heap
from libarena.run.plan import RunPlan


@dataclass(frozen=True)
class TrainConfig:
    global_batch: int
    #: Train until this many steps are completed (a resumed job continues towards the same target).
    steps: int
    seed: int = 0
    data_seed: int = 0
    dtype: str = "fp32"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    checkpoint_dir: str | None = None
    #: Save every this many steps (and after the last one); 0 = only at the end.
    checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY
    #: Measure per-stage busy time and peak memory on this (1-based, in this run) step; 0 = never.
    profile_step: int = 2

    def __post_init__(self) -> None:
        # one spelling ("float16" and "half" are fp16): what the executor, checkpoints and reports compare
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))


def check_target(meta: CheckpointMeta | None, steps: int, store: CheckpointStore) -> None:
    """``steps`` counts every step of the job, resumed ones included: a checkpoint already past it is an error
    (nothing would run, silently), one exactly at it means the job is done."""
    if meta is not None and meta.step > steps:
        raise ArenaError(f"checkpoint {store.directory / str(meta.step)} is already at step {meta.step}, past --steps "
                         f"{steps} (--steps is the total, resumed steps included): nothing to train; give --steps "
                         f"above {meta.step} to train further")


def batch_for_step(model: ModelDef, data_position: int, global_batch: int, data_seed: int) -> dict[str, np.ndarray]:
    """The global batch starting at sample ``data_position``: samples are a function of their index, so
    resuming at a position reproduces the uninterrupted stream exactly."""
    return model.synthetic_samples(np.arange(data_position, data_position + global_batch), data_seed)


@dataclass
class TrainReport:
    model: str
    plan: dict[str, Any]
    num_devices: int
    start_step: int
    end_step: int
    resumed_from: int | None
    #: (step number, 1-based, loss) of every step this run executed.
    losses: list[tuple[int, float]] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    stage_time_s: list[float] = field(default_factory=list)
    stage_peak_memory_bytes: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    #: newer checkpoints that could not be resumed from (corrupt, empty), each {"step", "path", "why"}
    skipped_checkpoints: list[dict[str, Any]] = field(default_factory=list)

    @property
    def steady_step_time_s(self) -> float:
        """Median step time excluding the first (compiling) step."""
        times = self.step_times_s[1:] or self.step_times_s
        return float(statistics.median(times)) if times else float("nan")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["steady_step_time_s"] = self.steady_step_time_s
        out["losses"] = [[s, l] for s, l in self.losses]
        return out


def train(model: ModelDef, plan: RunPlan, config: TrainConfig, devices: Sequence[Any] | None = None,
          on_step: Callable[[StepStats], None] | None = None) -> TrainReport:
    """Train ``model`` under ``plan`` until ``config.steps`` steps are done, resuming from the newest
    checkpoint in ``config.checkpoint_dir`` when there is one (whatever plan wrote it)."""
    import jax

    t0 = time.perf_counter()
    if plan.global_batch != config.global_batch:
        raise ArenaError(f"plan {plan.plan_id} is for global batch {plan.global_batch}, not {config.global_batch}")
    devices = list(jax.devices()) if devices is None else list(devices)
    plan.validate(model, len(devices))
    store = CheckpointStore(config.checkpoint_dir) if config.checkpoint_dir else None
    resume_meta, skipped = None, []
    if store is not None:
        resume_meta, skipped = store.newest_usable(model, config.global_batch, config.data_seed, config.optimizer,
                                                   dtype=config.dtype)
        check_target(resume_meta, config.steps, store)
    # Everything is validated before the first write: bad input leaves an existing checkpoint untouched.
    executor = PipelineExecutor(model, plan, devices, config.dtype, config.optimizer)
    restored = None
    while resume_meta is not None:  # a checkpoint whose arrays do not restore is skipped like a corrupt one
        try:
            restored = store.restore(model, config.optimizer, resume_meta.step)
            break
        except ArenaError as exc:
            skipped.append({"step": resume_meta.step, "path": str(store.directory / str(resume_meta.step)), "why": str(exc)})
            resume_meta, more = store.newest_usable(model, config.global_batch, config.data_seed, config.optimizer,
                                                    below=resume_meta.step, dtype=config.dtype)
            skipped += more
            if resume_meta is None:
                raise ArenaError(f"{exc}; no earlier checkpoint in {store.directory} is usable (move the directory "
                                 f"aside to start over)") from None
    # a multi-host job's processes each read --checkpoint-dir: one that sees another step (a directory not shared
    # by the nodes, a stale network file system cache) would train a mixture and then wait in a collective the
    # others never join; every process sees the disagreement here and stops, before any step
    starts = distributed.gather_over_processes(0 if resume_meta is None else resume_meta.step)
    if len(set(starts)) > 1:
        raise ArenaError(f"the job's processes would resume from different steps ({', '.join(map(str, starts))} by "
                         f"process): every host must see the same --checkpoint-dir {config.checkpoint_dir} (a "
                         f"directory shared by the job's nodes)")
    if store is not None and distributed.process_index() == 0:
        for entry in skipped:  # newer than the resume point: orbax would keep it as the newest, or refuse to save its step
            moved = store.set_aside(entry["step"])
            if moved is not None:
                entry["set_aside_as"] = str(moved)
    if restored is not None:
        params, opt, meta = restored
        executor.load_state(params, opt, meta.step, loss_scale=meta.loss_scale)
        start = meta.step
    else:
        executor.init_state(config.seed)
        start = 0
    report = TrainReport(model.name, plan.describe(), plan.num_gpus, start, start, resume_meta.step if resume_meta else None,
                         skipped_checkpoints=skipped)
    signature = param_signature(model) if store is not None else ""

    def save(step: int) -> None:
        params, opt = executor.host_state()  # every process takes part; process 0 writes
        if distributed.process_index() != 0:
            report.checkpoints.append(step)
            return
        meta = CheckpointMeta(
            model=model.name, global_batch=config.global_batch, step=step, data_position=step * config.global_batch,
            data_seed=config.data_seed, dtype=config.dtype, optimizer=asdict(config.optimizer), param_signature=signature,
            plan_id=plan.plan_id, num_devices=plan.num_gpus,
            loss_scale={} if executor.loss_scale is None else executor.loss_scale.state(),
        )
        store.save(params, opt, meta)
        report.checkpoints.append(step)

    # the executor, its executables and state live for the whole loop: out of the collector's way (run.heap)
    with frozen_heap():
        for step in range(start, config.steps):
            batch = batch_for_step(model, step * config.global_batch, config.global_batch, config.data_seed)
            profile = config.profile_step > 0 and step - start + 1 == config.profile_step
            stats = executor.step(batch, profile_stages=profile)
            if not np.isfinite(stats.loss):
                raise ArenaError(f"loss became {stats.loss} at step {step + 1} under plan {plan.plan_id}")
            report.losses.append((step + 1, stats.loss))
            report.step_times_s.append(stats.step_time_s)
            if profile:
                report.stage_time_s = stats.stage_time_s
                report.stage_peak_memory_bytes = stats.stage_peak_memory_bytes
            report.end_step = step + 1
            if on_step is not None:
                on_step(stats)
            if store is not None and config.checkpoint_every > 0 and (step + 1) % config.checkpoint_every == 0:
                save(step + 1)
    if store is not None and report.end_step > start and report.end_step not in report.checkpoints:
        save(report.end_step)
    if not report.stage_peak_memory_bytes:
        report.stage_peak_memory_bytes = executor.stage_memory_bytes()
    report.wall_s = time.perf_counter() - t0
    return report


@dataclass(frozen=True)
class PlanMeasurement:
    plan_id: str
    num_devices: int
    #: Median of the timed steps (after ``warmup`` untimed ones, the first of which compiles).
    step_time_s: float
    step_times_s: tuple[float, ...]
    #: Per-stage busy seconds of one step (tasks waited for one by one) and peak live bytes per device.
    stage_time_s: tuple[float, ...]
    stage_peak_memory_bytes: tuple[int, ...]
    #: Time of the first step (compilation included) and of the whole measurement.
    first_step_s: float
    wall_s: float
    #: CPU seconds of the dispatching thread in each timed step (libarena.run.executor.StepStats)
    dispatch_cpu_s: tuple[float, ...] = ()
    #: seconds it waited for a core in each timed step (None where the kernel does not say)
    dispatch_wait_s: tuple[float | None, ...] = ()

    @property
    def device_seconds(self) -> float:
        """What the measurement cost: wall time x devices held."""
        return self.wall_s * self.num_devices

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["device_seconds"] = self.device_seconds
        return out


def measure_plan(model: ModelDef, plan: RunPlan, warmup: int = 1, steps: int = 3, devices: Sequence[Any] | None = None,
                 dtype: str = "fp32", optimizer: OptimizerConfig | None = None, seed: int = 0, data_seed: int = 0,
                 profile_stages: bool = True) -> PlanMeasurement:
    """Run ``warmup`` + ``steps`` training steps of ``plan`` and time them; with ``profile_stages`` one more
    step is run task by task for per-stage busy time and peak memory."""
    import jax

    t0 = time.perf_counter()
    devices = list(jax.devices()) if devices is None else list(devices)
    executor = PipelineExecutor(model, plan, devices, dtype, optimizer)
    executor.init_state(seed)
    times, dispatch, waits = [], [], []
    first = None
    with frozen_heap():  # as the training loop runs
        for k in range(max(1, warmup) + steps):
            batch = batch_for_step(model, k * plan.global_batch, plan.global_batch, data_seed)
            stats = executor.step(batch)
            if first is None:
                first = stats.step_time_s
            if k >= max(1, warmup):
                times.append(stats.step_time_s)
                dispatch.append(stats.dispatch_cpu_s)
                waits.append(stats.dispatch_wait_s)
    stage_time: tuple[float, ...] = ()
    stage_memory: tuple[int, ...] = tuple(executor.stage_memory_bytes())
    if profile_stages:
        batch = batch_for_step(model, 0, plan.global_batch, data_seed)
        profiled = executor.step(batch, profile_stages=True)
        stage_time, stage_memory = tuple(profiled.stage_time_s), tuple(profiled.stage_peak_memory_bytes)
    return PlanMeasurement(
        plan.plan_id, plan.num_gpus, float(statistics.median(times)) if times else float(first), tuple(times),
        stage_time, stage_memory, float(first), time.perf_counter() - t0, tuple(dispatch), tuple(waits),
    )
