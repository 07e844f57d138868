"""Shared helpers for the live scheduler's tests: a small heterogeneous cluster, a synthetic perf table, a
small trace, and the simulator's decisions on it."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from libarena.hardware import load_cluster
from libarena.schedule.api import make_policy
from libarena.schedule.config import OverheadConfig, SimulatorConfig
from libarena.schedule.entities import JobSpec
from libarena.schedule.perf import load_perf
from libarena.schedule.simulator import Simulator
from tests.schedule.perf_fixtures import write_perf

MODELS = [("gpt__760M", 128), ("bert__1.3B", 128), ("moe__1.3B", 128), ("wide_resnet__1B", 128)]
#: smaller than the paper's so a run is a few ticks: launches, scale-ups, scale-downs and migrations all happen
OVERHEADS = OverheadConfig(grid_profiling_s=120.0, full_profiling_s=300.0, bootstrap_profiling_s=60.0,
                           pruned_ap_search_s=30.0, full_ap_search_s=150.0, checkpoint_resume_s=60.0)


def write_inputs(tmp: Path, nodes: int = 2) -> tuple[Path, Path]:
    cluster = tmp / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "live-test", "node_groups": [
        {"gpu_type": "a100", "nodes": nodes, "gpus_per_node": 4},
        {"gpu_type": "v100", "nodes": nodes, "gpus_per_node": 4}]}))
    perf = tmp / "perf.parquet"
    write_perf(perf, MODELS, ["a100", "v100"], max_gpus=16)
    return cluster, perf


def small_trace(n: int = 10, seed: int = 3) -> list[JobSpec]:
    import random

    rng = random.Random(seed)
    out = []
    t = 0.0
    for i in range(n):
        model, batch = MODELS[rng.randrange(len(MODELS))]
        out.append(JobSpec(f"j{i}", i + 1, t, model, batch, rng.randrange(1500, 12000), rng.choice([1, 2, 4]),
                           rng.choice(["a100", "v100"]), None, rng.randint(1, 3)))
        t += rng.choice([0.0, 100.0, 250.0, 400.0])
    return out


def simulate(specs: list[JobSpec], cluster: Path, perf: Path, policy: str = "arena", tick_s: float = 300.0,
             start_s: float | None = None):
    spec = load_cluster(cluster)
    sim = Simulator(specs, load_perf(perf, spec), spec, make_policy(policy),
                    SimulatorConfig(tick_s=tick_s, overheads=OVERHEADS, start_s=start_s))
    return sim.run()


def sim_decisions(res) -> list[tuple]:
    d = res.decisions
    ids = [j.spec.job_id for j in res.jobs]
    return [(round(d["time"][i] - res.start_time, 6), ids[d["job_index"][i]], d["action"][i], d["gpu_type"][i], d["num_gpus"][i])
            for i in range(len(d["time"]))]


def live_decisions(store) -> list[tuple]:
    out = []
    for e in store.log_of(None):
        if e["kind"] in ("launch", "rescale", "migrate", "finish", "drop"):
            det = e["detail"]
            out.append((round(e["time"], 6), e["job_id"], e["kind"], det.get("gpu_type", ""), det.get("num_gpus", 0)))
    return out


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def write_perf_for(out: str, model: str, batch: int) -> None:
    """What the test's profile-on-arrival script writes: the synthetic table for one (model, batch)."""
    write_perf(out, [(model, int(batch))], ["a100", "v100"], max_gpus=16)


def wait_until(pred, timeout: float = 30.0) -> None:
    """Poll ``pred`` every 50 ms until it holds; AssertionError after ``timeout`` seconds."""
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


@dataclass
class SetClock:
    """Scheduler time as the test sets it (a submission arrives at the time it is ingested)."""

    t: float = 0.0
    compression: float = 1.0

    def now(self) -> float:
        return self.t

    def at(self, wall: float) -> float:
        return self.t

    def wall_of(self, virtual: float) -> float:
        return virtual
