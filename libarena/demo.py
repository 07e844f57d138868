"""``make demo``: the whole pipeline on an embedded default workload, as a user would type it.

1. arena-analyze a paper-size model (moe__690M, global batch 256) into an HLO operator table;
2. arena-plan it on the paper's Cluster-A (16 x 2 A40 + 16 x 2 A10): grids, Pareto frontiers, proxy plans;
3. arena-schedule perf build: the performance table for every (model, batch) of a small embedded trace;
4. arena-schedule compare: Arena against FCFS, ElasticFlow-LS, Gavel and Sia on that trace, with plots.

Everything lands in ``--out`` (default demo-out/); the operator tables are cached in .arena-cache/, so a second
run takes seconds. Runs in a few minutes on a laptop CPU.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

from libarena.hardware import cluster_from_dict

CLUSTER_A = {"name": "cluster-a", "node_groups": [
    {"gpu_type": "a40", "nodes": 16, "gpus_per_node": 2},
    {"gpu_type": "a10", "nodes": 16, "gpus_per_node": 2},
]}
#: (model, global batch) pairs of the embedded trace: paper sizes that fit Cluster-A's 24-48 GB GPUs.
DEMO_JOBS = (("bert__760M", 128), ("bert__760M", 256), ("moe__690M", 256), ("moe__1.3B", 256), ("wide_resnet__500M", 256))


def demo_trace(path: Path, num_jobs: int = 40, seed: int = 7) -> None:
    """An arena-ae format trace: Poisson arrivals (one every 5 minutes on average) of the DEMO_JOBS."""
    rng = np.random.default_rng(seed)
    t = 0.0
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu", "gpu_type"])
        for i in range(num_jobs):
            t += rng.exponential(300.0)
            model, batch = DEMO_JOBS[int(rng.integers(len(DEMO_JOBS)))]
            iterations = int(rng.integers(300, 1500))
            gpus = int(2 ** rng.integers(0, 4))
            gpu_type = ("a40", "a10")[int(rng.integers(2))]
            writer.writerow([f"demo-{i:03d}", int(t), iterations, model, int(t + 6 * 3600), batch, gpus, gpu_type])


def run(command: list[str]) -> None:
    print(f"\n$ {shlex.join(command)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = subprocess.run(command)
    if done.returncode != 0:
        raise SystemExit(f"demo: step failed with exit code {done.returncode}: {shlex.join(command)}")
    print(f"  ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="demo-out", help="output directory")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    tool = lambda name: str(bin_dir / name)  # noqa: E731 - the console scripts of this environment

    cluster_path = out / "cluster-a.yaml"
    cluster_path.write_text(yaml.safe_dump(cluster_from_dict(CLUSTER_A).to_dict(), sort_keys=False))
    trace_path = out / "trace.csv"
    demo_trace(trace_path)

    run([tool("arena-analyze"), "--model", "moe__690M", "--global-batch", "256", "-o", str(out / "ops.parquet")])
    run([tool("arena-analyze"), "show", str(out / "ops.parquet"), "--top", "8"])
    run([tool("arena-plan"), "--ops", str(out / "ops.parquet"), "--cluster", str(cluster_path), "-o", str(out / "plans.parquet")])
    run([tool("arena-plan"), "show", str(out / "plans.parquet"), "--proxies"])
    run([tool("arena-schedule"), "trace", "stats", str(trace_path)])
    run([tool("arena-schedule"), "perf", "build", "--trace", str(trace_path), "--cluster", str(cluster_path),
         "-o", str(out / "perf.parquet"), "--mode", "roofline"])
    run([tool("arena-schedule"), "compare", "--policies", "arena,fcfs,elasticflow-ls,gavel,sia", "--trace", str(trace_path),
         "--perf", str(out / "perf.parquet"), "--cluster", str(cluster_path), "-o", str(out / "compare"), "--plot"])
    print(f"\ndemo: outputs in {out}/ (compare/compare.json, compare/*.png, perf.parquet, plans.parquet, ops.parquet)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
