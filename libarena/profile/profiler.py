"""Disaggregated single-device profiling of parallel plans into the performance table (§3.4).

Per plan: every stage's worker executable is profiled on the one local device (content-addressed cache:
identical stages across plans, grids and runs are profiled once), collectives are priced by the comm
model, and the 1F1B model (libarena.profile.pipeline) gives the iteration time. Rows for GPU types
other than the local one are roofline-scaled estimates (``estimated`` = true).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from libarena.artifacts import Provenance, content_digest, write_table
from libarena.artifacts.registry import get_kind
from libarena.checks import MAX_REPEATS, MAX_SEED, Range, check_fields
from libarena.errors import ArenaError
from libarena.hardware.catalogue import get_gpu
from libarena.hardware.comm import AlphaBetaCommModel, CommModel, GroupPlacement, MeasuredCommModel
from libarena.models import ModelDef, get_model
from libarena.models.training import tree_bytes
from libarena.plan import ParallelPlan, PlanSet, Resources, StageLayout, data_parallel_plan, replica_microbatch
from libarena.plan.config import USABLE_MEMORY_FRACTION
from libarena.plan.costs import RECOMPUTE_COMM_FACTOR
from libarena.profile.cache import ProfileCache, claim_notes, default_cache_dir
from libarena.profile.corun import CoRunItem, CoRunTiming, SpmdStage, profile_corun
from libarena.profile.concurrency import HostCapacity, HostConcurrency, host_concurrency
from libarena.profile.device import LocalDevice, RooflineSpec, catalogue_roofline, local_roofline, resolve_device
from libarena.profile.handoff import GATE_SHARE
from libarena.profile.pipeline import StageTimes, one_f_one_b
from libarena.profile.estimate import PlanEstimate, perf_rows
from libarena.profile.stage import (
    VIEW_BATCH_EQUIVALENT, CompiledStage, StageSpec, _is_axes_leaf, _shard_shape, build_stage_executables, compile_stage,
    lower_stage, plan_stage_specs, worker_view,
)
from libarena.profile.timers import HostTimer, Timer, Timing, select_timer
from libarena.progress import ProgressCallback, ProgressUpdate, no_progress

#: Which plans of each grid are profiled.
SELECTIONS = ("proxy", "frontier", "exhaustive")
#: Which statistic of the repeated timings a stage contributes: the median (default), the minimum or the
#: lower quartile (q1; on a shared, contended host disturbances only add time, so the fast quarter of many
#: samples is the closest to the device's own speed, and steadier than the single fastest).
STATISTICS = ("median", "min", "q1")
#: What one profiled executable covers: a whole stage, or one unit (layer) -- identical units (the
#: repeated blocks of a transformer) then share one profile across every stage partition.
GRANULARITIES = ("stage", "unit")
#: where a stage is built and timed (ProfileConfig.isolation)
ISOLATIONS = ("process", "child")
#: cpu-time: host devices share the process's cores, each stage demanding what its profile says it keeps
#: busy; measured: one slowdown factor from a micro-benchmark; independent: every device its own chip.
CONCURRENCY_MODELS = ("co-run", "cpu-time", "measured", "independent")
#: 4: records carry each timing's process CPU time (cpu_per_wall) and lower quartile (q1_s); the per-step
#: host work is done as the runtime does it; the forward returns its residuals stacked as the runtime's does;
#: 5: the gradient reset is the update's zero-fill on the device (it was zeros placed from the host);
#: 6: timed with the C heap's thresholds fixed (libarena.run.heap.steady_malloc);
#: 7: timings carry the calling thread's CPU to issue them (dispatch_cpu_s: the 1F1B model's dispatch bound);
#: 8: a stage child's C heap is on huge pages (libarena.run.heap.huge_page_heap_env)
#: 9: the key holds the burst and, on CPU, the host;
#: 10: the stage key holds the micro-batch (a batch-equivalent tensor-parallel worker runs ceil(micro-batch / tp)
#: samples: micro-batches 3 and 4 at tp 2 built alike, but their activations hand off at their own size), and
#: the optimizer key the host;
#: 11: records carry grad_sync_bytes (a batch-equivalent worker's gradients as the runtime shards them)
STAGE_RECORD_VERSION = 11
#: Record key of each statistic.
_STATISTIC_KEYS = {"median": "median_s", "min": "min_s", "q1": "q1_s"}


@dataclass
class ProfileConfig:
    device: str = "local"
    timer: str = "auto"
    warmup: int = 2
    repeats: int = 7
    cache_dir: Path | None = None
    #: proxy: each grid's proxy plan; frontier: every frontier plan; exhaustive: every plan in the table
    selection: str = "proxy"
    #: also profile each grid's pure data-parallel plan (the ``dp`` view)
    include_dp: bool = True
    #: fraction of the device memory a plan may use (the planner's default)
    memory_fraction: float = USABLE_MEMORY_FRACTION
    seed: int = 0
    #: stage: one executable per distinct stage (what the executor runs); unit: one per distinct layer,
    #: summed (identical layers profiled once: cheaper). Mean error against direct measurement on 1 / 2 CPU
    #: devices: stage 4.7% / 7.0% (bench/results/profile.json of commit de3485e, the timing protocol);
    #: unit 27.3% / 12.6% on the gpt and moe tiny models (profile-unit.json, before that protocol, on a host
    #: whose repeated measurements differed by 17-19%)
    granularity: str = "stage"
    statistic: str = "median"
    #: co-run: for plans of several host devices (XLA devices on one CPU), every stage is also timed in a
    #: process laid out as the plan's (libarena.profile.corun), alone and with every device busy; cpu-time:
    #: the devices share the cores, each stage demanding the cores its profile kept busy; measured: they slow
    #: each other down by one factor from a micro-benchmark (libarena.profile.concurrency); independent:
    #: every device is its own chip (what accelerators always are, whatever is asked)
    concurrency: str = "co-run"
    #: how the plans' host devices will run (libarena.profile.host.XLA_THREADING): ``pinned`` gives a
    #: process one core per device, so a plan's devices share as many cores as it has devices
    xla_threading: str = "default"
    #: stop timing a region after this many seconds of timed runs once 5 samples are in (None: always
    #: ``repeats``); long stages (seconds per micro-batch) need fewer repetitions for the same median
    timing_budget_s: float | None = 10.0
    #: micro-batches dispatched back to back per timed region (the runtime does not wait between them,
    #: so a lone, synchronised micro-batch would also time the launch and wait the pipeline hides)
    burst: int = 4
    #: threads compiling the next stages' executables while none is timed (compilation is host work)
    compile_workers: int = field(default_factory=lambda: min(8, os.cpu_count() or 1))
    #: stages lowered and compiled ahead of their timing, at most (bounds the executables held at once)
    compile_ahead: int = 16
    #: process: every stage compiled (ahead, on threads) and timed in the profiling process; child: each stage
    #: built and timed in a fresh interpreter of its own (libarena.profile.stage_child), as arena-run builds its
    #: plan in a fresh process; the co-run timings of plans over several host devices then take a fresh child per
    #: stage too (libarena.profile.corun.profile_corun). In probes (docs/profiler-accuracy.md, "A stage timed in a child of its own") a stage timed after the
    #: model's other stages ran up to 1.5x slower than the same stage in a fresh child; whether the child's
    #: timings predict the runtime better across the zoo is not yet benchmarked, so it is not the default. The
    #: child times ``repeats`` runs (``timing_budget_s`` does not cut them short)
    isolation: str = "process"
    #: rounds of a two-stage host plan's step timed per variant where its hand-offs are measured
    #: (libarena.profile.handoff: co-run plans of two one-device stages whose flat hand-off price is at least 2% of
    #: the step); 0: the flat price for every plan
    handoff_rounds: int = 40
    #: the flat hand-off price's share of a plan's composed step from which its boundary is measured
    handoff_gate: float = GATE_SHARE

    def __post_init__(self) -> None:
        if self.statistic not in STATISTICS:
            raise ArenaError(f"unknown statistic {self.statistic!r} (known: {', '.join(STATISTICS)})")
        if self.concurrency not in CONCURRENCY_MODELS:
            raise ArenaError(f"unknown concurrency model {self.concurrency!r} (known: {', '.join(CONCURRENCY_MODELS)})")
        if self.granularity not in GRANULARITIES:
            raise ArenaError(f"unknown granularity {self.granularity!r} (known: {', '.join(GRANULARITIES)})")
        if self.isolation not in ISOLATIONS:
            raise ArenaError(f"unknown stage isolation {self.isolation!r} (known: {', '.join(ISOLATIONS)})")
        if self.isolation == "child" and self.granularity != "stage":
            raise ArenaError("stage isolation 'child' times whole stages: it needs granularity 'stage'")
        if self.selection not in SELECTIONS:
            raise ArenaError(f"unknown plan selection {self.selection!r} (known: {', '.join(SELECTIONS)})")
        check_fields(self, {
            "warmup": Range("--warmup", 0, 1000, integer=True),
            "repeats": Range("--repeats", 1, MAX_REPEATS, integer=True),
            "burst": Range("--burst", 1, 1024, integer=True),
            "compile_workers": Range("--compile-workers", 1, 256, integer=True),
            "compile_ahead": Range("compile_ahead", 1, 4096, integer=True),
            "timing_budget_s": Range("--timing-budget", 0, 86400, lo_open=True, optional=True),
            "memory_fraction": Range("memory_fraction", 0, 1, lo_open=True),
            "seed": Range("seed", 0, MAX_SEED, integer=True),
            "handoff_rounds": Range("--handoff-rounds", 0, MAX_REPEATS, integer=True),
            "handoff_gate": Range("handoff_gate", 0, 1),
        })
        from libarena.profile.host import XLA_THREADING

        self.xla_threading = XLA_THREADING.canonical(self.xla_threading)


@dataclass(frozen=True)
class ProfiledJob:
    """What profiling a plan set needs besides its plans: the model, where the stages sit in it, the dtype."""

    planset: PlanSet
    model: ModelDef
    layout: StageLayout

    @classmethod
    def of(cls, planset: PlanSet) -> ProfiledJob:
        model = get_model(planset.model_name)
        layout = planset.layout
        layout.check_units([u.name for u in model.units], model.name)
        return cls(planset, model, layout)

    @property
    def dtype(self) -> str:
        return self.planset.dtype or "fp32"

    @property
    def seq_len(self) -> int | None:
        return self.planset.seq_len or None

    def stage_specs(self, plan: ParallelPlan) -> list[StageSpec]:
        return plan_stage_specs(self.model, self.layout, plan, self.dtype, self.seq_len)


@dataclass
class ProfileResult:
    table: pa.Table
    estimates: list[PlanEstimate]
    summary: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# One stage


def timing_namespace(config: ProfileConfig) -> str:
    """How a profiling run times a region (warmup and timed runs, time budget) and reduces the samples of a co-run
    (its records keep the reduced times): the namespace of its stage and co-run cache entries."""
    return content_digest("timing", config.warmup, config.repeats, config.timing_budget_s, config.statistic)


def stage_cache_key(spec: StageSpec, local: LocalDevice, timer_name: str, *, burst: int) -> str:
    """The key of a stage's profile: what builds its executables, the device and how it was timed (``burst``
    runs per timed region; on CPU the host too, whose cores are the device: a cache shared between hosts must
    not serve one host's times to another)."""
    import jax

    from libarena.models import get_model

    view = worker_view(spec)
    return content_digest(
        "stage-profile",
        STAGE_RECORD_VERSION,
        view.signature(get_model(spec.model)),
        spec.dtype,
        local.platform,
        local.kind,
        timer_name,
        jax.__version__,
        int(burst),
        local.host(),
        int(spec.micro_batch),
    )


def profile_stage(
    spec: StageSpec,
    local: LocalDevice,
    timer: Timer,
    cache: ProfileCache | None = None,
    warmup: int = 2,
    repeats: int = 7,
    seed: int = 0,
    burst: int = 4,
    compiled: CompiledStage | None = None,
    compile_device_s: float | None = None,
    budget_s: float | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, Any], bool]:
    """Profile one worker of one stage on the local device; returns (record, served_from_cache).

    ``compiled``: its executables compiled ahead (``compile_ahead``), which took ``compile_device_s`` of
    the profiling run's wall time (its share of a parallel compilation). ``log``: says when the stage is being
    profiled by another run sharing the cache (this one waits for it)."""
    key = stage_cache_key(spec, local, timer.name, burst=burst)
    return _profiled_once(cache, key, spec, log, lambda: _profile_stage(spec, key, local, timer, cache, warmup, repeats, seed,
                                                                        burst, compiled, compile_device_s, budget_s))


def _profiled_once(cache: ProfileCache | None, key: str, spec: StageSpec, log: Callable[[str], None] | None,
                   profile: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """(record, served_from_cache): ``key``'s cache entry, else ``profile()``'s record, stored under ``key``. A
    run claims the key before profiling (ProfileCache.claim), so runs sharing the cache profile a stage once:
    one that waited finds the other's entry."""
    if cache is None:
        return profile(), False
    hit = cache.get(key)
    if hit is not None:
        return hit, True
    stage = f"{spec.model} units [{spec.start}, {spec.stop}) mb {spec.micro_batch} tp {spec.tp}"
    with cache.claim(key, **claim_notes(log, f"profiling {stage}")):
        hit = cache.get(key)  # another run may have profiled it while this one waited
        if hit is not None:
            return hit, True
        record = profile()
        cache.put(key, record)
    return record, False


def _profile_stage(spec: StageSpec, key: str, local: LocalDevice, timer: Timer, cache: ProfileCache | None, warmup: int,
                   repeats: int, seed: int, burst: int, compiled: CompiledStage | None, compile_device_s: float | None,
                   budget_s: float | None) -> dict[str, Any]:
    """The stage's profile record (its optimizer step's profile read from, or written to, ``cache``)."""
    try:
        return _profile_stage_on_device(spec, key, local, timer, cache, warmup, repeats, seed, burst, compiled,
                                        compile_device_s, budget_s)
    except MemoryError:
        raise _out_of_memory(spec, local) from None
    except Exception as exc:  # XLA's allocation failures are runtime errors of its own type, named by status
        if "RESOURCE_EXHAUSTED" in str(exc):
            raise _out_of_memory(spec, local) from None
        raise


def _out_of_memory(spec: StageSpec, local: LocalDevice) -> ArenaError:
    """A stage that does not fit the memory of the device profiling it (a paper-size model on a laptop's CPU)."""
    return ArenaError(f"stage {spec} does not fit in the memory of {local.label} ({local.memory_bytes / 2**30:.1f} "
                      f"GiB): profile plans of a smaller model here, or estimate this one with `arena-schedule perf "
                      f"build --mode roofline`")


def _profile_stage_on_device(spec: StageSpec, key: str, local: LocalDevice, timer: Timer, cache: ProfileCache | None,
                             warmup: int, repeats: int, seed: int, burst: int, compiled: CompiledStage | None,
                             compile_device_s: float | None, budget_s: float | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    opt_key = optimizer_cache_key(spec, local, timer.name)
    opt_record = cache.get(opt_key) if cache is not None else None
    if compiled is not None and opt_record is None and compiled.optimizer is None:
        compiled = None  # compiled ahead without the optimizer, whose profile is not there after all
    execs = build_stage_executables(spec, device=local.device, seed=seed, with_optimizer=opt_record is None, compiled=compiled)
    timed = {"microbatch": 0.0, "optimizer": 0.0}
    t1 = time.perf_counter()
    microbatch = _time_burst(timer, execs.run_microbatch, warmup, repeats, burst, budget_s)
    timed["microbatch"] = time.perf_counter() - t1
    if opt_record is None:
        t1 = time.perf_counter()
        opt_record = {
            "optimizer": timer.time(execs.run_optimizer, warmup, repeats, budget_s).to_dict(),
            "cost": execs.cost["optimizer"],
            "memory": execs.memory["optimizer"],
            "state_bytes": execs.optimizer_state_bytes(),
        }
        timed["optimizer"] = time.perf_counter() - t1
        if cache is not None:
            cache.put(opt_key, opt_record)
    setup = _time_step_setup(execs, local.device, repeats)
    wall = time.perf_counter() - t0
    compile_wall = execs.compile_s
    if compiled is not None and compile_device_s is not None:
        wall += compile_device_s  # compiled before t0, in parallel with other stages
        compile_wall = compile_device_s
    return _stage_record(spec, execs, key, local, timer.name, microbatch, opt_key, opt_record, setup, wall, compile_wall, timed)


def profile_stage_in_child(spec: StageSpec, local: LocalDevice, timer: Timer, cache: ProfileCache | None, warmup: int,
                           repeats: int, seed: int, burst: int, threading: Any = None,
                           log: Callable[[str], None] | None = None) -> tuple[dict[str, Any], bool]:
    """``profile_stage`` with the stage built and timed in a fresh child of its own (``isolation = "child"``):
    (record, served_from_cache). The record keeps the stage's key (what plans and co-run timings look it up
    by); the cache keeps it apart from the in-process profile of the same stage."""
    from libarena.profile.stage_child import StageChild

    def profile() -> dict[str, Any]:
        with StageChild(spec, timer.name, device=local.label, threading=threading, seed=seed, burst=burst) as child:
            child.build(repeats)
            child.time(warmup, repeats)
            return child.record()

    # the child runs under the threading layout given (the in-process profile under this process's)
    key = content_digest("stage-profile-in-child", stage_cache_key(spec, local, timer.name, burst=burst),
                         getattr(threading, "name", None))
    return _profiled_once(cache, key, spec, log, profile)


def _stage_record(spec: StageSpec, execs: Any, key: str, local: LocalDevice, timer_name: str, microbatch: Timing, opt_key: str,
                  opt_record: dict[str, Any], setup: dict[str, float], wall: float, compile_wall: float,
                  timed: dict[str, float]) -> dict[str, Any]:
    """A stage's profile record from its executables and timings (what the cache keeps, estimate_plan reads).
    ``timed``: wall seconds spent in the timed runs (warm-up included) of the micro-batch and the optimizer step:
    the part of ``wall`` that grows with the stage's work (a benchmark derives larger grids' cost from it)."""
    import jax

    view = execs.view
    out = execs.forward(execs.inputs["params"], execs.inputs["carry_in"], execs.inputs["batch"])[0]
    out_bytes = 0.0 if view.is_last(_model(spec)) else float(out.size * out.dtype.itemsize)
    carry_in_bytes = 0.0 if view.carry_in is None else float(np.prod(view.carry_in.shape) * np.dtype(view.carry_in.dtype).itemsize)
    # Activations travel at the worker's micro-batch; the batch-equivalent view runs micro_batch / tp.
    scale = spec.micro_batch / view.local_batch
    return {
        "key": key,
        "spec": asdict(spec),
        "tp_view": view.tp_view,
        "local_batch": view.local_batch,
        "timer": timer_name,
        "device_kind": local.kind,
        "jax_version": jax.__version__,
        "microbatch": microbatch.to_dict(),
        "optimizer": opt_record["optimizer"],
        "optimizer_key": opt_key,
        **setup,
        "compile_s": execs.compile_s,
        #: this stage's part of the profiling run's wall time spent compiling (compile_s on one thread)
        "compile_device_s": compile_wall,
        "device_s": wall,
        "timed_device_s": {name: float(v) for name, v in timed.items()},
        "cost": {**execs.cost, "optimizer": opt_record["cost"]},
        "memory": {**execs.memory, "optimizer": opt_record["memory"]},
        "state_bytes": execs.weight_bytes() + opt_record["state_bytes"],
        "param_bytes": float(tree_bytes(view.params)),
        "grad_sync_bytes": _grad_sync_bytes(view),
        "activation_out_bytes": out_bytes * scale,
        "activation_in_bytes": carry_in_bytes * scale,
    }


class StageSession:
    """Stage executables kept compiled between timings, so that a timing protocol can take a stage's samples
    in several chunks interleaved with other work (the direct measurement it is compared with: ABAB on a
    shared host). ``record`` gives the stage's profile record, as ``profile_stage`` would, from every sample
    taken so far; ``device_s`` counts the wall time spent on the stage (build and compile included)."""

    def __init__(self, local: LocalDevice, timer: Timer, seed: int = 0, burst: int = 4) -> None:
        self.local, self.timer, self.seed, self.burst = local, timer, seed, burst
        self._execs: dict[str, Any] = {}
        self._state: dict[str, dict[str, Any]] = {}

    def build(self, spec: StageSpec, repeats: int = 7) -> str:
        """Compile the stage (once) and time its per-step host work; returns its profile key."""
        key = stage_cache_key(spec, self.local, self.timer.name, burst=self.burst)
        if key not in self._execs:
            t0 = time.perf_counter()
            execs = build_stage_executables(spec, device=self.local.device, seed=self.seed, with_optimizer=True)
            setup = _time_step_setup(execs, self.local.device, repeats)
            self._execs[key] = execs
            self._state[key] = {"spec": spec, "microbatch": [], "optimizer": [], "setup": setup, "device_s": time.perf_counter() - t0,
                                "timed": {"microbatch": 0.0, "optimizer": 0.0}}
        return key

    def time(self, spec: StageSpec, warmup: int, repeats: int) -> None:
        """``repeats`` more timed runs of the stage's micro-batch (in bursts) and optimizer step."""
        key = self.build(spec)
        execs, state = self._execs[key], self._state[key]
        t0 = time.perf_counter()
        state["microbatch"].append(_time_burst(self.timer, execs.run_microbatch, warmup, repeats, self.burst))
        t1 = time.perf_counter()
        state["optimizer"].append(self.timer.time(execs.run_optimizer, warmup, repeats))
        t2 = time.perf_counter()
        state["timed"]["microbatch"] += t1 - t0
        state["timed"]["optimizer"] += t2 - t1
        state["device_s"] += t2 - t0

    def device_s(self, spec: StageSpec) -> float:
        return self._state[stage_cache_key(spec, self.local, self.timer.name, burst=self.burst)]["device_s"]

    def record(self, spec: StageSpec, chunk: int | None = None) -> dict[str, Any]:
        """The stage's record from every sample so far, or (``chunk``) from the samples of that ``time`` call only
        (a benchmark pairs each turn of the estimate side with the measurement's turn beside it)."""
        key = stage_cache_key(spec, self.local, self.timer.name, burst=self.burst)
        execs, state = self._execs[key], self._state[key]
        if not state["microbatch"]:
            raise ArenaError(f"stage {spec.model}[{spec.start}:{spec.stop}] has not been timed yet")
        if chunk is not None and not 0 <= chunk < len(state["microbatch"]):
            raise ArenaError(f"stage {spec.model}[{spec.start}:{spec.stop}] has no timed chunk {chunk} "
                             f"({len(state['microbatch'])} so far)")
        picked = slice(None) if chunk is None else slice(chunk, chunk + 1)
        optimizer = _pooled(state["optimizer"][picked])
        opt_record = {"optimizer": optimizer.to_dict(), "cost": execs.cost["optimizer"], "memory": execs.memory["optimizer"],
                      "state_bytes": execs.optimizer_state_bytes()}
        return _stage_record(spec, execs, key, self.local, self.timer.name, _pooled(state["microbatch"][picked]),
                             optimizer_cache_key(spec, self.local, self.timer.name), opt_record, state["setup"], state["device_s"],
                             execs.compile_s, state["timed"])

    def release(self, spec: StageSpec) -> None:
        self._execs.pop(stage_cache_key(spec, self.local, self.timer.name, burst=self.burst), None)


def _grad_sync_bytes(view: Any) -> float:
    """Bytes of the gradients one worker's data-parallel replicas reduce: its parameters as the runtime shards them
    over the stage's tensor-parallel devices (a batch-equivalent view is built with whole layers, which would
    price the reduction tp times too large)."""
    import jax

    if view.tp_view != VIEW_BATCH_EQUIVALENT:
        return float(tree_bytes(view.params))
    leaves = jax.tree.leaves(view.params)
    axes = [a for ax in view.axes for a in jax.tree.leaves(ax, is_leaf=_is_axes_leaf)]
    return float(sum(np.prod(_shard_shape(s.shape, a, view.spec.tp)) * np.dtype(s.dtype).itemsize
                     for s, a in zip(leaves, axes, strict=True)))


def _pooled(timings: list[Timing]) -> Timing:
    return Timing(tuple(t for x in timings for t in x.samples), tuple(c for x in timings for c in x.cpu_samples),
                  tuple(d for x in timings for d in x.dispatch_samples) if all(x.dispatch_samples for x in timings) else ())


def optimizer_cache_key(spec: StageSpec, local: LocalDevice, timer_name: str) -> str:
    """The optimizer update depends only on the worker's optimizer shard sizes: one profile serves every
    micro-batch size (and every stage with the same parameter shapes), on one host (on CPU its cores are the
    device, as for the stage key)."""
    import jax

    return content_digest("optimizer-profile", STAGE_RECORD_VERSION, worker_view(spec).optimizer_elements, spec.dtype,
                          local.platform, local.kind, timer_name, jax.__version__, local.host())


def _time_burst(timer: Timer, region: Callable[[], Any], warmup: int, repeats: int, burst: int,
                budget_s: float | None = None) -> Timing:
    """Per-run timings of ``region`` dispatched ``burst`` times back to back in each timed run."""

    def runs() -> Any:
        out = None
        for _ in range(burst):
            out = region()
        return out

    return timer.time(runs, warmup, repeats, budget_s).scaled(1.0 / burst)


def compile_ahead(
    specs: list[tuple[StageSpec, bool]], workers: int, log: Callable[[str], None]
) -> tuple[dict[StageSpec, CompiledStage], dict[StageSpec, float]]:
    """Lower ``specs`` (spec, with_optimizer) in this thread (tracing holds the GIL) and compile them on
    ``workers`` threads (XLA releases it). Returns the executables and each one's share of the wall time,
    in proportion to its own compilation time."""
    from concurrent.futures import ThreadPoolExecutor

    t0 = time.perf_counter()
    lowered = [lower_stage(spec, with_optimizer=with_opt) for spec, with_opt in specs]
    if workers > 1 and len(lowered) > 1:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arena-compile") as pool:
            compiled = list(pool.map(compile_stage, lowered))
    else:
        compiled = [compile_stage(x) for x in lowered]
    wall = time.perf_counter() - t0
    total = sum(c.compile_s for c in compiled) or 1.0
    log(f"compiled {len(compiled)} stages on {min(workers, len(compiled))} threads in {wall:.1f} s ({total:.1f} s of compilation)")
    return ({c.lowered.spec: c for c in compiled}, {c.lowered.spec: wall * c.compile_s / total for c in compiled})


def _time_step_setup(execs: Any, device: Any, repeats: int) -> dict[str, float]:
    """What the runtime (libarena.run.executor) does for this worker once per step besides the stage's
    forward, backward and optimizer executables: its update also zeroes the worker's gradient accumulators
    for the next step (device work: timed as zero-fills of that many bytes on the device, several in a row so
    that each one's dispatch hides behind the last, as inside the update), and the host places one
    micro-batch of inputs with named shardings over the stage's (dp, tp) mesh -- here the worker's own
    one-device mesh (host wall clock). Median (and lower quartile) of ``repeats``."""
    import jax
    import jax.numpy as jnp

    from libarena.run.executor import carry_sharding, stage_mesh

    by_replica = carry_sharding(stage_mesh([device], 1, 1))  # as the runtime's stage takes its batch
    accumulator_bytes = sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(execs.view.params))
    zero_fill = jax.jit(jnp.zeros_like, donate_argnums=0)
    accumulator = [jax.device_put(np.ones(max(1, -(-accumulator_bytes // 4)), np.float32), device)]

    def fill() -> Any:  # into the buffer the last fill returned (donated), as the update writes the accumulators
        accumulator[0] = zero_fill(accumulator[0])
        return accumulator[0]

    batch = {name: np.asarray(jax.device_get(value)) for name, value in execs.inputs["batch"].items()}
    batch_shardings = {name: by_replica for name in batch}
    timer, samples = HostTimer(), max(3, repeats)
    zeroing = _time_burst(timer, fill, 1, samples, 8)
    put = timer.time(lambda: jax.device_put(batch, batch_shardings), 1, samples)
    return {
        "grad_reset_s": zeroing.median,
        "input_put_s": put.median,
        # the lower quartiles, for the q1 statistic (a shared host)
        "grad_reset_q1_s": zeroing.lower_quartile,
        "input_put_q1_s": put.lower_quartile,
    }


def dispatch_overhead(local: LocalDevice, cache: ProfileCache | None, timer: Timer) -> float:
    """Seconds one timed region pays besides its kernels (two executable launches and one sync), measured
    once per device with trivial executables. A stage timed as a sum of per-unit regions pays it once per
    unit; the fused stage once -- the difference is subtracted."""
    import jax

    if timer.name != "host":
        return 0.0  # kernel timers see no launch overhead
    key = content_digest("dispatch-overhead", 1, local.platform, local.kind, local.machine(), jax.__version__)
    hit = cache.get(key) if cache is not None else None
    if hit is not None:
        return float(hit["seconds"])
    x = jax.device_put(np.ones((8,), np.float32), local.device)
    first = jax.jit(lambda v: v * 2.0)
    second = jax.jit(lambda v: v + 1.0)
    seconds = timer.time(lambda: second(first(x)), 5, 51).median
    if cache is not None:
        cache.put(key, {"seconds": seconds})
    return seconds


def combine_unit_records(records: list[dict[str, Any]], spec: StageSpec, overhead_s: float) -> dict[str, Any]:
    """A stage record from the records of its units (executed one after another)."""
    n = len(records)

    def timing(name: str) -> dict[str, Any]:
        median = sum(r[name]["median_s"] for r in records) - (n - 1) * overhead_s
        minimum = sum(r[name].get("min_s", r[name]["median_s"]) for r in records) - (n - 1) * overhead_s
        q1 = sum(r[name].get("q1_s", r[name]["median_s"]) for r in records) - (n - 1) * overhead_s
        spread = float(np.sqrt(sum(r[name]["spread_s"] ** 2 for r in records)))
        # the units one after another keep busy the cores each kept busy, for its share of the time
        cpu = sum(r[name]["median_s"] * (r[name].get("cpu_per_wall") or 1.0) for r in records)
        wall = sum(r[name]["median_s"] for r in records)
        return {"median_s": max(median, 0.0), "min_s": max(minimum, 0.0), "q1_s": max(q1, 0.0), "spread_s": spread, "samples_s": [],
                "cpu_per_wall": cpu / wall if wall > 0 else 1.0}

    cost = {
        name: {k: float(sum((r["cost"].get(name) or {}).get(k, 0.0) for r in records)) for k in ("flops", "bytes")}
        for name in ("forward", "backward", "optimizer")
    }
    memory = {
        "forward": {"output": float(sum(r["memory"]["forward"].get("output", 0.0) for r in records))},
        "backward": {"temp": float(max(r["memory"]["backward"].get("temp", 0.0) for r in records))},
    }
    return {
        "key": content_digest("stage-of-units", [r["key"] for r in records], overhead_s),
        "spec": asdict(spec),
        "tp_view": records[0]["tp_view"],
        "local_batch": records[0]["local_batch"],
        "timer": records[0]["timer"],
        "units": [r["key"] for r in records],
        "microbatch": timing("microbatch"),
        "optimizer": timing("optimizer"),
        # one gradient buffer per parameter of every unit; one input placement for the stage
        "grad_reset_s": float(sum(r["grad_reset_s"] for r in records)),
        "input_put_s": float(records[0]["input_put_s"]),
        "grad_reset_q1_s": float(sum(r.get("grad_reset_q1_s", r["grad_reset_s"]) for r in records)),
        "input_put_q1_s": float(records[0].get("input_put_q1_s", records[0]["input_put_s"])),
        "compile_s": float(sum(r["compile_s"] for r in records)),
        "device_s": float(sum(r["device_s"] for r in records)),
        "timed_device_s": {name: float(sum(r.get("timed_device_s", {}).get(name, 0.0) for r in records))
                           for name in ("microbatch", "optimizer")},
        "cost": cost,
        "memory": memory,
        "state_bytes": float(sum(r["state_bytes"] for r in records)),
        "param_bytes": float(sum(r["param_bytes"] for r in records)),
        "grad_sync_bytes": float(sum(r["grad_sync_bytes"] for r in records)),
        "activation_out_bytes": records[-1]["activation_out_bytes"],
        "activation_in_bytes": records[0]["activation_in_bytes"],
    }


def _model(spec: StageSpec) -> Any:
    from libarena.models import get_model

    return get_model(spec.model)


# --------------------------------------------------------------------------------------------------
# Communication of a stage


def _price(comm: CommModel, primitive: str, volume: float, gpu_type: str, used: list[str], *,
           placement: GroupPlacement | None = None, boundary: tuple[int, int, int, int, bool, int] | None = None) -> float:
    """One collective that every group of ``placement`` runs at once, or a pipeline hand-off of ``volume`` bytes
    (``boundary`` = (dp of the two stages, their gpus, crosses nodes, gpus per node))."""
    if placement is not None:
        group, crosses = placement.size, placement.crosses_nodes
    else:
        assert boundary is not None
        group, crosses = 2, boundary[4]
    if volume <= 0 or (group <= 1 and primitive != "p2p"):
        return 0.0
    try:
        if placement is not None:
            seconds = float(comm.collective_time(primitive, volume, placement, gpu_type))
        else:
            seconds = float(comm.boundary_time(volume, *boundary, gpu_type))
    except ArenaError as exc:
        raise ArenaError(
            f"no communication cost for {primitive} on {group} x {gpu_type}: {exc} "
            "(measure one with 'arena-profile comm' and pass it with --comm)"
        ) from None
    used.append(f"{primitive}/{group}x{gpu_type}{'/inter-node' if crosses else ''}: {comm.source(primitive, group, gpu_type, crosses)}")
    return seconds


def stage_communication(
    job: ProfiledJob, plan: ParallelPlan, j: int, records: list[dict[str, Any]], comm: CommModel, used: list[str]
) -> tuple[float, float, float]:
    """(per-micro-batch collectives, P2P, once-per-iteration gradient sync) of stage j, seconds."""
    g = plan.grid.gpus_per_node
    gpu_type = plan.grid.gpu_type
    s, B = plan.pipeline_degree, plan.num_microbatches
    stage = plan.stages[j]
    dp, tp, zero = stage.dp, stage.tp, stage.zero
    rec = records[j]
    clusters = job.planset.clusters[stage.first_cluster : stage.end_cluster]
    comm_mb = 0.0
    units = {u.name: i for i, u in enumerate(job.model.units)}
    for c in clusters:
        # Every collective is its own operator (latency floor each): a unit's all-reduces (UnitSpec.tp_allreduce_count)
        # and all-to-alls (forward and again backward) split the cluster's volume evenly.
        members = [units[name] for name in c.get("units", []) if name in units]
        if tp > 1:
            count = max(1, sum(job.model.tp_collectives(u) for u in members))
            volume = float(c.get("tp_allreduce_bytes", 0.0)) / (B * dp)
            comm_mb += count * _price(comm, "all-reduce", volume / count, gpu_type, used, placement=GroupPlacement.tensor_parallel(tp, g))
        if dp > 1:
            count = max(1, sum(2 * job.model.units[u].alltoalls for u in members))
            volume = float(c.get("alltoall_bytes", 0.0)) / (B * dp)
            comm_mb += count * _price(comm, "all-to-all", volume / count, gpu_type, used,
                                      placement=GroupPlacement.data_parallel(dp, tp, g))
    if stage.remat:  # the recomputed forward pass runs its collectives again (the forward half of each)
        comm_mb *= RECOMPUTE_COMM_FACTOR
    offsets = plan.stage_gpu_offsets
    p2p = 0.0
    for other, key in ((j + 1, "activation_out_bytes"), (j - 1, "activation_in_bytes")):
        if 0 <= other < s:
            # a worker's share of the micro-batch's activation (gradient) times the replicas: the whole hand-off
            crosses = offsets[j] // g != offsets[other] // g
            neighbour = plan.stages[other]
            p2p += _price(comm, "p2p", rec[key] * dp, gpu_type, used,
                          boundary=(dp, neighbour.dp, stage.num_gpus, neighbour.num_gpus, crosses, g))
    grad = 0.0
    if dp > 1:
        volume = rec["grad_sync_bytes"]
        placement = GroupPlacement.data_parallel(dp, tp, g)
        if zero:
            grad = _price(comm, "reduce-scatter", volume, gpu_type, used, placement=placement) + _price(
                comm, "all-gather", volume, gpu_type, used, placement=placement
            )
        else:
            grad = _price(comm, "all-reduce", volume, gpu_type, used, placement=placement)
    return comm_mb, p2p, grad


# --------------------------------------------------------------------------------------------------
# Plans


def _roofline_ratio(record: dict[str, Any], names: tuple[str, ...], local: RooflineSpec, target: RooflineSpec, dtype: str) -> float:
    """Target / local roofline time of the stage's operator groups (forward, backward, optimizer)."""
    t_local = t_target = 0.0
    for name in names:
        cost = record["cost"].get(name) or {}
        flops, moved = float(cost.get("flops", 0.0)), float(cost.get("bytes", 0.0))
        if flops <= 0 and moved <= 0:
            continue
        t_local += local.time(flops, moved, "fp32" if local.peaks == () else dtype)
        t_target += target.time(flops, moved, dtype)
    if t_local <= 0:
        raise ArenaError(f"stage {record['spec']['start']}-{record['spec']['stop']}: no cost analysis to scale by the roofline")
    return t_target / t_local


def estimate_plan(
    job: ProfiledJob,
    plan: ParallelPlan,
    records: list[dict[str, Any]],
    new_cost_s: float,
    local: LocalDevice,
    local_spec: RooflineSpec | None,
    comm: CommModel,
    timer_name: str,
    memory_fraction: float,
    statistic: str = "median",
    concurrency: HostConcurrency | HostCapacity | None = None,
    handoff_wait_s: float | None = None,
) -> PlanEstimate:
    """The 1F1B estimate of ``plan`` from its stages' profiles. ``concurrency``: how local devices that share
    a host slow each other down (None: independent devices). ``handoff_wait_s``: the plan's measured wait for its
    hand-offs' producers (libarena.profile.handoff; co-run host plans only), in place of the flat price."""
    estimated = plan.grid.gpu_type != local.gpu_type
    target_spec = _target_roofline(plan.grid.gpu_type, local) if estimated else None
    used: list[str] = []
    stage_times, stage_rows, memory = [], [], []
    s, B = plan.pipeline_degree, plan.num_microbatches
    for j, rec in enumerate(records):
        workers = plan.stages[j].num_gpus
        # The runtime places each micro-batch's inputs on the stages that read the batch (first: samples, last:
        # targets) from the host, every step; each stage's update zeroes its gradient accumulators.
        reads_batch = j == 0 or j == s - 1
        corun = rec.get("corun") if not estimated and isinstance(concurrency, HostCapacity) else None
        if corun is not None and int(corun["num_devices"]) != plan.grid.num_gpus:
            corun = None  # timed for another device count's process
        spmd = corun is not None and corun.get("update_s") is not None
        if spmd:
            # timed as the runtime's SPMD executable on the stage's devices (all of the plan's: no pipeline
            # neighbour): its collectives, the replicas' gradient reduction (in the update) and the host work on
            # its mesh are all in the timings, so the comm model prices nothing on top
            compute, optimizer = float(corun["alone_s"]), float(corun["update_s"])
            comm_mb = p2p = grad = 0.0
            setup = B * float(corun["input_put_s"]) if reads_batch else 0.0
            cores = optimizer_cores = 1.0
        else:
            stat = _STATISTIC_KEYS[statistic]
            compute = rec["microbatch"].get(stat, rec["microbatch"]["median_s"])
            optimizer = rec["optimizer"].get(stat, rec["optimizer"]["median_s"])
            # the runtime's update also zeroes the worker's gradient accumulators on its device
            suffix = "_q1_s" if statistic == "q1" and "grad_reset_q1_s" in rec else "_s"
            optimizer += rec["grad_reset" + suffix]
            if target_spec is not None:
                compute *= _roofline_ratio(rec, ("forward", "backward"), local_spec, target_spec, job.dtype)
                optimizer *= _roofline_ratio(rec, ("optimizer",), local_spec, target_spec, job.dtype)
            comm_mb, p2p, grad = stage_communication(job, plan, j, records, comm, used)
            setup = plan.stages[j].dp * B * rec["input_put" + suffix] if reads_batch else 0.0
            cores, optimizer_cores = rec["microbatch"].get("cpu_per_wall") or 1.0, rec["optimizer"].get("cpu_per_wall") or 1.0
        # the calling thread's issuing of the stage's calls, from the local timing (a roofline-scaled row is
        # another device's: its launches are not this host's)
        dispatch, optimizer_dispatch = (0.0, 0.0) if estimated else (float(rec["microbatch"].get("dispatch_cpu_s") or 0.0),
                                                                     float(rec["optimizer"].get("dispatch_cpu_s") or 0.0))
        send_dispatch, timed_dispatch = 0.0, None
        if corun is not None and not spmd and corun.get("runtime_dispatch_s") is not None:
            # issued as the runtime issues it, on the plan's host layout (libarena.profile.corun), sends included
            dispatch, send_dispatch = float(corun["runtime_dispatch_s"]), float(corun.get("send_dispatch_s") or 0.0)
            timed_dispatch = corun.get("alone_dispatch_s")
        st = StageTimes(compute, comm_mb, p2p, grad, optimizer, workers, setup, cores=cores, optimizer_cores=optimizer_cores,
                        alone_s=None if corun is None else float(corun["alone_s"]),
                        together_s=None if corun is None else float(corun["together_s"]),
                        dispatch_s=dispatch, optimizer_dispatch_s=optimizer_dispatch, send_dispatch_s=send_dispatch,
                        timed_dispatch_s=timed_dispatch, timed_as_spmd=spmd)
        stage_times.append(st)
        inflight = min(s - j, B)
        mem = rec["state_bytes"] + inflight * rec["memory"]["forward"].get("output", 0.0) + rec["memory"]["backward"].get("temp", 0.0)
        memory.append(float(mem))
        stage_rows.append(
            {
                "units": [rec["spec"]["start"], rec["spec"]["stop"]],
                "micro_batch": rec["spec"]["micro_batch"],
                "tp_view": rec["tp_view"],
                "key": rec["key"],
                **asdict(st),
                "compute_spread_s": rec["microbatch"]["spread_s"],
                "memory_bytes": float(mem),
            }
        )
    # Roofline-scaled rows are for GPUs (separate chips); local ones share what the local devices share.
    if estimated or concurrency is None:
        iteration = one_f_one_b(stage_times, B)
    elif isinstance(concurrency, HostCapacity):
        iteration = one_f_one_b(stage_times, B, host_cores=concurrency.cores_for(plan.grid.num_gpus),
                                handoff_wait_s=handoff_wait_s if all(st.alone_s is not None for st in stage_times) else None)
    else:
        iteration = one_f_one_b(stage_times, B, concurrency.slowdown)
    try:
        capacity = get_gpu(plan.grid.gpu_type).memory_bytes
    except ArenaError:
        capacity = local.memory_bytes
    fits = max(memory) <= memory_fraction * capacity
    return PlanEstimate(
        plan=plan,
        iteration=iteration,
        fits_in_memory=bool(fits),
        memory_per_stage_bytes=memory,
        timer="estimated" if estimated else timer_name,
        estimated=estimated,
        profiling_cost_device_s=new_cost_s,
        stages=stage_rows,
        comm_sources=sorted(set(used)),
    )


def host_sharing(config: ProfileConfig, local: LocalDevice, max_devices: int, cache: ProfileCache | None) -> HostConcurrency | HostCapacity:
    """The concurrency model ``config`` asks for, for plans of up to ``max_devices`` devices of ``local``'s kind
    (accelerators are separate chips: independent whatever is asked)."""
    from libarena.profile.host import XLA_THREADING, usable_cores

    if local.platform != "cpu" or config.concurrency == "independent":
        return HostConcurrency()
    if config.concurrency == "measured":
        return host_concurrency(local, max_devices, cache)
    # co-run: the CPU-time model for what is not co-run timed (the optimizer step, unit granularity)
    layout = XLA_THREADING.get(config.xla_threading)
    measured = host_concurrency(local, max_devices, cache, layout) if max_devices > 1 else None
    return HostCapacity(len(usable_cores()), layout.pin_one_core_per_device, measured)


def corun_item(plan: ParallelPlan, j: int, spec: StageSpec) -> CoRunItem:
    """What the co-run child times for stage ``j`` (worker spec ``spec``) of a plan of host devices: a stage
    whose workers hold every device of the plan (a one-device plan's one stage too) as the runtime's executable
    on them, any other stage as its worker's executable alone and beside the others."""
    stage = plan.stages[j]
    if stage.num_gpus == plan.grid.num_gpus:
        return SpmdStage(spec.model, spec.start, spec.stop, stage.dp, stage.tp,
                         replica_microbatch(plan.grid.global_batch, plan.num_microbatches), stage.zero, stage.remat,
                         spec.dtype, spec.seq_len, plan.num_microbatches)
    return spec


def corun_timings(job: ProfiledJob, work: list[tuple[ParallelPlan, bool]], config: ProfileConfig, local: LocalDevice, timer: Timer,
                  cache: ProfileCache | None, log: Callable[[str], None]
                  ) -> tuple[dict[tuple[int, str, CoRunItem], CoRunTiming], dict[int, float]]:
    """Co-run timings (libarena.profile.corun) of the stages of ``work``'s plans on local host devices:
    {(devices, stage key, co-run item): timing}, and per device count the wall seconds its child spent measuring.
    One-device plans too: their one stage is timed as the runtime runs it (an SpmdStage on one device), since the
    profiler's own executables, timed alone, leave out what the runtime's step adds on a host (its executables'
    extra arguments, the inputs placed per micro-batch, the update right behind the step's micro-batches:
    corun.update_in_step)."""
    from libarena.profile.host import XLA_THREADING

    if config.concurrency != "co-run" or config.granularity != "stage" or local.platform != "cpu":
        return {}, {}
    by_devices: dict[int, dict[tuple[str, CoRunItem], CoRunItem]] = {}
    for plan, _ in work:
        if plan.grid.gpu_type == local.gpu_type:
            for j, spec in enumerate(job.stage_specs(plan)):
                item = corun_item(plan, j, spec)
                by_devices.setdefault(plan.grid.num_gpus, {})[(stage_cache_key(spec, local, timer.name, burst=config.burst), item)] = item
    out: dict[tuple[int, str, CoRunItem], CoRunTiming] = {}
    cost: dict[int, float] = {}
    layout = XLA_THREADING.get(config.xla_threading)
    for n, items in sorted(by_devices.items()):
        timings, spent = profile_corun(items, n, layout, cache, warmup=config.warmup, repeats=config.repeats,
                                       statistic=config.statistic, seed=config.seed, burst=config.burst,
                                       fresh_child=config.isolation == "child", log=log)
        out.update({(n, key, item): t for (key, item), t in timings.items()})
        if spent > 0:
            cost[n] = spent
    return out, cost


def _with_measured_handoffs(job: ProfiledJob, composed: list[tuple[ParallelPlan, bool, list[dict[str, Any]], PlanEstimate]],
                            config: ProfileConfig, local: LocalDevice, local_spec: RooflineSpec | None, comm: CommModel,
                            timer: Timer, cache: ProfileCache | None, concurrency: Any, log: Callable[[str], None],
                            progress: ProgressCallback = no_progress,
                            ) -> tuple[list[tuple[ParallelPlan, bool, list[dict[str, Any]], PlanEstimate]], int, dict[int, float]]:
    """``composed`` with the co-run plans of two one-device stages whose flat hand-off price is at least
    libarena.profile.handoff.GATE_SHARE of the step estimated again on their measured wait for the producers
    (each boundary's child charged to its plan, as the co-run stages are); how many were; and per device count
    the wall seconds the children spent measuring. ``progress`` hears one update per device count's child."""
    from libarena.profile.handoff import boundary_of, profile_handoffs
    from libarena.profile.host import XLA_THREADING

    if config.handoff_rounds == 0 or not isinstance(concurrency, HostCapacity):
        return composed, 0, {}
    wanted: dict[int, dict[Any, tuple[str, str]]] = {}
    boundary_at: dict[int, Any] = {}
    for i, (plan, _is_dp, records, estimate) in enumerate(composed):
        # a plan that does not fit is not run whole in a child to refine its estimate
        if estimate.estimated or not estimate.fits_in_memory or not all("corun" in rec for rec in records):
            continue
        iteration = estimate.iteration
        boundary = boundary_of(plan, job.stage_specs(plan), iteration.handoff_s, iteration.composed_s, config.handoff_gate)
        if boundary is not None:
            boundary_at[i] = boundary
            wanted.setdefault(plan.grid.num_gpus, {})[boundary] = (records[0]["key"], records[1]["key"])
    if not boundary_at:
        return composed, 0, {}
    layout = XLA_THREADING.get(config.xla_threading)
    timings: dict[tuple[int, Any], Any] = {}
    cost: dict[int, float] = {}
    what = "timing two-stage plans' hand-offs"
    progress(ProgressUpdate(what, 0, len(wanted)))
    for done_counts, (n, boundaries) in enumerate(sorted(wanted.items()), start=1):
        measured, spent = profile_handoffs(boundaries, n, layout, cache, rounds=config.handoff_rounds, seed=config.seed,
                                            fresh_child=config.isolation == "child", log=log)
        timings.update({(n, b): t for b, t in measured.items()})
        if spent > 0:
            cost[n] = spent
        progress(ProgressUpdate(what, done_counts, len(wanted), f"{len(boundaries)} boundaries on {n} devices"))
    out, charged, done = list(composed), set(), 0
    for i, boundary in boundary_at.items():
        plan, is_dp, records, estimate = composed[i]
        timing = timings.get((plan.grid.num_gpus, boundary))
        if timing is None:
            continue  # its measurement failed (logged): the flat price stays
        done += 1
        plan_cost = estimate.profiling_cost_device_s
        if (plan.grid.num_gpus, boundary) not in charged:
            charged.add((plan.grid.num_gpus, boundary))
            plan_cost += plan.grid.num_gpus * timing.device_s  # its child held the plan's devices
        again = estimate_plan(job, plan, records, plan_cost, local, local_spec, comm, timer.name, config.memory_fraction,
                              config.statistic, concurrency, handoff_wait_s=timing.wait_s(config.statistic))
        out[i] = (plan, is_dp, records, again)
    return out, done, cost


def select_plans(planset: PlanSet, selection: str) -> list[ParallelPlan]:
    """The plans to profile of every allocation (all its grids' plans, whatever their pipeline degree)."""
    chosen = []
    by_resources: dict[Resources, list[ParallelPlan]] = {}
    for plan in planset.plans():
        by_resources.setdefault(plan.resources, []).append(plan)
    for plans in by_resources.values():
        if selection == "exhaustive":
            chosen.extend(plans)
        elif selection == "frontier":
            chosen.extend(p for p in plans if p.on_frontier or p.is_proxy)
        else:
            proxies = [p for p in plans if p.is_proxy]
            chosen.extend(proxies or plans[:1])
    return chosen


def check_comm_model(comm: CommModel, planset: PlanSet) -> None:
    """A measured table must cover at least one of the planned GPU types (else it is for other hardware)."""
    if isinstance(comm, MeasuredCommModel):
        types = sorted({g.grid.gpu_type for g in planset.grids})
        if not any(comm.covers(t) for t in types):
            raise ArenaError(
                f"the communication table {comm.source_name} measures {', '.join(comm.gpu_types)}, "
                f"not the planned GPU types ({', '.join(types)})"
            )


def _target_roofline(gpu_type: str, local: LocalDevice) -> RooflineSpec:
    """The roofline a profiled stage is scaled to for ``gpu_type``, another type than the local device's."""
    try:
        return catalogue_roofline(gpu_type)
    except ArenaError:
        raise ArenaError(f"GPU type {gpu_type!r} is neither the local device ({local.gpu_type}) nor in the hardware "
                         "catalogue") from None


def check_prices(comm: CommModel, planset: PlanSet, local: LocalDevice) -> None:
    """Before anything is profiled: every feasible grid's GPU type can be priced, its compute from the local
    device or the catalogue's roofline, its communication from the comm table or the catalogue's links (else the
    run would end in the same error after its profiling)."""
    from libarena.hardware import get_gpu

    grids = [g.grid for g in planset.grids if g.feasible]
    for gpu_type in sorted({g.gpu_type for g in grids} - {local.gpu_type}):
        _target_roofline(gpu_type, local)
    for gpu_type, num_gpus in sorted({(g.gpu_type, g.num_gpus) for g in grids if g.num_gpus > 1}):
        if isinstance(comm, MeasuredCommModel) and comm.covers(gpu_type):
            continue
        try:
            get_gpu(gpu_type)  # the alpha-beta model's link bandwidths
        except ArenaError as exc:
            raise ArenaError(f"no communication cost for the {num_gpus} x {gpu_type} plans: {exc} (measure one with "
                             "'arena-profile comm' and pass it with --comm)") from None


def profile_plans(
    planset: PlanSet,
    config: ProfileConfig | None = None,
    comm: CommModel | None = None,
    log: Callable[[str], None] | None = None,
    progress: ProgressCallback | None = None,
) -> ProfileResult:
    """Profile a plan set (``plan.read_plans(path, require_costs=False)``) into performance-table rows and
    per-plan estimates.

    ``progress`` hears one update per profiled plan (the tools draw it as a progress bar)."""
    config = config or ProfileConfig()
    log = log or (lambda message: None)
    progress = progress or no_progress
    job = ProfiledJob.of(planset)
    if not any(g.feasible for g in planset.grids):
        raise ArenaError(f"{job.model.name}: nothing to profile: the plans file has no feasible plan (every grid is "
                         "out of memory or too small for its micro-batches; arena-plan show lists why)")
    comm = comm or AlphaBetaCommModel()
    check_comm_model(comm, planset)
    local = resolve_device(config.device)
    check_prices(comm, planset, local)
    timer = select_timer(config.timer, local.device)
    cache = ProfileCache(config.cache_dir or default_cache_dir())
    # the host's calibrations (roofline, dispatch overhead, concurrency) come from ``cache``; the timings of stages
    # and co-runs from its part for this run's timing protocol
    timed = cache.within(timing_namespace(config))
    needs_scaling = any(g.grid.gpu_type != local.gpu_type for g in planset.grids)
    local_spec = local_roofline(local, cache) if needs_scaling else None
    log(f"device {local.label} ({local.kind}, counts as {local.gpu_type}); timer {timer.name}; comm {comm.describe()}")

    selected = select_plans(planset, config.selection)
    # One grid per allocation stands for it (its pipeline degree does not matter to the dp plan). An allocation
    # with no feasible grid gets no dp plan either: nothing of the model fits there, and building its whole
    # model on the local device to find that out can take more memory than the host has.
    allocations: dict[Resources, Any] = {}
    for g in planset.grids:
        if g.feasible:
            allocations.setdefault(g.grid.resources, g.grid)
    resources = sorted(allocations, key=lambda r: (r.gpu_type, r.num_gpus, r.num_nodes, r.global_batch))
    num_clusters = job.layout.num_clusters
    dp_plans = {r: data_parallel_plan(replace(allocations[r], pipeline_degree=1), num_clusters) for r in resources} if config.include_dp else {}
    work = [(p, False) for p in selected] + [(p, True) for p in dp_plans.values()]

    stages_needed = stages_cached = stages_profiled = 0
    stage_costs: list[dict[str, Any]] = []
    seen_this_run: set[str] = set()
    estimates: list[PlanEstimate] = []
    dp_estimates: dict[Resources, PlanEstimate] = {}
    overhead = dispatch_overhead(local, cache, timer) if config.granularity == "unit" else 0.0
    local_devices = max([p.grid.num_gpus for p, _ in work if p.grid.gpu_type == local.gpu_type] or [1])
    concurrency = host_sharing(config, local, local_devices, cache)
    if isinstance(concurrency, HostCapacity):
        log(f"host devices share {'one core per device' if concurrency.one_core_per_device else f'{concurrency.cores} cores'}; "
            "each stage demands the cores its profile kept busy")
    elif concurrency.slowdowns:
        log(f"host concurrency: {', '.join(f'{k} devices at once run {v:.2f}x slower' for k, v in concurrency.slowdowns)} ({concurrency.source})")
    corun, corun_cost = corun_timings(job, work, config, local, timer, timed, log)
    # A plan's profiling cost is what its stages cost to profile, charged to the first plan of this run that needs
    # each (an identical stage is profiled once), taken from the stage's record whether it was profiled now or
    # served from the cache: a table rebuilt from its own build's cache reports the same costs. (A stage's record
    # includes its optimizer step's profile only when it was the one to profile it: the optimizer's is shared
    # with stages of the same shapes, possibly of another global batch.)
    corun_charged: set[tuple[int, str, Any]] = set()

    def pieces_of(stage_spec: StageSpec) -> list[StageSpec]:
        if config.granularity == "unit":
            return [replace(stage_spec, start=i, stop=i + 1) for i in range(stage_spec.start, stage_spec.stop)]
        return [stage_spec]

    plan_pieces = [[pieces_of(st) for st in job.stage_specs(plan)] for plan, _ in work]
    # Stages to profile, in the order they will be timed; each optimizer shape is compiled with its first.
    # Identical stages (same key: the repeated layers at unit granularity, equal stages of other plans) once.
    pending: list[tuple[StageSpec, bool]] = []
    queued: set[StageSpec] = set()
    keys_queued: set[str] = set()
    optimizers_queued: set[str] = set()
    from libarena.profile.host import XLA_THREADING

    isolated = config.isolation == "child"
    child_threading = XLA_THREADING.get(config.xla_threading) if isolated else None
    # isolated: each stage built in a child of its own, so nothing is queued to compile ahead here
    to_compile = [] if isolated else [spec for stages in plan_pieces for pieces in stages for spec in pieces]
    for spec in to_compile:
        key = stage_cache_key(spec, local, timer.name, burst=config.burst)
        if key in keys_queued or timed.get(key) is not None:
            continue
        opt_key = optimizer_cache_key(spec, local, timer.name)
        with_opt = opt_key not in optimizers_queued and timed.get(opt_key) is None
        optimizers_queued.add(opt_key)
        keys_queued.add(key)
        queued.add(spec)
        pending.append((spec, with_opt))
    ahead: dict[StageSpec, CompiledStage] = {}
    ahead_cost: dict[StageSpec, float] = {}
    next_pending = 0

    composed: list[tuple[ParallelPlan, bool, list[dict[str, Any]], PlanEstimate]] = []
    for done, (plan, is_dp) in enumerate(work):
        progress(ProgressUpdate("profiling plans", done, len(work), f"{plan.grid.gpu_type} {plan.plan_id}"))
        records, new_cost = [], 0.0
        for j, (stage_spec, pieces) in enumerate(zip(job.stage_specs(plan), plan_pieces[done])):
            piece_records = []
            for spec in pieces:
                if spec in queued and spec not in ahead and next_pending < len(pending):
                    # Compile the next stages together, before any of them is timed: compiling while a
                    # stage runs would slow a host device down.
                    batch = pending[next_pending : next_pending + config.compile_ahead]
                    next_pending += len(batch)
                    compiled, shares = compile_ahead(batch, config.compile_workers, log)
                    ahead.update(compiled)
                    ahead_cost.update(shares)
                if isolated:
                    record, cached = profile_stage_in_child(spec, local, timer, timed, config.warmup, config.repeats, config.seed,
                                                            config.burst, child_threading, log=log)
                else:
                    record, cached = profile_stage(spec, local, timer, timed, config.warmup, config.repeats, config.seed,
                                                   config.burst, ahead.pop(spec, None), ahead_cost.pop(spec, None),
                                                   config.timing_budget_s, log=log)
                stages_needed += 1
                if record["key"] not in seen_this_run:
                    new_cost += record["device_s"]
                if cached:
                    stages_cached += 1
                else:
                    stages_profiled += 1
                    stage_costs.append(_stage_cost(spec, record))
                    log(
                        f"profiled {spec.model} units [{spec.start}, {spec.stop}) mb {spec.micro_batch} tp {spec.tp}: "
                        f"{record['microbatch']['median_s'] * 1e3:.2f} ms/micro-batch ({record['device_s']:.1f} device-s)"
                    )
                seen_this_run.add(record["key"])
                piece_records.append(record)
            if config.granularity == "unit":
                records.append(combine_unit_records(piece_records, stage_spec, overhead))
            else:
                corun_key = (plan.grid.num_gpus, piece_records[0]["key"], corun_item(plan, j, stage_spec))
                timing = corun.get(corun_key)
                if timing is not None and corun_key not in corun_charged:
                    corun_charged.add(corun_key)
                    new_cost += plan.grid.num_gpus * timing.device_s  # its co-run child held the plan's devices
                records.append(piece_records[0] if timing is None else {**piece_records[0], "corun": timing.to_dict()})
        estimate = estimate_plan(
            job, plan, records, new_cost, local, local_spec, comm, timer.name, config.memory_fraction, config.statistic, concurrency
        )
        composed.append((plan, is_dp, records, estimate))
    progress(ProgressUpdate("profiling plans", len(work), len(work)))
    composed, handoffs_measured, handoff_cost = _with_measured_handoffs(job, composed, config, local, local_spec, comm, timer,
                                                                        timed, concurrency, log, progress) if corun else (composed, 0, {})
    for n, spent in handoff_cost.items():  # its children are co-run children: they held the plan's devices
        corun_cost[n] = corun_cost.get(n, 0.0) + spent
    for plan, is_dp, _records, estimate in composed:
        if is_dp:
            dp_estimates[plan.resources] = estimate
        else:
            estimates.append(estimate)
    what = "units" if config.granularity == "unit" else "stages"
    log(f"{stages_needed} {what}: {stages_profiled} profiled, {stages_cached} skipped (identical, served from the cache)")

    rows = perf_rows(estimates, dp_estimates, resources)
    kind = get_kind("perf_table")
    table = pa.Table.from_pylist(rows, schema=kind.arrow_schema()) if rows else kind.arrow_schema().empty_table()
    sources = sorted({src for e in [*estimates, *dp_estimates.values()] for src in e.comm_sources})
    summary = {
        "device": local.describe(),
        "timer": timer.name,
        "comm_model": comm.describe(),
        "comm_sources": sources,
        "selection": config.selection,
        "granularity": config.granularity,
        "statistic": config.statistic,
        "dispatch_overhead_s": overhead,
        "host_concurrency": {**concurrency.to_dict(), "co_run_stages": len(corun)} if corun else concurrency.to_dict(),
        #: wall seconds co-run children held N host devices, per N (0 entries when all came from the cache)
        "co_run_wall_s": {str(n): w for n, w in corun_cost.items()},
        #: two-stage host plans whose hand-offs' wait was measured (libarena.profile.handoff)
        "handoffs_measured": handoffs_measured,
        "plans_profiled": len(estimates),
        "stages_needed": stages_needed,
        "stages_profiled": stages_profiled,
        "stages_skipped": stages_cached,
        "unique_stages": len(seen_this_run),
        "local_roofline": local_spec.to_dict() if local_spec else None,
    }
    metadata = {
        **summary,
        "model": job.model.describe(),
        "operator_table_sha256": planset.operator_table_sha256,
        "plans": [e.to_dict() for e in [*estimates, *dp_estimates.values()]],
    }
    # where this run's profiling time went, stage by stage (the result's summary only: not an artifact's metadata)
    summary["stage_costs"] = stage_costs
    return ProfileResult(table, [*estimates, *dp_estimates.values()], summary, metadata)


def stage_shape(spec: StageSpec) -> dict[str, int]:
    """A stage's units and its worker's micro-batch and shardings: what the work of its timed runs scales with."""
    return {"start": spec.start, "stop": spec.stop, "micro_batch": spec.micro_batch, "tp": spec.tp, "ep": spec.ep,
            "zero_shards": spec.zero_shards}


def _stage_cost(spec: StageSpec, record: dict[str, Any]) -> dict[str, Any]:
    """A profiled stage's shape and its device-seconds: all of them, compiling, and in the timed runs (the part
    that grows with the stage's work; the rest is the fixed cost of building it: tracing, inputs, a child's start)."""
    timed = record.get("timed_device_s") or {}
    return {**stage_shape(spec), "device_s": float(record["device_s"]), "compile_s": float(record.get("compile_device_s", record["compile_s"])),
            "timed_microbatch_s": float(timed.get("microbatch", 0.0)), "timed_optimizer_s": float(timed.get("optimizer", 0.0))}


def write_perf_table(path: str, result: ProfileResult, provenance: Provenance) -> None:
    write_table(path, "perf_table", result.table, provenance, result.metadata)
