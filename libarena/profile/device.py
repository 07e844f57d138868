"""The local device the profiler times on: resolution of ``--device``, its GPU type, memory, and its
roofline spec (catalogue figures for a known GPU; for anything else peak FLOP/s and memory bandwidth
measured once by a microbenchmark and cached).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Any

from libarena.artifacts import content_digest
from libarena.errors import ArenaError
from libarena.hardware.catalogue import get_gpu, gpu_names, normalize_dtype
from libarena.hardware.roofline import roofline_seconds

#: GPU type name of host (CPU) devices in plans and tables; not a catalogue entry.
CPU_TYPE = "cpu"


@dataclass(frozen=True)
class RooflineSpec:
    """Peak FLOP/s and memory bandwidth of a device (its roofline)."""

    name: str
    peak_flops: float
    bandwidth: float
    source: str
    #: Per-dtype peaks when known (catalogue GPUs); others use ``peak_flops``.
    peaks: tuple[tuple[str, float], ...] = ()

    def peak(self, dtype: str) -> float:
        return dict(self.peaks).get(normalize_dtype(dtype), self.peak_flops)

    def time(self, flops: float, bytes_: float, dtype: str) -> float:
        """Roofline time of an operator group (eq. 2)."""
        return float(roofline_seconds(flops, bytes_, self.peak(dtype), self.bandwidth))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "peak_flops": self.peak_flops, "bandwidth": self.bandwidth, "source": self.source, "peaks": dict(self.peaks)}


def catalogue_roofline(gpu_type: str) -> RooflineSpec:
    gpu = get_gpu(gpu_type)
    return RooflineSpec(
        name=gpu.name,
        peak_flops=gpu.peak("fp32"),
        bandwidth=gpu.hbm_bandwidth,
        source=gpu.source,
        peaks=tuple(sorted(gpu.peak_flops.items())),
    )


@dataclass(frozen=True)
class LocalDevice:
    device: Any
    label: str
    platform: str
    kind: str
    #: the GPU type the device counts as in plans (catalogue name, or ``cpu``)
    gpu_type: str
    memory_bytes: float

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "platform": self.platform, "kind": self.kind, "gpu_type": self.gpu_type, "memory_bytes": self.memory_bytes}

    def host(self) -> list[Any]:
        """On CPU the host, whose cores are the device (node name, core count), and how this process may use it
        (its cores and XLA flags: libarena.profile.host.process_identity): what a cache key holds so that a cache
        shared between hosts, or between runs pinned or flagged differently, never serves one's CPU times to
        another. Empty on a GPU."""
        if self.platform != "cpu":
            return []
        from libarena.profile.host import process_identity

        return [platform.node(), os.cpu_count(), process_identity()]

    def machine(self) -> list[Any] | str:
        """What keys a measurement of this machine's device (its roofline, its dispatch overhead): on CPU the host
        (``host()``), on a GPU the node's name, since two GPUs of one kind may still sit in different machines."""
        return self.host() or platform.node()

    def cache_identity(self) -> dict[str, Any]:
        """What names this device in the key of a cached profile: ``describe()`` and, on CPU, the host."""
        return {**self.describe(), "host": self.host()}


def _device_memory(device: Any) -> float:
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - CPU devices have no memory stats
        stats = {}
    if stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    import psutil

    return float(psutil.virtual_memory().total)


def gpu_type_of(platform_name: str, kind: str, memory_bytes: float) -> str:
    """Catalogue name matching a JAX device kind (``NVIDIA H100 80GB HBM3`` -> ``h100``); ``cpu`` for hosts."""
    if platform_name == "cpu":
        return CPU_TYPE
    tokens = kind.lower().replace("-", " ").split()
    candidates = [name for name in gpu_names() if name.split("-")[0] in tokens]
    if not candidates:
        return kind.lower().replace(" ", "-")
    return min(candidates, key=lambda name: abs(get_gpu(name).memory_bytes - memory_bytes))


def split_device_name(name: str) -> tuple[str, int]:
    """(platform, index) of ``cpu``, ``gpu``, ``platform:index`` (``gpu:1``; ``cuda`` and ``nvidia`` name the GPUs,
    ``host`` the CPU; a bare platform is index 0)."""
    platform_name, _, index_text = str(name).strip().lower().partition(":")
    platform_name = {"cuda": "gpu", "nvidia": "gpu", "host": "cpu"}.get(platform_name, platform_name)
    try:
        index = int(index_text) if index_text else 0
        if not platform_name:  # (JAX would take an empty platform name for its default one)
            raise ValueError(name)
    except ValueError:
        raise ArenaError(f"bad device {name!r}: expected local, cpu, gpu or platform:index") from None
    return platform_name, index


def resolve_device(name: str = "local") -> LocalDevice:
    """``local`` (JAX's default device), ``cpu``, ``gpu``, or ``platform:index`` (``cpu:0``, ``gpu:1``)."""
    import jax

    label = str(name).strip().lower()
    if label == "local":
        device = jax.devices()[0]
    else:
        platform_name, index = split_device_name(label)
        try:
            devices = jax.devices(platform_name)
        except RuntimeError:
            devices = []
        if index >= len(devices) or index < 0:
            have = ", ".join(f"{d.platform}:{d.id}" for d in jax.devices())
            raise ArenaError(f"device {name!r} does not exist here (available: {have})")
        device = devices[index]
    memory = _device_memory(device)
    kind = str(device.device_kind)
    return LocalDevice(device, f"{device.platform}:{device.id}", device.platform, kind, gpu_type_of(device.platform, kind, memory), memory)


def _measure_roofline(device: Any) -> tuple[float, float]:
    """(peak FLOP/s, bandwidth bytes/s) of ``device``: a large matmul and a large streaming reduction."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    n = 1024 if device.platform == "cpu" else 8192
    a = jax.device_put(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32), device)
    matmul = jax.jit(lambda x: x @ x)
    words = (32 if device.platform == "cpu" else 512) * 2**20
    v = jax.device_put(np.ones((words,), np.float32), device)
    # A reduction reads the whole vector and writes a scalar: no fresh output buffer to page in.
    stream = jax.jit(lambda x: jnp.sum(x * 1.5))

    def best(fn: Any, arg: Any, repeats: int = 7) -> float:
        jax.block_until_ready(fn(arg))
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(arg))
            out.append(time.perf_counter() - t0)
        # The machine may be shared: the fastest repetitions show what the device can do.
        return statistics.median(sorted(out)[: max(1, repeats // 2)])

    flops = 2.0 * n**3 / best(matmul, a)
    bandwidth = 4.0 * words / best(stream, v)  # one read per element
    return flops, bandwidth


def local_roofline(local: LocalDevice, cache: Any | None = None) -> RooflineSpec:
    """The local device's roofline: catalogue figures for a known GPU, else measured (cached)."""
    try:
        return catalogue_roofline(local.gpu_type)
    except ArenaError:
        pass
    import jax

    key = content_digest("device-roofline", 2, local.platform, local.kind, local.machine(), platform.processor(),
                         jax.__version__)
    if cache is not None:
        hit = cache.get(key)
        if hit is not None:
            return RooflineSpec(hit["name"], hit["peak_flops"], hit["bandwidth"], hit["source"])
    flops, bandwidth = _measure_roofline(local.device)
    spec = RooflineSpec(local.gpu_type, flops, bandwidth, f"measured on {local.label} ({local.kind})")
    if cache is not None:
        cache.put(key, spec.to_dict())
    return spec
