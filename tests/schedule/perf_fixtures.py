"""Small, plausible performance tables built in code for the scheduler's tests (never benchmark numbers).

Throughput follows an Amdahl-style curve per model and GPU type: thr(n) = thr1 * n / (1 + s * (n - 1)), with
thr1 proportional to the GPU's speed over the model size. The ``ap`` view (best adaptive plan) fits whenever
the model's training state (12 bytes per parameter) and activations fit the n GPUs together; ``dp`` needs a
replica of the weights (2 bytes per parameter) on every GPU plus its share of the activations, and scales
worse (all-reduce of every gradient); ``arena`` (proxy plan) is 93% of ``ap``.
"""

from __future__ import annotations

import pyarrow as pa

from libarena.hardware import get_gpu

SPEED = {"h100": 3.0, "a100": 1.6, "l20": 0.9, "a40": 1.0, "v100": 0.8, "a10": 0.5}


def size_billions(model: str) -> float:
    size = model.split("__")[1]
    unit = size[-1]
    return float(size[:-1]) * (1.0 if unit == "B" else 1e-3)


def synthetic_perf_rows(models: list[tuple[str, int]], gpu_types: list[str], max_gpus: int = 16,
                        dp_penalty: float = 2.0) -> dict[str, list]:
    rows: dict[str, list] = {k: [] for k in ("model", "global_batch", "gpu_type", "num_gpus", "view", "iter_time_s",
                                             "throughput", "fits_in_memory")}
    for model, batch in models:
        size = size_billions(model)
        for t in gpu_types:
            gpu = get_gpu(t)
            mem = gpu.memory_bytes * 0.8
            thr1 = 400.0 * SPEED[gpu.name] / size
            serial = 0.02 + 0.01 * size / (1 + size) + (0.03 if gpu.intra_node_bandwidth < 100e9 else 0.0)
            n = 1
            while n <= max_gpus:
                params = size * 1e9
                act = 0.02e9 * size * batch
                ap_fits = (12 * params + act) / n <= mem
                for view, s, fits in (
                    ("ap", serial, ap_fits),
                    ("arena", serial, ap_fits),
                    ("dp", serial * dp_penalty, 2 * params + act / n <= mem),
                ):
                    thr = thr1 * n / (1 + s * (n - 1))
                    if view == "arena":
                        thr *= 0.93
                    rows["model"].append(model)
                    rows["global_batch"].append(batch)
                    rows["gpu_type"].append(gpu.name)
                    rows["num_gpus"].append(n)
                    rows["view"].append(view)
                    rows["iter_time_s"].append(batch / thr)
                    rows["throughput"].append(thr)
                    rows["fits_in_memory"].append(bool(fits))
                n *= 2
    return rows


def synthetic_perf_table(models: list[tuple[str, int]], gpu_types: list[str], max_gpus: int = 16) -> pa.Table:
    return pa.table(synthetic_perf_rows(models, gpu_types, max_gpus))


def write_perf(path, models, gpu_types, max_gpus: int = 16) -> None:
    from libarena.artifacts import Provenance, write_table

    write_table(path, "perf_table", synthetic_perf_table(models, gpu_types, max_gpus), Provenance(tool="tests"))


def zoo_pairs() -> list[tuple[str, int]]:
    from libarena.workloads import GLOBAL_BATCHES, PAPER_SIZES

    return [(f"{f}__{s}", b) for f, sizes in PAPER_SIZES.items() for s in sizes for b in GLOBAL_BATCHES[f]]
