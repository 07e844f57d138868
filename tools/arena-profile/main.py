"""arena-profile: plans -> performance table by disaggregated single-device profiling (thin CLI over
libarena.profile).

    arena-plan ... -o - | arena-profile --device local -o perf.parquet
    arena-profile -i plans.parquet --all-frontier --measure -o perf.parquet
    arena-profile ... -o perf.parquet [--quiet] [--json] [--no-cache] [--cache-dir DIR]
    arena-profile comm --devices 2 -o comm.parquet
    arena-profile show perf.parquet [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from libarena.artifacts import read_table
from libarena.cli import (
    JSON_OPTION, QUIET_OPTION, Reporter, print_json, refuse_binary_to_terminal, refuse_json_with_stdout_data, run_app,
    strict_json,
)
from libarena.errors import ArenaError

app = typer.Typer(
    add_completion=False,
    help="Profile parallel plans on one local device into the performance table; benchmark collectives.",
)


@app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    plans: str = typer.Option("-", "--plans", "-i", help="plans (Parquet, or '-' for an Arrow stream on stdin)"),
    output: str = typer.Option("-", "--output", "-o", help="performance table (Parquet; '-' = an Arrow stream on stdout)"),
    device: str = typer.Option("local", "--device", help="device to profile on: local, cpu, gpu, or platform:index"),
    timer: str = typer.Option("auto", "--timer", help="auto (cupti on an NVIDIA GPU, else host), cupti or host"),
    all_frontier: bool = typer.Option(False, "--all-frontier", help="profile every frontier plan, not only the proxies"),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="profile every plan in the input"),
    measure: bool = typer.Option(False, "--measure", help="also run each profiled plan for real and record its time"),
    measure_repeats: int = typer.Option(3, "--measure-repeats", help="timed iterations per directly measured plan"),
    comm: Optional[Path] = typer.Option(None, "--comm", help="measured comm_table (arena-profile comm); default alpha-beta"),
    ops: Optional[Path] = typer.Option(None, "--ops", help="operator table the plans must come from (checked by sha256)"),
    cache_dir: Optional[Path] = typer.Option(
        None, "--cache-dir", help="profiled stages in DIR, whole outputs in DIR/stages/ (default: stages in "
        "~/.cache/arena/profile, outputs in .arena-cache/stages/)"),
    warmup: int = typer.Option(2, "--warmup", help="untimed runs per stage executable"),
    repeats: int = typer.Option(7, "--repeats", help="timed runs per stage executable (median and spread reported)"),
    no_dp: bool = typer.Option(False, "--no-dp", help="do not profile the pure data-parallel plan (view dp)"),
    granularity: str = typer.Option("stage", "--granularity", help="stage (one executable per distinct stage: accurate) or unit (identical layers profiled once: cheaper)"),
    statistic: str = typer.Option("median", "--statistic", help="median of the timed runs, min, or q1 (lower quartile: steadiest on a shared host)"),
    concurrency: str = typer.Option("co-run", "--concurrency", help="how host devices sharing the CPU slow each other: "
                                    "co-run (each stage also timed in a process laid out as the plan's, alone and with every "
                                    "device busy), cpu-time (each stage demands the cores its profile kept busy), measured "
                                    "(one factor from a micro-benchmark) or independent"),
    burst: int = typer.Option(4, "--burst", help="micro-batches dispatched back to back per timed run (as the runtime does)"),
    timing_budget: float = typer.Option(10.0, "--timing-budget", help="seconds of timed runs per stage after which "
                                        "timing stops once 5 runs are in (0: always --repeats)"),
    isolation: str = typer.Option("process", "--isolation", help="process (stages compiled ahead and timed in this "
                                  "process) or child (each stage built and timed in a fresh interpreter of its own, as "
                                  "arena-run builds its plan; needs --granularity stage)"),
    handoff_rounds: int = typer.Option(40, "--handoff-rounds", help="rounds of a two-stage host plan's step timed "
                                       "per variant where its hand-offs' wait is measured (co-run plans of two "
                                       "one-device stages whose flat hand-off price is 2% of the step or more); 0: "
                                       "the flat price"),
    compile_workers: Optional[int] = typer.Option(None, "--compile-workers", help="threads compiling stage executables "
                                                  "ahead of timing (default: the host's cores, at most 8)"),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
    no_cache: bool = typer.Option(False, "--no-cache", help="profile again even when the stage cache has this output "
                                  "(stage profiles are still reused)"),
) -> None:
    """Profile plans (no subcommand)."""
    if ctx.invoked_subcommand is not None:
        return
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.profile import MeasureSettings, profile as run_profile
    from libarena.profile import ProfileConfig

    if all_frontier and exhaustive:
        raise ArenaError("--all-frontier and --exhaustive exclude each other")
    if plans == "-" and sys.stdin.isatty():  # (it would wait for a stream nobody types)
        raise ArenaError("no plans: pipe them from arena-plan, or pass --plans FILE")
    refuse_binary_to_terminal(output)
    refuse_json_with_stdout_data(as_json, output)
    config = ProfileConfig(
        device=device,
        timer=timer,
        warmup=warmup,
        repeats=repeats,
        cache_dir=cache_dir,
        selection="exhaustive" if exhaustive else "frontier" if all_frontier else "proxy",
        include_dp=not no_dp,
        granularity=granularity,
        statistic=statistic,
        concurrency=concurrency,
        burst=burst,
        timing_budget_s=timing_budget if timing_budget != 0 else None,
        isolation=isolation,
        handoff_rounds=handoff_rounds,
        **({"compile_workers": compile_workers} if compile_workers is not None else {}),
    )
    where = "stdout" if output == "-" else output
    with Reporter(quiet=quiet) as reporter:
        # profiled stages stay in the profile cache (--cache-dir, or ~/.cache/arena/profile); outputs in its stages/
        outcome, summary = run_profile(plans, config, output, comm=comm, ops=ops,
                                       measure=MeasureSettings(measure, measure_repeats),
                                       cache=CacheSettings(cache_dir, no_cache), report=reporter)
    if outcome.cache_hit:
        reporter.log(f"cached: {where} from {outcome.entry} ({outcome.rows} rows; --no-cache profiles again)")
    if as_json:
        print_json({"tool": "arena-profile", **outcome.summary(), **summary, "elapsed_s": round(reporter.elapsed_s(), 4)})


@app.command("comm")
def comm_command(
    output: str = typer.Option("-", "--output", "-o", help="comm_table (Parquet), '-' = Arrow stream on stdout"),
    devices: int = typer.Option(2, "--devices", "-n", help="devices to benchmark on (host devices are simulated)"),
    min_bytes: int = typer.Option(2**10, "--min-bytes", help="smallest volume per device"),
    max_bytes: int = typer.Option(2**22, "--max-bytes", help="largest volume per device"),
    points: int = typer.Option(7, "--points", help="log-spaced volumes between them"),
    repeats: int = typer.Option(10, "--repeats", help="timed repetitions per volume"),
    device: str = typer.Option("local", "--device", help="platform to benchmark: local, cpu or gpu"),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Benchmark all-reduce, all-gather, reduce-scatter, all-to-all and P2P into a comm_table.

    Not cached: a benchmark's point is a fresh measurement of this machine's interconnect."""
    from libarena.profile import CommBenchConfig, write_comm_table

    from libarena.artifacts.io import check_writable

    refuse_binary_to_terminal(output)
    refuse_json_with_stdout_data(as_json, output)
    check_writable(output)  # before the benchmark's seconds of work, not after them
    platform = "cpu" if device in ("local", "cpu") else "gpu" if device in ("gpu", "cuda") else None
    if platform is None:
        raise ArenaError(f"bad device {device!r} for the communication benchmark: use local, cpu or gpu")
    if platform == "cpu" and device == "local":
        from libarena.profile import resolve_device

        platform = "cpu" if resolve_device("local").platform == "cpu" else "gpu"
    config = CommBenchConfig(num_devices=devices, min_bytes=min_bytes, max_bytes=max_bytes, points=points, repeats=repeats, platform=platform)
    reporter = Reporter(quiet=quiet)
    rows = write_comm_table(output, config)
    reporter.log(f"{rows} measurements ({devices} devices, {platform})")
    if as_json:
        print_json({"tool": "arena-profile comm", "output": output, "rows": rows, "devices": devices,
                    "platform": platform, "cache": {"hit": False, "stored": False},
                    "elapsed_s": round(reporter.elapsed_s(), 4)})


@app.command("show")
def show(
    table: str = typer.Argument(..., help="performance table (Parquet/CSV, or '-')"),
    as_json: bool = typer.Option(False, "--json", help="JSON rows instead of a text table"),
) -> None:
    """Print a performance table (also one measured elsewhere)."""
    from libarena.artifacts.kinds.perf_table import check_perf_table
    from libarena.profile import format_perf_table

    artifact = read_table(table, "perf_table")
    check_perf_table(artifact.table, artifact.source)
    if as_json:
        print(strict_json(artifact.table.to_pylist(), indent=1, default=str))
        return
    print(format_perf_table(artifact))


def main() -> None:
    run_app("arena-profile", app)


if __name__ == "__main__":
    main()
