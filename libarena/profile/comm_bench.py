"""``arena-profile comm``: benchmark the planner's collectives on the local devices into a ``comm_table``.

All-reduce, all-gather, reduce-scatter and all-to-all run under ``jax.shard_map`` on meshes of the first
2, 4, ... N devices; P2P is a ``ppermute`` between two devices. Volumes follow nccl-tests' ``size``
convention (libarena.hardware.comm). On a host, N devices exist only when XLA is told so before JAX
starts, so the benchmark runs in a subprocess with ``--xla_force_host_platform_device_count=N``.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from libarena.checks import MAX_REPEATS, Range, check_fields
from libarena.errors import ArenaError

#: The largest collective volume per device (1 GiB): nccl-tests' sweeps end about there.
MAX_COMM_BYTES = 1 << 30
from libarena.hardware.comm import PRIMITIVES
from libarena.profile.subprocess_devices import run_module_with_devices
from libarena.run.heap import frozen_heap


@dataclass(frozen=True)
class CommBenchConfig:
    num_devices: int = 2
    min_bytes: int = 2**10
    max_bytes: int = 2**22
    points: int = 7
    warmup: int = 2
    repeats: int = 10
    primitives: tuple[str, ...] = PRIMITIVES
    platform: str = "cpu"
    #: XLA:CPU thread layout of the benchmark's devices (libarena.profile.host.XLA_THREADING; None: this process's)
    xla_threading: str | None = None

    def __post_init__(self) -> None:
        check_fields(self, {
            "num_devices": Range("--devices", 2, 1024, integer=True),
            "min_bytes": Range("--min-bytes", 4, MAX_COMM_BYTES, integer=True),
            "max_bytes": Range("--max-bytes", 4, MAX_COMM_BYTES, integer=True),
            "points": Range("--points", 1, 64, integer=True),
            "warmup": Range("warmup", 0, 1000, integer=True),
            "repeats": Range("--repeats", 1, MAX_REPEATS, integer=True),
        })
        if self.min_bytes > self.max_bytes:
            raise ArenaError(f"--min-bytes {self.min_bytes} is larger than --max-bytes {self.max_bytes}")
        unknown = [p for p in self.primitives if p not in PRIMITIVES]
        if unknown or not self.primitives:
            raise ArenaError(f"unknown primitive(s) {', '.join(map(str, unknown)) or '(none given)'} "
                             f"(known: {', '.join(PRIMITIVES)})")
        if self.platform not in ("cpu", "gpu"):
            raise ArenaError(f"unknown platform {self.platform!r} (cpu or gpu)")
        if self.platform == "cpu":
            # host devices share this machine's memory: a buffer and its result per device, and XLA's temporaries
            # (the largest volume measured: --max-bytes rounded up to the primitives' step of 4 x devices^2 bytes)
            largest = max(self.sizes())
            need = 4 * self.num_devices * largest
            have = _host_memory_bytes()
            if have and need > have // 2:
                measured = "" if largest == self.max_bytes else f" (measured as {largest}: volumes are multiples of 4 x devices^2)"
                raise ArenaError(f"--max-bytes {self.max_bytes}{measured} on {self.num_devices} host devices needs about "
                                 f"{need / 2**30:.1f} GiB, more than half of this machine's {have / 2**30:.1f} GiB")

    def sizes(self) -> list[int]:
        raw = np.geomspace(self.min_bytes, self.max_bytes, self.points)
        # Multiples of 4 bytes x devices^2 so every primitive splits its buffer evenly.
        quantum = 4 * self.num_devices * self.num_devices
        return sorted({max(quantum, int(round(v / quantum)) * quantum) for v in raw})


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _trimmed_mean(samples: list[float]) -> float:
    """Mean of the middle 60% (the host is shared: a few preempted repetitions must not dominate)."""
    ordered = sorted(samples)
    cut = len(ordered) // 5
    kept = ordered[cut : len(ordered) - cut] or ordered
    return float(statistics.fmean(kept))


def _group_sizes(n: int) -> list[int]:
    out, g = [], 2
    while g <= n:
        out.append(g)
        g *= 2
    return out


def _collective(primitive: str, mesh: Any, elements: int) -> tuple[Any, Any]:
    """(jitted function, its input) moving ``elements`` float32 per device in nccl-tests' convention."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    g = mesh.devices.size
    if primitive == "all-reduce":
        per_device, fn = elements, lambda x: jax.lax.psum(x, "x")
    elif primitive == "all-gather":
        per_device, fn = elements // g, lambda x: jax.lax.all_gather(x, "x", tiled=True)
    elif primitive == "reduce-scatter":
        per_device, fn = elements, lambda x: jax.lax.psum_scatter(x, "x", tiled=True)
    elif primitive == "all-to-all":
        per_device, fn = elements, lambda x: jax.lax.all_to_all(x, "x", 0, 0, tiled=True)
    elif primitive == "p2p":
        per_device, fn = elements, lambda x: jax.lax.ppermute(x, "x", perm=[(0, 1)])
    else:
        raise ArenaError(f"unknown primitive {primitive!r}")
    mapped = jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    x = jax.device_put(np.ones((g * per_device,), np.float32), NamedSharding(mesh, P("x")))
    return jax.jit(mapped), x


def benchmark(config: CommBenchConfig, gpu_type: str) -> list[dict[str, Any]]:
    """Rows of a comm_table measured on this process's devices (run with enough devices)."""
    import jax
    from jax.sharding import Mesh

    devices = jax.devices()
    if config.platform == "gpu" and devices[0].platform != "gpu":
        raise ArenaError(f"--device gpu: JAX finds no GPU on this machine (only {devices[0].platform} devices); "
                         f"use --device cpu")
    if len(devices) < config.num_devices:
        raise ArenaError(f"{config.num_devices} devices requested, {len(devices)} available")
    rows = []
    for g in _group_sizes(config.num_devices):
        mesh = Mesh(np.array(devices[:g]), ("x",))
        for primitive in config.primitives:
            if primitive == "p2p" and g != 2:
                continue
            for size in config.sizes():
                fn, x = _collective(primitive, mesh, size // 4)
                samples = []
                with frozen_heap():  # timed as every other loop is (libarena.run.heap): no collection, steady malloc
                    for _ in range(config.warmup):
                        jax.block_until_ready(fn(x))
                    for _ in range(config.repeats):
                        t0 = time.perf_counter()
                        jax.block_until_ready(fn(x))
                        samples.append(time.perf_counter() - t0)
                rows.append(
                    {
                        "primitive": primitive,
                        "gpu_type": gpu_type,
                        "num_devices": g,
                        "crosses_nodes": False,
                        "bytes": float(size),
                        "latency_s": _trimmed_mean(samples),
                        "num_nodes": 1,
                        "repeats": config.repeats,
                        "timer": "host",
                    }
                )
    return rows


def benchmark_in_subprocess(config: CommBenchConfig, timeout_s: float = 1800.0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run :func:`benchmark` in a fresh interpreter with ``num_devices`` host devices (CPU) or the GPUs."""
    if config.num_devices < 2:
        raise ArenaError("the communication benchmark needs at least 2 devices (--devices)")
    from libarena.profile.host import XLA_THREADING

    layout = XLA_THREADING.get(config.xla_threading) if config.xla_threading is not None else None
    data = run_module_with_devices("libarena.profile.comm_bench", asdict(config), platform=config.platform,
                                   num_devices=config.num_devices, timeout_s=timeout_s, what="communication benchmark",
                                   threading=layout)
    return data["rows"], data["hardware"]


def _main(request_path: str, result_path: str) -> None:
    from libarena.artifacts import write_json
    from libarena.profile.device import resolve_device

    raw = json.loads(Path(request_path).read_text())
    raw["primitives"] = tuple(raw["primitives"])
    config = CommBenchConfig(**raw)
    local = resolve_device("local")
    try:
        rows = benchmark(config, local.gpu_type)
    except ArenaError as exc:  # one line for the parent's message (run_module_with_devices keeps the last line)
        print(exc.message, file=sys.stderr)
        raise SystemExit(2) from None
    hardware = {"device_kind": local.kind, "platform": local.platform, "num_devices": config.num_devices, "interconnect": "in-process" if local.platform == "cpu" else "local"}
    write_json(result_path, {"rows": rows, "hardware": hardware})


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
