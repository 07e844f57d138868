"""arena-schedule: simulate scheduling policies on a trace with a performance table and a cluster spec.

    arena-schedule simulate --trace T.csv --perf perf.parquet --cluster C.yaml --policy arena -o run/
    arena-schedule compare --policies arena,fcfs,elasticflow-ls,gavel,sia --trace ... -o compare/
    arena-schedule perf build --trace T.csv --cluster C.yaml -o perf.parquet
    (simulate, compare and perf build: [--quiet] [--json] [--no-cache] [--cache-dir .arena-cache])
    arena-schedule trace stats T.csv
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
    print_json, refuse_json_with_stdout_data, run_app,
)
from libarena.errors import ArenaError
from libarena.schedule.policies import policy_names

app = typer.Typer(add_completion=False, help="AP-aware cluster scheduling: simulator, Arena and baselines.")
trace_app = typer.Typer(add_completion=False, help="Workload traces.")
perf_app = typer.Typer(add_completion=False, help="Performance tables for a trace.")
app.add_typer(trace_app, name="trace")
app.add_typer(perf_app, name="perf")

TraceOpt = typer.Option(..., "--trace", help="trace CSV (arena-ae, ElasticFlow or raw ITP format)")
PerfOpt = typer.Option(..., "--perf", help="performance table (perf_table artifact, or CSV/Parquet in its schema)")
ClusterOpt = typer.Option(..., "--cluster", help="cluster spec (YAML/TOML)")
PolicyOpt = typer.Option("arena", "--policy", help=", ".join(policy_names()))


def _workload_inputs(trace: Path, perf: Path, cluster: Path, seed: int, skip_bad_rows: bool):
    """The workload, the provenance entries of its inputs, and their cache-key entries (a perf table piped on
    stdin is keyed by its decoded content)."""
    from libarena.artifacts import input_ref
    from libarena.artifacts.stage_cache import cache_input
    from libarena.schedule.api import prepare_workload

    refs = [input_ref(trace), input_ref(perf), input_ref(cluster)]
    if str(perf) != "-":
        return prepare_workload(trace, perf, cluster, seed=seed, skip_bad_rows=skip_bad_rows), refs, refs
    from libarena.artifacts import read_table
    from libarena.artifacts.kinds.perf_table import check_perf_table
    from libarena.hardware import load_cluster
    from libarena.schedule.perf import PerfLookup

    spec = load_cluster(cluster)
    art = read_table("-", "perf_table")
    check_perf_table(art.table, art.source)
    workload = prepare_workload(trace, PerfLookup(art.table, spec, source=art.source), spec, seed=seed,
                                skip_bad_rows=skip_bad_rows)
    return workload, refs, [refs[0], cache_input("-", art), refs[2]]


def _read_metrics(path: Path) -> dict:
    """metrics.json as written (NaN stored as null), with null numbers back to NaN for the text summaries."""
    doc = json.loads(path.read_text())
    return {k: (float("nan") if v is None else v) for k, v in doc.items()}


def _overheads(pairs: list[str]):
    import dataclasses

    from libarena.schedule.config import OverheadConfig

    base = OverheadConfig()
    names = {f.name for f in dataclasses.fields(base)}
    updates = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in names:
            raise ArenaError(f"--overhead {pair!r}: expected NAME=SECONDS with NAME one of {', '.join(sorted(names))}")
        try:
            updates[key] = float(value)
        except ValueError:
            raise ArenaError(f"--overhead {pair!r}: {value!r} is not a number") from None
    return dataclasses.replace(base, **updates)


def _sim_config(tick: float, horizon: Optional[float], seed: int, overhead: list[str]):
    from libarena.schedule.config import SimulatorConfig

    cfg = SimulatorConfig(tick_s=tick, horizon_s=horizon, seed=seed, overheads=_overheads(overhead))
    cfg.validate()
    return cfg


def _policy_options(view, objective, no_hetero, no_elastic, no_pruning, no_profiler, queues, search_depth,
                    promotion_time, max_gpus) -> dict:
    from libarena.schedule.config import Objective

    opts: dict = {"view": view, "max_gpus_per_job": max_gpus}
    if objective is not None:
        try:
            opts["objective"] = Objective(objective)
        except ValueError:
            raise ArenaError(f"--objective {objective!r}: expected one of {', '.join(o.value for o in Objective)}") from None
    if no_hetero:
        opts["hetero"] = False
    if no_elastic:
        opts["elastic"] = False
    if no_pruning:
        opts["pruning"] = False
    if no_profiler:
        opts["profiler"] = False
    opts.update(num_queues=queues, search_depth=search_depth, promotion_time_s=promotion_time)
    return opts


def _summary_line(m: dict) -> str:
    return (f"{m['policy']}: {m['finished_jobs']}/{m['submitted_jobs']} finished ({m['unfinished_jobs']} unfinished, "
            f"{m['dropped_jobs']} dropped), avg JCT {m['avg_jct_s'] / 3600:.2f} h, avg queuing "
            f"{m['avg_queuing_s'] / 3600:.2f} h, avg throughput {m['avg_throughput']:.1f} samples/s, peak "
            f"{m['peak_throughput']:.1f}, {m['reschedules_per_job']:.2f} reschedules/job, simulated in "
            f"{m['simulation_wall_s']:.1f} s")


@app.command()
def simulate(
    trace: Path = TraceOpt,
    perf: Path = PerfOpt,
    cluster: Path = ClusterOpt,
    policy: str = PolicyOpt,
    output: Path = typer.Option(..., "-o", "--output", help="output directory"),
    view: Optional[str] = typer.Option(None, "--view", help="decision view: arena, dp, ap, dp-linear (default: the policy's)"),
    objective: Optional[str] = typer.Option(None, "--objective", help="arena: throughput, deadline, fairness"),
    no_hetero: bool = typer.Option(False, "--no-hetero", help="arena ablation: no GPU-type switching"),
    no_elastic: bool = typer.Option(False, "--no-elastic", help="arena ablation: no GPU-count scaling"),
    no_pruning: bool = typer.Option(False, "--no-pruning", help="arena ablation: full AP search at every (re)launch"),
    no_profiler: bool = typer.Option(False, "--no-profiler", help="arena ablation: full DP profiling before first launch"),
    queues: Optional[int] = typer.Option(None, "--queues", help="arena: number of priority queues P (3)"),
    search_depth: Optional[int] = typer.Option(None, "--search-depth", help="arena: search depth D (3)"),
    promotion_time: Optional[float] = typer.Option(None, "--promotion-time", help="arena: seconds before promotion"),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus-per-job", help="largest GPU count per job (16)"),
    tick: float = typer.Option(300.0, "--tick", help="scheduling interval in seconds"),
    horizon: Optional[float] = typer.Option(None, "--horizon", help="stop this many seconds after the first submission"),
    seed: int = typer.Option(0, "--seed", help="seed for trace adaptation"),
    overhead: list[str] = typer.Option([], "--overhead", help="override an overhead, NAME=SECONDS (repeatable)"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows", help="skip bad trace rows, with a count"),
    plot: bool = typer.Option(False, "--plot", help="also write PNG figures"),
    as_json: bool = typer.Option(False, "--json", help="print the metrics and a summary (output, cache, elapsed_s) as JSON on stdout"),
    quiet: bool = QUIET_OPTION,
    no_cache: bool = NO_CACHE_OPTION,
    cache_dir: Optional[Path] = CACHE_DIR_OPTION,
) -> None:
    """Simulate one policy; writes jobs.parquet, timeseries.parquet, decisions.msgpack, metrics.json."""
    from dataclasses import asdict

    from libarena.artifacts.stage_cache import StageCache, library_versions
    from libarena.schedule.api import make_policy, run_policy, write_run

    cfg = _sim_config(tick, horizon, seed, overhead)
    pol = make_policy(policy, **_policy_options(view, objective, no_hetero, no_elastic, no_pruning, no_profiler,
                                                queues, search_depth, promotion_time, max_gpus))
    workload, refs, key_inputs = _workload_inputs(trace, perf, cluster, seed, skip_bad_rows)
    _report_skipped(workload.skipped)
    params = {"policy": policy, "view": pol.view, "tick_s": tick, "horizon_s": horizon, "seed": seed,
              "overheads": cfg.overheads.__dict__, "policy_config": {k: str(v) for k, v in pol.config.__dict__.items()}}
    with Reporter(quiet=quiet) as reporter:
        cache = StageCache(cache_dir, "arena-schedule simulate", refresh=no_cache, log=reporter.log, warn=reporter.warn)
        key = cache.key({**params, "simulator": asdict(cfg), "skip_bad_rows": skip_bad_rows, "plot": plot}, key_inputs,
                        library_versions("matplotlib") if plot else None, code=[__file__])

        def produce() -> None:
            res = run_policy(workload, pol, cfg, progress=reporter.progress)
            write_run(output, res, workload, cfg, params, refs, plot)

        outcome = cache.produce_tree(key, output, produce)
    metrics = _read_metrics(output / "metrics.json")
    if outcome.cache_hit:
        reporter.log(f"cached: {output}/ from {outcome.entry} ({len(outcome.files)} files; --no-cache simulates again)")
    reporter.log(_summary_line(metrics))
    if as_json:
        from libarena.schedule.metrics import json_safe

        print_json({**json_safe(metrics), "tool": "arena-schedule simulate", **outcome.summary(),
                    "elapsed_s": round(reporter.elapsed_s(), 4)})


def _report_skipped(skipped: list[str]) -> None:
    if skipped:
        print(f"skipped {len(skipped)} bad row(s); first: {skipped[0]}", file=sys.stderr)


@app.command()
def compare(
    policies: str = typer.Option("arena,fcfs,elasticflow-ls,gavel,sia", "--policies", help="comma-separated policies"),
    trace: Path = TraceOpt,
    perf: Path = PerfOpt,
    cluster: Path = ClusterOpt,
    output: Path = typer.Option(..., "-o", "--output", help="output directory (one sub-directory per policy)"),
    tick: float = typer.Option(300.0, "--tick"),
    horizon: Optional[float] = typer.Option(None, "--horizon"),
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
    from dataclasses import asdict

    from libarena.artifacts import write_json
    from libarena.artifacts.stage_cache import StageCache, library_versions
    from libarena.progress import ProgressUpdate
    from libarena.schedule.api import make_policy, run_policy, write_run
    from libarena.schedule.compare import compare_json, compare_table

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names or len(set(names)) != len(names):
        raise ArenaError(f"--policies {policies!r}: give distinct policy names separated by commas")
    cfg = _sim_config(tick, horizon, seed, overhead)
    pols = {name: make_policy(name) for name in names}
    workload, inputs, key_inputs = _workload_inputs(trace, perf, cluster, seed, skip_bad_rows)
    _report_skipped(workload.skipped)
    with Reporter(quiet=quiet) as reporter:
        cache = StageCache(cache_dir, "arena-schedule compare", refresh=no_cache, log=reporter.log, warn=reporter.warn)
        key = cache.key({"policies": names, "policy_configs": {n: {k: str(v) for k, v in p.config.__dict__.items()}
                                                               for n, p in pols.items()},
                         "tick_s": tick, "horizon_s": horizon, "seed": seed, "simulator": asdict(cfg),
                         "skip_bad_rows": skip_bad_rows, "plot": plot}, key_inputs,
                        library_versions("matplotlib") if plot else None, code=[__file__])

        def produce() -> None:
            output.mkdir(parents=True, exist_ok=True)
            metrics, runs = {}, {}
            for i, (name, pol) in enumerate(pols.items()):
                reporter.progress(ProgressUpdate("policies", i, len(pols), name))
                res = run_policy(workload, pol, cfg, progress=reporter.progress)
                params = {"policy": name, "view": pol.view, "tick_s": tick, "horizon_s": horizon, "seed": seed}
                metrics[name] = write_run(output / name, res, workload, cfg, params, inputs)
                runs[name] = res
                reporter.log(_summary_line(metrics[name]))
            reporter.progress(ProgressUpdate("policies", len(pols), len(pols)))
            write_json(output / "compare.json", compare_json(metrics))
            if plot:
                from libarena.schedule.plots import plot_runs

                plot_runs(runs, output)

        outcome = cache.produce_tree(key, output, produce)
    metrics = {name: _read_metrics(output / name / "metrics.json") for name in names}
    if outcome.cache_hit:
        reporter.log(f"cached: {output}/ from {outcome.entry} ({len(outcome.files)} files; --no-cache simulates again)")
        for name in names:
            reporter.log(_summary_line(metrics[name]))
    if as_json:
        doc = json.loads((output / "compare.json").read_text())
        print_json({**doc, "tool": "arena-schedule compare", **outcome.summary(),
                    "elapsed_s": round(reporter.elapsed_s(), 4)})
    else:
        from rich.console import Console

        Console(file=sys.stdout, width=160).print(compare_table(metrics))


@app.command("policies")
def list_policies() -> None:
    """List the registered policies and their decision views."""
    from libarena.schedule.policies import get_policy

    for name in policy_names():
        cls = get_policy(name)
        print(f"{name:16s} view={cls.default_view:10s} {cls.description}")


@trace_app.command("stats")
def trace_stats_cmd(
    file: Path = typer.Argument(..., help="trace CSV"),
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
    _report_skipped(tr.skipped)
    stats = trace_stats(tr)
    if as_json:
        print(json.dumps(stats, indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{file} ({stats['format']}{', adapted' if stats['adapted'] else ''})", show_header=False)
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


@perf_app.command("build")
def perf_build(
    trace: Path = TraceOpt,
    cluster: Path = ClusterOpt,
    output: Path = typer.Option(..., "-o", "--output"),
    mode: str = typer.Option("auto", "--mode", help="local (profile on this device), roofline (execution-free), auto (local for tiny/small models)"),
    cache_dir: Path = typer.Option(Path(".arena-cache"), "--cache-dir", help="content-addressed caches: operator tables, stage profiles, and whole outputs (DIR/stages/)"),
    seed: int = typer.Option(0, "--seed", help="seed of the trace adaptation (ElasticFlow/ITP traces)"),
    skip_bad_rows: bool = typer.Option(False, "--skip-bad-rows"),
    quiet: bool = QUIET_OPTION,
    as_json: bool = JSON_OPTION,
    no_cache: bool = typer.Option(False, "--no-cache", help="rebuild even when the stage cache has this output "
                                  "(cached operator tables and stage profiles are still reused)"),
) -> None:
    """Build the performance table a trace needs (analyze -> plan -> profile per (model, batch) and GPU type)."""
    from dataclasses import asdict

    from libarena.artifacts import input_ref
    from libarena.artifacts.stage_cache import StageCache, library_versions
    from libarena.hardware import load_cluster
    from libarena.profile.perf_build import PerfBuildConfig
    from libarena.schedule.perf_build import build_perf_table_for_trace, trace_pairs

    refuse_json_with_stdout_data(as_json, output)
    spec = load_cluster(cluster)
    config = PerfBuildConfig(mode=mode, cache_dir=cache_dir)
    inputs = [input_ref(trace), input_ref(cluster)]
    pairs = trace_pairs(trace, spec, seed, skip_bad_rows)  # reads and checks the trace before the key
    device = None
    if mode != "roofline":  # local profiles measure this machine: its device is part of the key
        from libarena.profile import resolve_device

        device = resolve_device("local").describe()
    where = "stdout" if str(output) == "-" else str(output)
    with Reporter(quiet=quiet) as reporter:
        cache = StageCache(cache_dir, "arena-schedule perf build", refresh=no_cache, log=reporter.log, warn=reporter.warn)
        key = cache.key({**{k: v for k, v in asdict(config).items() if k != "cache_dir"}, "seed": seed,
                         "skip_bad_rows": skip_bad_rows, "device": device}, inputs,
                        library_versions("jax", "jaxlib", "scipy", "highspy"), code=[__file__])

        def produce(path: str) -> None:
            table = build_perf_table_for_trace(trace, spec, path, config, seed, skip_bad_rows, inputs, reporter.log,
                                               reporter.progress)
            reporter.log(f"wrote {table.num_rows} performance rows to {where}")

        outcome = cache.produce_table(key, str(output), produce)
    if outcome.cache_hit:
        reporter.log(f"cached: {where} from {outcome.entry} ({outcome.rows} rows; --no-cache builds again)")
    if as_json:
        print_json({"tool": "arena-schedule perf build", **outcome.summary(), "pairs": [list(p) for p in pairs],
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
    overhead: list[str] = typer.Option([], "--overhead", help="override a modelled overhead, NAME=SECONDS"),
    poll: float = typer.Option(0.5, "--poll", help="wall seconds between polls of submissions and profiles"),
    profile_script: Optional[str] = typer.Option(None, "--profile-script", help="shell template for profiling on "
                                                 "arrival ({model} {batch} {cluster} {out}); default analyze|plan|profile"),
    checkpoint_every: int = typer.Option(10, "--checkpoint-every", help="arena-run: checkpoint every N steps"),
    until_idle: bool = typer.Option(False, "--until-idle", help="exit once every submitted job is done"),
) -> None:
    """Run the live scheduler: the policy against (compressed) real time, state in SQLite; survives kill -9."""
    from libarena.schedule.live.server import ServeConfig, Server

    cfg = ServeConfig(cluster, perf, state, policy=policy, tick_s=tick, compression=time_compression,
                      launcher=launcher, workdir=workdir, address=address, overheads=_overheads(overhead), poll_s=poll,
                      profile_script=profile_script, launcher_options={"checkpoint_every": checkpoint_every})
    server = Server(cfg)
    print(f"arena-schedule: serving {state} (policy {policy}, tick {tick:g} s, compression {time_compression:g}, "
          f"launcher {launcher})", file=sys.stderr, flush=True)
    try:
        server.serve(until_idle=until_idle)
    finally:
        server.close()


@app.command()
def submit(
    job_file: Path = typer.Argument(..., help="job YAML: model, global_batch, iterations[, name, priority, deadline, gpu_type, num_gpus]"),
    state: Path = StateOpt,
    at: Optional[float] = typer.Option(None, "--at", help="replay: arrive at this scheduler time (seconds)"),
) -> None:
    """Submit a job to the live scheduler (through its database; the server picks it up)."""
    from libarena.schedule.live.jobfile import load_job_file
    from libarena.schedule.live.store import Store

    sub = load_job_file(job_file)
    if at is not None and not at >= 0:
        raise ArenaError(f"--at must be >= 0 scheduler seconds, got {at}")
    store = Store(state, create=True)  # a job may be submitted before the server first starts
    try:
        print(store.submit(sub, not_before=at))
    finally:
        store.close()


@app.command()
def status(
    state: Path = StateOpt,
    as_json: bool = typer.Option(False, "--json", help="print the status as JSON"),
    active: bool = typer.Option(False, "--active", help="only queued and running jobs"),
) -> None:
    """Queue, running jobs with their GPUs and plan, progress and ETA."""
    from libarena.schedule.live.status import job_rows, render
    from libarena.schedule.live.store import Store

    store = Store(state)
    try:
        doc = job_rows(store, include_done=not active)
    finally:
        store.close()
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
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
    from libarena.schedule.live.status import log_lines
    from libarena.schedule.live.store import Store

    store = Store(state)
    try:
        row = store.job(job)
        if row is None:
            raise ArenaError(f"{state}: no job {job!r}")
        for line in log_lines(store, job, tail):
            print(line)
        snap = (row["state"] or {}).get("snapshot") or {}
        workdir = Path(store.get_meta("workdir") or state.with_name(state.name + ".d"))
    finally:
        store.close()
    out = workdir / "launcher" / "jobs" / job / f"v{snap.get('version', 0)}" / "output.log"
    if output_lines > 0 and out.exists():
        print(f"--- {out} (last {output_lines} lines)")
        for line in out.read_text(errors="replace").splitlines()[-output_lines:]:
            print(line)


def main() -> None:
    run_app("arena-schedule", app)


if __name__ == "__main__":
    main()
