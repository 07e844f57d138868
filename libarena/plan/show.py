"""Human (rich) and script (JSON) views of a plans artifact."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from libarena.plan.io import plan_columns
from libarena.plan.types import GridResult, ParallelPlan, PlanSet

GIB = 1024**3


def _finite(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def plan_dict(plan: ParallelPlan) -> dict[str, Any]:
    return plan_columns(plan)


def grid_dict(result: GridResult) -> dict[str, Any]:
    g = result.grid
    return {
        "gpu_type": g.gpu_type,
        "num_gpus": g.num_gpus,
        "num_nodes": g.num_nodes,
        "gpus_per_node": g.gpus_per_node,
        "pipeline_degree": g.pipeline_degree,
        "feasible": result.feasible,
        "infeasible_reason": result.infeasible_reason,
        "plans_considered": result.plans_considered,
        "plans_out_of_memory": result.plans_out_of_memory,
        "min_memory_bytes": _finite(result.min_memory_bytes),
        "comm_model": result.comm_model,
        "proxy_plan_id": result.proxy.plan_id if result.proxy else None,
        "plans": [plan_dict(p) for p in result.plans],
    }


def planset_dict(planset: PlanSet, proxies_only: bool = False) -> dict[str, Any]:
    grids = []
    for r in planset.grids:
        d = grid_dict(r)
        if proxies_only:
            d["plans"] = [p for p in d["plans"] if p["is_proxy"]]
        grids.append(d)
    return {
        "model": planset.model,
        "global_batch": planset.global_batch,
        "cluster": planset.cluster_name,
        "operator_table_sha256": planset.operator_table_sha256,
        "num_clusters": len(planset.clusters),
        "comm_model": planset.comm_model,
        "grids": grids,
    }


def _intra(plan: ParallelPlan) -> str:
    parts = []
    for st in plan.stages:
        parts.append(f"{st.dp}x{st.tp}{'z' if st.zero else ''}{'r' if st.remat else ''}")
    return " ".join(parts)


def render(planset: PlanSet, console: Console, proxies_only: bool = False) -> None:
    console.print(
        f"[bold]{planset.model_name}[/bold]  global batch {planset.global_batch}  cluster {planset.cluster_name}  "
        f"O={len(planset.clusters)}  comm: {planset.comm_model or 'alpha-beta'}"
    )
    table = Table(show_lines=False, header_style="bold")
    for col in ("grid", "plan", "stages (first cluster)", "GPUs/stage", "dp x tp", "b_comp", "l_comm ms", "mem GiB", ""):
        table.add_column(col, overflow="fold")
    feasible = sum(r.feasible for r in planset.grids)
    for result in planset.grids:
        g = result.grid
        label = f"{g.gpu_type} x{g.num_gpus} ({g.num_nodes}n) s={g.pipeline_degree}"
        if not result.feasible:
            table.add_row(label, "[red]infeasible[/red]", result.infeasible_reason, "", "", "", "", "", "")
            continue
        plans = [p for p in result.plans if p.is_proxy] if proxies_only else list(result.plans)
        for i, plan in enumerate(plans):
            table.add_row(
                label if i == 0 else "",
                plan.plan_id.rsplit("-", 1)[-1],
                " ".join(str(b) for b in plan.stage_boundaries),
                " ".join(str(c) for c in plan.gpus_per_stage),
                _intra(plan),
                f"{plan.computation_bias:.3f}",
                f"{plan.communication_load * 1e3:.2f}",
                f"{plan.memory_per_gpu_bytes / GIB:.1f}",
                "[green]proxy[/green]" if plan.is_proxy else ("" if plan.on_frontier else "[dim]off-frontier[/dim]"),
            )
    console.print(table)
    console.print(f"{feasible} of {len(planset.grids)} grids feasible; 'z' = ZeRO-1 optimizer sharding")
