"""Fixtures of the runtime's tests: subprocesses with N host devices, a real plans file for gpt__tiny."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def device_env(num_devices: int) -> dict[str, str]:
    env = dict(os.environ)
    # Unoptimised XLA backend code: the tests check numerics, not speed, and compile several times faster.
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={num_devices} --xla_backend_optimization_level=0"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_worker(module: str, args: list[str], num_devices: int, timeout: float = 600) -> list[dict]:
    """Run ``python -m module args`` from the repository root with ``num_devices`` host devices; returns
    the JSON lines it printed."""
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=device_env(num_devices), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def make_plans(model: str, global_batch: int, root: Path, dtype: str = "fp32") -> Path:
    """arena-analyze + arena-plan (their libraries) for ``model`` on one 8-GPU A100 node, priced in ``dtype``."""
    from libarena.analyze.api import analyze_model
    from libarena.artifacts import Provenance, read_table
    from libarena.hardware import load_cluster
    from libarena.plan import PlannerConfig, plan_job, write_plans

    cluster_path = root / "local.yaml"
    cluster_path.write_text("name: local-a100\nnode_groups:\n  - {gpu_type: a100, nodes: 1, gpus_per_node: 8}\n")
    ops_path = root / f"{model}.{dtype}.ops.parquet"
    analyze_model(model, global_batch, dtype=dtype, num_clusters=6).write(ops_path)
    planset = plan_job(read_table(ops_path, "operator_table"), load_cluster(cluster_path), PlannerConfig(max_gpus=8))
    out = root / (f"{model}.plans.parquet" if dtype == "fp32" else f"{model}.{dtype}.plans.parquet")
    write_plans(out, planset, Provenance(tool="tests/run", parameters={"model": model}))
    return out


@pytest.fixture(scope="session")
def gpt_tiny_plans(tmp_path_factory) -> Path:
    """gpt__tiny's plans at global batch 8."""
    return make_plans("gpt__tiny", 8, tmp_path_factory.mktemp("plans"))
