"""Every parallel plan of small grids, built straight from a zoo model (no operator table needed).

The accuracy benchmark and the tests profile *every* plan of the 1- and 2-device grids of the tiny and
small models; this module enumerates them (stage partitions of the clusters, power-of-two GPU splits,
every dp x tp factorisation) as plans of the one plan type, and writes them as a ``plans`` artifact with a
``clusters`` metadata entry computed from the model's units (activation, TP all-reduce and all-to-all
volumes at the global batch). They carry no planner cost estimates (read them with
``read_plans(path, require_costs=False)``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from libarena.artifacts import Provenance
from libarena.models import get_model
from libarena.plan import (MICROBATCHES_PER_STAGE, Grid, GridResult, ParallelPlan, PlanSet, make_plan,
                           planned_microbatch_count, too_few_microbatches, write_plans)
from libarena.plan.partition import power_of_two_compositions


def model_clusters(model_name: str, global_batch: int, dtype: str = "fp32", num_clusters: int | None = None) -> list[dict[str, Any]]:
    """Contiguous groups of the model's units with communication volumes at the global batch."""
    import jax
    import numpy as np

    from libarena.models.training import abstract_params, batch_spec, compute_dtype, unit_outputs

    model = get_model(model_name)
    units = model.units
    n = len(units)
    k = min(num_clusters or n, n)
    # Balanced contiguous groups by unit count.
    edges = [round(i * n / k) for i in range(k + 1)]
    batch = batch_spec(model, global_batch)
    cdt = compute_dtype(dtype)
    params = abstract_params(model)
    sizes = [float(np.prod(out.shape) * np.dtype(out.dtype).itemsize) for out in unit_outputs(model, params, batch, cdt)]
    inputs = [0.0, *sizes[:-1]]  # a unit's input is the previous unit's output
    dispatch_bytes = model.expert_dispatch_bytes(global_batch, np.dtype(cdt).itemsize)
    records = []
    for c in range(k):
        members = range(edges[c], edges[c + 1])
        leaves = [leaf for i in members for leaf in jax.tree.leaves(params[i])]
        param_count = int(sum(np.prod(leaf.shape) for leaf in leaves))
        records.append(
            {
                "index": c,
                "units": [units[i].name for i in members],
                "num_ops": 0,
                "flops": 0.0,
                "bytes": 0.0,
                "optimizer_flops": 0.0,
                "optimizer_bytes": 0.0,
                "param_count": param_count,
                "param_bytes": 4.0 * param_count,
                "activation_bytes": sizes[edges[c + 1] - 1],
                "saved_activation_bytes": 0.0,
                # fwd + bwd, by the rules arena-analyze records (UnitSpec)
                "tp_allreduce_bytes": float(sum(model.tp_allreduce_bytes(i, inputs[i], sizes[i], global_batch,
                                                                         np.dtype(cdt).itemsize) for i in members)),
                "alltoall_bytes": float(sum(units[i].alltoall_bytes(dispatch_bytes) for i in members)),
            }
        )
    return records


def enumerate_grid_plans(
    model_name: str,
    global_batch: int,
    num_gpus: int,
    gpu_type: str,
    num_clusters: int,
    microbatches_per_stage: int = MICROBATCHES_PER_STAGE,
    max_stages: int | None = None,
) -> list[ParallelPlan]:
    """Every plan of one grid (one node of ``num_gpus`` GPUs) whose micro-batches split evenly over each stage's
    replicas (arena-plan's micro-batch count); the first is marked as the proxy."""
    plans = []
    max_stages = min(max_stages or num_gpus, num_gpus, num_clusters)
    for s in range(1, max_stages + 1):
        if too_few_microbatches(global_batch, s, microbatches_per_stage):
            continue  # too small a batch for the grid, as arena-plan judges it
        B = planned_microbatch_count(global_batch, s, microbatches_per_stage)
        grid = Grid(model_name, global_batch, gpu_type, num_gpus, 1, num_gpus, s)
        for cuts in itertools.combinations(range(1, num_clusters), s - 1):
            bounds = [0, *cuts]
            for gpus in power_of_two_compositions(num_gpus, s):
                options = [[(g // tp, tp) for tp in (2**i for i in range(int(math.log2(g)) + 1))] for g in gpus]
                for choice in itertools.product(*options):
                    dps = [d for d, _ in choice]
                    if any(global_batch % (B * d) for d in dps):
                        continue
                    plan_id = "s{}-b{}-g{}-{}".format(
                        s, ".".join(map(str, bounds)), ".".join(map(str, gpus)), ".".join(f"{d}x{t}" for d, t in choice)
                    )
                    plans.append(make_plan(grid, bounds, list(gpus), dps, [t for _, t in choice], None, B, num_clusters,
                                           plan_id, is_proxy=not plans))
    return plans


def write_plans_table(
    path: str,
    model_name: str,
    global_batch: int,
    plans: list[ParallelPlan],
    clusters: list[dict[str, Any]],
    dtype: str = "fp32",
    seq_len: int = 0,
) -> None:
    """A ``plans`` artifact of ``plans`` (one grid result per grid) with the metadata the profiler reads
    (model record, clusters, dtype)."""
    by_grid: dict[Any, list[ParallelPlan]] = {}
    for plan in plans:
        by_grid.setdefault(plan.grid, []).append(plan)
    grids = [GridResult(grid, tuple(group), group[0].num_microbatches, len(group), 0) for grid, group in by_grid.items()]
    planset = PlanSet(
        model=get_model(model_name).describe(),
        global_batch=global_batch,
        seq_len=seq_len,
        dtype=dtype,
        cluster_name="local",
        operator_table_sha256="",
        clusters=clusters,
        grids=grids,
        planner={"source": "libarena.profile.local_plans (every plan of the grid)"},
    )
    write_plans(path, planset, Provenance("arena-profile", {"enumerated": True}))
