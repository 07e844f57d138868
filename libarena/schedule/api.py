"""Entry points used by the CLI, the benchmark and the tests: prepare a workload and run a policy."""

from __future__ import annotations

import dataclasses
import os
from enum import Enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from libarena.checks import brief
from libarena.errors import ArenaError
from libarena.hardware import ClusterSpec, load_cluster
from libarena.progress import ProgressCallback
from libarena.schedule.config import SimulatorConfig
from libarena.schedule.entities import JobSpec
from libarena.schedule.perf import PerfLookup, load_perf
from libarena.schedule.policies import Policy, get_policy
from libarena.schedule.simulator import SimulationResult, Simulator
from libarena.schedule.traces import Trace, read_trace, read_trace_input


@dataclass
class Workload:
    trace: Trace
    perf: PerfLookup
    cluster: ClusterSpec
    jobs: list[JobSpec]
    skipped: list[str] = field(default_factory=list)


def make_policy(name: str, **options: Any) -> Policy:
    """Instantiate a registered policy; options set fields of its config class (None = keep the default)."""
    cls = get_policy(name)
    base = cls.default_config() if hasattr(cls, "default_config") else cls.config_class()
    fields = {f.name for f in dataclasses.fields(base)}
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise ArenaError(f"policy {name!r} has no option {', '.join(unknown)} (its options: {', '.join(sorted(fields))})")
    for key, value in given.items():
        default = getattr(base, key)
        if isinstance(default, bool) and not isinstance(value, bool):  # a sweep spec's hetero: "yes" is not true
            raise ArenaError(f"policy {name!r} option {key}: expected true or false, got {brief(value)}")
        if isinstance(default, Enum) and not isinstance(value, Enum):  # e.g. --objective deadline
            try:
                given[key] = type(default)(value)
            except ValueError:
                raise ArenaError(f"{key} {value!r}: expected one of {', '.join(o.value for o in type(default))}") from None
        # a spec's numbers as the field's type: search_depth 3.0 runs as 3 (the range checks accept a whole
        # float, a slice or range() would not), trade_margin 5 as 5.0 (keyed and recorded as --trade-margin 5 is);
        # anything else is left for the config's own range check to refuse by name
        elif type(default) is int and isinstance(value, float) and value.is_integer():
            given[key] = int(value)
        elif type(default) is float and type(value) is int:
            given[key] = float(value)
    return cls(dataclasses.replace(base, **given))


def load_workload(trace: Path, perf: Path, cluster: Path, *, seed: int = 0,
                  skip_bad_rows: bool = False) -> tuple[Workload, list[dict[str, Any]], list[dict[str, Any]]]:
    """The workload of a trace, a performance table (``-``: piped on stdin) and a cluster spec, with the
    provenance entries of the inputs and their cache-key entries (a table piped on stdin is keyed by its
    decoded content).

    Each input is read once and its digest taken of the bytes that are parsed: a file replaced between a
    digest and a read would have had its results cached (and recorded) under the old content's digest."""
    from libarena.artifacts import read_table
    from libarena.artifacts.kinds.perf_table import check_perf_table
    from libarena.artifacts.stage_cache import cache_input
    from libarena.hardware import load_cluster_input

    if str(trace) == "-" and str(perf) == "-":
        raise ArenaError("--trace - and --perf -: only one input can come from stdin")
    # read in the order errors were always reported in: stdin first, then the cluster, the table, the trace file
    if str(trace) == "-":  # keyed by its content, as a table piped on stdin is
        trace_text, trace_ref = read_trace_input(trace)
    spec, cluster_ref = load_cluster_input(cluster)
    art = read_table(perf, "perf_table")
    check_perf_table(art.table, art.source)
    perf_ref = cache_input(perf, art)  # a piped table is named by its decoded content
    if str(trace) != "-":
        trace_text, trace_ref = read_trace_input(trace)
    workload = prepare_workload(trace, PerfLookup(art.table, spec, source=art.source), spec, seed=seed,
                                skip_bad_rows=skip_bad_rows, trace_text=trace_text)
    refs = [trace_ref, perf_ref, cluster_ref]
    return workload, refs, list(refs)


def prepare_workload(trace: str | os.PathLike[str] | Trace, perf: str | os.PathLike[str] | PerfLookup,
                     cluster: str | os.PathLike[str] | ClusterSpec, *, seed: int = 0,
                     skip_bad_rows: bool = False, trace_text: str | None = None) -> Workload:
    """Read the inputs and check every job against the cluster and the performance table.

    Bad jobs (GPU type not in the cluster, (model, batch) missing from the table, no configuration that
    fits the cluster) fail with one line naming file, row and column, or are skipped with --skip-bad-rows.
    """
    cluster_spec = cluster if isinstance(cluster, ClusterSpec) else load_cluster(cluster)
    lookup = perf if isinstance(perf, PerfLookup) else load_perf(perf, cluster_spec)
    tr = trace if isinstance(trace, Trace) else read_trace(
        trace, gpu_types=lookup.gpu_types, seed=seed, rate=lookup.submitted_rate, skip_bad_rows=skip_bad_rows,
        text=trace_text)
    skipped = list(tr.skipped)
    missing = lookup.lacking(tr.jobs, tr.source, skip=skip_bad_rows)
    jobs = []
    for spec in tr.jobs:
        if (spec.model, spec.global_batch) in missing:
            skipped.append(lookup.lacking_message(spec, tr.source))
            continue
        problem = None
        if spec.requested_type not in lookup.type_index:
            problem = (f"{tr.source}: row {spec.row}, column 'gpu_type': GPU type {spec.requested_type!r} is not in "
                       f"cluster {cluster_spec.name} ({', '.join(lookup.gpu_types)})")
        else:
            truth = lookup.get(spec.model, spec.global_batch).truth
            fits = any(truth[t, c] > 0 and (1 << c) <= lookup.capacity[t]
                       for t in range(truth.shape[0]) for c in range(truth.shape[1]))
            if not fits:
                problem = (f"{tr.source}: row {spec.row}, column 'model_name': {spec.model} (batch {spec.global_batch}) "
                           f"cannot run on any configuration of cluster {cluster_spec.name} in {lookup.source}")
        if problem:
            if not skip_bad_rows:
                raise ArenaError(problem)
            skipped.append(problem)
            continue
        jobs.append(spec)
    if not jobs:
        raise ArenaError(f"{tr.source}: no job can run on cluster {cluster_spec.name} ({len(skipped)} skipped)")
    return Workload(tr, lookup, cluster_spec, jobs, skipped)


def scale_cluster(source: str | os.PathLike[str], output: str | os.PathLike[str], factor: int) -> ClusterSpec:
    """``arena-schedule cluster scale``: :func:`libarena.hardware.write_scaled_cluster`, refusing before anything is
    written a spec the simulator cannot place jobs on (GPUs per node not a power of two, node sizes mixed within a
    GPU type), as ``simulate`` would refuse the scaled spec."""
    from libarena.hardware import write_scaled_cluster
    from libarena.schedule.entities.cluster import ClusterState

    spec = load_cluster(source)
    ClusterState(spec, spec.gpu_types)  # its pools refuse what buddy placement cannot take
    return write_scaled_cluster(source, output, factor)


def run_policy(workload: Workload, policy: Policy, config: SimulatorConfig | None = None,
               progress: ProgressCallback | None = None) -> SimulationResult:
    sim = Simulator(workload.jobs, workload.perf, workload.cluster, policy, config, trace_source=workload.trace.source,
                    progress=progress)
    return sim.run()


def policy_parameters(policy: Policy) -> dict[str, str]:
    return {k: str(v) for k, v in policy.config.__dict__.items()}


def run_parameters(policy: Policy, config: SimulatorConfig) -> dict[str, Any]:
    """The parameters a simulation's outputs record (their provenance; simulate keys its cache on them too)."""
    return {"policy": policy.name, "view": policy.view, "tick_s": config.tick_s, "horizon_s": config.horizon_s,
            "start_s": config.start_s, "max_ticks": config.max_ticks, "seed": config.seed,
            "overheads": config.overheads.__dict__, "policy_config": policy_parameters(policy)}


#: The files a run (simulate) and a comparison (compare) write into their output directory, besides figures
#: (*.png); an existing output directory holding anything else is not replaced (libarena.artifacts.atomic_directory).
RUN_FILES = ("jobs.parquet", "timeseries.parquet", "decisions.msgpack", "metrics.json")
COMPARE_FILES = ("compare.json", "table.txt")


def is_output_file(relative: str) -> bool:
    """Whether a file under a simulate/compare output directory is one they write, by its place: a run's files
    and figures at the top, compare's files beside them and each policy's run in a directory named after it,
    and the temp files (``.<one of those>.<pid>.<random>.tmp``) a killed run left. Anything else is the user's
    and keeps the directory from being replaced (a name alone is not enough: ``photos/2024/holiday.png``)."""
    from libarena.schedule.plots import FIGURES
    from libarena.schedule.policies import policy_names

    parts = Path(relative).parts
    if len(parts) == 2 and parts[0] not in policy_names():
        return False
    if not 1 <= len(parts) <= 2:
        return False
    name = parts[-1]
    known = {*RUN_FILES, *FIGURES, *(COMPARE_FILES if len(parts) == 1 else ())}
    if name.startswith(".") and name.endswith(".tmp"):
        target = name[1:-len(".tmp")].rsplit(".", 2)[0]
        return target in known
    return name in known


def write_run(out_dir: str | os.PathLike[str], res: SimulationResult, workload: Workload, config: SimulatorConfig,
              parameters: dict[str, Any], inputs: list[dict[str, Any]], plot: bool = False) -> dict:
    """Write jobs.parquet, timeseries.parquet, decisions.msgpack, metrics.json (and PNGs) into out_dir."""
    from libarena.artifacts import Provenance, write_document, write_json_document, write_table
    from libarena.schedule.metrics import job_records, json_safe, summarize, timeseries

    out = Path(out_dir)
    out.mkdir(exist_ok=True)  # its parent is the output being built
    records = job_records(res)
    metrics = summarize(res, records)
    metrics["skipped_rows"] = len(workload.skipped)
    prov = Provenance(tool="arena-schedule", parameters=parameters, inputs=inputs)
    write_table(out / "jobs.parquet", "job_records", records, prov,
                {"policy": res.policy, "view": res.view, "cluster": workload.cluster.name, "metrics": json_safe(metrics)})
    write_table(out / "timeseries.parquet", "timeseries", timeseries(res), prov,
                {"policy": res.policy, "tick_s": config.tick_s, "total_gpus": res.total_gpus})
    doc = dict(res.decisions)
    doc.update(policy=res.policy, view=res.view, gpu_types=res.gpu_types, job_ids=[j.spec.job_id for j in res.jobs])
    write_document(out / "decisions.msgpack", "decisions", doc, prov)
    write_json_document(out / "metrics.json", "run_metrics", json_safe(metrics), prov)
    if plot:
        from libarena.schedule.plots import plot_runs

        plot_runs({res.policy: res}, out)
    return metrics
