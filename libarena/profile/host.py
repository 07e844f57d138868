"""The timing protocol for a shared host: what the machine was doing while something was timed, waiting for
it to be quiet, and how XLA:CPU's threads are laid out on its cores.

Timings taken on a machine that other processes share are only as good as the quiet they were taken in, so
an accuracy run (bench/) first waits, bounded, for the load to fall (:func:`wait_until_quiet`: the one-minute
load average, the other processes' CPU use and, since neighbours on a shared virtual machine show in neither,
how steadily a fixed computation times right now (:func:`timing_noise`); refused with a one-line error when
the host does not quiet down), and records
around its work the load average before and after, the CPU time the hypervisor stole (``/proc/stat``), the
process's own CPU time beside its wall time, and the XLA flags and core affinity it ran with
(:func:`host_window`).

XLA host devices share the CPU's cores, and XLA:CPU's intra-op thread pool is as large as the cores the
process may run on. :data:`XLA_THREADING` names the layouts a benchmark can compare (and keep the steadier
one with the evidence): ``default`` (XLA's own), ``eigen-single`` (``--xla_cpu_multi_thread_eigen=false``)
and ``pinned`` (a process with N devices pinned to N cores, one intra-op thread per device, and the flag).
A layout is applied to a child process's environment and cores (:func:`child_layout`: its XLA flags and a
``taskset`` prefix) or to this process before JAX starts (:func:`apply_threading`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError
from libarena.profile.timers import lower_quartile
from libarena.registry import Registry
from libarena.run.heap import heap_pages, huge_page_heap_env

#: /proc/stat's first line: cpu user nice system idle iowait irq softirq steal ...
_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks(stat_path: str | Path = "/proc/stat") -> dict[str, int] | None:
    """The machine's cumulative CPU ticks by state (None where /proc/stat is not readable)."""
    try:
        fields = Path(stat_path).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1 : 1 + len(_STAT_FIELDS)]]
    return dict(zip(_STAT_FIELDS, values + [0] * (len(_STAT_FIELDS) - len(values))))


def usable_cores() -> list[int]:
    """The cores this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


#: The cores this process could use when it started (before any pinning): what children are pinned within.
STARTING_CORES = usable_cores()

#: the XLA flag that only says how many host devices a process has (the keys that depend on it name the count)
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def process_identity() -> dict[str, Any]:
    """How this process may use its host, for the keys of cached CPU timings: the cores it could use when it
    started (``taskset`` limits them, and the children timing stages are pinned within them) and the XLA flags it
    runs under (its children inherit them; threading flags change every CPU time), less the device count."""
    flags = sorted(f for f in os.environ.get("XLA_FLAGS", "").split() if f.split("=", 1)[0] != DEVICE_COUNT_FLAG)
    return {"cores": list(STARTING_CORES), "xla_flags": flags}


@dataclass(frozen=True)
class HostSnapshot:
    """The host and this process at one instant."""

    wall_s: float
    load_average: tuple[float, float, float]
    ticks: dict[str, int] | None
    #: CPU seconds of this process (all threads) and of its waited-for children
    process_cpu_s: float
    children_cpu_s: float


def snapshot() -> HostSnapshot:
    children = os.times()
    return HostSnapshot(time.perf_counter(), tuple(round(x, 2) for x in os.getloadavg()), cpu_ticks(), time.process_time(),
                        children.children_user + children.children_system)


def host_window(before: HostSnapshot, after: HostSnapshot) -> dict[str, Any]:
    """What the host did between two snapshots: load average at both ends, the share of all CPU time that
    was stolen (by the hypervisor) and that was busy (any process), this process's CPU time beside the wall
    time, and the XLA flags and cores it ran with."""
    wall = after.wall_s - before.wall_s
    out: dict[str, Any] = {
        "wall_s": wall,
        "load_average_before": list(before.load_average),
        "load_average_after": list(after.load_average),
        "process_cpu_s": after.process_cpu_s - before.process_cpu_s,
        "children_cpu_s": after.children_cpu_s - before.children_cpu_s,
        "cpu_steal_fraction": None,
        "cpu_busy_fraction": None,
        "cpus": os.cpu_count(),
        "cores": usable_cores(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # whether this process's C heap is on huge pages (its children's is: child_layout)
        "heap": heap_pages(),
    }
    if before.ticks and after.ticks:
        delta = {k: after.ticks[k] - before.ticks[k] for k in _STAT_FIELDS}
        total = sum(delta.values())
        if total > 0:
            out["cpu_steal_fraction"] = delta["steal"] / total
            out["cpu_busy_fraction"] = 1.0 - (delta["idle"] + delta["iowait"]) / total
    return out


def busy_processes(min_percent: float = 20.0, interval_s: float = 1.0, exclude: set[int] | None = None) -> list[dict[str, Any]]:
    """Other processes that used more than ``min_percent`` of one core over ``interval_s`` (this process, its
    ancestors and its children excluded): who would disturb a timing."""
    import psutil

    me = psutil.Process()
    skip = {me.pid, *(p.pid for p in me.parents()), *(p.pid for p in me.children(recursive=True)), *(exclude or set())}
    procs = []
    for proc in psutil.process_iter(["pid", "name"]):
        if proc.pid in skip:
            continue
        try:
            proc.cpu_percent(None)
            procs.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    time.sleep(interval_s)
    busy = []
    for proc in procs:
        try:
            percent = proc.cpu_percent(None)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if percent >= min_percent:
            busy.append({"pid": proc.pid, "name": proc.info.get("name") or "?", "cpu_percent": round(percent, 1)})
    return sorted(busy, key=lambda b: -b["cpu_percent"])


@dataclass(frozen=True)
class QuietPolicy:
    """When the host counts as quiet enough to time on, and how long to wait for it."""

    #: one-minute load average at most (this process idle); None: not checked (between a benchmark's models, where
    #: the benchmark's own last minutes of work keep it up)
    max_load: float | None = 0.5
    #: no other process may use more than this share of one core (percent)
    max_process_percent: float = 25.0
    #: the timing noise (:func:`timing_noise`'s ``level``) at most; None: recorded, not limited. A host on which
    #: one fixed computation's timings a second apart differ by more than the 5% an accuracy target allows cannot
    #: show whether that target is met
    max_noise: float | None = 0.05
    #: wait at most this long for quiet, then refuse (or go on, with ``refuse=False``, recording it)
    max_wait_s: float = 600.0
    poll_s: float = 15.0
    refuse: bool = True

    def __post_init__(self) -> None:
        if (self.max_load is not None and self.max_load < 0) or self.max_process_percent <= 0 or self.max_wait_s < 0 or self.poll_s <= 0:
            raise ArenaError("quiet policy: max_load and max_wait_s must be >= 0, max_process_percent and poll_s > 0")
        if self.max_noise is not None and not self.max_noise > 0:
            raise ArenaError("quiet policy: max_noise must be > 0 (or None: no noise probe)")


def relative_spread(values: list[float]) -> float:
    """(max - min) / median; 0 for fewer than two values."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def relative_iqr(samples: list[float]) -> float:
    """Interquartile range / median (the relative spread for fewer than four samples): how far repeated
    timings of one thing land apart, the figure of every repeatability check (the benchmarks' too)."""
    if len(samples) < 4:
        return relative_spread(samples)
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / statistics.median(samples)


def _fixed_computation() -> Callable[[], Any]:
    """A few milliseconds of fixed host work: a chain of small float64 matmuls in numpy (no JAX, no compilation),
    on the calling thread: ``timing_noise`` limits the BLAS to one thread while it times. On its thread pool
    the chain's timings follow the other cores' availability and the pool's hand-offs (on a 2-core virtual
    machine 3.2 or 6.3 ms in phases of seconds, where the same work on one thread pinned to either core varied
    about 10%), while the timings a noise probe stands for run one thread per core (``XlaThreading``'s
    ``pinned``). The chain is vectorised work, like XLA's kernels; a chain of 48 x 48 products or an einsum loop,
    dominated by call overhead and scalar code, varied about twice as much on that host."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((160, 160)) / 16.0

    def work() -> Any:
        x = a
        for _ in range(20):
            x = np.tanh(x @ a)
        return x

    return work


def _noise_of(quartiles: list[float], within: list[float]) -> dict[str, float]:
    spread, inside = relative_iqr(quartiles), statistics.median(within)
    return {"level": max(spread, inside), "spread": spread, "within": inside, "sample_s": statistics.median(quartiles)}


def timing_noise(bursts: int = 10, samples: int = 15, interval_s: float = 1.0, work: Callable[[], Any] | None = None,
                 clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
                 cores: list[int] | None = None) -> dict[str, Any]:
    """How steadily this host times a fixed computation now: ``bursts`` bursts of ``samples`` runs, ``interval_s``
    apart (about 12 s in all, of which 2 s of work: noise on a shared machine comes and goes, and one short
    burst often misses it). ``spread`` is the IQR / median of the bursts' lower quartiles (the protocol's
    statistic): how far two timings of the same thing a second apart land; ``within`` the median of the
    bursts' own IQR / median; ``level`` the larger of the two, what a quiet policy limits; ``sample_s`` the
    median burst's lower quartile.

    ``cores``: the cores the timings it stands for run on (one thread each, as the ``pinned`` layout runs
    devices); each burst then runs on each of them in turn, this thread pinned to it (its affinity restored
    after), ``per_core`` holds each core's figures and the top-level ones are the noisiest core's. None: where
    this thread may run.

    A neighbour on a shared virtual machine (its cores' caches and memory bandwidth, the hypervisor) shows in
    neither the load average nor this machine's process list, but it shows here."""
    from threadpoolctl import threadpool_limits

    if bursts < 4 or samples < 4:
        raise ArenaError("timing noise: at least 4 bursts of 4 samples")
    usable = usable_cores()
    if cores is not None and (not cores or not set(cores) <= set(usable)):
        raise ArenaError(f"timing noise: cores {cores} are not among this process's usable cores {usable}")
    work = work or _fixed_computation()
    placements = [None] if cores is None else list(cores)
    cpu_s = wall_s = 0.0
    quartiles: dict[int | None, list[float]] = {core: [] for core in placements}
    within: dict[int | None, list[float]] = {core: [] for core in placements}
    # the BLAS on this thread alone (the probe times one thread)
    with _affinity_restored(cores is not None), threadpool_limits(limits=1):
        for burst in range(bursts):
            if burst and interval_s > 0:
                sleep(interval_s)
            for core in placements:
                if core is not None:
                    pin_cores([core])
                work()  # first-touch and caches (on this core)
                times = []
                cpu0 = time.process_time()
                for _ in range(samples):
                    t0 = clock()
                    work()
                    times.append(clock() - t0)
                cpu_s += time.process_time() - cpu0
                wall_s += sum(times)
                quartiles[core].append(lower_quartile(times))
                within[core].append(relative_iqr(times))
    per_core = {core: _noise_of(quartiles[core], within[core]) for core in placements}
    noisiest = max(per_core.values(), key=lambda n: n["level"])
    out: dict[str, Any] = {**noisiest, "bursts": bursts, "samples": samples, "interval_s": interval_s, "cores": cores,
                           # about 1 for work on one thread, up to the cores used for work on a thread pool
                           "cpu_per_wall": cpu_s / wall_s if wall_s > 0 else None}
    if cores is not None:
        out["per_core"] = {str(core): figures for core, figures in per_core.items()}
    return out


def timing_noise_on(cores: list[int] | None, bursts: int = 10, samples: int = 15, interval_s: float = 1.0,
                    timeout_s: float = 300.0) -> dict[str, Any]:
    """:func:`timing_noise` on ``cores``, timed by a fresh interpreter started there: a process pinned to fewer
    cores (a benchmark's measuring interpreter, pinned by its layout) can neither run nor probe the others."""
    import json
    import subprocess
    import sys

    code = ("import json; from libarena.profile.host import timing_noise; "
            f"print(json.dumps(timing_noise(bursts={int(bursts)}, samples={int(samples)}, interval_s={float(interval_s)!r}, "
            f"cores={None if cores is None else [int(c) for c in cores]!r})))")
    argv = ChildLayout(dict(os.environ), None if cores is None else list(cores)).command([sys.executable, "-c", code])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ArenaError(f"timing noise on cores {cores}: the probe took over {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise ArenaError(f"timing noise on cores {cores}: the probe failed (exit {done.returncode}): {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _timed_back_to_back(work: Callable[[], Any], duration_s: float, clock: Callable[[], float]) -> list[float]:
    """``work`` run once untimed (first touch, caches on this core), then timed back to back for ``duration_s``."""
    work()
    samples = []
    began = clock()
    while clock() - began < duration_s:
        t0 = clock()
        work()
        samples.append(clock() - t0)
    return samples


def alternation_gaps(samples: list[float], per_turn: int, turns: int) -> list[float]:
    """How far apart two sides that time the *same* work land when they alternate: ``samples`` (one fixed
    computation timed back to back) cut into windows of ``turns`` turns per side of ``per_turn`` samples each,
    the turns given alternately to side A and side B; per window, |lower quartile of A / lower quartile of B - 1|.
    Windows overlap by three quarters (a run of a minute holds only a few whole ones of long turns). Whatever
    an ABAB accuracy figure compares, drift of the host's speed between the two sides' turns adds about this
    much; a steady host gives about 0."""
    if per_turn < 1 or turns < 1:
        raise ArenaError("alternation gaps: at least one turn of one sample per side")
    window = 2 * per_turn * turns
    gaps = []
    for start in range(0, len(samples) - window + 1, max(1, window // 4)):
        chunk = samples[start:start + window]
        sides: tuple[list[float], list[float]] = ([], [])
        for i, t in enumerate(chunk):
            sides[(i // per_turn) % 2].append(t)
        a, b = (lower_quartile(side) for side in sides)  # the benchmark's statistic of each side
        gaps.append(abs(a / b - 1.0))
    return gaps


def alternation_floor(schemes: list[tuple[float, int]], duration_s: float = 60.0, core: int | None = None,
                      work: Callable[[], Any] | None = None, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """The error that alternation alone leaves on this host now: the fixed computation (on one thread, pinned to
    ``core``) timed back to back for ``duration_s``, then, for each (seconds per turn, turns per side) in
    ``schemes``, :func:`alternation_gaps` of those samples: their mean and 90th percentile. An accuracy
    benchmark that alternates that way cannot show errors much below this floor."""
    from threadpoolctl import threadpool_limits

    if duration_s <= 0 or not schemes or any(turn_s <= 0 or turns < 1 for turn_s, turns in schemes):
        raise ArenaError("alternation floor: a positive duration and schemes of a positive turn length and at least one turn")
    work = work or _fixed_computation()
    with _affinity_restored(core is not None), threadpool_limits(limits=1):
        if core is not None:
            pin_cores([core])
        samples = _timed_back_to_back(work, duration_s, clock)
    sample_s = statistics.median(samples)
    out: dict[str, Any] = {"duration_s": duration_s, "core": core, "samples": len(samples), "sample_s": sample_s, "schemes": []}
    for turn_s, turns in schemes:
        per_turn = max(1, round(turn_s / sample_s))
        gaps = alternation_gaps(samples, per_turn, turns)
        out["schemes"].append({"turn_s": turn_s, "turns": turns, "samples_per_turn": per_turn, "windows": len(gaps),
                               "mean_gap": statistics.fmean(gaps) if gaps else None,
                               "p90_gap": statistics.quantiles(gaps, n=10)[-1] if len(gaps) >= 2 else (gaps[0] if gaps else None)})
    return out


class TurnControl:
    """A fixed computation timed in a short chunk right after each turn of an interleaved (ABAB) comparison of
    two ``sides``: how fast the host ran beside side A's turns against beside side B's, measured while the
    comparison runs. Their ``gap`` (|lower quartile after A / lower quartile after B - 1|) is the drift between
    the two sides' turns, which the comparison cannot tell from an error of its own; a steady host gives about
    0. Looks at the host before and after a timing miss noise inside it, and a probe in bursts with idle
    seconds between them measures a host that the timing, back-to-back work, never sees.

    ``cores``: the cores the compared work runs on; a turn's chunks (one after each side) run on
    ``cores[turn % len(cores)]``, this thread pinned there (its affinity restored after), so both sides get
    the same cores. None: where this thread may run. Each chunk starts with one untimed run (the side before
    left its own data in the caches)."""

    def __init__(self, sides: tuple[str, str], cores: list[int] | None = None, chunk_s: float = 0.1,
                 work: Callable[[], Any] | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        if len(sides) != 2 or sides[0] == sides[1] or chunk_s <= 0 or (cores is not None and not cores):
            raise ArenaError("turn control: two distinct sides, a positive chunk and some cores (or None)")
        self.sides, self.cores, self.chunk_s = sides, (None if cores is None else list(cores)), chunk_s
        self._work, self._clock = work or _fixed_computation(), clock
        self._samples: dict[str, list[float]] = {side: [] for side in sides}

    def after(self, side: str, turn: int) -> None:
        """Time one chunk right after ``side``'s turn number ``turn``."""
        from threadpoolctl import threadpool_limits

        if side not in self._samples:
            raise ArenaError(f"turn control: unknown side {side!r} (sides {', '.join(self.sides)})")
        core = None if self.cores is None else self.cores[turn % len(self.cores)]
        with _affinity_restored(core is not None), threadpool_limits(limits=1):
            pin_cores(None if core is None else [core])
            self._samples[side] += _timed_back_to_back(self._work, self.chunk_s, self._clock)

    def summary(self) -> dict[str, Any]:
        """The gap and each side's figures (None where a side has no chunk yet)."""
        first, second = self.sides
        quartiles = {side: lower_quartile(s) if s else None for side, s in self._samples.items()}
        gap = None if None in quartiles.values() else abs(quartiles[first] / quartiles[second] - 1.0)
        return {"gap": gap, "sides": list(self.sides), "lower_quartile_s": quartiles,
                "samples": {side: len(s) for side, s in self._samples.items()},
                "iqr_over_median": {side: relative_iqr(s) if s else None for side, s in self._samples.items()},
                "chunk_s": self.chunk_s, "cores": self.cores}


def continuous_noise(duration_s: float = 2.0, cores: list[int] | None = None, work: Callable[[], Any] | None = None,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """How steadily this host runs the fixed computation back to back now: ``duration_s`` of it on each of
    ``cores`` in turn (this thread pinned there, its affinity restored after; None: where it may run), and the
    IQR / median of each core's samples; ``level`` is the noisiest core's. The same figure as a
    :class:`TurnControl` side's ``iqr_over_median``, so a benchmark can wait for the host that its plans are
    judged by (work back to back, as timings run, not bursts with idle seconds between them)."""
    from threadpoolctl import threadpool_limits

    if duration_s <= 0:
        raise ArenaError("continuous noise: a positive duration")
    work = work or _fixed_computation()
    per_core: dict[str, float] = {}
    with _affinity_restored(cores is not None), threadpool_limits(limits=1):
        for core in [None] if cores is None else list(cores):
            pin_cores(None if core is None else [core])
            per_core[str(core)] = relative_iqr(_timed_back_to_back(work, duration_s, clock))
    return {"level": max(per_core.values()), "per_core": per_core, "duration_s": duration_s}


def wait_until_quiet(policy: QuietPolicy, log: Callable[[str], None] | None = None,
                     probe: Callable[[], tuple[float, list[dict[str, Any]]]] | None = None,
                     sleep: Callable[[float], None] = time.sleep,
                     noise_probe: Callable[[], dict[str, float]] | None = None) -> dict[str, Any]:
    """Wait (at most ``policy.max_wait_s``) until the load average, every other process and the timing noise
    are under the policy's limits. Returns what was seen (``quiet``, ``waited_s``, the load, the busy
    processes and the timing noise at the end, and the same at the first look, ``first_look``); raises a
    one-line ArenaError when the host stays busy or noisy and the policy refuses.

    ``probe`` (tests): returns (one-minute load average, busy processes) instead of looking at the host;
    ``noise_probe`` (tests): returns :func:`timing_noise`'s record instead of timing."""
    log = log or (lambda message: None)

    def look() -> tuple[float, list[dict[str, Any]]]:
        return os.getloadavg()[0], busy_processes(policy.max_process_percent)

    probe = probe or look
    noise_probe = noise_probe or timing_noise
    waited = 0.0
    first_look = None
    while True:
        load, busy = probe()
        noise = None
        quiet = (policy.max_load is None or load <= policy.max_load) and not busy
        if quiet:  # timed only on a host that looks idle (the probe is work of its own)
            noise = noise_probe()
            quiet = policy.max_noise is None or noise["level"] <= policy.max_noise
        if first_look is None:  # the host as found, before any waiting (what the work just before it ran on)
            first_look = {"quiet": quiet, "load_average": load, "busy_processes": busy, "timing_noise": noise}
        if quiet or waited >= policy.max_wait_s:
            break
        log(f"host {_condition(load, busy, noise, policy)}: waiting {policy.poll_s:.0f} s ({waited:.0f} of at most {policy.max_wait_s:.0f} s)")
        sleep(policy.poll_s)
        waited += policy.poll_s
    record = {"quiet": quiet, "waited_s": waited, "load_average": load, "busy_processes": busy, "timing_noise": noise,
              "first_look": first_look,
              "policy": {"max_load": policy.max_load, "max_process_percent": policy.max_process_percent,
                         "max_noise": policy.max_noise, "max_wait_s": policy.max_wait_s}}
    if not quiet and policy.refuse:
        raise ArenaError(f"host not quiet after waiting {waited:.0f} s: {_condition(load, busy, noise, policy)}; "
                         "run the benchmark alone on a steadier machine (or lower the limits knowingly)")
    return record


def _condition(load: float, busy: list[dict[str, Any]], noise: dict[str, float] | None, policy: QuietPolicy) -> str:
    """What keeps the host from being quiet, in a few words."""
    if noise is None:
        limit = "not limited" if policy.max_load is None else f"limit {policy.max_load}"
        return f"busy (load average {load:.2f}, {limit}; {_describe(busy)})"
    return (f"noisy (a fixed computation's timings {noise['level']:.1%} apart, limit {policy.max_noise:.0%}, "
            f"at load average {load:.2f} with no other busy process)")


def _describe(busy: list[dict[str, Any]]) -> str:
    if not busy:
        return "no other busy process"
    return "busy: " + ", ".join(f"{b['name']}[{b['pid']}] {b['cpu_percent']:.0f}%" for b in busy[:5])


# --------------------------------------------------------------------------------------------------
# XLA:CPU thread layouts


@dataclass(frozen=True)
class XlaThreading:
    """How XLA:CPU's threads sit on the cores: extra XLA flags, and whether a process is pinned to as many
    cores as it has devices (one intra-op thread per device)."""

    name: str
    flags: tuple[str, ...] = ()
    pin_one_core_per_device: bool = False
    description: str = ""

    def cores(self, num_devices: int, available: list[int] | None = None) -> list[int] | None:
        """The cores a process with ``num_devices`` devices runs on (None: wherever it may)."""
        if not self.pin_one_core_per_device:
            return None
        available = available if available is not None else usable_cores()
        if num_devices > len(available):
            raise ArenaError(f"threading {self.name!r}: {num_devices} devices need {num_devices} cores, {len(available)} usable")
        return available[:num_devices]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "flags": list(self.flags), "pin_one_core_per_device": self.pin_one_core_per_device}


XLA_THREADING: Registry[XlaThreading] = Registry("XLA threading layout")
for _layout in (
    XlaThreading("default", (), False, "XLA's own: an intra-op pool of every usable core, shared by the devices"),
    XlaThreading("eigen-single", ("--xla_cpu_multi_thread_eigen=false",), False, "Eigen's multi-threading off"),
    XlaThreading("pinned", ("--xla_cpu_multi_thread_eigen=false",), True,
                 "N devices pinned to N cores (an intra-op pool of one thread per device), Eigen single-threaded"),
):
    XLA_THREADING.register(_layout.name, _layout)


def merge_xla_flags(existing: str, flags: tuple[str, ...]) -> str:
    """``existing`` XLA_FLAGS with ``flags`` set (a flag given again replaces the old value)."""
    names = {f.split("=", 1)[0] for f in flags}
    kept = [f for f in existing.split() if f.split("=", 1)[0] not in names]
    return " ".join([*kept, *flags]).strip()


def threading_env(layout: XlaThreading, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the layout's XLA flags."""
    out = dict(env)
    flags = merge_xla_flags(out.get("XLA_FLAGS", ""), layout.flags)
    if flags:
        out["XLA_FLAGS"] = flags
    return out


def pin_cores(cores: list[int] | None) -> None:
    """Pin this process (and the children it starts later) to ``cores`` (None: leave it)."""
    if cores is not None:
        os.sched_setaffinity(0, set(cores))


@contextlib.contextmanager
def _affinity_restored(restore: bool) -> Any:
    """This process's affinity as it was before the block, restored after it (``restore`` False: nothing done),
    for probes that pin this thread to one core at a time."""
    original = usable_cores() if restore else None
    try:
        yield
    finally:
        pin_cores(original)


def apply_threading(layout: XlaThreading, num_devices: int = 1) -> dict[str, Any]:
    """Apply ``layout`` to this process, which must not have started a JAX backend yet (XLA reads its flags
    and sizes its thread pool once). Returns what was applied."""
    import sys

    if "jax" in sys.modules:
        from jax._src import xla_bridge

        if xla_bridge.backends_are_initialized():
            raise ArenaError(f"threading {layout.name!r} must be applied before JAX starts its backend")
    os.environ.update(threading_env(layout, os.environ))
    cores = layout.cores(num_devices)
    pin_cores(cores)
    return {**layout.to_dict(), "cores": cores if cores is not None else usable_cores(), "xla_flags": os.environ.get("XLA_FLAGS", "")}


@dataclass(frozen=True)
class ChildLayout:
    """Environment and cores of a child process that runs ``num_devices`` devices under a layout."""

    env: dict[str, str]
    cores: list[int] | None = field(default=None)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` started on the layout's cores (``taskset``: pinning in the parent between fork and exec
        is not safe in a process with threads, as JAX's is)."""
        if self.cores is None:
            return list(argv)
        taskset = shutil.which("taskset")
        if taskset is None:
            raise ArenaError("pinning a process to cores needs taskset (util-linux)")
        return [taskset, "-c", ",".join(map(str, self.cores)), *argv]


def child_layout(layout: XlaThreading | None, num_devices: int, env: Mapping[str, str]) -> ChildLayout:
    """A child's environment and cores under ``layout`` (None: ``env`` as it is), its C heap on huge pages
    either way (libarena.run.heap: which pages back a heap is fixed at the start and moved a child's stage times)."""
    if layout is None:
        return ChildLayout(huge_page_heap_env(env))
    # A pinned parent would hand its own (fewer) cores down: choose from those it started with.
    return ChildLayout(huge_page_heap_env(threading_env(layout, env)), layout.cores(num_devices, STARTING_CORES))
