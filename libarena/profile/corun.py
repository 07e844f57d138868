"""Stage times on the host the plan's devices share: alone, and with every device busy (co-run profiling).

XLA host devices (``--xla_force_host_platform_device_count=N``) are not separate processors. A process's
devices share one intra-op thread pool on the cores it may use, so a stage's time depends on what the other
devices do at the same moment, in both directions (bench/results/sharing.json):

* alone -- one device computing, the others idle -- a stage may use every core of the process: gpt__small's
  stages run 1.37-1.62x faster on two cores than in the profiler's one-core process;
* together -- every device computing -- small kernels pay the shared pool's hand-offs: gpt__tiny's
  data-parallel forward + backward takes 1.6x its one-core time with both devices busy.

Neither follows from a one-device profile (the CPU-time model of libarena.profile.concurrency assumed a
stage's cores from its CPU time, which on two cores counts spinning). So for plans of N > 1 host devices the
profiler also times each distinct stage in a child process laid out as the plan's devices will be (N
devices, the same XLA threading and cores): its micro-batch alone on device 0, and on all N devices at once
(the same executable on each: the contention of the all-busy phases), the two interleaved sample by sample.
The 1F1B model (libarena.profile.pipeline) uses the first where one stage works alone and the second where
all do. Accelerators are separate chips and need none of this.

A stage whose workers hold every device of the plan (data or tensor parallelism over the whole grid) is timed
as the runtime runs it instead (:class:`SpmdStage`): one SPMD executable over its dp x tp devices
(libarena.run.executor.StageRuntime, collectives inside), its forward + backward per micro-batch, the
optimizer update (which reduces the replicas' gradients and zeroes their accumulators for the next step)
and one micro-batch's input placement. Two one-device executables side by side miss what the SPMD one adds on a host -- GSPMD's
partitioning, the dp stacking of residuals and accumulators, the update's cross-replica sum: gpt__small's
data-parallel micro-batch took 9% longer as the runtime's executable than co-run as two
(bench/results/profile-corun.json), and gpt__tiny's update 1.1 ms against the 0.5 ms of a one-device update
plus the priced all-reduce. A one-device plan's one stage is timed so too (an SpmdStage of dp = tp = 1 in a
one-device child): the runtime's stage takes more arguments than the profiler's executables, places its inputs
per micro-batch in the step, and runs the update right behind the step's micro-batches. In probes on the 2-core host
(fresh children taking turns with the runtime's own; not a benchmark file) the profiler's executables composed
to between 11% under and 1% over the tiny models' 4-micro-batch steps, mostly from the inputs' placement (about 0.55 ms a
micro-batch in the step's context against 0.17 ms timed in a loop) and a 2-5% slower micro-batch.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from libarena.artifacts import content_digest
from libarena.errors import ArenaError
from libarena.profile.cache import claim_notes
from libarena.profile.stage import StageSpec
from libarena.profile.subprocess_devices import DeviceChild, serve_requests
from libarena.profile.timers import Timing
from libarena.run.heap import frozen_heap

#: bump when what a co-run record holds, or how it is timed, changes (cached records are then re-measured);
#: 3: timed with the C heap's thresholds fixed (libarena.run.heap.steady_malloc);
#: 4: an SpmdStage's update timed as the runtime's step runs it, right behind its micro-batches;
#: 5: a one-device worker's stage also issued as the runtime issues it (its dispatching thread's CPU per micro-batch
#: and for its sends to the pipeline neighbours); 6: an SpmdStage's update timed behind as many micro-batches as its step
#: runs (SpmdStage.step_microbatches), not behind a burst of the session's size; 7: the child's C heap on huge pages
#: (libarena.run.heap.huge_page_heap_env)
CORUN_VERSION = 7


@dataclass(frozen=True)
class SpmdStage:
    """A stage over a plan's whole grid of host devices as the runtime runs it: units [start, stop) of ``model`` on
    a (dp, tp) mesh, ``microbatch`` samples per micro-batch over the whole stage, ``step_microbatches`` of them
    per step before the update."""

    model: str
    start: int
    stop: int
    dp: int
    tp: int
    microbatch: int
    zero: bool = False
    remat: bool = False
    dtype: str = "fp32"
    seq_len: int | None = None
    step_microbatches: int = 4

    @property
    def workers(self) -> int:
        return self.dp * self.tp


#: what the co-run child times: a worker's stage executable (alone / all devices busy) or a whole SPMD stage
CoRunItem = StageSpec | SpmdStage


@dataclass(frozen=True)
class CoRunTiming:
    """A stage's micro-batch (forward + backward) seconds on ``num_devices`` host devices: ``alone_s`` on one of
    them while the others idle, ``together_s`` on each while all run it (the statistic of the samples)."""

    num_devices: int
    alone_s: float
    together_s: float
    alone_samples_s: tuple[float, ...] = ()
    together_samples_s: tuple[float, ...] = ()
    #: wall seconds of the child spent on this stage (build, compile, warm-up and timing; the child's start too for
    #: the first stage it timed)
    device_s: float = 0.0
    #: an SpmdStage's (None for a worker's stage): alone_s = together_s = its SPMD forward + backward; the
    #: optimizer update with the replicas' gradient reduction and the accumulators' reset, as the step runs it
    #: (issued right behind the micro-batches, not waited for apart: :func:`update_in_step`); one micro-batch's
    #: inputs; and the update timed on its own, back to back (for the record: the step does not run it so)
    update_s: float | None = None
    input_put_s: float | None = None
    update_alone_s: float | None = None
    #: a one-device worker's stage (tensor degree 1): the runtime's dispatching thread's CPU seconds to issue one
    #: micro-batch's forward and backward of the stage as the runtime builds it (libarena.run.executor.StageRuntime;
    #: the profiler's own executables take fewer arguments and issue faster), and to send one micro-batch's
    #: output activation to the next stage's device and its input gradient to the previous one's (each only where
    #: the stage has that neighbour); None where not timed
    runtime_dispatch_s: float | None = None
    send_dispatch_s: float | None = None
    #: the calling thread's CPU per micro-batch while ``alone_s`` was timed (the profiler's executables)
    alone_dispatch_s: float | None = None

    @property
    def spmd(self) -> bool:
        return self.update_s is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def update_in_step(microbatch_s: tuple[float, ...], microbatches_update_s: tuple[float, ...], step_microbatches: int,
                   statistic: str, alone_s: float) -> float:
    """An SpmdStage's update as the runtime's step runs it: issued right behind the step's micro-batches, with no
    wait between. On a host it then takes longer than timed on its own -- in probes on the 2-device development
    host (not a benchmark file) gpt__tiny's data-parallel update took 2.6-3.8 ms alone, and 4 micro-batches then
    the update took 6.6 ms more than the 4 micro-batches -- and the 1F1B sum of the two regions timed apart fell
    short of the step by as much. So the child times the step's ``step_microbatches`` micro-batches and the update
    as one region, interleaved with the micro-batches' own bursts (``microbatch_s``: per micro-batch), and the
    update is what the region's statistic adds to ``step_microbatches`` micro-batches at theirs. Composed again
    (the 1F1B model of a one-stage plan: B micro-batches, then the update), the micro-batch statistic cancels and
    the step's compute is the region's statistic: the update alone is a difference of two regions each many times
    its size, which on a noisy host moves by a multiple of itself (an earlier version timed it behind a burst of 4
    micro-batches whatever the plan's count, so for other counts it did not cancel). (The statistic of the paired
    differences would not compose so: in a benchmark run that used it, bench/results/profile-spmd-update-paired.json,
    their lower quartile gave smaller updates than the ones timed alone in the run before and larger misses.) Where
    the host's noise swamps the difference (not positive), or nothing was timed behind the micro-batches, the
    update timed on its own (``alone_s``) stands in."""
    if not microbatch_s or not microbatches_update_s:
        return alone_s
    in_step = (Timing(tuple(microbatches_update_s)).statistic(statistic)
               - step_microbatches * Timing(tuple(microbatch_s)).statistic(statistic))
    return in_step if in_step > 0 else alone_s


def corun_cache_key(stage_key: str, num_devices: int, threading_name: str, item: CoRunItem | None = None,
                    fresh_child: bool = False) -> str:
    """A stage's co-run record: the stage's own profile key, the process's device count and threading layout,
    and the host (its name and CPU count: the cores the devices share); for an SpmdStage its mesh, micro-batch
    and options too; and whether it was timed in a child of its own (``fresh_child``), a record of its own."""
    import os
    import platform

    spmd = asdict(item) if isinstance(item, SpmdStage) else None
    return content_digest("stage-corun", CORUN_VERSION, stage_key, int(num_devices), threading_name, platform.node(), os.cpu_count(),
                          *([spmd] if spmd else []), *(["fresh-child"] if fresh_child else []))


def _describe(item: CoRunItem) -> str:
    what = f"dp {item.dp} x tp {item.tp} SPMD" if isinstance(item, SpmdStage) else f"mb {item.micro_batch} tp {item.tp}"
    return f"{item.model} units [{item.start}, {item.stop}) {what}"


def _pooled_regions(chunks: Iterable[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Each region's samples over ``chunks``, in order."""
    out: dict[str, list[float]] = {}
    for chunk in chunks:
        for region, samples in chunk.items():
            out.setdefault(region, []).extend(samples)
    return out


def _request(item: CoRunItem) -> dict[str, Any]:
    return {"kind": "spmd" if isinstance(item, SpmdStage) else "worker", "item": asdict(item)}


class CoRunSession(DeviceChild):
    """A child with ``num_devices`` host devices that keeps stages compiled on every device (or, for an
    SpmdStage, on its mesh) between chunks of timed samples, so that a benchmark can interleave them with other
    timings (ABAB). ``time`` adds samples; ``timing`` gives the statistic of all of them, or of one ``time`` call's."""

    def __init__(self, num_devices: int, threading: Any = None, seed: int = 0, burst: int = 4) -> None:
        super().__init__("libarena.profile.corun", [str(seed), str(burst)], num_devices, what="co-run profiling",
                         platform="cpu", threading=threading)
        self.burst = burst
        #: per item, one entry per ``time`` call (a benchmark pairs turns): its samples per region, and per region
        #: the calling thread's CPU while issuing each sample (not wall time)
        self._chunks: dict[CoRunItem, list[tuple[dict[str, list[float]], dict[str, list[float]]]]] = {}
        self._device_s: dict[CoRunItem, float] = {}

    def build(self, item: CoRunItem) -> None:
        if item not in self._chunks:
            reply = self.ask({"op": "build", **_request(item)})
            self._chunks[item] = []
            self._device_s[item] = float(reply["wall_s"])

    def time(self, item: CoRunItem, warmup: int, repeats: int) -> None:
        """``repeats`` more samples of each region, interleaved, after ``warmup`` untimed ones."""
        self.build(item)
        reply = self.ask({"op": "time", **_request(item), "warmup": warmup, "repeats": repeats})
        self._chunks[item].append((dict(reply["samples_s"]), dict(reply.get("dispatch_s", {}))))
        self._device_s[item] += float(reply["wall_s"])

    def timing(self, item: CoRunItem, statistic: str, chunk: int | None = None) -> CoRunTiming:
        """The statistic of every sample so far, or (``chunk``) of that ``time`` call's samples only."""
        chunks = self._chunks.get(item) or []
        if not any(c[0] for c in chunks):
            raise ArenaError(f"stage {_describe(item)} has no co-run samples yet")
        if chunk is not None:
            if not 0 <= chunk < len(chunks):
                raise ArenaError(f"stage {_describe(item)} has no co-run chunk {chunk} ({len(chunks)} so far)")
            chunks = chunks[chunk:chunk + 1]
        samples, dispatch = _pooled_regions(c[0] for c in chunks), _pooled_regions(c[1] for c in chunks)

        def stat(region: str) -> float:
            return Timing(tuple(samples[region])).statistic(statistic)

        if isinstance(item, SpmdStage):  # its own devices are all busy: one time is both alone and together
            step, step_s, alone = tuple(samples["microbatch"]), stat("microbatch"), stat("update")
            update = update_in_step(step, tuple(samples["microbatches_update"]), item.step_microbatches, statistic, alone)
            return CoRunTiming(self.num_devices, step_s, step_s, step, step, self._device_s[item],
                               update_s=update, input_put_s=stat("input_put"), update_alone_s=alone)
        issued = {region: Timing(tuple(dispatch[region])).statistic(statistic) if dispatch.get(region) else None
                  for region in ("alone", "runtime_microbatch", "sends")}
        return CoRunTiming(self.num_devices, stat("alone"), stat("together"), tuple(samples["alone"]), tuple(samples["together"]),
                           self._device_s[item], runtime_dispatch_s=issued["runtime_microbatch"], send_dispatch_s=issued["sends"],
                           alone_dispatch_s=issued["alone"])

    def release(self, item: CoRunItem) -> None:
        if self._chunks.pop(item, None) is not None:
            self.ask({"op": "release", **_request(item)})

    def time_handoff(self, boundary: Any, rounds: int) -> Any:
        """A two-stage plan's step as the runtime runs it and with its hand-offs copies of ready inputs
        (libarena.profile.handoff): a HandoffTiming, its ``device_s`` the child's seconds on it."""
        from libarena.profile.handoff import HandoffTiming

        reply = self.ask({"op": "handoff", "item": asdict(boundary), "rounds": int(rounds)})
        return HandoffTiming(tuple(reply["samples_s"]["runtime"]), tuple(reply["samples_s"]["copy"]),
                             int(reply["handoffs_per_step"]), float(reply["wall_s"]))


def profile_corun(items: dict[tuple[str, CoRunItem], CoRunItem], num_devices: int, threading: Any, cache: Any, *,
                  warmup: int, repeats: int, statistic: str, seed: int = 0, burst: int = 4, fresh_child: bool = False,
                  log: Any = None) -> tuple[dict[tuple[str, CoRunItem], CoRunTiming], float]:
    """Co-run timings of ``items`` (keyed by (stage profile key, item)) on ``num_devices`` host devices laid
    out as ``threading``: {key: timing}, and the wall seconds spent measuring (0 when all came from ``cache``).
    ``fresh_child``: each item in a child of its own (ProfileConfig.isolation = "child": a stage built after
    others in one process can run slower, docs/profiler-accuracy.md, "What the process compiled before"), else all in one child."""
    out: dict[tuple[str, CoRunItem], CoRunTiming] = {}
    missing = []
    threading_name = getattr(threading, "name", "default")
    for key, item in items.items():
        hit = cache.get(corun_cache_key(key[0], num_devices, threading_name, item, fresh_child)) if cache is not None else None
        if hit is not None:
            out[key] = _timing_from_record(hit)
        else:
            missing.append((key, item))
    if not missing:
        return out, 0.0
    t0 = time.perf_counter()
    groups = [[entry] for entry in missing] if fresh_child else [missing]
    for group in groups:
        with contextlib.ExitStack() as stack:
            # the child starts at the first stage this run times itself: none for a group another run timed
            session, start_s = None, 0.0
            for key, item in group:
                cache_key = corun_cache_key(key[0], num_devices, threading_name, item, fresh_child)
                # claimed like a stage profile: a run sharing the cache that is timing it now is waited for
                doing = f"co-running {_describe(item)} on {num_devices} host devices"
                with cache.claim(cache_key, **claim_notes(log, doing)) if cache is not None else contextlib.nullcontext():
                    hit = cache.get(cache_key) if cache is not None else None
                    if hit is not None:
                        out[key] = _timing_from_record(hit)
                        continue
                    if session is None:
                        started = time.perf_counter()
                        session = stack.enter_context(CoRunSession(num_devices, threading, seed, burst))
                        start_s = time.perf_counter() - started  # the child's start: charged to this first stage
                    session.time(item, warmup, repeats)
                    timing = session.timing(item, statistic)
                    timing, start_s = replace(timing, device_s=timing.device_s + start_s), 0.0
                    session.release(item)
                    out[key] = timing
                    if cache is not None:
                        cache.put(cache_key, timing.to_dict())
                if log is not None:
                    times = (f"{timing.alone_s * 1e3:.2f} ms per micro-batch, update {timing.update_s * 1e3:.2f} ms" if timing.spmd
                             else f"{timing.alone_s * 1e3:.2f} ms alone, {timing.together_s * 1e3:.2f} ms all busy")
                    log(f"co-run {_describe(item)} on {num_devices} host devices: {times}")
    return out, time.perf_counter() - t0


def _timing_from_record(record: dict[str, Any]) -> CoRunTiming:
    return CoRunTiming(**{k: tuple(v) if k.endswith("samples_s") else v for k, v in record.items()})


class _SpmdRunner:
    """The child's side of an SpmdStage: the runtime's StageRuntime on the stage's devices, with its parameters,
    optimizer state, gradient buffers and one micro-batch (its input activation and output gradient random)."""

    def __init__(self, item: SpmdStage, devices: list[Any], seed: int) -> None:
        import jax
        import jax.numpy as jnp

        from libarena.models import get_model
        from libarena.models.training import OptimizerConfig, compute_dtype
        from libarena.plan import StagePlan
        from libarena.profile.stage import _batch_abstract, _carry_in_abstract, _concrete
        from libarena.run.executor import StageRuntime

        model = get_model(item.model)
        if item.workers > len(devices):
            raise ArenaError(f"{_describe(item)} needs {item.workers} devices, the child has {len(devices)}")
        first, last = item.start == 0, item.stop == len(model.units)
        stage = StagePlan(index=0, first_cluster=0, end_cluster=1, num_gpus=item.workers, dp=item.dp, tp=item.tp,
                          zero=item.zero, gpu_offset=0, remat=item.remat)
        # built directly, not through the runtime's stage cache: a released stage's executables are freed
        rt = StageRuntime(model, stage, range(item.start, item.stop), devices[: item.workers], item.microbatch, item.dtype,
                           OptimizerConfig(), first, last)
        self.rt, self.first = rt, first
        self.params = rt.fresh_params(model, seed)
        self.opt_state = rt.init_opt(self.params)
        self.grads = rt.zero_grads()
        abstract_batch = _batch_abstract(model, item.microbatch, item.seq_len)
        host = model.synthetic_samples(np.arange(item.microbatch), seed, item.seq_len)
        self.host_batch = {name: np.asarray(host[name]) for name in abstract_batch}
        self.batch_shardings = {name: rt.batch_sharding for name in self.host_batch}
        self.batch = jax.device_put(self.host_batch, self.batch_shardings) if rt.uses_batch else {}
        self.carry = None if first else _concrete(_carry_in_abstract(model, item.start, abstract_batch, compute_dtype(item.dtype)),
                                                  seed + 1, rt.carry_sharding)
        out, _ = self._forward()
        self.cotangent = jax.device_put(np.float32(1.0), rt.replicated) if last else jnp.ones_like(out)
        self.last = last
        self.output = None if last else out
        # a pipeline neighbour's carry layout on another device (the runtime's StageRuntime.carry_sharding there)
        self.neighbour = None
        if len(devices) > item.workers:
            from libarena.run.executor import carry_sharding, stage_mesh

            self.neighbour = carry_sharding(stage_mesh(devices[item.workers: item.workers + 1], 1, 1))

    def _forward(self) -> Any:
        if self.first:
            return self.rt.forward(self.params, self.batch)
        return self.rt.forward(self.params, self.carry, self.batch)

    def microbatch(self) -> Any:
        """One micro-batch's forward and backward, accumulating into the (donated) gradient buffers."""
        _, residuals = self._forward()
        result = self.rt.backward(self.params, self.batch, residuals, self.cotangent, self.grads)
        self.grads = result if self.first else result[0]
        return result

    def update(self) -> Any:
        import warnings

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
            # as in the runtime's step: the update also zeroes the accumulators for the next step
            self.params, self.opt_state, self.grads = self.rt.update(self.params, self.opt_state, self.grads,
                                                                     np.float32(1.0))
        return self.params

    def microbatches_then_update(self, count: int) -> Any:
        """``count`` micro-batches and then the update, issued back to back as the runtime's step issues them."""
        for _ in range(count):
            self.microbatch()
        return self.update()

    @property
    def sends_anything(self) -> bool:
        """Whether the stage has a pipeline neighbour to send to (on a device of this child)."""
        return self.neighbour is not None and not (self.first and self.last)

    def sends(self) -> list[Any]:
        """What the runtime's step sends per micro-batch from this stage (PipelineExecutor._move): its output
        activation to the next stage's devices, its input gradient (shaped as its input) to the previous one's."""
        import jax

        if not self.sends_anything:
            return []
        return ([] if self.last else [jax.device_put(self.output, self.neighbour)]) + \
            ([] if self.first else [jax.device_put(self.carry, self.neighbour)])

    def input_put(self) -> Any:
        from libarena.run import distributed

        # as the runtime's step places each micro-batch on a stage that reads the batch
        return distributed.place_tree(self.host_batch, self.batch_shardings) if self.rt.uses_batch else []


def _serve(seed: int, burst: int) -> None:
    """The child side of CoRunSession: a worker's stage built on each of this process's devices, an SpmdStage
    on its mesh."""
    import jax

    from libarena.profile.profiler import _time_burst
    from libarena.profile.stage import build_stage_executables
    from libarena.profile.timers import HostTimer

    devices = jax.devices()
    timer = HostTimer()
    built: dict[CoRunItem, Any] = {}
    issued: dict[CoRunItem, _SpmdRunner] = {}

    def item_of(request: dict[str, Any]) -> CoRunItem:
        kind = SpmdStage if request["kind"] == "spmd" else StageSpec
        return kind(**request["item"])  # every field a JSON scalar

    def build(request: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        item = item_of(request)
        if item not in built:
            if isinstance(item, SpmdStage):
                built[item] = _SpmdRunner(item, devices, seed)
            else:
                built[item] = []
                for d in devices:
                    with jax.default_device(d):  # the executables are lowered and compiled for this device
                        built[item].append(build_stage_executables(item, device=d, seed=seed, with_optimizer=False))
                if item.tp == 1 and item.ep == 1 and item.zero_shards == 1:
                    # the same stage as the runtime builds it on one device: issued, not timed (the dispatching
                    # thread's CPU for its calls and its sends, which the 1F1B model adds beside the devices' work)
                    issued[item] = _SpmdRunner(SpmdStage(item.model, item.start, item.stop, 1, 1, item.micro_batch, remat=item.remat,
                                                         dtype=item.dtype, seq_len=item.seq_len), devices, seed)
        return {"wall_s": time.perf_counter() - t0}

    def sample(region: Any, times: int = burst) -> Timing:
        return _time_burst(timer, region, 0, 1, times)

    def regions(item: CoRunItem) -> list[tuple[str, Any, int]]:
        """(name, region, burst) of what is timed for ``item``."""
        target = built[item]
        if isinstance(item, SpmdStage):
            # host work (input placement) is timed one call per sample, as the runtime does it per micro-batch;
            # the update also right behind the step's micro-batches, as the step issues it (update_in_step)
            return [("microbatch", target.microbatch, burst), ("update", target.update, burst),
                    ("input_put", target.input_put, 1),
                    ("microbatches_update", lambda: target.microbatches_then_update(item.step_microbatches), 1)]

        def together() -> Any:  # every device dispatched before any is waited for: they run at once
            return [e.run_microbatch() for e in target]

        timed = [("alone", target[0].run_microbatch, burst), ("together", together, burst)]
        runner = issued.get(item)
        if runner is not None:
            timed.append(("runtime_microbatch", runner.microbatch, burst))
            if runner.sends_anything:
                timed.append(("sends", runner.sends, 1))
        return timed

    def time_item(request: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        build(request)
        sides = [(name, region, times, []) for name, region, times in regions(item_of(request))]
        with frozen_heap():  # one freeze for the whole interleaved loop (the timer's own is then nested)
            for _ in range(int(request["warmup"])):
                for _name, region, times, _samples in sides:
                    sample(region, times)
            for i in range(int(request["repeats"])):  # interleaved, alternating the order
                for _name, region, times, samples in sides if i % 2 == 0 else sides[::-1]:
                    samples.append(sample(region, times))
        return {"samples_s": {name: [t.samples[0] for t in samples] for name, _region, _times, samples in sides},
                # the calling thread's CPU while issuing each sample (per call of the burst)
                "dispatch_s": {name: [t.dispatch_samples[0] for t in samples] for name, _region, _times, samples in sides
                               if all(t.dispatch_samples for t in samples)},
                "wall_s": time.perf_counter() - t0}

    def release(request: dict[str, Any]) -> dict[str, Any]:
        built.pop(item_of(request), None)
        issued.pop(item_of(request), None)
        return {"ok": True}

    def handoff(request: dict[str, Any]) -> dict[str, Any]:
        from libarena.profile.handoff import StageBoundary, measure_boundary

        t0 = time.perf_counter()
        measured = measure_boundary(StageBoundary.from_dict(request["item"]), devices, seed, int(request["rounds"]))
        return {**measured, "wall_s": time.perf_counter() - t0}

    serve_requests({"build": build, "time": time_item, "release": release, "handoff": handoff})


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--serve":
        _serve(int(sys.argv[2]), int(sys.argv[3]))
