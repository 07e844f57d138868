"""arena-plan: operator table -> per-grid Pareto frontiers and proxy plans (thin CLI over libarena.plan).

    arena-analyze --model moe__2.4B --global-batch 256 -o - | arena-plan --cluster c.yaml -o plans.parquet
    arena-plan ... -o plans.parquet [--quiet] [--json] [--no-cache] [--cache-dir .arena-cache]
    arena-plan show plans.parquet [--json] [--proxies]
    arena-plan export plans.parquet --format alpa --gpu-type a100 --num-gpus 16 --stages 4 -o alpa.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from libarena.artifacts import Provenance, input_ref, read_table, write_bytes
from libarena.cli import (
    CACHE_DIR_OPTION, JSON_OPTION, NO_CACHE_OPTION, QUIET_OPTION, Reporter,
    print_json, refuse_json_with_stdout_data, run_app,
)
from libarena.errors import ArenaError

app = typer.Typer(
    add_completion=False,
    help="Plan a job on a cluster: grids, load-aware stage partitions, Pareto frontiers and proxy plans.",
)


def _refuse_binary_to_terminal(output: str) -> None:
    if output == "-" and sys.stdout.isatty():
        raise ArenaError("refusing to write an Arrow stream to a terminal: use -o FILE or pipe the output")


@app.callback(invoke_without_command=True)
def plan(
    ctx: typer.Context,
    ops: str = typer.Option("-", "--ops", "-i", help="operator table (Parquet, or '-' for an Arrow stream on stdin)"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", "-c", help="cluster spec (YAML or TOML)"),
    output: str = typer.Option("-", "--output", "-o", help="plans file (Parquet), '-' = Arrow stream on stdout"),
    max_gpus: int = typer.Option(16, "--max-gpus", help="largest GPU count of a grid (powers of two up to it)"),
    gpu_type: Optional[list[str]] = typer.Option(None, "--gpu-type", help="only these GPU types (repeatable)"),
    num_gpus: Optional[list[int]] = typer.Option(None, "--num-gpus", help="only these GPU counts (repeatable)"),
    stages: Optional[list[int]] = typer.Option(None, "--stages", help="only these pipeline degrees (repeatable)"),
    microbatches_per_stage: int = typer.Option(4, "--microbatches-per-stage", help="B = this x s (the paper: 4)"),
    num_microbatches: Optional[int] = typer.Option(None, "--num-microbatches", help="fix B instead"),
    frontier_cap: int = typer.Option(8, "--frontier-cap", help="most frontier plans kept per grid (0 = all)"),
    memory_fraction: float = typer.Option(0.9, "--memory-fraction", help="fraction of GPU memory plans may use"),
    no_zero: bool = typer.Option(False, "--no-zero", help="do not consider ZeRO-1 optimizer sharding"),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="enumerate every plan of every grid (reference)"),
    exhaustive_limit: int = typer.Option(2_000_000, "--exhaustive-limit", help="refuse larger exhaustive grids"),
    comm: Optional[Path] = typer.Option(None, "--comm", help="measured comm_table (arena-profile comm) instead of alpha-beta"),
    comm_required: bool = typer.Option(
        False, "--comm-required", help="error when --comm has no measurements for a planned GPU type (default: fall back)"
    ),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
    no_cache: bool = NO_CACHE_OPTION,
    cache_dir: Optional[Path] = CACHE_DIR_OPTION,
) -> None:
    """Plan every grid of the job (no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from dataclasses import asdict

    from libarena.artifacts.stage_cache import StageCache, cache_input, library_versions
    from libarena.hardware import load_cluster
    from libarena.hardware.comm import load_comm_model
    from libarena.plan import PlannerConfig, load_model_profile, plan_job, write_plans

    if cluster is None:
        raise ArenaError("missing --cluster: the cluster spec to plan for")
    for name, value in (("--max-gpus", max_gpus), ("--microbatches-per-stage", microbatches_per_stage)):
        if value < 1:
            raise ArenaError(f"{name} must be at least 1, got {value}")
    if num_microbatches is not None and num_microbatches < 1:
        raise ArenaError(f"--num-microbatches must be at least 1, got {num_microbatches}")
    if not 0 < memory_fraction <= 1:
        raise ArenaError(f"--memory-fraction must be in (0, 1], got {memory_fraction}")
    if ops == "-" and sys.stdin.isatty():
        raise ArenaError("no operator table: pipe one from arena-analyze or pass --ops FILE")
    _refuse_binary_to_terminal(output)
    refuse_json_with_stdout_data(as_json, output)
    spec = load_cluster(cluster)
    comm_model = load_comm_model(str(comm)) if comm is not None else None
    if comm_required and comm_model is None:
        raise ArenaError("--comm-required needs --comm")
    config = PlannerConfig(
        max_gpus=max_gpus,
        microbatches_per_stage=microbatches_per_stage,
        num_microbatches=num_microbatches,
        frontier_cap=frontier_cap,
        usable_memory_fraction=memory_fraction,
        allow_zero=not no_zero,
        gpu_types=tuple(gpu_type) if gpu_type else None,
        num_gpus=tuple(num_gpus) if num_gpus else None,
        pipeline_degrees=tuple(stages) if stages else None,
        exhaustive=exhaustive,
        exhaustive_limit=exhaustive_limit,
    )
    artifact = read_table(ops, "operator_table")
    profile = load_model_profile(artifact)
    inputs = [input_ref(ops, "operator_table", digest=profile.digest if ops == "-" else None), input_ref(cluster)]
    if comm is not None:
        inputs.append(input_ref(comm, "comm_table"))
    where = "stdout" if output == "-" else output
    with Reporter(quiet=quiet, prefix="arena-plan: ") as reporter:
        cache = StageCache(cache_dir, "arena-plan", refresh=no_cache, log=reporter.log, warn=reporter.warn)
        key = cache.key({"planner": asdict(config), "comm_required": comm_required},
                        [cache_input(ops, artifact), *inputs[1:]], library_versions("scipy", "highspy"), code=[__file__])
        summary: dict = {}

        def produce(path: str) -> None:
            planset = plan_job(profile, spec, config, comm=comm_model, require_measured_comm=comm_required)
            if not planset.grids:
                raise ArenaError(f"cluster {spec.name!r} offers no grid for this job (check --gpu-type, --num-gpus, --stages, --max-gpus)")
            provenance = Provenance(tool="arena-plan", parameters=dict(planset.planner), inputs=inputs)
            write_plans(path, planset, provenance)
            feasible = [r for r in planset.grids if r.feasible]
            summary.update(model=planset.model_name, grids=len(planset.grids), feasible_grids=len(feasible),
                           plans=sum(len(r.plans) for r in feasible))
            if not feasible:
                reporter.warn(f"{planset.model_name} fits in no grid of {spec.name}; every grid is listed as infeasible")
            else:
                reporter.log(f"{planset.model_name}: {len(feasible)} of {len(planset.grids)} grids feasible, "
                             f"{summary['plans']} plans written to {where}")
            if comm_model is not None:
                for name in sorted({r.grid.gpu_type for r in planset.grids if not comm_model.covers(r.grid.gpu_type)}):
                    reporter.log(f"note: {comm} has no measurements for {name}; priced with the alpha-beta model")

        outcome = cache.produce_table(key, output, produce)
    if outcome.cache_hit:
        reporter.log(f"cached: {where} from {outcome.entry} ({outcome.rows} rows; --no-cache plans again)")
    if as_json:
        print_json({"tool": "arena-plan", **outcome.summary(), **summary, "elapsed_s": round(reporter.elapsed_s(), 4)})


@app.command()
def show(
    plans: str = typer.Argument(..., help="plans file ('-' = stdin)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable JSON on stdout"),
    proxies: bool = typer.Option(False, "--proxies", help="only the proxy plan of each grid"),
) -> None:
    """Print frontiers and proxy plans."""
    from rich.console import Console

    from libarena.plan import read_plans
    from libarena.plan.show import planset_dict, render

    planset = read_plans(plans)
    if as_json:
        sys.stdout.write(json.dumps(planset_dict(planset, proxies_only=proxies), indent=2, sort_keys=True) + "\n")
        return
    render(planset, Console(highlight=False, width=160), proxies_only=proxies)


@app.command()
def export(
    plans: str = typer.Argument(..., help="plans file ('-' = stdin)"),
    fmt: str = typer.Option("alpa", "--format", help="export format: alpa"),
    output: str = typer.Option("-", "--output", "-o", help="output JSON file ('-' = stdout)"),
    plan_id: Optional[str] = typer.Option(None, "--plan-id", help="the plan to export (default: the one matching proxy)"),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type"),
    num_gpus: Optional[int] = typer.Option(None, "--num-gpus"),
    stages: Optional[int] = typer.Option(None, "--stages"),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Write a (proxy) plan in another runtime's format (alpa: ManualStageOption JSON). Not cached: instant."""
    from libarena.hardware import get_gpu
    from libarena.plan import read_plans
    from libarena.plan.export import EXPORT_FORMATS, export_plan, select_proxy

    if fmt not in EXPORT_FORMATS:
        raise ArenaError(f"unknown export format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    refuse_json_with_stdout_data(as_json, output)
    reporter = Reporter(quiet=quiet, prefix="arena-plan: ")
    planset = read_plans(plans)
    canonical = get_gpu(gpu_type).name if gpu_type else None
    plan_obj = select_proxy(planset, plan_id, canonical, num_gpus, stages)
    document = export_plan(planset, plan_obj, fmt)
    write_bytes(output, (json.dumps(document, indent=2, sort_keys=True) + "\n").encode())
    if output != "-":
        reporter.log(f"exported plan {plan_obj.plan_id} ({fmt}) to {output}")
    if as_json:
        print_json({"tool": "arena-plan export", "output": output, "format": fmt, "plan_id": plan_obj.plan_id,
                    "cache": {"hit": False, "stored": False}, "elapsed_s": round(reporter.elapsed_s(), 4)})


def main() -> None:
    run_app("arena-plan", app)
