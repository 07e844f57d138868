"""``make demo``: the paper's experiment (examples/paper/Makefile) on a small embedded workload.

The same Make pipeline as ``make reproduce``, with a configuration that runs in a few minutes on a laptop and
needs no downloaded trace:

1. an embedded 40-job trace in the Arena artifact's format (Poisson arrivals of paper-size models that fit the
   24-48 GB GPUs of the paper's Cluster-A: 16 x 2 A40 + 16 x 2 A10), written to ``OUT/traces/``;
2. arena-analyze and arena-plan of one model (moe__690M at global batch 256) step by step (``OUT/model/``);
3. arena-schedule perf build: the performance table for every (model, batch) of the trace (``OUT/demo/``);
4. arena-schedule sweep: Arena, FCFS, Gavel, ElasticFlow, ElasticFlow-LS and Sia on it (Ray tasks), with plots;
5. the report: ``OUT/results.md``, ``results.json``, ``summary.png``.

Operator tables are cached in .arena-cache/ and Make redoes only what changed, so a second run takes seconds.
The embedded trace's iteration counts are its real ones and every job runs to completion (ITERATION_DIVISOR=1,
HORIZON empty). Extra ``NAME=VALUE`` arguments go to make (e.g. ``POLICIES=arena,fcfs``).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from libarena.errors import ArenaError

#: the repository root (examples/ is not part of the installed package: the demo runs from a checkout)
REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_MAKEFILE = REPO_ROOT / "examples" / "paper" / "Makefile"
DEMO_CLUSTER = REPO_ROOT / "examples" / "clusters" / "cluster-a.yaml"
DEMO_TRACE_NAME = "demo"
#: (model, global batch) pairs of the embedded trace: paper sizes that fit Cluster-A's 24-48 GB GPUs.
DEMO_JOBS = (("bert__760M", 128), ("bert__760M", 256), ("moe__690M", 256), ("moe__1.3B", 256), ("wide_resnet__500M", 256))
#: the arena-ae trace columns (libarena.schedule.traces.FORMATS, which the demo layer may not import)
TRACE_COLUMNS = ("job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu", "gpu_type")


def demo_trace_text(num_jobs: int = 40, seed: int = 7) -> str:
    """An arena-ae format trace: Poisson arrivals (one every 5 minutes on average) of the DEMO_JOBS."""
    rng = np.random.default_rng(seed)
    t = 0.0
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(TRACE_COLUMNS)
    for i in range(num_jobs):
        t += rng.exponential(300.0)
        model, batch = DEMO_JOBS[int(rng.integers(len(DEMO_JOBS)))]
        iterations = int(rng.integers(300, 1500))
        gpus = int(2 ** rng.integers(0, 4))
        gpu_type = ("a40", "a10")[int(rng.integers(2))]
        writer.writerow([f"demo-{i:03d}", int(t), iterations, model, int(t + 6 * 3600), batch, gpus, gpu_type])
    return buf.getvalue()


def write_if_changed(path: Path, text: str) -> None:
    """Leave an identical file untouched, so Make sees nothing new and re-runs are no-ops."""
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def make_command(out: Path, bin_dir: Path, extra: list[str]) -> list[str]:
    make = shutil.which("make")
    if make is None:
        raise ArenaError("the demo runs examples/paper/Makefile and needs GNU make on PATH")
    if not EXAMPLE_MAKEFILE.is_file():
        raise ArenaError(f"{EXAMPLE_MAKEFILE} not found: run the demo from a checkout of the Arena repository")
    return [make, "--no-print-directory", "-C", str(EXAMPLE_MAKEFILE.parent), f"BIN={bin_dir}",
            f"OUT={out}", f"TRACES_DIR={out / 'traces'}", f"TRACES={DEMO_TRACE_NAME}", f"CLUSTER={DEMO_CLUSTER}",
            "MODEL=moe__690M", "MODEL_BATCH=256", "ITERATION_DIVISOR=1", "HORIZON=", *extra]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo-out", help="output directory")
    parser.add_argument("make_args", nargs="*", metavar="NAME=VALUE", help="extra variables for examples/paper/Makefile")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    try:
        write_if_changed(out / "traces" / f"simulate_trace_{DEMO_TRACE_NAME}.csv", demo_trace_text())
        command = make_command(out, Path(sys.executable).parent, args.make_args)
    except ArenaError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    print(f"$ {shlex.join(command)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = subprocess.run(command)
    if done.returncode != 0:
        print(f"demo: the pipeline failed (make exit code {done.returncode})", file=sys.stderr)
        return done.returncode
    print(f"\ndemo: done in {time.perf_counter() - start:.0f} s; outputs in {out}/ (results.md, summary.png, "
          f"{DEMO_TRACE_NAME}/compare/*.png, {DEMO_TRACE_NAME}/perf.parquet, model/)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
