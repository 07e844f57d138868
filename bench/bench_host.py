"""How repeatable is a timing on this host at all? The floor under every timed figure in bench/results.

A fixed XLA:CPU computation (a jitted 512x512 float32 matmul chain, nothing else) is timed in ``RUNS``
runs of ``SAMPLES`` samples each, in one process, back to back: per run the median and the spread of
its samples (IQR / median), across runs the spread of the medians ((max - min) / median). The same for a
plain numpy matmul chain in a child process with one BLAS thread, to show the variation is the host's and
not XLA's. CPU time stolen by the hypervisor over the measurement (``/proc/stat`` steal) is recorded.

Nothing here has a target: the profiler's accuracy target (5% mean error) is only checkable where these
spreads are well under 5%. Writes bench/results/host.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import relative_iqr, relative_spread
from libarena.artifacts import write_json

RUNS, SAMPLES, WARMUP = 5, 15, 3
SIZE, CHAIN = 512, 40

_NUMPY_CHILD = f"""
import json, time
import numpy as np
a = np.random.default_rng(0).random(({SIZE}, {SIZE}), dtype=np.float32)
def sample():
    t = time.perf_counter()
    for _ in range({CHAIN}):
        a @ a
    return time.perf_counter() - t
for _ in range({WARMUP}):
    sample()
print(json.dumps([[sample() for _ in range({SAMPLES})] for _ in range({RUNS})]))
"""


def _steal_ticks() -> int | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    return int(fields[8]) if len(fields) > 8 else None


def _summary(runs: list[list[float]]) -> dict[str, Any]:
    medians = [statistics.median(r) for r in runs]
    iqr = [relative_iqr(r) for r in runs]
    return {
        "run_medians_s": medians,
        "within_run_iqr_over_median": iqr,
        "within_run_iqr_over_median_median": statistics.median(iqr),
        "across_runs_spread": relative_spread(medians),
        "samples": runs,
    }


def _xla_runs() -> list[list[float]]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    @jax.jit
    def chain(a: Any) -> Any:
        out = a
        for _ in range(CHAIN):
            out = (a @ out) * (1.0 / SIZE)  # scaled so values stay finite
        return out

    a = jnp.asarray(np.random.default_rng(0).random((SIZE, SIZE), dtype=np.float32))

    def sample() -> float:
        t = time.perf_counter()
        chain(a).block_until_ready()
        return time.perf_counter() - t

    for _ in range(WARMUP):
        sample()
    return [[sample() for _ in range(SAMPLES)] for _ in range(RUNS)]


def run(results_dir: Path) -> bool:
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    steal0, t0 = _steal_ticks(), time.perf_counter()
    xla = _summary(_xla_runs())
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    child = subprocess.run([sys.executable, "-c", _NUMPY_CHILD], env=env, capture_output=True, text=True, check=True)
    numpy_runs = _summary(json.loads(child.stdout))
    steal1, wall = _steal_ticks(), time.perf_counter() - t0
    steal = None if steal0 is None or steal1 is None else (steal1 - steal0) / ticks / (wall * (os.cpu_count() or 1))
    payload = {
        "benchmark": f"repeatability of a fixed computation: {RUNS} runs x {SAMPLES} samples after {WARMUP} warm-up, "
                     f"a chain of {CHAIN} {SIZE}x{SIZE} float32 matmuls per sample",
        "xla_cpu": xla,
        "numpy_one_thread": numpy_runs,
        "cpu_steal_fraction": steal,
        "wall_s": wall,
        "machine": {"cpus": os.cpu_count(), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
    }
    write_json(results_dir / "host.json", payload)
    print(
        f"bench_host: XLA:CPU run IQR/median {xla['within_run_iqr_over_median_median']:.1%}, across runs {xla['across_runs_spread']:.1%}; "
        f"numpy {numpy_runs['within_run_iqr_over_median_median']:.1%} / {numpy_runs['across_runs_spread']:.1%}; steal {steal}",
        file=sys.stderr,
    )
    return True


if __name__ == "__main__":
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    raise SystemExit(0 if run(out) else 1)
