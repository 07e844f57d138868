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
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from libarena.artifacts import content_digest
from libarena.errors import ArenaError
from libarena.profile.stage import StageSpec
from libarena.profile.subprocess_devices import DeviceChild, serve_requests
from libarena.profile.timers import Timing

#: bump when what a co-run record holds, or how it is timed, changes (cached records are then re-measured)
CORUN_VERSION = 1


@dataclass(frozen=True)
class CoRunTiming:
    """A stage's micro-batch (forward + backward) seconds on ``num_devices`` host devices: ``alone_s`` on one of
    them while the others idle, ``together_s`` on each while all run it (the statistic of the samples)."""

    num_devices: int
    alone_s: float
    together_s: float
    alone_samples_s: tuple[float, ...] = ()
    together_samples_s: tuple[float, ...] = ()
    #: wall seconds of the child spent on this stage (build, compile, warm-up and timing)
    device_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def corun_cache_key(stage_key: str, num_devices: int, threading_name: str) -> str:
    """A stage's co-run record: the stage's own profile key, the process's device count and threading layout,
    and the host (its name and CPU count: the cores the devices share)."""
    import os
    import platform

    return content_digest("stage-corun", CORUN_VERSION, stage_key, int(num_devices), threading_name, platform.node(), os.cpu_count())


class CoRunSession(DeviceChild):
    """A child with ``num_devices`` host devices that keeps stages compiled on every device between chunks of
    timed samples, so that a benchmark can interleave them with other timings (ABAB). ``time`` adds samples;
    ``timing`` gives the statistic of all of them."""

    def __init__(self, num_devices: int, threading: Any = None, seed: int = 0, burst: int = 4) -> None:
        super().__init__("libarena.profile.corun", [str(seed), str(burst)], num_devices, what="co-run profiling",
                         platform="cpu", threading=threading)
        self._samples: dict[StageSpec, tuple[list[float], list[float]]] = {}
        self._device_s: dict[StageSpec, float] = {}

    def build(self, spec: StageSpec) -> None:
        if spec not in self._samples:
            reply = self.ask({"op": "build", "spec": asdict(spec)})
            self._samples[spec] = ([], [])
            self._device_s[spec] = float(reply["wall_s"])

    def time(self, spec: StageSpec, warmup: int, repeats: int) -> None:
        """``repeats`` more samples of each (alone, together), interleaved, after ``warmup`` untimed ones."""
        self.build(spec)
        reply = self.ask({"op": "time", "spec": asdict(spec), "warmup": warmup, "repeats": repeats})
        alone, together = self._samples[spec]
        alone.extend(reply["alone_s"])
        together.extend(reply["together_s"])
        self._device_s[spec] += float(reply["wall_s"])

    def timing(self, spec: StageSpec, statistic: str) -> CoRunTiming:
        alone, together = self._samples[spec]
        if not alone:
            raise ArenaError(f"stage {spec.model}[{spec.start}:{spec.stop}] has no co-run samples yet")
        return CoRunTiming(self.num_devices, Timing(tuple(alone)).statistic(statistic), Timing(tuple(together)).statistic(statistic),
                           tuple(alone), tuple(together), self._device_s[spec])

    def release(self, spec: StageSpec) -> None:
        if self._samples.pop(spec, None) is not None:
            self.ask({"op": "release", "spec": asdict(spec)})


def profile_corun(specs: dict[str, StageSpec], num_devices: int, threading: Any, cache: Any, *,
                  warmup: int, repeats: int, statistic: str, seed: int = 0, burst: int = 4,
                  log: Any = None) -> tuple[dict[str, CoRunTiming], float]:
    """Co-run timings of ``specs`` (by their stage profile keys) on ``num_devices`` host devices laid out as
    ``threading``: {stage key: timing}, and the wall seconds spent measuring (0 when all came from ``cache``)."""
    out: dict[str, CoRunTiming] = {}
    missing = []
    threading_name = getattr(threading, "name", "default")
    for key, spec in specs.items():
        hit = cache.get(corun_cache_key(key, num_devices, threading_name)) if cache is not None else None
        if hit is not None:
            out[key] = CoRunTiming(**{k: tuple(v) if k.endswith("samples_s") else v for k, v in hit.items()})
        else:
            missing.append((spec, key))
    if not missing:
        return out, 0.0
    t0 = time.perf_counter()
    with CoRunSession(num_devices, threading, seed, burst) as session:
        for spec, key in missing:
            session.time(spec, warmup, repeats)
            timing = session.timing(spec, statistic)
            session.release(spec)
            out[key] = timing
            if cache is not None:
                cache.put(corun_cache_key(key, num_devices, threading_name), timing.to_dict())
            if log is not None:
                log(f"co-run {spec.model} units [{spec.start}, {spec.stop}) mb {spec.micro_batch} tp {spec.tp} on {num_devices} "
                    f"host devices: {timing.alone_s * 1e3:.2f} ms alone, {timing.together_s * 1e3:.2f} ms all busy")
    return out, time.perf_counter() - t0


def _serve(seed: int, burst: int) -> None:
    """The child side of CoRunSession: every stage built on each of this process's devices."""
    import jax

    from libarena.profile.profiler import _time_burst
    from libarena.profile.stage import build_stage_executables
    from libarena.profile.timers import HostTimer

    devices = jax.devices()
    timer = HostTimer()
    built: dict[StageSpec, list[Any]] = {}

    def spec_of(request: dict[str, Any]) -> StageSpec:
        return StageSpec(**request["spec"])  # every field a JSON scalar

    def build(request: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        spec = spec_of(request)
        if spec not in built:
            built[spec] = []
            for d in devices:
                with jax.default_device(d):  # the executables are lowered and compiled for this device
                    built[spec].append(build_stage_executables(spec, device=d, seed=seed, with_optimizer=False))
        return {"wall_s": time.perf_counter() - t0}

    def sample(region: Any) -> float:
        return _time_burst(timer, region, 0, 1, burst).samples[0]

    def time_stage(request: dict[str, Any]) -> dict[str, Any]:
        t0 = time.perf_counter()
        build(request)
        execs = built[spec_of(request)]

        def together() -> Any:  # every device dispatched before any is waited for: they run at once
            return [e.run_microbatch() for e in execs]

        sides = [(execs[0].run_microbatch, []), (together, [])]
        for _ in range(int(request["warmup"])):
            for region, _samples in sides:
                sample(region)
        for i in range(int(request["repeats"])):  # interleaved, alternating which goes first
            for region, samples in sides if i % 2 == 0 else sides[::-1]:
                samples.append(sample(region))
        return {"alone_s": sides[0][1], "together_s": sides[1][1], "wall_s": time.perf_counter() - t0}

    def release(request: dict[str, Any]) -> dict[str, Any]:
        built.pop(spec_of(request), None)
        return {"ok": True}

    serve_requests({"build": build, "time": time_stage, "release": release})


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--serve":
        _serve(int(sys.argv[2]), int(sys.argv[3]))
