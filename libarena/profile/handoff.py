"""What a two-stage pipeline's hand-offs cost on host devices beyond their issuing: the wait for the producer.

Between GPUs an activation or its gradient moves on a copy engine while the stages compute. Between XLA host
devices the move is a copy on the cores the devices share (``PipelineExecutor._move``), and its issuing is priced
already: the co-run child times each stage's sends as the runtime issues them (``send_dispatch_s``, beside the
bottleneck in the 1F1B period). What no stage timing shows is how long the receiving call then waits for its
producer in the 1F1B steady state: from -0.1 to 0.2 ms a step for gpt__tiny's and bert__tiny's two-stage
plans, 0.25-1.8 ms for moe__tiny's and wide_resnet__tiny's (bench/results/handoff.json, "runtime - copy"); bytes
do not predict it (wide_resnet moves the fewest and waits the longest), nor does the dispatching thread's load.
A flat price per move (``2 p2p_b`` per micro-batch) read gpt's and bert's pipelines up to 15% high and
wide_resnet's 5-6% low (docs/profiler-accuracy.md, "The hand-offs").

So for a plan of two one-device stages on host devices (the runtime's two-stage plans on 2 devices) the co-run
child runs the plan's own step (the runtime's executor, at the plan's micro-batch count) two ways, interleaved
chunk by chunk: as the runtime runs it (``runtime``), and with every hand-off a copy of an input computed in an
earlier step (``copy``: the move is made and issued alike, but nobody waits for its producer). The wait is the
difference of the two statistics, clamped at 0; the 1F1B model then charges it in place of the flat price
(``one_f_one_b(..., handoff_wait_s=...)``). A boundary is measured only where the flat price is at least
:data:`GATE_SHARE` of the composed step (the small models' hand-offs are 0.3-1.2% of theirs: the measurement, a
whole step compiled, would cost more than it could change). Deeper pipelines, stages of several devices and
plans run at another sequence length keep the flat price.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any

from libarena.artifacts import content_digest
from libarena.profile.timers import Timing

#: bump when what a hand-off record holds, or how it is timed, changes (cached records are then re-measured)
HANDOFF_VERSION = 1
#: untimed steps after building the executor (the first compiles), then rounds of CHUNK steps per variant
WARMUP, CHUNK = 10, 5
#: the variants the profiler times (bench_handoff also times ``ready``: every hand-off's input already in place)
VARIANTS = ("runtime", "copy")
#: a boundary is measured where the flat price (``2 (B - 1) p2p_b``) is at least this share of the composed step
GATE_SHARE = 0.02


@dataclass(frozen=True)
class StageBoundary:
    """A plan of two one-device stages as the runtime runs it: units [0, split) and [split, end) of ``model``,
    ``micro_batch`` samples per micro-batch, ``num_microbatches`` of them per step."""

    model: str
    split: int
    micro_batch: int
    num_microbatches: int
    remat: tuple[bool, bool] = (False, False)
    dtype: str = "fp32"

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> StageBoundary:
        return cls(**{**fields, "remat": tuple(bool(r) for r in fields["remat"])})

    def describe(self) -> str:
        return f"{self.model} split at unit {self.split}, mb {self.micro_batch} x {self.num_microbatches}"


@dataclass(frozen=True)
class HandoffTiming:
    """One boundary's step timed as the runtime runs it and with its hand-offs copies of ready inputs."""

    runtime_samples_s: tuple[float, ...]
    copy_samples_s: tuple[float, ...]
    handoffs_per_step: int
    #: wall seconds of the child spent on it (build, compile, warm-up and timing)
    device_s: float = 0.0

    def wait_s(self, statistic: str) -> float:
        """Seconds a step's receiving calls wait for their producers (the statistic of each variant's steps)."""
        runtime = Timing(self.runtime_samples_s).statistic(statistic)
        return max(0.0, runtime - Timing(self.copy_samples_s).statistic(statistic))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> HandoffTiming:
        return cls(**{k: tuple(v) if k.endswith("samples_s") else v for k, v in record.items()})


def handoff_cache_key(stage_keys: tuple[str, str], boundary: StageBoundary, num_devices: int, threading_name: str, rounds: int,
                      fresh_child: bool) -> str:
    """A boundary's record: its two stages' profile keys (which hold the host), the boundary, the process's device
    count and threading layout, and how many rounds were timed."""
    return content_digest("stage-handoff", HANDOFF_VERSION, list(stage_keys), asdict(boundary), int(num_devices), threading_name,
                          int(rounds), *(["fresh-child"] if fresh_child else []))


def handoff_executor(model: Any, run_plan: Any, devices: list[Any], dtype: str) -> Any:
    """The runtime's executor with its hand-offs replaceable: ``variant`` (runtime, copy, ready, or record: run as
    the runtime and keep each hand-off's source and result, waited for). A step's hand-offs come in the same
    order every step (its fixed 1F1B order), so the k-th of one step stands in for the k-th of another."""
    import jax

    from libarena.run.executor import PipelineExecutor

    class HandoffExecutor(PipelineExecutor):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.variant = "runtime"
            self._handoff = 0
            self.sources: list[Any] = []
            self.results: list[Any] = []
            self.directions: list[str] = []

        def step(self, batch: Any, profile_stages: bool = False) -> Any:
            self._handoff = 0
            return super().step(batch, profile_stages)

        def _move(self, x: Any, source: Any, target: Any) -> Any:
            k, self._handoff = self._handoff, self._handoff + 1
            if self.variant == "record":
                moved = super()._move(x, source, target)
                self.sources.append(jax.block_until_ready(x))
                self.results.append(jax.block_until_ready(moved))
                self.directions.append("forward" if self.stages.index(target) > self.stages.index(source) else "backward")
                return moved
            if self.variant == "ready":
                return self.results[k]
            if self.variant == "copy":
                return super()._move(self.sources[k], source, target)
            return super()._move(x, source, target)

        def move_alone(self, k: int) -> float:
            """Wall seconds to issue the k-th hand-off's move of its captured source and wait for it."""
            pair = (self.stages[0], self.stages[1]) if self.directions[k] == "forward" else (self.stages[1], self.stages[0])
            t0 = time.perf_counter()
            jax.block_until_ready(super()._move(self.sources[k], *pair))
            return time.perf_counter() - t0

    return HandoffExecutor(model, run_plan, devices, dtype)


def time_variants(executor: Any, batch: Any, variants: tuple[str, ...], rounds: int, warmup: int = WARMUP,
                  chunk: int = CHUNK) -> dict[str, list[float]]:
    """Each variant's step seconds: ``warmup`` untimed steps, one step recording the hand-offs, each variant's
    first step untimed, then ``rounds`` rounds of ``chunk`` steps per variant, the order reversed every other
    round (a host's drift falls on both). Round r's steps of a variant are ``[r * chunk, (r + 1) * chunk)``."""
    from libarena.run.heap import frozen_heap

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        for _ in range(warmup):
            executor.step(batch)
        executor.variant = "record"
        executor.step(batch)
        samples: dict[str, list[float]] = {v: [] for v in variants}
        with frozen_heap():
            for variant in variants:
                executor.variant = variant
                executor.step(batch)
            for rnd in range(rounds):
                for variant in variants if rnd % 2 == 0 else variants[::-1]:
                    executor.variant = variant
                    samples[variant] += [executor.step(batch).step_time_s for _ in range(chunk)]
    return samples


def measure_boundary(boundary: StageBoundary, devices: list[Any], seed: int, rounds: int) -> dict[str, Any]:
    """The child's side: ``boundary``'s plan built by the runtime on the first two of ``devices`` and timed."""
    from libarena.models import get_model
    from libarena.run.plan import simple_plan
    from libarena.run.train import batch_for_step

    model = get_model(boundary.model)
    run_plan = simple_plan(model, boundary.micro_batch * boundary.num_microbatches, [0, boundary.split], [1, 1], [1, 1],
                           boundary.num_microbatches, remat=[int(r) for r in boundary.remat])
    executor = handoff_executor(model, run_plan, list(devices[:2]), boundary.dtype)
    executor.init_state(seed)
    batch = batch_for_step(model, 0, run_plan.global_batch, seed)
    samples = time_variants(executor, batch, VARIANTS, rounds)
    return {"samples_s": samples, "handoffs_per_step": len(executor.results)}


def boundary_of(plan: Any, specs: list[Any], handoff_s: float, composed_s: float, gate_share: float = GATE_SHARE
                ) -> StageBoundary | None:
    """The boundary to measure for ``plan`` (worker specs ``specs``; its estimate's flat hand-off seconds and
    composed step): two one-device stages, more than one micro-batch, the model's own sequence length and a
    flat price of at least ``gate_share`` of the step; else None."""
    from libarena.models import get_model

    if plan.pipeline_degree != 2 or plan.num_microbatches < 2 or any(st.num_gpus != 1 for st in plan.stages):
        return None
    first, second = specs
    model = get_model(first.model)
    if first.seq_len is not None and model.batch_shapes(1, first.seq_len) != model.batch_shapes(1, None):
        return None  # the runtime trains at the model's own sequence length
    if composed_s <= 0 or handoff_s < gate_share * composed_s:
        return None
    return StageBoundary(first.model, first.stop, first.micro_batch, plan.num_microbatches,
                         (bool(first.remat), bool(second.remat)), first.dtype)


def profile_handoffs(boundaries: dict[StageBoundary, tuple[str, str]], num_devices: int, threading: Any, cache: Any, *,
                     rounds: int, seed: int = 0, fresh_child: bool = False, log: Any = None
                     ) -> tuple[dict[StageBoundary, HandoffTiming], float]:
    """Hand-off timings of ``boundaries`` (each with its two stages' profile keys) in co-run children of
    ``num_devices`` host devices laid out as ``threading``: {boundary: timing}, and the wall seconds spent
    measuring (0 when all came from ``cache``). ``fresh_child``: each boundary in a child of its own. A boundary
    whose measurement fails (its child out of memory, over its time limit) is logged and left out: the plan keeps
    the flat price, a refinement's failure does not end the profile."""
    import contextlib

    from libarena.errors import ArenaError
    from libarena.profile.cache import claim_notes
    from libarena.profile.corun import CoRunSession

    out: dict[StageBoundary, HandoffTiming] = {}
    threading_name = getattr(threading, "name", "default")
    t0, measured = time.perf_counter(), False
    with contextlib.ExitStack() as shared:
        session = None
        for boundary, stage_keys in boundaries.items():
            key = handoff_cache_key(stage_keys, boundary, num_devices, threading_name, rounds, fresh_child)
            doing = f"timing the hand-offs of {boundary.describe()} on {num_devices} host devices"
            with cache.claim(key, **claim_notes(log, doing)) if cache is not None else contextlib.nullcontext():
                hit = cache.get(key) if cache is not None else None
                if hit is not None:
                    out[boundary] = HandoffTiming.from_record(hit)
                    continue
                measured = True
                with contextlib.ExitStack() as own:
                    started = time.perf_counter()
                    try:
                        if fresh_child or session is None:
                            child = CoRunSession(num_devices, threading, seed)
                            session = own.enter_context(child) if fresh_child else shared.enter_context(child)
                        timing = session.time_handoff(boundary, rounds)
                    except ArenaError as exc:
                        if log is not None:
                            log(f"hand-offs of {boundary.describe()} not measured ({exc}): its plans keep the flat price")
                        session = None  # a child that failed is not asked again
                        continue
                    timing = replace(timing, device_s=time.perf_counter() - started)  # the child's start counts too
                    if fresh_child:
                        session = None
                out[boundary] = timing
                if cache is not None:
                    cache.put(key, timing.to_dict())
            if log is not None:
                log(f"hand-offs of {boundary.describe()} on {num_devices} host devices: runtime "
                    f"{Timing(timing.runtime_samples_s).statistic('median') * 1e3:.2f} ms a step, copies of ready inputs "
                    f"{Timing(timing.copy_samples_s).statistic('median') * 1e3:.2f} ms ({timing.handoffs_per_step} hand-offs)")
    return out, (time.perf_counter() - t0) if measured else 0.0
