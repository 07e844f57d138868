"""GPU validation in one command (``make gpu-check``, ``python -m bench gpu``): the CUPTI timer against the
host timer, and the disaggregated profiler against direct measurement, on one NVIDIA GPU.

On a machine with an NVIDIA GPU and nothing else set up, it

1. finds the GPU and its driver's CUDA version (``nvidia-smi``; on a machine without one it stops with the
   one line "no NVIDIA GPU visible" and exit status 2),
2. installs what the GPU needs into this interpreter's environment when it is missing: JAX's CUDA plugin
   matching jax 0.10.2 (``jax[cuda12]`` or ``jax[cuda13]``, by the driver) and NVIDIA's ``cupti-python`` of
   the same CUDA major version (the ``cuda12`` / ``cuda13`` extras of pyproject.toml),
3. runs, in a fresh interpreter (JAX must start after the install): a fixed matmul chain timed by both
   timers; then for the tiny and small size of every family, every plan of the 1-GPU grid (and its pure
   data-parallel plan) profiled with the ``cupti`` timer and with the ``host`` timer, and measured
   directly with the runtime's executor;
4. writes ``bench/results/gpu.json``: per plan the two estimates, the measurement, the errors, the CUPTI
   kernel time per stage, the runtime's stage busy time (one step run task by task) beside the estimate's,
   and the machine it ran on.

On a GPU machine without network access but with JAX's CUDA plugin and ``cupti-python`` already importable,
``python3 -m bench gpu`` from the repository root installs nothing (see the README).

Everything within ``TIME_BUDGET_S`` (models are skipped, and listed as such, once it is spent; ``python -m
bench.bench_gpu --time-budget S`` for a shorter lease).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: This module needs an NVIDIA GPU: ``python -m bench`` runs it only when named.
REQUIRES_GPU = True
#: Cheapest to compile first: XLA autotunes wide_resnet's convolutions for minutes on a first compile (in
#: gpu-h200.json wide_resnet__tiny's first profiling pass took 207 s, its second, from the compilation cache, 7 s),
#: so its sizes come last and the rest fit the budget before them.
MODELS = (*(f"{family}__{size}" for family in ("gpt", "bert", "moe") for size in ("tiny", "small")),
          "wide_resnet__tiny", "wide_resnet__small")
GLOBAL_BATCH = 16
NUM_CLUSTERS = 3
WARMUP, REPEATS = 3, 15
#: The whole check (install excluded) within this; the rest of the models are skipped once it is spent.
TIME_BUDGET_S = 420.0
#: The child is stopped this long after its budget (a model started just inside it can take minutes to compile).
CHILD_GRACE_S = 150.0
#: XLA's kernel autotuning in the check's compilations (``--xla_gpu_autotune_level``; None: XLA's default, 4).
#: Autotuning times candidate kernels while compiling: on an H200 it made wide_resnet__tiny's first compilation
#: 207 s and left three small models outside the budget (gpu-h200.json). Off, XLA picks kernels by its
#: heuristics, the same for the profiler's stage programs and the runtime's, which is what the check compares.
AUTOTUNE_LEVEL: int | None = 0
NO_GPU = "no NVIDIA GPU visible"


class GpuCheckError(Exception):
    """A one-line reason the check cannot run here."""


#: Printed alone by ``python -m bench`` (exit status 2), never as a traceback.
REFUSALS = (GpuCheckError,)

#: Where this benchmark's code starts: it measures with every library and bench file this can run
#: (bench.provenance.code_identity follows the imports)
MEASURING_MODULES = ("bench/bench_gpu.py",)


def nvidia_gpus(run: Any = subprocess.run) -> list[str]:
    """The NVIDIA GPUs the driver shows (``nvidia-smi -L`` lines); empty without a driver or a GPU."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("GPU ")]


def driver_cuda_major(run: Any = subprocess.run) -> int:
    """The CUDA major version the driver supports (``nvidia-smi``'s header: "CUDA Version: 12.8")."""
    out = run(["nvidia-smi"], capture_output=True, text=True, timeout=60)
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out.stdout or "")
    if not match:
        raise GpuCheckError("nvidia-smi does not say which CUDA version the driver supports")
    return int(match.group(1))


def cuda_extra(cuda_major: int) -> str:
    """The pyproject extra for a driver: cuda13 from CUDA 13 on, cuda12 for CUDA 12 (older: unsupported)."""
    if cuda_major >= 13:
        return "cuda13"
    if cuda_major == 12:
        return "cuda12"
    raise GpuCheckError(f"the driver supports CUDA {cuda_major}; jax 0.10.2 needs CUDA 12 or 13")


def _installed(extra: str) -> bool:
    import importlib.util

    plugin = "jax_cuda13_plugin" if extra == "cuda13" else "jax_cuda12_plugin"
    return importlib.util.find_spec(plugin) is not None and importlib.util.find_spec("cupti") is not None


def ensure_installed(extra: str, log: Any) -> None:
    if _installed(extra):
        return
    repo = Path(__file__).resolve().parents[1]
    log(f"installing the '{extra}' extra (JAX's CUDA plugin and cupti-python)")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", f"{repo}[{extra}]"], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise GpuCheckError(f"pip install '.[{extra}]' failed: {tail[0]}")


def _log(message: str) -> None:
    print(f"[bench_gpu] {message}", file=sys.stderr, flush=True)


def preflight() -> list[str]:
    """The visible NVIDIA GPUs; GpuCheckError("no NVIDIA GPU visible") where there is none."""
    gpus = nvidia_gpus()
    if not gpus:
        raise GpuCheckError(NO_GPU)
    return gpus


def check_env(base: Any, tmp: Path, autotune_level: int | None = AUTOTUNE_LEVEL) -> dict[str, str]:
    """The check's children's environment. The direct measurement's child shares the GPU (no preallocation).
    Compiling is most of the check's time, and the profiler's second timer pass compiles exactly what its first
    did: JAX's persistent compilation cache in ``tmp`` serves it (and with it JAX turns on XLA's per-fusion
    autotuning cache, which the measurement's child reads). Neither changes what runs. ``autotune_level``
    (see AUTOTUNE_LEVEL) goes into XLA_FLAGS beside the caller's own flags."""
    from libarena.profile.host import merge_xla_flags

    env = dict(base, XLA_PYTHON_CLIENT_PREALLOCATE="false", JAX_COMPILATION_CACHE_DIR=str(tmp / "jax-cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if autotune_level is not None:
        env["XLA_FLAGS"] = merge_xla_flags(base.get("XLA_FLAGS", ""), (f"--xla_gpu_autotune_level={int(autotune_level)}",))
    return env


def run_check_child(command: list[str], env: dict[str, str], out: Path, timeout_s: float) -> dict[str, Any]:
    """Run the check's child; one that overruns ``timeout_s`` (or a check that is interrupted) is stopped, and the
    models it finished (its file is rewritten after each) are kept, the one it was on listed as not done.
    GpuCheckError when nothing is left."""
    from libarena.errors import ArenaError

    from bench.child import run_child

    try:
        payload, stopped = run_child(command, out, timeout_s, env, what="the GPU check")
    except ArenaError as exc:
        raise GpuCheckError(str(exc)) from None
    if stopped is not None:
        payload["summary"]["stopped"] = stopped
        if stopped.startswith("overran"):
            payload["summary"]["stopped_after_s"] = timeout_s
        _log(f"{stopped}; kept the {payload['summary']['plans']} plans done, not done: "
             f"{', '.join(payload['summary']['models_not_reached']) or 'none'}")
    return payload


def run(results_dir: Path, time_budget_s: float = TIME_BUDGET_S, autotune_level: int | None = AUTOTUNE_LEVEL) -> bool:
    gpus = preflight()
    extra = cuda_extra(driver_cuda_major())
    ensure_installed(extra, _log)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        env = check_env(os.environ, Path(tmp), autotune_level)
        out = Path(tmp) / "gpu.json"
        payload = run_check_child([sys.executable, "-m", "bench.bench_gpu", "--child", str(out), str(time_budget_s)], env, out,
                                  time_budget_s + CHILD_GRACE_S)
    payload["machine"].update(gpus=gpus, cuda_extra=extra)
    from libarena.artifacts import write_json

    from bench.provenance import code_identity

    payload["code"] = code_identity(MEASURING_MODULES)

    write_json(results_dir / "gpu.json", payload)
    s = payload["summary"]
    _log(f"{s['plans']} plans: mean error {s['mae_cupti']:.1%} (cupti) / {s['mae_host']:.1%} (host); wrote {results_dir / 'gpu.json'}")
    return True


# --------------------------------------------------------------------------------------------------
# The check itself (a fresh interpreter with the GPU packages importable)


def _fixed_computation() -> dict[str, Any]:
    """A chain of matmuls timed by both timers: CUPTI's kernel time is at most the host's wall time."""
    import jax
    import numpy as np

    from libarena.profile.timers import select_timer

    device = jax.devices()[0]
    a = jax.device_put(np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32), device)

    @jax.jit
    def chain(x: Any) -> Any:
        out = x
        for _ in range(16):
            out = (x @ out) * (1.0 / 2048)
        return out

    host = select_timer("host", device).time(lambda: chain(a), WARMUP, REPEATS)
    cupti = select_timer("cupti", device).time(lambda: chain(a), WARMUP, REPEATS)
    return {"what": "16 chained 2048x2048 float32 matmuls", "host": host.to_dict(), "cupti": cupti.to_dict(),
            "cupti_over_host": cupti.median / host.median}


def _model_rows(tmp: Path, model: str, gpu_type: str, timers: tuple[str, str] = ("cupti", "host"), platform: str = "gpu") -> list[dict[str, Any]]:
    """One model's rows: its 1-device plans profiled with each of ``timers`` (the first is the one reported as
    ``estimate_cupti_s``) and measured directly on ``platform`` (a test runs it on the CPU with two host timers)."""
    from libarena.hardware.comm import AlphaBetaCommModel
    from libarena.plan import read_plans
    from libarena.profile import ProfileConfig, profile_plans
    from libarena.profile.local_plans import enumerate_grid_plans, model_clusters, write_plans_table
    from libarena.profile.measure import measure_in_subprocess

    path = tmp / f"plans-{model}.parquet"
    plans = enumerate_grid_plans(model, GLOBAL_BATCH, 1, gpu_type, NUM_CLUSTERS)
    write_plans_table(str(path), model, GLOBAL_BATCH, plans, model_clusters(model, GLOBAL_BATCH, num_clusters=NUM_CLUSTERS))
    planset = read_plans(path, require_costs=False)
    results = {}
    for key, timer in zip(("cupti", "host"), timers, strict=True):
        t0 = time.perf_counter()
        config = ProfileConfig(cache_dir=tmp / f"cache-{model}-{key}", timer=timer, selection="exhaustive", warmup=WARMUP,
                               repeats=REPEATS)
        results[key] = (profile_plans(planset, config, comm=AlphaBetaCommModel()), time.perf_counter() - t0)
    wanted = [(p.resources.to_dict(), p.plan_id) for p in planset.plans()] + [(planset.grids[0].grid.resources.to_dict(), "dp")]
    t0 = time.perf_counter()
    measured = {m["plan_id"]: m for m in measure_in_subprocess(path, wanted, 1, platform=platform, warmup=WARMUP, repeats=REPEATS,
                                                               stage_times=True)}
    measure_wall = time.perf_counter() - t0
    host_by_id = {e.plan.plan_id: e for e in results["host"][0].estimates}
    rows = []
    for e in results["cupti"][0].estimates:
        h = host_by_id[e.plan.plan_id]
        m = measured[e.plan.plan_id]
        rows.append({
            "model": model, "plan_id": e.plan.plan_id, "num_microbatches": e.plan.num_microbatches,
            "estimate_cupti_s": e.iter_time_s, "estimate_host_s": h.iter_time_s, "measured_s": m["iter_time_s"],
            "measured_samples_s": m["samples_s"],
            # where the step goes: the runtime's one stage run task by task (forward + backward of every
            # micro-batch and the update, each synchronised) against the estimate's B x micro-batch + optimizer
            "runtime_stage_busy_s": m["stage_busy_s"][0],
            "estimate_stage_busy_host_s": e.plan.num_microbatches * h.stages[0]["compute_s"] + h.stages[0]["optimizer_s"],
            "estimate_setup_host_s": h.iteration.setup_s,
            "error_cupti": e.iter_time_s / m["iter_time_s"] - 1.0, "error_host": h.iter_time_s / m["iter_time_s"] - 1.0,
            # the dispatch bound: the runtime's dispatching thread's CPU per step, and the estimates' (setup and
            # the issuing of every call); each estimate without the bound (the 1F1B composition alone)
            "measured_dispatch_cpu_s": m.get("dispatch_cpu_s"),
            "estimate_dispatch_host_s": h.iteration.dispatch_s, "estimate_dispatch_cupti_s": e.iteration.dispatch_s,
            "estimate_composed_host_s": h.iteration.composed_s, "estimate_composed_cupti_s": e.iteration.composed_s,
            "error_composed_host": h.iteration.composed_s / m["iter_time_s"] - 1.0,
            "error_composed_cupti": e.iteration.composed_s / m["iter_time_s"] - 1.0,
            # what CUPTI saw of each stage: kernel seconds per micro-batch (forward + backward) and optimizer step
            "stages": [{"units": st["units"], "micro_batch": st["micro_batch"], "cupti_kernel_s": st["compute_s"],
                        "cupti_optimizer_kernel_s": st["optimizer_s"], "host_s": hs["compute_s"], "host_optimizer_s": hs["optimizer_s"],
                        "host_dispatch_s": hs["dispatch_s"], "host_optimizer_dispatch_s": hs["optimizer_dispatch_s"]}
                       for st, hs in zip(e.stages, h.stages, strict=True)],
            "profiling_wall_s": {t: r[1] for t, r in results.items()},
            "measurement_wall_s": measure_wall,
        })
    return rows


def _child(out_path: str, time_budget_s: float = TIME_BUDGET_S) -> None:
    import jax

    from libarena.artifacts import write_json
    from libarena.profile import resolve_device

    started = time.perf_counter()
    local = resolve_device("local")
    if local.platform != "gpu":
        raise GpuCheckError(f"JAX sees no GPU after the install (its default device is {local.label})")
    _log(f"device {local.label}: {local.kind} (counts as {local.gpu_type}); jax {jax.__version__}")
    fixed = _fixed_computation()
    _log(f"fixed computation: cupti {fixed['cupti']['median_s'] * 1e3:.2f} ms, host {fixed['host']['median_s'] * 1e3:.2f} ms")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    machine = {"device": local.describe(), "jax": jax.__version__, "python": sys.version.split()[0],
               "xla_flags": os.environ.get("XLA_FLAGS", "")}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-child-") as tmp:
        for k, model in enumerate(MODELS):
            if time.perf_counter() - started > time_budget_s:
                skipped.append(model)
                continue
            model_rows = _model_rows(Path(tmp), model, local.gpu_type)
            for r in model_rows:
                _log(f"{model} {r['plan_id']}: estimate {r['estimate_cupti_s'] * 1e3:.2f} ms (cupti) / {r['estimate_host_s'] * 1e3:.2f} ms "
                     f"(host), measured {r['measured_s'] * 1e3:.2f} ms; dispatch CPU per step: estimate "
                     f"{r['estimate_dispatch_host_s'] * 1e3:.2f} ms, runtime {(r['measured_dispatch_cpu_s'] or 0.0) * 1e3:.2f} ms")
            rows += model_rows
            # after every model: a check stopped for overrunning still leaves the models it finished
            write_json(out_path, check_payload(rows, skipped, list(MODELS[k + 1:]), fixed, machine, time.perf_counter() - started))
    write_json(out_path, check_payload(rows, skipped, [], fixed, machine, time.perf_counter() - started))


def check_payload(rows: list[dict[str, Any]], skipped: list[str], pending: list[str], fixed: dict[str, Any],
                  machine: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """gpu.json's content once the models in ``rows`` are done (``pending``: not reached yet; a file written
    with some pending is what a stopped check leaves: the parent lists them as not done)."""
    summary = {
        "plans": len(rows),
        # each estimate's mean absolute error, with the dispatch bound and without it (the composition alone)
        **{f"mae_{error}": statistics.fmean(abs(r[f"error_{error}"]) for r in rows) if rows else None
           for error in ("cupti", "host", "composed_cupti", "composed_host")},
        "models_skipped_for_time": skipped,
        "models_not_reached": pending,
        "wall_s": wall_s,
    }
    return {
        "benchmark": "CUPTI and host timers; disaggregated estimate vs direct measurement of every 1-GPU plan of the tiny and small models",
        "summary": summary, "fixed_computation": fixed, "plans": rows,
        "setup": {"models": list(MODELS), "global_batch": GLOBAL_BATCH, "clusters": NUM_CLUSTERS, "warmup": WARMUP, "repeats": REPEATS},
        "machine": machine,
    }

if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], float(sys.argv[3]))
    else:
        import argparse

        parser = argparse.ArgumentParser(description="GPU validation (python -m bench gpu runs it with the defaults)")
        parser.add_argument("--time-budget", type=float, default=TIME_BUDGET_S,
                            help="seconds for the models (the rest are skipped and listed once it is spent)")
        parser.add_argument("--results", default=str(Path(__file__).resolve().parent / "results"))
        parser.add_argument("--autotune-level", type=int, choices=range(5), default=AUTOTUNE_LEVEL,
                            help=f"XLA's GPU kernel autotuning level for the check's compilations (default {AUTOTUNE_LEVEL}; 4 is XLA's own)")
        args = parser.parse_args()
        out = Path(args.results)
        try:
            ok = run(out, args.time_budget, args.autotune_level)
        except GpuCheckError as exc:
            print(exc, file=sys.stderr)
            raise SystemExit(2) from None
        raise SystemExit(0 if ok else 1)
