"""arena-analyze: a zoo model's training step -> HLO operator table (thin CLI over libarena.analyze).

    arena-analyze --model moe__2.4B --global-batch 256 [--seq-len 1024] [--dtype bf16] [--num-clusters 16] -o ops.parquet
    arena-analyze ... -o ops.parquet [--quiet] [--json] [--no-cache] [--cache-dir .arena-cache]
    arena-analyze --model gpt__1.3B --global-batch 512 -o - | arena-plan --cluster c.yaml -o plans.parquet
    arena-analyze --list-models [--json]
    arena-analyze show ops.parquet [--top 15] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from libarena.cli import (
    CACHE_DIR_OPTION, JSON_HELP, NO_CACHE_OPTION, QUIET_OPTION, Reporter,
    print_json, refuse_binary_to_terminal, refuse_json_with_stdout_data, run_app, strict_json,
)
from libarena.errors import ArenaError

app = typer.Typer(
    add_completion=False,
    help="Lower a model's training step abstractly and write its HLO operator table and clustered view.",
)


@app.callback(invoke_without_command=True)
def analyze(
    ctx: typer.Context,
    model: Optional[str] = typer.Option(None, "--model", "-m", help="zoo model, family__size (see --list-models)"),
    global_batch: Optional[int] = typer.Option(None, "--global-batch", "-b", help="global batch size (samples per step)"),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", help="sequence length (image side for wide_resnet); default: the model's"),
    dtype: str = typer.Option("bf16", "--dtype", help="training compute dtype: bf16, fp16, fp32, tf32"),
    num_clusters: int = typer.Option(16, "--num-clusters", help="O, the number of clustered operators"),
    output: str = typer.Option("-", "--output", "-o", help="operator table (Parquet), '-' = Arrow stream on stdout"),
    list_models: bool = typer.Option(False, "--list-models", help="list the model zoo and exit"),
    as_json: bool = typer.Option(False, "--json", help=f"{JSON_HELP}; with --list-models: the zoo as JSON"),
    quiet: bool = QUIET_OPTION,
    no_cache: bool = NO_CACHE_OPTION,
    cache_dir: Optional[Path] = CACHE_DIR_OPTION,
) -> None:
    """Analyze a model (no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from libarena.analyze import AnalyzeConfig
    from libarena.artifacts.io import check_table_output
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.analyze import analyze as run_analyze

    if list_models:
        from libarena.analyze.show import render_zoo, zoo_rows

        rows = zoo_rows()
        if as_json:
            sys.stdout.write(strict_json(rows, indent=2, sort_keys=True) + "\n")
        else:
            from rich.console import Console

            render_zoo(rows, Console(highlight=False, width=120))
        return
    if model is None:
        raise ArenaError("missing --model: the zoo model to analyze (see --list-models)")
    if global_batch is None:
        raise ArenaError("missing --global-batch: the global batch size to analyze the step at")
    config = AnalyzeConfig(model, global_batch, seq_len, dtype, num_clusters)
    refuse_json_with_stdout_data(as_json, output)
    refuse_binary_to_terminal(output)
    check_table_output(output)
    where = "stdout" if output == "-" else output
    with Reporter(quiet=quiet, prefix="arena-analyze: ") as reporter:
        outcome = run_analyze(config, output, CacheSettings(cache_dir, no_cache), reporter)
    if outcome.cache_hit:
        reporter.log(f"cached: {where} is {outcome.entry} ({outcome.rows} instructions; --no-cache analyzes again)")
    if as_json:
        print_json({"tool": "arena-analyze", **outcome.summary(), "parameters": config.parameters(),
                    "elapsed_s": round(reporter.elapsed_s(), 4)})


@app.command()
def show(
    ops: str = typer.Argument(..., help="operator table ('-' = Arrow stream on stdin)"),
    top: int = typer.Option(15, "--top", help="how many instructions to list (by FLOPs)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable JSON on stdout"),
) -> None:
    """Print the top instructions by FLOPs and the clustered operators."""
    from rich.console import Console

    from libarena.analyze import read_operator_table
    from libarena.analyze.show import render, summary

    if top < 0:
        raise ArenaError(f"--top must be at least 0, got {top}")
    table = read_operator_table(ops)
    if as_json:
        sys.stdout.write(strict_json(summary(table, top), indent=2, sort_keys=True) + "\n")
        return
    render(table, Console(highlight=False, width=180), top)


def main() -> None:
    run_app("arena-analyze", app)
