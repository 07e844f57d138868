"""Every parallel plan of small grids, built straight from a zoo model (no operator table needed).

The accuracy benchmark and the tests profile *every* plan of the 1- and 2-device grids of the tiny and
small models; this module enumerates them (stage partitions of the clusters, power-of-two GPU splits,
every dp x tp factorisation) and writes them as a ``plans`` artifact of the same shape arena-plan
produces, with a ``clusters`` metadata entry computed from the model's units (activation, TP all-reduce
and all-to-all volumes at the global batch).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from libarena.artifacts import Provenance, write_table
from libarena.models import get_model


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
                # fwd + bwd: each all-reduce of a unit's output activation happens once each way
                "tp_allreduce_bytes": float(sum(2 * units[i].tp_allreduces * sizes[i] for i in members)),
                "alltoall_bytes": float(sum(2 * units[i].alltoalls * sizes[i] for i in members)),
            }
        )
    return records


def _powers_of_two_splits(total: int, parts: int) -> list[tuple[int, ...]]:
    powers = [2**i for i in range(int(math.log2(total)) + 1)]
    return [combo for combo in itertools.product(powers, repeat=parts) if sum(combo) == total]


def enumerate_grid_plans(
    model_name: str,
    global_batch: int,
    num_gpus: int,
    gpu_type: str,
    num_clusters: int,
    microbatches_per_stage: int = 4,
    max_stages: int | None = None,
) -> list[dict[str, Any]]:
    """Rows (plans kind) of every plan of one grid whose micro-batches split evenly."""
    rows = []
    max_stages = min(max_stages or num_gpus, num_gpus, num_clusters)
    for s in range(1, max_stages + 1):
        B = microbatches_per_stage * s
        for cuts in itertools.combinations(range(1, num_clusters), s - 1):
            bounds = [0, *cuts]
            for gpus in _powers_of_two_splits(num_gpus, s):
                options = [[(g // tp, tp) for tp in (2**i for i in range(int(math.log2(g)) + 1))] for g in gpus]
                for choice in itertools.product(*options):
                    dps = [d for d, _ in choice]
                    if any(global_batch % (B * d) for d in dps):
                        continue
                    offsets = list(itertools.accumulate([0, *gpus[:-1]]))
                    plan_id = "s{}-b{}-g{}-{}".format(
                        s, ".".join(map(str, bounds)), ".".join(map(str, gpus)), ".".join(f"{d}x{t}" for d, t in choice)
                    )
                    rows.append(
                        {
                            "model": model_name,
                            "global_batch": global_batch,
                            "gpu_type": gpu_type,
                            "num_gpus": num_gpus,
                            "num_nodes": 1,
                            "pipeline_degree": s,
                            "plan_id": plan_id,
                            "feasible": True,
                            "infeasible_reason": "",
                            "num_microbatches": B,
                            "stage_boundaries": bounds,
                            "gpus_per_stage": list(gpus),
                            "dp_per_stage": dps,
                            "tp_per_stage": [t for _, t in choice],
                            "zero_per_stage": [0] * s,
                            "is_proxy": False,
                            "gpus_per_node": num_gpus,
                            "stage_gpu_offsets": offsets,
                            "on_frontier": True,
                        }
                    )
    if rows:
        rows[0]["is_proxy"] = True
    return rows


def write_plans_table(
    path: str,
    model_name: str,
    global_batch: int,
    rows: list[dict[str, Any]],
    clusters: list[dict[str, Any]],
    dtype: str = "fp32",
    seq_len: int = 0,
) -> None:
    """A ``plans`` artifact with the metadata the profiler reads (model record, clusters, dtype)."""
    import pyarrow as pa

    from libarena.artifacts.registry import get_kind

    kind = get_kind("plans")
    full = [{c.name: r.get(c.name) for c in kind.columns} for r in rows]
    table = pa.Table.from_pylist(full, schema=kind.arrow_schema())
    model = get_model(model_name)
    metadata = {
        "model": model.describe(),
        "operator_table_sha256": "",
        "cluster": "local",
        "clusters": clusters,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "dtype": dtype,
        "planner": {"source": "libarena.profile.local_plans (every plan of the grid)"},
        "comm_model": "",
    }
    write_table(path, "plans", table, Provenance("arena-profile", {"enumerated": True}), metadata)
