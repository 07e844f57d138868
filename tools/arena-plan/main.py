"""arena-plan: operator table -> per-grid Pareto frontiers and proxy plans (thin CLI over libarena.plan).

    arena-analyze --model moe__2.4B --global-batch 256 -o - | arena-plan --cluster c.yaml -o plans.parquet
    arena-plan --model moe__2.4B --global-batch 256 --cluster c.yaml -o plans.parquet   # analyzed on the way (cached)
    arena-plan ... -o plans.parquet [--quiet] [--json] [--no-cache] [--cache-dir .arena-cache]
    arena-plan show plans.parquet [--json] [--proxies]
    arena-plan export plans.parquet --format alpa --gpu-type a100 --num-gpus 16 --stages 4 -o alpa.json
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from libarena.artifacts import refuse_overwriting_inputs, write_bytes
from libarena.artifacts.io import check_table_output
from libarena.cli import (
    CACHE_DIR_OPTION, JSON_OPTION, NO_CACHE_OPTION, QUIET_OPTION, Reporter,
    print_json, refuse_binary_to_terminal, refuse_json_with_stdout_data, run_app, strict_json,
)
from libarena.errors import ArenaError
from libarena.plan.config import USABLE_MEMORY_FRACTION

app = typer.Typer(
    add_completion=False,
    help="Plan a job on a cluster: grids, load-aware stage partitions, Pareto frontiers and proxy plans.",
)


@app.callback(invoke_without_command=True)
def plan(
    ctx: typer.Context,
    ops: str = typer.Option("-", "--ops", "-i", help="operator table (Parquet, or '-' for an Arrow stream on stdin)"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="plan a zoo model instead of --ops (analyzed on the way, cached)"),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", help="with --model: the global batch size"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", "-c", help="cluster spec (YAML or TOML)"),
    output: str = typer.Option("-", "--output", "-o", help="plans file (Parquet), '-' = Arrow stream on stdout"),
    max_gpus: int = typer.Option(16, "--max-gpus", help="largest GPU count of a grid (powers of two up to it)"),
    gpu_type: Optional[list[str]] = typer.Option(None, "--gpu-type", help="only these GPU types (repeatable)"),
    num_gpus: Optional[list[int]] = typer.Option(None, "--num-gpus", help="only these GPU counts (repeatable)"),
    stages: Optional[list[int]] = typer.Option(None, "--stages", help="only these pipeline degrees (repeatable)"),
    microbatches_per_stage: int = typer.Option(4, "--microbatches-per-stage", help="B = this x s (the paper: 4)"),
    num_microbatches: Optional[int] = typer.Option(None, "--num-microbatches", help="fix B instead"),
    frontier_cap: int = typer.Option(8, "--frontier-cap", help="most frontier plans kept per grid (0 = all)"),
    memory_fraction: float = typer.Option(USABLE_MEMORY_FRACTION, "--memory-fraction", help="fraction of GPU memory plans may use"),
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
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.plan import PlanStep, plan as run_plan, plan_model
    from libarena.plan import PlannerConfig

    if cluster is None:
        raise ArenaError("missing --cluster: the cluster spec to plan for")
    if (model is None) != (global_batch is None):
        raise ArenaError("--model and --global-batch go together (or give an operator table with --ops)")
    if model is not None and ops != "-":
        raise ArenaError("give --ops or --model with --global-batch, not both")
    if model is None and ops == "-" and sys.stdin.isatty():
        raise ArenaError("no operator table: pipe one from arena-analyze, pass --ops FILE, or --model and --global-batch")
    refuse_binary_to_terminal(output)
    refuse_json_with_stdout_data(as_json, output)
    check_table_output(output)
    step = PlanStep(cluster, PlannerConfig(
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
    ), comm, comm_required)
    where = "stdout" if output == "-" else output
    cache = CacheSettings(cache_dir, no_cache)
    with Reporter(quiet=quiet, prefix="arena-plan: ") as reporter:
        if model is not None:
            from libarena.analyze import AnalyzeConfig

            outcome, summary = plan_model(AnalyzeConfig(model, global_batch), step, output, cache, reporter)
        else:
            outcome, summary = run_plan(ops, step, output, cache, reporter)
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
        sys.stdout.write(strict_json(planset_dict(planset, proxies_only=proxies), indent=2, sort_keys=True) + "\n")
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
    from libarena.plan.export import EXPORT_FORMATS, export_plan, select_for_export

    if fmt not in EXPORT_FORMATS:
        raise ArenaError(f"unknown export format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    refuse_json_with_stdout_data(as_json, output)
    refuse_overwriting_inputs(output, {"plans": plans})
    reporter = Reporter(quiet=quiet, prefix="arena-plan: ")
    planset = read_plans(plans)
    canonical = get_gpu(gpu_type).name if gpu_type else None
    plan_obj, note = select_for_export(planset, fmt, plan_id, canonical, num_gpus, stages)
    if note:
        reporter.log(note)
    document = export_plan(planset, plan_obj, fmt)
    write_bytes(output, (strict_json(document, indent=2, sort_keys=True) + "\n").encode())
    if output != "-":
        reporter.log(f"exported plan {plan_obj.plan_id} ({fmt}) to {output}")
    if as_json:
        print_json({"tool": "arena-plan export", "output": output, "format": fmt, "plan_id": plan_obj.plan_id,
                    "cache": {"hit": False, "stored": False}, "elapsed_s": round(reporter.elapsed_s(), 4)})


def main() -> None:
    run_app("arena-plan", app)
