"""Timers for stage executables, registered by name: ``host`` (wall clock around the executable on the
local JAX device, synchronised with block_until_ready) and ``cupti`` (sum of the GPU kernels' durations
from CUPTI's activity records). ``auto`` picks cupti on an NVIDIA GPU where cupti-python is installed,
host elsewhere; the chosen timer's name goes into every output row.
"""

from __future__ import annotations

import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from libarena.errors import ArenaError
from libarena.registry import Registry


@dataclass(frozen=True)
class Timing:
    """Repeated timings of one region: median and spread (interquartile range), seconds; beside each
    sample the process CPU time it took (all threads: how many cores' worth the region kept busy)."""

    samples: tuple[float, ...]
    #: process CPU seconds of each sample (empty where the timer cannot see them)
    cpu_samples: tuple[float, ...] = ()
    #: CPU seconds the calling thread spent issuing each sample's calls (before waiting for them): the host
    #: work of dispatching the region, which one runtime thread does for every call of a step
    dispatch_samples: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def lower_quartile(self) -> float:
        """The first quartile: on a shared host, disturbances only add time, so the fast quarter of many
        short samples is the steadiest estimate of the region's own time (the minimum is one outlier away)."""
        return lower_quartile(self.samples)

    @property
    def cpu_per_wall(self) -> float | None:
        """Cores' worth of CPU the region kept busy while it ran: process CPU time over wall time, lower
        quartiles of both (a busy host stretches the wall time of some samples, not the work they do)."""
        if not self.cpu_samples:
            return None
        wall = lower_quartile(self.samples)
        return float(lower_quartile(self.cpu_samples) / wall) if wall > 0 else None

    @property
    def dispatch(self) -> float | None:
        """The calling thread's CPU seconds to issue one run (lower quartile; None where not recorded)."""
        return lower_quartile(self.dispatch_samples) if self.dispatch_samples else None

    def statistic(self, name: str) -> float:
        """The named statistic of the samples: median, min or q1 (the lower quartile)."""
        return float(getattr(self, {"median": "median", "min": "minimum", "q1": "lower_quartile"}[name]))

    def scaled(self, factor: float) -> Timing:
        return Timing(tuple(t * factor for t in self.samples), tuple(t * factor for t in self.cpu_samples),
                      tuple(t * factor for t in self.dispatch_samples))

    @property
    def spread(self) -> float:
        if len(self.samples) < 4:
            return float(max(self.samples) - min(self.samples))
        q = statistics.quantiles(self.samples, n=4)
        return float(q[2] - q[0])

    @property
    def minimum(self) -> float:
        return float(min(self.samples))

    def to_dict(self) -> dict[str, Any]:
        out = {"median_s": self.median, "min_s": self.minimum, "q1_s": self.lower_quartile, "spread_s": self.spread,
               "samples_s": list(self.samples)}
        if self.cpu_samples:
            out.update(cpu_per_wall=self.cpu_per_wall, cpu_samples_s=list(self.cpu_samples))
        if self.dispatch_samples:
            out.update(dispatch_cpu_s=self.dispatch, dispatch_samples_s=list(self.dispatch_samples))
        return out


def lower_quartile(samples: Sequence[float]) -> float:
    """First quartile (the minimum for fewer than four samples)."""
    if len(samples) < 4:
        return float(min(samples))
    return float(statistics.quantiles(samples, n=4)[0])



#: Samples a timing keeps even when its time budget is spent (enough for a median and a spread).
MIN_SAMPLES = 5


class Timer(ABC):
    name: str
    #: whether the timer's own instrumentation slows the issuing of calls (CUPTI hooks every launch): then the
    #: issuing CPU comes from as many plain runs after the timed ones, not from the timed runs
    instruments_issuing: bool = False

    def time(self, region: Callable[[], Any], warmup: int, repeats: int, budget_s: float | None = None) -> Timing:
        """Run ``region`` warmup + repeats times; time each of the last ``repeats`` runs. ``budget_s``:
        stop early once the timed runs have taken that much wall time and ``MIN_SAMPLES`` (or ``repeats``)
        are in (a stage that runs for seconds needs fewer repetitions than one that runs for microseconds).
        The budget is wall time, whatever the timer itself reports. Runs with the process's long-lived objects
        frozen (libarena.run.heap), as the runtime's training loop does."""
        from libarena.run.heap import frozen_heap

        samples: list[float] = []
        cpu: list[float] = []
        dispatch: list[float] = []

        def issued() -> Any:
            d0 = time.thread_time()
            out = region()
            dispatch.append(time.thread_time() - d0)
            return out

        with frozen_heap():
            for _ in range(warmup):
                _block(region())
            started = time.perf_counter()
            while len(samples) < repeats:
                if budget_s is not None and len(samples) >= min(MIN_SAMPLES, repeats) and time.perf_counter() - started >= budget_s:
                    break
                c0 = time.process_time()
                samples.append(self.sample(region if self.instruments_issuing else issued))
                cpu.append(time.process_time() - c0)
            if self.instruments_issuing:
                for _ in samples:
                    _block(issued())
        return Timing(tuple(samples), tuple(cpu), tuple(dispatch) if len(dispatch) == len(samples) else ())

    @abstractmethod
    def sample(self, region: Callable[[], Any]) -> float:
        """Seconds of one run of ``region``, as this timer sees them."""

    @classmethod
    def usable(cls, device: Any) -> bool:
        return True


def _block(value: Any) -> None:
    import jax

    jax.block_until_ready(value)


class HostTimer(Timer):
    name = "host"

    def sample(self, region):
        t0 = time.perf_counter()
        _block(region())
        return time.perf_counter() - t0


class CuptiTimer(Timer):
    """Kernel time from CUPTI: the sum of the kernels launched by one run of the region."""

    name = "cupti"
    instruments_issuing = True

    def __init__(self) -> None:
        import arena_cupti.activity as arena_cupti

        self._recorder = arena_cupti.KernelActivityRecorder()
        self._kernel_seconds = arena_cupti.kernel_seconds

    @classmethod
    def usable(cls, device: Any) -> bool:
        import arena_cupti.activity as arena_cupti

        platform = str(getattr(device, "platform", "")).lower()
        return platform in ("gpu", "cuda") and arena_cupti.available()

    def sample(self, region):
        _block(None)
        self._recorder.start()
        _block(region())
        records = self._recorder.stop()
        if not records:
            raise ArenaError("cupti timer: CUPTI reported no kernels for the region (is the device a GPU?)")
        return self._kernel_seconds(records)


TIMERS: Registry[type[Timer]] = Registry("timer")


def register_timer(cls: type[Timer]) -> type[Timer]:
    return TIMERS.register(cls.name, cls)


register_timer(HostTimer)
register_timer(CuptiTimer)


def timer_names() -> list[str]:
    return ["auto", *TIMERS.names()]


def resolved_timer_name(name: str, device: Any) -> str:
    """The name of the timer ``select_timer(name, device)`` gives, without making one (a cache key's part)."""
    if name == "auto":
        return CuptiTimer.name if CuptiTimer.usable(device) else HostTimer.name
    return name


def select_timer(name: str, device: Any) -> Timer:
    """The timer called ``name`` (``auto``: cupti where usable on ``device``, else host)."""
    if name == "auto":
        return TIMERS.get(resolved_timer_name(name, device))()
    if name not in TIMERS:
        raise ArenaError(f"unknown timer {name!r} (known: {', '.join(timer_names())})")
    cls = TIMERS.get(name)
    if not cls.usable(device):
        raise ArenaError(f"timer {name!r} cannot time device {device} (needs an NVIDIA GPU and cupti-python)")
    return cls()
