"""How repeatable is a timing on this host, under each XLA:CPU thread layout? The floor under every timed
figure in bench/results, and the evidence for the layout the accuracy benchmark uses.

For every layout of libarena.profile.host.XLA_THREADING (``default``, ``eigen-single``, ``pinned``), in
fresh interpreters with the layout applied before JAX starts:

* a fixed computation (a jitted chain of 512x512 float32 matmuls) on one device: ``RUNS`` runs of
  ``SAMPLES`` samples each;
* a fixed plan's direct measurement through the runtime's executor (gpt__tiny: its 1-device plan and its
  2-device two-stage pipeline), the executor built once, then ``RUNS`` runs of ``SAMPLES`` steps.

Per run the lower quartile (the protocol's statistic) and the median of its samples; across runs the
IQR / median of those per-run values: how far apart two runs of the same thing land. The layout whose
worst across-run spread is smallest is ``steadiest_layout`` (bench_profile uses it). Target: <= 3% on an
otherwise idle machine. The host check, load average before/after, CPU steal and process CPU time are
recorded, and so is the quiet check's short timing-noise probe (libarena.profile.host.timing_noise), which this
benchmark does not refuse on: it measures that noise itself. Writes bench/results/host.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.provenance import code_identity
from bench.stats import relative_iqr
from libarena.artifacts import write_json
from libarena.errors import ArenaError

RUNS, SAMPLES, WARMUP = 7, 15, 3
SIZE, CHAIN = 512, 40
PLAN_MODEL, GLOBAL_BATCH, NUM_CLUSTERS = "gpt__tiny", 16, 3
#: The plans measured: (devices, plan id) of PLAN_MODEL's grids.
PLANS = ((1, "s1-b0-g1-1x1"), (2, "s2-b0.1-g1.1-1x1.1x1"))
TARGET = 0.03
REFUSALS = (ArenaError,)

#: Where this benchmark's code starts: it measures with every library and bench file this can run
#: (bench.provenance.code_identity follows the imports)
MEASURING_MODULES = ("bench/bench_host.py",)


def _log(message: str) -> None:
    print(f"[bench_host] {message}", file=sys.stderr, flush=True)


def _fixed_computation() -> list[list[tuple[float, float]]]:
    """RUNS x SAMPLES (wall, process CPU) seconds of the matmul chain (in a child with the layout applied)."""
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

    def sample() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        chain(a).block_until_ready()
        return time.perf_counter() - t, time.process_time() - c

    for _ in range(WARMUP):
        sample()
    return [[sample() for _ in range(SAMPLES)] for _ in range(RUNS)]


def spread(runs: list[list[tuple[float, float]]]) -> dict[str, Any]:
    """Per-run lower quartile and median of the wall samples; their IQR / median across runs."""
    from libarena.profile.timers import lower_quartile

    walls = [[w for w, _ in run] for run in runs]
    q1 = [lower_quartile(w) for w in walls]
    medians = [statistics.median(w) for w in walls]
    cpu = sum(c for run in runs for _, c in run) / sum(w for run in runs for w, _ in run)
    return {
        "run_lower_quartiles_s": q1,
        "run_medians_s": medians,
        "across_runs_iqr_over_median": relative_iqr(q1),
        "across_runs_iqr_over_median_of_run_medians": relative_iqr(medians),
        "within_run_iqr_over_median_median": statistics.median(relative_iqr(w) for w in walls),
        "cpu_per_wall": cpu,
        "samples_s": walls,
    }


def _plans_file(tmp: Path) -> Path:
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table

    plans = [p for n in sorted({n for n, _ in PLANS}) for p in enumerate_grid_plans(PLAN_MODEL, GLOBAL_BATCH, n, "cpu", NUM_CLUSTERS)]
    path = tmp / "plans.parquet"
    write_plans_table(str(path), PLAN_MODEL, GLOBAL_BATCH, plans, model_clusters(PLAN_MODEL, GLOBAL_BATCH, num_clusters=NUM_CLUSTERS))
    return path


def _plan_runs(plans_path: Path, num_devices: int, plan_id: str, layout: Any) -> tuple[dict[str, Any], list[list[tuple[float, float]]]]:
    from libarena.profile.measure import MeasureSession

    grid = {"model": PLAN_MODEL, "global_batch": GLOBAL_BATCH, "gpu_type": "cpu", "num_gpus": num_devices, "num_nodes": 1}
    with MeasureSession(plans_path, num_devices, threading=layout) as session:
        prepared = session.prepare(grid, plan_id, warmup=WARMUP)
        runs = []
        for _ in range(RUNS):
            out = session.steps(grid, plan_id, SAMPLES)
            runs.append(list(zip(out["samples_s"], out["cpu_s"], strict=True)))
    return prepared, runs


def _layout_round(name: str, plans_path: Path) -> dict[str, Any]:
    from libarena.profile.host import XLA_THREADING, child_layout, host_window, snapshot

    layout = XLA_THREADING.get(name)
    before = snapshot()
    child = child_layout(layout, 1, os.environ)
    proc = subprocess.run(child.command([sys.executable, "-m", "bench.bench_host", "--fixed"]), env=child.env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ArenaError(f"bench_host: the fixed computation failed under {name}: {tail[0]}")
    out: dict[str, Any] = {"layout": layout.to_dict(), "fixed_computation": spread(json.loads(proc.stdout))}
    for n, plan_id in PLANS:
        prepared, runs = _plan_runs(plans_path, n, plan_id, layout)
        out[f"plan_{n}_devices"] = {"plan_id": plan_id, "prepare": prepared, **spread(runs)}
    out["host"] = host_window(before, snapshot())
    out["worst_across_runs_iqr_over_median"] = max(v["across_runs_iqr_over_median"] for k, v in out.items()
                                                   if isinstance(v, dict) and "across_runs_iqr_over_median" in v)
    _log(f"{name}: fixed computation {out['fixed_computation']['across_runs_iqr_over_median']:.1%}, "
         + ", ".join(f"{n}-device plan {out[f'plan_{n}_devices']['across_runs_iqr_over_median']:.1%}" for n, _ in PLANS)
         + f" across runs (IQR/median); steal {out['host']['cpu_steal_fraction']}")
    return out


def run(results_dir: Path, quiet: Any = None, layouts: tuple[str, ...] | None = None, name: str = "host") -> bool:
    from libarena.profile.host import XLA_THREADING, QuietPolicy, wait_until_quiet

    if not Path(results_dir).is_dir():  # found out now, not after the runs
        raise ArenaError(f"bench_host: results directory {results_dir} does not exist")
    # this benchmark measures the timing noise itself: its probe is recorded beside the runs, not a reason to refuse
    quiet_record = wait_until_quiet(quiet or QuietPolicy(max_noise=None), _log)
    started = time.perf_counter()
    rounds = {}
    with tempfile.TemporaryDirectory(prefix="bench-host-") as tmp:
        plans_path = _plans_file(Path(tmp))
        for layout in layouts or tuple(XLA_THREADING.names()):
            rounds[layout] = _layout_round(layout, plans_path)
    steadiest = min(rounds, key=lambda k: rounds[k]["worst_across_runs_iqr_over_median"])
    met = rounds[steadiest]["worst_across_runs_iqr_over_median"] <= TARGET
    payload = {
        "benchmark": f"repeatability: {RUNS} runs x {SAMPLES} samples after {WARMUP} warm-up, per XLA:CPU thread layout: a chain of {CHAIN} "
                     f"{SIZE}x{SIZE} float32 matmuls, and the direct measurement of {PLAN_MODEL} plans {', '.join(p for _, p in PLANS)}",
        "statistic": "per run: lower quartile of its samples; across runs: IQR / median of the per-run values",
        "layouts": rounds,
        "steadiest_layout": steadiest,
        "target": TARGET,
        "met": met,
        "quiet_check": quiet_record,
        "wall_s": time.perf_counter() - started,
        "machine": {"cpus": os.cpu_count(), "load_average_after": [round(x, 2) for x in os.getloadavg()]},
        "code": code_identity(MEASURING_MODULES),
    }
    write_json(results_dir / f"{name}.json", payload)
    _log(f"steadiest layout {steadiest}: worst across-run IQR/median {rounds[steadiest]['worst_across_runs_iqr_over_median']:.1%} "
         f"(target {TARGET:.0%})")
    return met


if __name__ == "__main__":
    if sys.argv[1:] == ["--fixed"]:
        print(json.dumps(_fixed_computation()))
        raise SystemExit(0)
    import argparse

    from libarena.profile.host import XLA_THREADING, QuietPolicy

    parser = argparse.ArgumentParser()
    parser.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
    parser.add_argument("--name", default="host")
    parser.add_argument("--layouts", nargs="*", choices=XLA_THREADING.names(), default=None)
    parser.add_argument("--max-wait", type=float, default=QuietPolicy.max_wait_s)
    parser.add_argument("--allow-busy", action="store_true", help="go on (recording it) when the host stays busy")
    args = parser.parse_args()
    try:
        ok = run(Path(args.results), QuietPolicy(max_noise=None, max_wait_s=args.max_wait, refuse=not args.allow_busy),
                 tuple(args.layouts) if args.layouts else None, args.name)
    except ArenaError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(0 if ok else 1)
