"""arena-schedule: simulate scheduling policies on a trace with a performance table and a cluster spec.

    arena-schedule simulate --trace T.csv --perf perf.parquet --cluster C.yaml --policy arena -o run/
    arena-schedule compare --policies arena,fcfs,elasticflow-ls,gavel,sia --trace ... -o compare/
    arena-schedule perf build --trace T.csv --cluster C.yaml -o perf.parquet   (or --pair MODEL,BATCH ...)
    (simulate, compare and perf build: [--quiet] [--json] [--no-cache] [--cache-dir .arena-cache])
    arena-schedule sweep [SPEC.yaml] [--trace NAME=T.csv --perf NAME=perf.parquet ...] [--policies ...] [--seeds 0,1]
                         -o sweep/ [--address ray://head:10001 | --num-cpus N | --sequential]
    arena-schedule trace stats T.csv
    arena-schedule trace scale T.csv -x 10 [--jitter 150] [--seed 0] -o T10.csv
    arena-schedule cluster scale C.yaml -x 10 -o C10.yaml
    arena-schedule policies
    arena-schedule serve --cluster C.yaml --perf perf.parquet --state state.db [--time-compression X] [--tick 300]
    arena-schedule submit job.yaml --state state.db
    arena-schedule status --state state.db [--json]
    arena-schedule logs JOB --state state.db
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from libarena.cli import (
    CACHE_DIR_OPTION, JSON_OPTION, NO_CACHE_OPTION, QUIET_OPTION, Reporter,
    print_json, refuse_binary_to_terminal, refuse_json_with_stdout_data, run_app, strict_json,
)
from libarena.errors import ArenaError
from libarena.schedule.live.profiling import DEFAULT_PROFILE_RETRY_S, DEFAULT_PROFILE_TIMEOUT_S
from libarena.schedule.policies import policy_names
from libarena.schedule.sweep import DEFAULT_POLICIES

app = typer.Typer(add_completion=False, help="AP-aware cluster scheduling: simulator, Arena and baselines.")
trace_app = typer.Typer(add_completion=False, help="Workload traces.")
perf_app = typer.Typer(add_completion=False, help="Performance tables for a trace.")
app.add_typer(trace_app, name="trace")
cluster_app = typer.Typer(add_completion=False, help="Cluster specs.")
app.add_typer(perf_app, name="perf")
app.add_typer(cluster_app, name="cluster")

TraceOpt = typer.Option(..., "--trace", help="trace CSV (arena-ae, ElasticFlow or raw ITP format; '-' = stdin)")
PerfOpt = typer.Option(..., "--perf", help="performance table (perf_table artifact, or CSV/Parquet in its schema)")
ClusterOpt = typer.Option(..., "--cluster", help="cluster spec (YAML/TOML)")
PolicyOpt = typer.Option("arena", "--policy", help=", ".join(policy_names()))
StartOpt = typer.Option(None, "--start", help="where the run's window and ticks begin, in the trace's seconds "
                        "(default: the first submission; at most that)")


def _sim_config(tick: float, horizon: Optional[float], seed: int, overhead: list[str], max_ticks: int,
                start: Optional[float]):
    from libarena.schedule.config import OverheadConfig, SimulatorConfig

    return SimulatorConfig(tick_s=tick, horizon_s=horizon, seed=seed, overheads=OverheadConfig.from_assignments(overhead),
                           max_ticks=max_ticks, start_s=start)


def _max_ticks_option():
    from libarena.schedule.config import MAX_TICKS

    return typer.Option(MAX_TICKS, "--max-ticks", help="refuse or stop a simulation that needs more scheduling ticks")


MaxTicksOpt = _max_ticks_option()


@app.command()
def simulate(
    trace: Path = TraceOpt,
    perf: Path = PerfOpt,
    cluster: Path = ClusterOpt,
    policy: str = PolicyOpt,
    output: Path = typer.Option(..., "-o", "--output", help="output directory"),
    view: Optional[str] = typer.Option(None, "--view", help="decision view: arena, dp, ap, dp-linear, truth (default: the policy's)"),
    objective: Optional[str] = typer.Option(None, "--objective", help="arena: jct (default), throughput (eq. 5), deadline, fairness"),
    no_hetero: bool = typer.Option(False, "--no-hetero", help="arena ablation: no GPU-type switching"),
    no_elastic: bool = typer.Option(False, "--no-elastic", help="arena ablation: no GPU-count scaling"),
    no_pruning: bool = typer.Option(False, "--no-pruning", help="arena ablation: full AP search at every (re)launch"),
    no_profiler: bool = typer.Option(False, "--no-profiler", help="arena ablation: full DP profiling before first launch"),
    queues: Optional[int] = typer.Option(None, "--queues", help="arena: number of priority queues P (3)"),
    search_depth: Optional[int] = typer.Option(None, "--search-depth", help="arena: search depth D (3)"),
    promotion_time: Optional[float] = typer.Option(None, "--promotion-time", help="arena: seconds before promotion"),
    trade_margin: Optional[float] = typer.Option(None, "--trade-margin", help="arena: in-flight trades when the gain is this many times the loss (5; 0: none)"),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus-per-job", help="largest GPU count per job (16)"),
    global_queue: bool = typer.Option(False, "--global-queue", help="fcfs: one FIFO queue for every GPU type (default: one per type)"),
    tick: float = typer.Option(300.0, "--tick", help="scheduling interval in seconds (1 to 86400)"),
    horizon: Optional[float] = typer.Option(None, "--horizon", help="stop this many seconds after the start"),
    start: Optional[float] = StartOpt,
    max_ticks: int = MaxTicksOpt,
    seed: int = typer.Option(0, "--seed", help="seed for trace adaptation"),
    overhead: list[str] = typer.Option([], "--overhead", help="override an overhead, NAME=SECONDS, or reuse_profiles=/reuse_plans=true|false (repeatable)"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="skip bad trace rows, with a count"),
    plot: bool = typer.Option(False, "--plot", help="also write PNG figures"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics and a summary (output, cache, elapsed_s) as JSON on stdout"),
    quiet: bool = QUIET_OPTION,
    no_cache: bool = NO_CACHE_OPTION,
    cache_dir: Optional[Path] = CACHE_DIR_OPTION,
) -> None:
    """Simulate one policy; writes jobs.parquet, timeseries.parquet, decisions.msgpack, metrics.json."""
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.schedule import simulate as run_simulate
    from libarena.schedule.api import make_policy

    cfg = _sim_config(tick, horizon, seed, overhead, max_ticks, start)
    pol = make_policy(policy, view=view, objective=objective, hetero=False if no_hetero else None,
                      elastic=False if no_elastic else None, pruning=False if no_pruning else None,
                      profiler=False if no_profiler else None, num_queues=queues, search_depth=search_depth,
                      promotion_time_s=promotion_time, trade_margin=trade_margin, max_gpus_per_job=max_gpus,
                      per_type_queues=False if global_queue else None)
    with Reporter(quiet=quiet) as reporter:
        outcome, metrics = run_simulate(trace, perf, cluster, pol, cfg, output, skip_bad_rows=skip_bad_rows, plot=plot,
                                        cache=CacheSettings(cache_dir, no_cache), report=reporter)
    if as_json:
        from libarena.schedule.metrics import json_safe

        print_json({**json_safe(metrics), "tool": "arena-schedule simulate", **outcome.summary(),
                    "elapsed_s": round(reporter.elapsed_s(), 4)})


@app.command()
def compare(
    policies: str = typer.Option(",".join(DEFAULT_POLICIES), "--policies", help="comma-separated policies"),
    trace: Path = TraceOpt,
    perf: Path = PerfOpt,
    cluster: Path = ClusterOpt,
    output: Path = typer.Option(..., "-o", "--output", help="output directory (one sub-directory per policy)"),
    tick: float = typer.Option(300.0, "--tick", help="scheduling interval in seconds (1 to 86400)"),
    horizon: Optional[float] = typer.Option(None, "--horizon", help="stop this many seconds after the start"),
    start: Optional[float] = StartOpt,
    max_ticks: int = MaxTicksOpt,
    seed: int = typer.Option(0, "--seed"),
    overhead: list[str] = typer.Option([], "--overhead"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows"),
    plot: bool = typer.Option(False, "--plot", help="write comparison PNGs"),
    as_json: bool = typer.Option(False, "--json", help='print {"policies": {name: {...}}} and a summary (output, cache, elapsed_s) on stdout'),
    quiet: bool = QUIET_OPTION,
    no_cache: bool = NO_CACHE_OPTION,
    cache_dir: Optional[Path] = CACHE_DIR_OPTION,
) -> None:
    """Run several policies on the same workload; print a table relative to Arena."""
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.schedule import compare as run_compare
    from libarena.schedule.api import make_policy
    from libarena.schedule.compare import compare_table_text, paired_from_json

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise ArenaError(f"--policies {policies!r}: give distinct policy names separated by commas")
    cfg = _sim_config(tick, horizon, seed, overhead, max_ticks, start)
    pols = {name: make_policy(name) for name in names}
    with Reporter(quiet=quiet) as reporter:
        outcome, metrics, doc = run_compare(trace, perf, cluster, pols, cfg, output, skip_bad_rows=skip_bad_rows,
                                            plot=plot, cache=CacheSettings(cache_dir, no_cache), report=reporter)
    if as_json:
        print_json({**doc, "tool": "arena-schedule compare", **outcome.summary(),
                    "elapsed_s": round(reporter.elapsed_s(), 4)})
    else:
        sys.stdout.write(compare_table_text(metrics, paired_from_json(doc)))


@app.command()
def sweep(
    spec: Optional[Path] = typer.Argument(None, help="sweep spec (YAML: cluster, traces, policies, seeds, variants, "
                                          "simulator, layout); the options below replace its fields"),
    output: Path = typer.Option(..., "-o", "--output", help="output directory (one folder per comparison, sweep.json)"),
    trace: list[str] = typer.Option([], "--trace", help="[NAME=]TRACE.csv (repeatable; NAME defaults to the file's stem)"),
    perf: list[str] = typer.Option([], "--perf", help="[NAME=]PERF.parquet: that trace's performance table (no NAME: every trace's)"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="cluster spec (YAML/TOML)"),
    policies: Optional[str] = typer.Option(None, "--policies", help="comma-separated (default: the spec's, else compare's)"),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="comma-separated simulator seeds (default 0)"),
    tick: Optional[float] = typer.Option(None, "--tick", help="scheduling interval in seconds (300)"),
    horizon: Optional[float] = typer.Option(None, "--horizon", help="stop this many seconds after the first submission"),
    overhead: list[str] = typer.Option([], "--overhead", help="override an overhead, NAME=SECONDS, or reuse_profiles=/reuse_plans=true|false (repeatable)"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="skip bad trace rows, with a count"),
    layout: Optional[str] = typer.Option(None, "--layout", help='folder of each comparison, from {trace} {variant} {seed} '
                                         '(default: the dimensions with several values)'),
    plot: bool = typer.Option(False, "--plot", help="write each comparison's PNGs"),
    address: Optional[str] = typer.Option(None, "--address", help="run on this Ray cluster (ray://host:10001 or host:port; "
                                          "workers need the inputs at the same paths)"),
    num_cpus: Optional[int] = typer.Option(None, "--num-cpus", help="CPUs of the embedded local Ray (default: all)"),
    sequential: bool = typer.Option(False, "--sequential", help="no Ray: one simulation after another in this process"),
    as_json: bool = typer.Option(False, "--json", help="print the sweep's summary on stdout (sweep.json's fields, its inputs and the time taken)"),
    quiet: bool = QUIET_OPTION,
    no_cache: bool = NO_CACHE_OPTION,
    cache_dir: Optional[Path] = CACHE_DIR_OPTION,
) -> None:
    """Policies x traces x seeds x ablations: every simulation a Ray task (cached as simulate caches it)."""
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.sweep import RayExecutor, SequentialExecutor, sweep as run_sweep
    from libarena.schedule.compare import compare_table_text
    from libarena.schedule.sweep import build_sweep_spec

    if sequential and (address or num_cpus is not None):
        raise ArenaError("--sequential runs in this process: drop --address / --num-cpus")
    if address and num_cpus is not None:
        raise ArenaError("--num-cpus sizes the embedded local Ray: it does not apply with --address")
    sweep_spec = build_sweep_spec(spec, traces=trace, perfs=perf, cluster=cluster, policies=policies, seeds=seeds,
                                  tick_s=tick, horizon_s=horizon, overheads=overhead, skip_bad_rows=skip_bad_rows,
                                  layout=layout)
    executor = SequentialExecutor() if sequential else RayExecutor(address, num_cpus)
    with Reporter(quiet=quiet) as reporter:
        summary = run_sweep(sweep_spec, output, executor, plot=plot, cache=CacheSettings(cache_dir, no_cache),
                            report=reporter)
        reporter.log(f"sweep: {len(summary.records)} simulations ({summary.count('cached')} cached, "
                     f"{summary.count('simulated')} simulated, {summary.count('failed')} failed) in {output}/; "
                     f"{reporter.elapsed_s():.1f} s")
    if as_json:
        print_json({"tool": "arena-schedule sweep", **summary.to_dict(), "inputs": summary.inputs,
                    "elapsed_s": round(reporter.elapsed_s(), 4)})
    else:
        for group in summary.groups:
            print(f"== {group or output}")
            sys.stdout.write(compare_table_text(summary.comparison(group), summary.paired.get(group)))
    failed = summary.failed
    if failed:
        raise ArenaError(f"{len(failed)} of {len(summary.records)} simulations failed (first: {failed[0].label}: "
                         f"{(failed[0].error or '')[:300]}); the others are in {output}/, every outcome in {output}/sweep.json")


@app.command("policies")
def list_policies() -> None:
    """List the registered policies and their decision views."""
    from libarena.schedule.policies import get_policy

    for name in policy_names():
        cls = get_policy(name)
        print(f"{name:16s} view={cls.default_view:10s} {cls.description}")


@trace_app.command("stats")
def trace_stats_cmd(
    file: Path = typer.Argument(..., help="trace CSV ('-' = stdin)"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="adapt GPU types to this cluster's"),
    seed: int = typer.Option(0, "--seed"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Summarize a trace (jobs, span, arrival rate, GPU demand, models, GPU types)."""
    from libarena.hardware import load_cluster
    from libarena.schedule.traces import read_trace, trace_stats

    types = load_cluster(cluster).gpu_types if cluster else None
    tr = read_trace(file, gpu_types=types, seed=seed, skip_bad_rows=skip_bad_rows)
    if tr.ignored_columns_note():
        Reporter().warn(tr.ignored_columns_note())
    if tr.skipped:
        Reporter().warn(f"skipped {len(tr.skipped)} bad row(s); first: {tr.skipped[0]}")
    stats = trace_stats(tr)
    if as_json:
        print(strict_json(stats, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{'stdin' if str(file) == '-' else file} ({stats['format']}{', adapted' if stats['adapted'] else ''})", show_header=False)
    for key in ("jobs", "skipped_rows", "span_days", "arrivals_per_hour", "jobs_with_deadline", "median_deadline_slack_s"):
        v = stats[key]
        table.add_row(key, f"{v:.2f}" if isinstance(v, float) else str(v))
    rg = stats["requested_gpus"]
    table.add_row("requested GPUs", f"total {rg['total']}, mean {rg['mean']:.2f}, max {rg['max']}, by count {rg['by_count']}")
    table.add_row("iterations", f"mean {stats['iterations']['mean']:.0f}, median {stats['iterations']['median']:.0f}")
    table.add_row("models", ", ".join(f"{k}: {v}" for k, v in stats["models"].items()))
    table.add_row("GPU types", ", ".join(f"{k}: {v}" for k, v in stats["gpu_types"].items()))
    table.add_row("global batches", ", ".join(f"{k}: {v}" for k, v in stats["global_batches"].items()))
    Console(file=sys.stdout, width=160).print(table)


@trace_app.command("scale")
def trace_scale_cmd(
    file: Path = typer.Argument(..., help="trace CSV (arena-ae, ElasticFlow or raw ITP format)"),
    output: Path = typer.Option(..., "-o", "--output", help="the scaled trace, an arena-ae CSV ('-': stdout)"),
    copies: int = typer.Option(..., "-x", "--copies", help="copies of the trace (copy 0 is the trace itself)"),
    jitter: float = typer.Option(150.0, "--jitter", help="each further copy's submission times move by U(-J, +J) seconds"),
    seed: int = typer.Option(0, "--seed", help="seed of the jitter (and of the adaptation of ElasticFlow/ITP traces)"),
    cluster: Optional[Path] = typer.Option(None, "--cluster", help="adapt GPU types to this cluster's"),
    perf: Optional[Path] = typer.Option(None, "--perf", help="performance table whose rates make an adapted "
                                        "(ElasticFlow/ITP) trace's iteration counts, as simulate makes them; needs --cluster"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="leave bad rows out, with a count"),
) -> None:
    """Replicate a trace N times with seeded jitter of the submission times (job ids made unique)."""
    from libarena.schedule.traces import TraceScale, write_scaled_trace

    scaled = write_scaled_trace(file, output, TraceScale(copies, jitter, seed), cluster=cluster, perf=perf,
                                skip_bad_rows=skip_bad_rows)
    reporter = Reporter()
    if scaled.skipped:
        reporter.warn(f"skipped {len(scaled.skipped)} bad row(s); first: {scaled.skipped[0]}")
    reporter.log(f"{'stdout' if str(output) == '-' else output}: {len(scaled.jobs)} jobs ({copies} copies of {file})")


@cluster_app.command("scale")
def cluster_scale_cmd(
    file: Path = typer.Argument(..., help="cluster spec (YAML/TOML)"),
    output: Path = typer.Option(..., "-o", "--output", help="the scaled cluster spec, YAML ('-': stdout)"),
    factor: int = typer.Option(..., "-x", "--factor", help="multiply every node group's node count by this"),
) -> None:
    """Replicate a cluster N times: the same GPU types and node shapes, N times the nodes."""
    from libarena.schedule.api import scale_cluster

    scaled = scale_cluster(file, output, factor)
    Reporter().log(f"{'stdout' if str(output) == '-' else output}: {scaled.name}, {scaled.total_gpus} GPUs")


@perf_app.command("build")
def perf_build(
    cluster: Path = ClusterOpt,
    output: Path = typer.Option(..., "-o", "--output", help="performance table (Parquet; '-' = an Arrow stream on stdout)"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="build the rows every (model, batch) of this trace needs"),
    pair: list[str] = typer.Option([], "--pair", help="and/or these pairs, MODEL,GLOBAL_BATCH (repeatable)"),
    mode: str = typer.Option("auto", "--mode", help="local (profile on this device), roofline (execution-free), auto (local for tiny/small models)"),
    granularity: str = typer.Option("unit", "--granularity", help="local profiles: unit (identical layers profiled once) or stage (one executable per stage)"),
    dtype: str = typer.Option("bf16", "--dtype", help="training compute dtype of every job: bf16, fp16 (V100s have fp16 tensor cores, no bf16), fp32, tf32"),
    cache_dir: Path = typer.Option(Path(".arena-cache"), "--cache-dir", help="content-addressed caches: stage outputs (DIR/stages/, operator tables included) and stage profiles (DIR/profiles/)"),
    seed: int = typer.Option(0, "--seed", help="seed of the trace adaptation (ElasticFlow/ITP traces)"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows"),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
    no_cache: bool = typer.Option(False, "--no-cache", help="rebuild even when the stage cache has this output "
                                  "(cached operator tables and stage profiles are still reused)"),
) -> None:
    """Build the performance table a trace (or a list of pairs) needs: analyze -> plan -> profile per (model, batch)."""
    from libarena.pipeline import CacheSettings
    from libarena.pipeline.perf_build import PerfBuildConfig, parse_pair, perf_build as run_perf_build

    refuse_json_with_stdout_data(as_json, output)
    refuse_binary_to_terminal(output)
    config = PerfBuildConfig(mode=mode, dtype=dtype, granularity=granularity)
    pairs = [parse_pair(text) for text in pair]
    where = "stdout" if str(output) == "-" else str(output)
    with Reporter(quiet=quiet) as reporter:
        outcome, summary = run_perf_build(cluster, str(output), config, trace=trace, pairs=pairs, seed=seed,
                                          skip_bad_rows=skip_bad_rows, cache=CacheSettings(cache_dir, no_cache),
                                          report=reporter)
    if outcome.cache_hit:
        reporter.log(f"cached: {where} from {outcome.entry} ({outcome.rows} rows; --no-cache builds again)")
    if as_json:
        print_json({"tool": "arena-schedule perf build", **outcome.summary(), **summary,
                    "elapsed_s": round(reporter.elapsed_s(), 4)})


StateOpt = typer.Option(Path("state.db"), "--state", help="the live scheduler's state database (SQLite)")


@app.command()
def serve(
    cluster: Path = ClusterOpt,
    perf: Path = PerfOpt,
    state: Path = StateOpt,
    policy: str = PolicyOpt,
    time_compression: float = typer.Option(1.0, "--time-compression", help="scheduler seconds per wall second"),
    tick: float = typer.Option(300.0, "--tick", help="scheduling interval in scheduler seconds"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster for arena-run (ray://... or host:port)"),
    launcher: str = typer.Option("arena-run", "--launcher", help="arena-run (real jobs) or perf-table (emulated hosts)"),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="launcher and profiling files (default: STATE.d)"),
    overhead: list[str] = typer.Option([], "--overhead", help="override a modelled overhead, NAME=SECONDS, or reuse_profiles=/reuse_plans=true|false"),
    poll: float = typer.Option(0.5, "--poll", help="wall seconds between polls of submissions and profiles"),
    profile_script: Optional[str] = typer.Option(None, "--profile-script", help="shell template for profiling on "
                                                 "arrival ({model} {batch} {cluster} {out} {schedule}; {cluster} is serve's copy "
                                                 "of the cluster file, in its workdir); default: perf build --pair"),
    profile_timeout: float = typer.Option(DEFAULT_PROFILE_TIMEOUT_S, "--profile-timeout",
                                          help="wall seconds a profile on arrival may run before it is stopped and its jobs rejected"),
    profile_retry: float = typer.Option(DEFAULT_PROFILE_RETRY_S, "--profile-retry",
                                        help="wall seconds after a failed profile before a later job of its (model, batch) "
                                             "has it profiled again (until then such jobs are rejected with the same failure)"),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every",
                                                   help="arena-run: checkpoint every N steps (default: arena-run's)"),
    until_idle: bool = typer.Option(False, "--until-idle", help="exit once every submitted job is done"),
    event_passes: bool = typer.Option(True, "--event-passes/--ticks-only", help="schedule at once when a job arrives, "
                                      "starts or ends (default), or only at ticks, as the simulator does"),
) -> None:
    """Run the live scheduler: the policy against (compressed) real time, state in SQLite; survives kill -9."""
    from libarena.schedule.config import OverheadConfig
    from libarena.schedule.live.launchers import LauncherOptions
    from libarena.schedule.live.server import ServeConfig, Server
    from libarena.schedule.live.store import state_database_errors

    cfg = ServeConfig(cluster, perf, state, policy=policy, tick_s=tick, compression=time_compression,
                      launcher=launcher, workdir=workdir, overheads=OverheadConfig.from_assignments(overhead), poll_s=poll,
                      profile_script=profile_script, profile_timeout_s=profile_timeout, profile_retry_s=profile_retry,
                      launcher_options=LauncherOptions(address=address, checkpoint_every=checkpoint_every),
                      event_passes=event_passes)
    with state_database_errors(state, "the scheduler state database, or its launcher's in the work directory"):
        server = Server(cfg)
        print(f"arena-schedule: serving {state} (policy {policy}, tick {tick:g} s, compression {time_compression:g}, "
              f"launcher {launcher})", file=sys.stderr, flush=True)
        try:
            ran_to_end = server.serve(until_idle=until_idle)
        finally:
            server.close()
    if server.stop_signal is not None and not ran_to_end:  # stopped cleanly between steps, before its end
        import signal

        raise ArenaError(f"interrupted ({signal.Signals(server.stop_signal).name}): stopped serving {state}; its jobs "
                         "are kept, and serving it again resumes them")


@app.command()
def submit(
    job_file: Path = typer.Argument(..., help="job YAML ('-' = stdin): model, global_batch, iterations[, name, priority, deadline, gpu_type, num_gpus]"),
    state: Path = StateOpt,
    at: Optional[float] = typer.Option(None, "--at", help="replay: arrive at this scheduler time (seconds)"),
) -> None:
    """Submit a job to the live scheduler (through its database; the server picks it up)."""
    from libarena.schedule.live.jobfile import load_job_file
    from libarena.schedule.live.store import check_not_before, submit_job

    sub = load_job_file(job_file)
    check_not_before(at)  # before the state database is created
    print(submit_job(state, sub, not_before=at))


@app.command()
def cancel(
    jobs: list[str] = typer.Argument(..., help="job ids"),
    state: Path = StateOpt,
    reason: str = typer.Option("cancelled by the operator", "--reason", help="why (shown by status and logs)"),
) -> None:
    """Cancel jobs: the server stops their runs, frees their GPUs and schedules again at its next poll (with
    --ticks-only, at its next tick); one not yet placed never starts. Prints each job's status when asked."""
    from libarena.schedule.live.store import Store, state_database_errors

    store = Store(state)
    try:
        with state_database_errors(state):
            statuses = store.request_cancel(jobs, reason)
    finally:
        store.close()
    for job, status_now in statuses.items():
        print(f"{job}\t{status_now}")


@app.command()
def status(
    state: Path = StateOpt,
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON"),
    active: bool = typer.Option(False, "--active", help="only queued and running jobs"),
) -> None:
    """Queue, running jobs with their GPUs and plan, progress and ETA."""
    from libarena.schedule.live.status import job_rows, render
    from libarena.schedule.live.store import Store, damaged_state, state_database_errors

    store = Store(state)
    try:
        with state_database_errors(state), damaged_state(state, "its stored jobs or settings"):
            doc = job_rows(store, include_done=not active)
    finally:
        store.close()
    if as_json:
        print(strict_json(doc, indent=2, default=str))
    else:
        from rich.console import Console

        Console(file=sys.stdout, width=160).print(render(doc))


@app.command()
def logs(
    job: str = typer.Argument(..., help="job id"),
    state: Path = StateOpt,
    tail: Optional[int] = typer.Option(None, "--tail", help="only the last N events"),
    output_lines: int = typer.Option(20, "--output-lines", help="lines of the job's own output to show (0: none)"),
) -> None:
    """A job's events and decisions, then the end of its current run's output."""
    from libarena.schedule.live.status import job_output, log_lines
    from libarena.schedule.live.store import Store, damaged_state, state_database_errors

    store = Store(state)
    try:
        with state_database_errors(state), damaged_state(state, f"job {job!r}'s stored state or the settings"):
            output = job_output(store, job, state, output_lines)  # also: an unknown job is an error
            lines = log_lines(store, job, tail)
    finally:
        store.close()
    for line in lines:
        print(line)
    if output is not None:
        path, lines = output
        print(f"--- {path} (last {output_lines} lines)")
        for line in lines:
            print(line)


def main() -> None:
    run_app("arena-schedule", app)


if __name__ == "__main__":
    main()
