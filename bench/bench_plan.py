"""arena-plan speed: all grids of one job on the paper's 1,280-GPU cluster (target <= 2 s) and the whole
14-model zoo x 3 global batch sizes (target <= 60 s). Writes bench/results/plan.json.

Inputs are real operator tables from ``libarena.analyze`` (JAX lowering of the zoo models); analysis time
is excluded from the timings (it is arena-analyze's cost, measured by its own benchmark); the tables come from
the content-addressed cache that ``arena-schedule perf build`` shares (.arena-cache/), analyzed when missing.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from libarena.artifacts import write_json

REPO = Path(__file__).resolve().parents[1]
PAPER_CLUSTER = REPO / "examples" / "clusters" / "paper-sim-1280.yaml"

#: The paper's Table 2 (GPT-3, GShard MoE, Wide-ResNet; 14 sizes) with each family's global batch sizes.
ZOO_BATCHES = {"gpt": (128, 256, 512), "moe": (256, 512, 1024), "wide_resnet": (256, 512, 1024)}
ONE_JOB = ("moe__2.4B", 256)
ONE_JOB_TARGET_S = 2.0
ZOO_TARGET_S = 60.0


def _zoo_jobs() -> list[tuple[str, int]]:
    from libarena.models import list_models

    jobs = []
    for entry in list_models(include_test_sizes=False):
        for batch in ZOO_BATCHES.get(entry.family, ()):
            jobs.append((entry.name, batch))
    return jobs


def run(results_dir: Path) -> bool:
    from libarena.analyze import AnalyzeConfig
    from libarena.hardware import load_cluster
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.analyze import operator_table
    from libarena.plan import PlannerConfig, load_model_profile, plan_job

    from bench.paper_inputs import machine_record

    load_before = os.getloadavg()
    cluster = load_cluster(PAPER_CLUSTER)
    config = PlannerConfig()

    def timed_plan(model: str, batch: int) -> dict[str, Any]:
        profile = load_model_profile(operator_table(AnalyzeConfig(model, batch), CacheSettings()))
        start = time.perf_counter()
        planset = plan_job(profile, cluster, config)
        wall = time.perf_counter() - start
        return {
            "model": model,
            "global_batch": batch,
            "num_clusters": profile.num_clusters,
            "grids": len(planset.grids),
            "feasible_grids": sum(g.feasible for g in planset.grids),
            "frontier_plans": sum(len(g.plans) for g in planset.grids),
            "plans_considered": sum(g.plans_considered for g in planset.grids),
            "wall_s": wall,
        }

    model, batch = ONE_JOB
    one = [timed_plan(model, batch) for _ in range(3)]
    one_job = dict(one[0], wall_s_runs=[r["wall_s"] for r in one], wall_s=max(r["wall_s"] for r in one))

    zoo = [timed_plan(m, b) for m, b in _zoo_jobs()]
    zoo_total = sum(r["wall_s"] for r in zoo)
    ok_one = one_job["wall_s"] <= ONE_JOB_TARGET_S
    ok_zoo = zoo_total <= ZOO_TARGET_S and len(zoo) == 42
    write_json(
        results_dir / "plan.json",
        {
            "status": "ok" if ok_one and ok_zoo else "target missed",
            "cluster": cluster.name,
            "max_gpus": config.max_gpus,
            "one_job": one_job,
            "one_job_target_s": ONE_JOB_TARGET_S,
            "zoo_jobs": len(zoo),
            "zoo_total_wall_s": zoo_total,
            "zoo_target_s": ZOO_TARGET_S,
            "zoo": zoo,
            "machine": machine_record(load_before),
        },
    )
    print(
        f"bench_plan: one job ({model}, batch {batch}): {one_job['wall_s']:.2f} s (target {ONE_JOB_TARGET_S} s); "
        f"zoo {len(zoo)} jobs: {zoo_total:.1f} s (target {ZOO_TARGET_S} s)",
        file=sys.stderr,
    )
    return ok_one and ok_zoo
