"""Small traces in the paper artifact's format (arena-ae), built in code for tests that must run without
../shared: plausible jobs (the artifact's models and batch sizes, its GPU counts and types), never its rows."""

from __future__ import annotations

import csv
import io
import random
from pathlib import Path

from libarena.schedule.entities import JobSpec
from libarena.schedule.traces import read_trace
from tests.conftest import SHARED
from tests.schedule.perf_fixtures import size_billions, zoo_pairs

GPU_TYPES = ("a100", "v100", "a40", "a10")


def arena_ae_trace_csv(count: int, seed: int, iterations: tuple[int, int] = (2000, 8000),
                       max_size_billions: float = 2.6, mean_gap_s: float = 900.0) -> str:
    """``count`` jobs submitted from time 0 with exponential gaps, of models up to ``max_size_billions``
    parameters, each asking for 1-16 GPUs of one type; deadlines a day after submission."""
    rng = random.Random(seed)
    pairs = [p for p in zoo_pairs() if size_billions(p[0]) <= max_size_billions]
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu",
                "gpu_type"])
    submit = 0.0
    for i in range(count):
        model, batch = rng.choice(pairs)
        w.writerow([f"job-{seed}-{i}", round(submit), rng.randint(*iterations), model, round(submit) + 86400, batch,
                    rng.choice((1, 2, 2, 4, 4, 4, 8, 16)), rng.choice(GPU_TYPES)])
        submit += rng.expovariate(1.0 / mean_gap_s)
    return out.getvalue()


def first_jobs(name: str, count: int, scratch: Path, seed: int, iterations: tuple[int, int],
               max_size_billions: float = 2.6) -> tuple[list[JobSpec], bool]:
    """(the first ``count`` jobs by submission of the artifact's trace ``name`` in ../shared, True), or where
    ../shared is absent, (``count`` jobs of its format built in code, False): a test then runs either way."""
    real = SHARED / "traces" / "arena-ae" / f"simulate_trace_{name}.csv"
    if real.is_file():
        return sorted(read_trace(real).jobs, key=lambda j: j.submit_time)[:count], True
    path = Path(scratch) / f"{name}-generated.csv"
    path.write_text(arena_ae_trace_csv(count, seed, iterations, max_size_billions))
    return read_trace(path).jobs, False
