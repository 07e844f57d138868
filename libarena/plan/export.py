"""Export a plan for other runtimes.

``alpa``: Alpa's manual stage option (``alpa.ManualStageOption``), as JSON::

    {
      "format": "alpa.ManualStageOption", "format_version": 1,
      "plan_id": ..., "model": ..., "global_batch": ..., "gpu_type": ..., "num_gpus": ..., "num_nodes": ...,
      "num_micro_batches": B,
      "layer_num": O,                         # one Alpa pipeline layer per Arena cluster
      "layers": [{"index": i, "units": [model units of cluster i]}, ...],
      "remat_layer": false,                   # activation recomputation of every layer (Alpa's is all or none:
                                              # a plan recomputing in some stages only cannot be exported)
      "stage_option": {
        "forward_stage_layer_ids": [[0, 1, 2], [3, 4], ...],     # layer ids of each forward stage
        "submesh_physical_shapes": [[hosts, gpus_per_host], ...],# (1, c) inside a node, (c/g, g) across nodes
        "submesh_logical_shapes": [[dp, tp], ...],               # mesh axis 0 = data, axis 1 = tensor
        "submesh_autosharding_option_dicts": [{...}, ...]         # force_batch_dim_to_mesh_dim: 0 when dp > 1,
                                                                   # prefer_reduce_scatter: true under ZeRO-1
      }
    }

Use it with Alpa as::

    spec = json.load(open("alpa.json"))
    method = alpa.PipeshardParallel(
        num_micro_batches=spec["num_micro_batches"],
        layer_option=alpa.AutoLayerOption(layer_num=spec["layer_num"], remat_layer=spec["remat_layer"]),
        stage_option=alpa.ManualStageOption(**spec["stage_option"]))

Alpa's automatic layer construction balances FLOPs, not Arena's clusters; for an exact match mark a
pipeline boundary (``alpa.mark_pipeline_boundary()``) after the last unit of each entry of ``layers``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from libarena.errors import ArenaError
from libarena.plan.frontier import choose_proxy
from libarena.plan.types import ParallelPlan, PlanSet

EXPORT_FORMATS = ("alpa",)


def alpa_stage_option(plan: ParallelPlan) -> dict[str, Any]:
    g = plan.grid.gpus_per_node
    physical, logical, options = [], [], []
    for st in plan.stages:
        physical.append([1, st.num_gpus] if st.num_gpus <= g else [st.num_gpus // g, g])
        logical.append([st.dp, st.tp])
        opt: dict[str, Any] = {}
        if st.dp > 1:
            opt["force_batch_dim_to_mesh_dim"] = 0
        if st.zero:
            opt["prefer_reduce_scatter"] = True
        options.append(opt)
    return {
        "forward_stage_layer_ids": [list(st.clusters) for st in plan.stages],
        "submesh_physical_shapes": physical,
        "submesh_logical_shapes": logical,
        "submesh_autosharding_option_dicts": options,
    }


def alpa_expressible(plan: ParallelPlan) -> bool:
    """Alpa's remat_layer is all or none: a plan recomputing activations in some stages only has no equivalent."""
    return not plan.recomputes or all(st.remat for st in plan.stages)


def export_alpa(planset: PlanSet, plan: ParallelPlan) -> dict[str, Any]:
    if not alpa_expressible(plan):
        raise ArenaError(f"plan {plan.plan_id} recomputes activations in some stages only ({plan.remat_per_stage}); "
                         "Alpa's remat_layer applies to every layer, so this plan has no Alpa equivalent")
    return {
        "format": "alpa.ManualStageOption",
        "format_version": 1,
        "plan_id": plan.plan_id,
        "model": planset.model_name,
        "global_batch": plan.grid.global_batch,
        "gpu_type": plan.grid.gpu_type,
        "num_gpus": plan.grid.num_gpus,
        "num_nodes": plan.grid.num_nodes,
        "num_micro_batches": plan.num_microbatches,
        "layer_num": len(planset.clusters),
        "layers": [{"index": int(c.get("index", i)), "units": list(c.get("units", []))} for i, c in enumerate(planset.clusters)],
        # alpa.ManualLayerOption(remat_layer=...): activation recomputation of every layer
        "remat_layer": plan.recomputes,
        "stage_option": alpa_stage_option(plan),
    }


EXPRESSIBLE = {"alpa": alpa_expressible}


def select_for_export(planset: PlanSet, fmt: str, plan_id: str | None = None, gpu_type: str | None = None,
                      num_gpus: int | None = None, stages: int | None = None) -> tuple[ParallelPlan, str | None]:
    """The plan to export and, where it is not the proxy, why: the plan named by ``plan_id`` (exported as is,
    or refused), else the proxy of the one grid matching the filters, or, where the format cannot express the
    proxy, the frontier plan of that grid the proxy rule ranks first among those it can (none: the proxy with
    recomputation in every stage)."""
    plan = select_proxy(planset, plan_id, gpu_type, num_gpus, stages)
    expressible = EXPRESSIBLE.get(fmt, lambda p: True)
    if plan_id or expressible(plan):
        return plan, None
    grid = next(g for g in planset.grids if g.proxy is plan)
    candidates = [p for p in grid.frontier if expressible(p)]
    if not candidates:
        # the nearest plan the format can run: the proxy recomputing in every stage (less memory, one more
        # forward pass in the stages that kept their activations)
        everywhere = dataclasses.replace(plan, plan_id=f"{plan.plan_id}-remat", is_proxy=False,
                                         stages=tuple(dataclasses.replace(st, remat=True) for st in plan.stages))
        return everywhere, (f"the proxy {plan.plan_id} recomputes activations in some stages only "
                            f"({plan.remat_per_stage}), which {fmt} cannot express, and no other frontier plan of "
                            f"its grid can be: exporting it with recomputation in every stage ({everywhere.plan_id})")
    chosen = candidates[choose_proxy(np.array([p.computation_bias for p in candidates]),
                                     np.array([p.communication_load for p in candidates]))]
    return chosen, (f"the proxy {plan.plan_id} recomputes activations in some stages only ({plan.remat_per_stage}), "
                    f"which {fmt} cannot express: exporting {chosen.plan_id}, the frontier plan the proxy rule ranks "
                    f"first among those it can")


def select_proxy(
    planset: PlanSet,
    plan_id: str | None = None,
    gpu_type: str | None = None,
    num_gpus: int | None = None,
    stages: int | None = None,
) -> ParallelPlan:
    """The plan named by ``plan_id``, else the one proxy plan matching the grid filters."""
    if plan_id:
        try:
            return planset.plan(plan_id)
        except KeyError:
            raise ArenaError(f"no plan with id {plan_id!r} in the plans file") from None
    matches = [
        p
        for p in planset.proxy_plans()
        if (gpu_type is None or p.grid.gpu_type == gpu_type)
        and (num_gpus is None or p.grid.num_gpus == num_gpus)
        and (stages is None or p.grid.pipeline_degree == stages)
    ]
    if not matches:
        raise ArenaError("no feasible proxy plan matches the selection (--gpu-type, --num-gpus, --stages)")
    if len(matches) > 1:
        raise ArenaError(
            f"{len(matches)} proxy plans match; pick one with --plan-id or narrow with --gpu-type, --num-gpus, --stages"
        )
    return matches[0]


def export_plan(planset: PlanSet, plan: ParallelPlan, fmt: str) -> dict[str, Any]:
    if fmt == "alpa":
        return export_alpa(planset, plan)
    raise ArenaError(f"unknown export format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
