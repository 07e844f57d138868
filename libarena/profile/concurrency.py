"""How much devices that share hardware slow each other down (the host's concurrency).

Two models (libarena.profile.pipeline has the formulas). ``HostCapacity`` (the profiler's default on a
host): the cores the plan's devices share, against each stage's own CPU demand from its profile (process
CPU time over wall time) -- a stage that keeps one core busy runs beside another on a second core at full
speed, one that keeps both busy does not. ``HostConcurrency``: one slowdown factor for every stage, measured
once by a micro-benchmark, described below. The micro-benchmark's MLP keeps about 1.6 of 2 cores busy, so its
factor (1.7-2.0 on 2 cores) said that two devices never run faster than one, for the tiny models' stages too,
which keep one core busy: 2-device estimates were biased upwards (bench/results/profile.json before commit f2a8e84).

XLA host devices (``--xla_force_host_platform_device_count=N``) are not separate processors: they run on
the same CPU cores, and one device's computation already uses the cores' intra-op threads. So k devices
computing at once each take longer than one alone, unlike k GPUs. The 1F1B model
(libarena.profile.pipeline) takes this as ``slowdown(k)`` = (time of a kernel while k devices run it at
once) / (time of the kernel alone), measured here by a micro-benchmark that has nothing to do with the
plans being profiled: a small MLP's forward + backward (matmuls and element-wise work, like the models'
blocks), timed alone on device 0 and on devices 0..k-1 at once, the two interleaved and repeated, medians.
Accelerators (GPUs) are separate chips: slowdown 1 without measuring.

The result is cached in the profile cache per (host, CPU count, the process's cores and XLA flags, platform, device
kind, JAX version).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from libarena.artifacts import content_digest
from libarena.profile.subprocess_devices import run_module_with_devices
from libarena.run.heap import frozen_heap

CONCURRENCY_VERSION = 2
#: Micro-benchmark size: an MLP on (batch, width) activations, fp32.
BATCH, WIDTH = 256, 512


@dataclass(frozen=True)
class HostCapacity:
    """The cores a plan's host devices share: every core this process may use, or -- when each process is
    pinned to one core per device (libarena.profile.host's ``pinned`` layout) -- as many as the plan has devices;
    at most what the micro-benchmark found the host gives that many devices busy at once (``measured``: its
    effective cores, k x the cores one device alone keeps busy / slowdown(k) -- less than the cores when other
    work shares them, or when threads contend)."""

    cores: int
    one_core_per_device: bool = False
    measured: HostConcurrency | None = None

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ValueError("a host has at least one core")

    def cores_for(self, num_devices: int) -> float:
        cores = float(max(1, num_devices) if self.one_core_per_device else self.cores)
        effective = self.measured.effective_cores(num_devices) if self.measured is not None and num_devices > 1 else None
        return cores if effective is None else max(1.0, min(cores, effective))

    def to_dict(self) -> dict[str, Any]:
        return {"model": "cpu-time", "cores": self.cores, "one_core_per_device": self.one_core_per_device,
                "measured": None if self.measured is None else self.measured.to_dict()}


@dataclass(frozen=True)
class HostConcurrency:
    """slowdown(k) for k devices busy at once; measured points, linear in between, capped at k."""

    slowdowns: tuple[tuple[int, float], ...] = ()
    source: str = "independent devices"
    #: wall seconds spent measuring it in this run (0 when served from the cache)
    measured_now_s: float = 0.0
    #: per measured k: the cores' worth of CPU one device running the micro-benchmark alone kept busy
    alone_cores: tuple[tuple[int, float], ...] = ()

    def effective_cores(self, k: int) -> float | None:
        """Cores' worth of CPU the host gave k devices busy at once: k x (cores one alone keeps busy) / slowdown(k)
        (None where k was not measured)."""
        cores = dict(self.alone_cores).get(k)
        return None if cores is None else k * cores / self.slowdown(k)

    def slowdown(self, k: int) -> float:
        if k <= 1 or not self.slowdowns:
            return 1.0
        points = [(1, 1.0), *sorted(self.slowdowns)]
        for (k0, s0), (k1, s1) in zip(points, points[1:]):
            if k0 <= k <= k1:
                return s0 + (s1 - s0) * (k - k0) / (k1 - k0)
        (k0, s0), (k1, s1) = points[-2], points[-1]  # beyond the last point: extend its line, at most k
        return min(float(k), s1 + (s1 - s0) * (k - k1) / (k1 - k0))

    def to_dict(self) -> dict[str, Any]:
        return {"slowdowns": {str(k): s for k, s in self.slowdowns}, "source": self.source, "measured_now_s": self.measured_now_s,
                "alone_cores": {str(k): c for k, c in self.alone_cores}}


def _mlp_step(device: Any) -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    params = [jax.device_put(0.02 * rng.standard_normal(shape, dtype=np.float32), device) for shape in ((WIDTH, 4 * WIDTH), (4 * WIDTH, WIDTH))]
    x = jax.device_put(rng.standard_normal((BATCH, WIDTH), dtype=np.float32), device)

    def loss(p: Any, v: Any) -> Any:
        return jnp.mean(jax.nn.gelu(v @ p[0]) @ p[1])

    return jax.jit(jax.grad(loss)), (params, x)


def measure(max_devices: int, repeats: int = 15) -> list[tuple[int, float, float]]:
    """(k, slowdown(k), cores one device alone keeps busy) for k = 2 .. max_devices on this process's devices."""
    import jax

    devices = jax.devices()[:max_devices]
    kernels = [_mlp_step(d) for d in devices]
    for fn, args in kernels:
        for _ in range(3):
            jax.block_until_ready(fn(*args))

    def run(k: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        outs = [fn(*args) for fn, args in kernels[:k]]  # dispatched asynchronously: they run at once
        jax.block_until_ready(outs)
        return time.perf_counter() - t0, time.process_time() - c0

    out = []
    for k in range(2, len(devices) + 1):
        alone, together = [], []
        with frozen_heap():  # timed as every other loop is (libarena.run.heap): no collection, steady malloc
            for _ in range(repeats):  # interleaved: load from elsewhere affects both alike
                alone.append(run(1))
                together.append(run(k))
        wall = statistics.median(w for w, _ in alone)
        cores = statistics.median(c for _, c in alone) / wall if wall > 0 else 1.0
        out.append((k, max(1.0, statistics.median(w for w, _ in together) / wall), cores))
    return out


def host_concurrency(local: Any, max_devices: int, cache: Any | None = None, threading: Any = None) -> HostConcurrency:
    """The slowdowns of ``max_devices`` devices of ``local``'s kind (measured on host CPUs, cached; ``threading``:
    the XLA:CPU thread layout of the benchmark's devices, None for this process's own)."""
    import jax

    if local.platform != "cpu" or max_devices <= 1:
        return HostConcurrency()
    key = content_digest(
        "host-concurrency", CONCURRENCY_VERSION, local.platform, local.kind, local.host(), max_devices, BATCH, WIDTH,
        jax.__version__, None if threading is None else threading.name,
    )
    hit = cache.get(key) if cache is not None else None
    spent = 0.0
    if hit is None:
        t0 = time.perf_counter()
        points = run_module_with_devices(
            "libarena.profile.concurrency", {"max_devices": max_devices}, platform="cpu", num_devices=max_devices, timeout_s=600,
            what="host concurrency benchmark", threading=threading,
        )
        spent = time.perf_counter() - t0
        hit = {"points": points, "seconds": spent}
        if cache is not None:
            cache.put(key, hit)
    slowdowns = tuple((int(point[0]), float(point[1])) for point in hit["points"])
    alone_cores = tuple((int(point[0]), float(point[2])) for point in hit["points"])
    return HostConcurrency(slowdowns, f"measured on {os.cpu_count()} host cores", spent, alone_cores)


def _main(request_path: str, result_path: str) -> None:
    from libarena.artifacts import write_json

    request = json.loads(Path(request_path).read_text())
    write_json(result_path, measure(int(request["max_devices"])))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
