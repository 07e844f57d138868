"""``arena-schedule sweep``: the simulations of a sweep (libarena.schedule.sweep), each a Ray task.

Each simulation is what ``arena-schedule simulate`` runs, cached under the same key in the same stage cache
(``<cache-dir>/stages/arena-schedule-simulate/``): a sweep serves what ``simulate`` or an earlier sweep
computed, and the other way round, where ``simulate`` was given the inputs by their absolute paths (a key
names each input's path as well as its content, so that a served output's provenance names the right file;
the sweep makes its paths absolute). The driver looks every simulation up first and restores the hits; only
the misses become tasks, so a sweep whose simulations are all cached starts no Ray at all (nor one with a
single simulation to run: it runs in process). A task runs the
simulation and returns its output files (bytes), which the driver writes under the sweep's output and
stores in the cache: workers need Arena and the input files at the same paths (input paths are made
absolute; on a multi-node cluster, a shared filesystem), never the output folder or the cache.

Executors: :class:`RayExecutor` (the embedded local Ray with ``num_cpus`` workers, or the cluster at
``address``) and :class:`SequentialExecutor` (in this process, one after another). Both give the same
files: a simulation is a pure function of its inputs. Progress is logged per finished simulation; a failed
one (a bad trace row, a worker that died) is reported and recorded in ``sweep.json`` while the others run on,
and the sweep then ends with an error naming it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from libarena.artifacts.io import foreign_files, input_ref, remove_stale_temps
from libarena.errors import ArenaError
from libarena.pipeline.cache import CacheSettings
from libarena.pipeline.schedule import SIMULATE_STAGE, simulation_build, simulation_key
from libarena.progress import ProgressUpdate, Report, SilentReport

SUMMARY = "sweep.json"


# -- the worker's side ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulationTask:
    """One simulation, as plain data (it crosses to a Ray worker)."""

    trace: str
    perf: str
    cluster: str
    policy: str
    options: dict[str, Any]
    config: Any  # SimulatorConfig
    skip_bad_rows: bool
    #: the trace's, table's and cluster's references (sha256) the sweep keyed this simulation on
    expected_inputs: tuple[dict[str, Any], ...] = ()
    #: the driver's code and libraries, which the key holds (libarena.pipeline.schedule.simulation_build)
    expected_build: dict[str, Any] = field(default_factory=dict)


@dataclass
class SimulationFiles:
    """A finished simulation: its output files (name -> bytes) and the trace rows it left out."""

    files: dict[str, bytes]
    skipped: list[str]
    #: the trace's warning about columns it does not read (Trace.ignored_columns_note)
    trace_note: str | None = None


@dataclass
class SimulationFailure:
    message: str
    detail: str = ""


def run_simulation_task(task: SimulationTask) -> SimulationFiles | SimulationFailure:
    """Simulate and return the files ``arena-schedule simulate`` would write (never raises)."""
    from libarena.schedule.api import load_workload, make_policy, run_parameters, run_policy, write_run

    try:
        if task.expected_build:
            here = simulation_build()
            differ = [what for what in ("code", "libraries") if here.get(what) != task.expected_build.get(what)]
            if differ:
                # e.g. another node's install, or libarena edited since the sweep began
                return SimulationFailure(f"this worker runs other {' and '.join(differ)} than the sweep's driver "
                                         f"(libraries here: {here['libraries']}); its result would be cached as the "
                                         f"driver's")
        workload, refs, _ = load_workload(Path(task.trace), Path(task.perf), Path(task.cluster), seed=task.config.seed,
                                          skip_bad_rows=task.skip_bad_rows)
        for expected, read in zip(task.expected_inputs, refs):
            # the output is stored under the sweep's key: it must come from the bytes that key names (an input
            # rewritten since the sweep began, or another node's copy of it, would be cached as the original's)
            if expected.get("sha256") != read.get("sha256"):
                return SimulationFailure(f"{read.get('path')} is not the file the sweep started with (its content "
                                         f"changed, or this node's copy differs)")
        policy = make_policy(task.policy, **task.options)
        res = run_policy(workload, policy, task.config)
        # ignore_cleanup_errors: at an interrupt the process may exit while a helper thread still writes here
        with tempfile.TemporaryDirectory(prefix="arena-sweep-", ignore_cleanup_errors=True) as tmp:
            write_run(tmp, res, workload, task.config, run_parameters(policy, task.config), refs)
            files = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
        return SimulationFiles(files, list(workload.skipped), workload.trace.ignored_columns_note())
    except ArenaError as exc:
        return SimulationFailure(" ".join(str(exc).split()))
    except Exception as exc:  # noqa: BLE001 - an internal error fails this simulation only; the sweep goes on
        return SimulationFailure(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())}",
                                 traceback.format_exc())


# -- executors -----------------------------------------------------------------------------------------------


class Executor(Protocol):
    def map_unordered(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[tuple[int, Any]]:
        """``(i, fn(items[i]))`` for every item, in the order they finish."""


class SequentialExecutor:
    """Every task in this process, one after another."""

    def map_unordered(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[tuple[int, Any]]:
        for i, item in enumerate(items):
            yield i, fn(item)


@dataclass(frozen=True)
class RayExecutor:
    """Every task a Ray task of one CPU: on the cluster at ``address``, else on an embedded local Ray with
    ``num_cpus`` CPUs (default: this machine's). A Ray error of one task (its worker died) is its failure.

    Starting the embedded Ray takes seconds; meanwhile the driver runs tasks itself (in a thread), from the end
    of the list (a sweep lists the costliest first: the driver takes short ones, and none is left running long
    after Ray is up), and stops taking new ones once Ray is up: every later task is a Ray task."""

    address: str | None = None
    num_cpus: int | None = None

    def __post_init__(self) -> None:
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ArenaError(f"--num-cpus must be >= 1, got {self.num_cpus}")

    def map_unordered(self, fn: Callable[[Any], Any], items: list[Any]) -> Iterator[tuple[int, Any]]:
        import queue
        import threading
        from collections import deque

        import ray

        from libarena.run.cluster import LocalClusterConfig, connect

        todo = deque(range(len(items)))
        lock = threading.Lock()
        ray_up = threading.Event()
        local: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        def help_while_ray_starts() -> None:
            while not ray_up.is_set():
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                try:
                    local.put((i, fn(items[i])))
                except BaseException as exc:  # noqa: BLE001 - every taken task must report back, or the loop waits
                    local.put((i, SimulationFailure(f"internal error: {type(exc).__name__}: {exc}")))

        helper = None
        if self.address is None and not ray.is_initialized():
            helper = threading.Thread(target=help_while_ray_starts, name="sweep-while-ray-starts", daemon=True)
            helper.start()
        try:
            started = connect(self.address, LocalClusterConfig(num_cpus=self.num_cpus or os.cpu_count() or 1,
                                                               num_devices=0))
        finally:
            ray_up.set()
        try:
            remote = ray.remote(num_cpus=1)(fn)
            with lock:
                pending = {remote.remote(items[i]): i for i in todo}
                todo.clear()
            remaining = len(items)
            while remaining:
                while not local.empty():
                    remaining -= 1
                    yield local.get()
                if pending:
                    helping = helper is not None and helper.is_alive()
                    done, _ = ray.wait(list(pending), num_returns=1, timeout=0.1 if helping else None)
                    for ref in done:
                        i = pending.pop(ref)
                        try:
                            result = ray.get(ref)
                        except Exception as exc:  # noqa: BLE001 - the task's worker died: this task failed
                            first = (str(exc).strip().splitlines() or [""])[0]
                            result = SimulationFailure(f"Ray: {type(exc).__name__}: {first}", str(exc))
                        remaining -= 1
                        yield i, result
                elif remaining:
                    remaining -= 1
                    yield local.get()  # the last ones are the driver's own
        finally:
            if started:
                ray.shutdown()


# -- the driver ----------------------------------------------------------------------------------------------


@dataclass
class SweepRecord:
    """What became of one simulation of the sweep."""

    label: str
    #: the comparison it belongs to (a folder under the output)
    group: str
    trace: str
    variant: str
    seed: int
    policy: str
    output: str
    status: str = "pending"  # cached, simulated or failed
    error: str | None = None
    #: a failure's traceback (internal errors) or Ray's full report
    detail: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepSummary:
    output: str
    records: list[SweepRecord]
    #: provenance entries (path, sha256) of the spec file, the cluster spec, the traces and the performance tables
    inputs: list[dict[str, Any]] = field(default_factory=list)
    #: the comparisons written (group folder -> policies), those left out for a failed simulation
    groups: dict[str, list[str]] = field(default_factory=dict)
    incomplete_groups: list[str] = field(default_factory=list)
    #: per comparison written: each policy's jobs-both-finished figures against the reference policy
    paired: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.records)

    def comparison(self, group: str) -> dict[str, dict[str, Any]]:
        """The metrics of one comparison written, by policy."""
        return {r.policy: r.metrics for r in self.records if r.group == group}

    @property
    def failed(self) -> list[SweepRecord]:
        return [r for r in self.records if r.status == "failed"]

    def to_dict(self) -> dict[str, Any]:
        """The fields of sweep.json (a sweep_summary document, libarena.artifacts.kinds.sweep_summary); its inputs
        are in the header (``provenance``)."""
        from libarena.schedule.metrics import json_safe

        return {"output": self.output, "total": len(self.records), "cached": self.count("cached"),
                "simulated": self.count("simulated"), "failed": self.count("failed"),
                "comparisons": self.groups, "incomplete_comparisons": self.incomplete_groups,
                "simulations": [{**r.__dict__, "metrics": json_safe(r.metrics)} for r in self.records]}


def _costliest_first(indices: Iterable[int], tasks: list[SimulationTask]) -> list[int]:
    """The simulations by expected cost, highest first (trace size x the policy's relative cost), so the
    longest do not start last; the results do not depend on the order."""
    from libarena.schedule.policies import get_policy

    size = {t.trace: os.path.getsize(t.trace) for t in tasks}
    return sorted(indices, key=lambda i: -size[tasks[i].trace] * get_policy(tasks[i].policy).relative_cost)


def sweep(spec: Any, output: Path, executor: Executor, *, plot: bool = False, cache: CacheSettings = CacheSettings(),
          report: Report = SilentReport()) -> SweepSummary:
    """Run every simulation of ``spec`` (a SweepSpec) not already cached, on ``executor``; write each into
    ``output/<group>/<policy>/``, each comparison's ``compare.json`` and ``table.txt`` (and, ``plot``, its
    figures), and ``output/sweep.json``. Failed simulations are in the
    summary (the caller decides what that means for its exit status).

    Everything is built in a staging folder inside ``output`` and moved into place when the sweep ends, the
    summary last (the previous one is removed first): an interrupted or failed sweep leaves the previous
    results as they were and no mix of old and new (a later run resumes from the cache). A sweep that would
    write over one of its inputs is refused; one that fails removes the folders it made."""
    created: list[Path] = []
    try:
        return _sweep(spec, output, executor, plot, cache, report, created)
    except BaseException:
        for folder in reversed(created):
            try:
                folder.rmdir()  # an empty one only: nothing a finished simulation wrote is removed
            except OSError:
                pass
        raise


def _make_dir(folder: Path, created: list[Path]) -> None:
    """``folder`` and its missing parents; those it made are appended to ``created``, outermost first."""
    missing = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    created.extend(reversed(missing))


def _refuse_writing_inputs(spec: Any, output: Path, groups: Iterable[str], run_dirs: list[str], plot: bool) -> None:
    """Refuse a sweep that would write over one of its inputs: ``sweep.json``, a comparison's files, or a run's
    folder (replaced as a whole). Inputs elsewhere under the output are fine (examples/paper keeps each trace's
    table beside its comparisons)."""
    from libarena.schedule.plots import FIGURES

    real = Path(os.path.realpath(output))
    files = {real / SUMMARY} | {real / group / name for group in groups
                                for name in ("compare.json", "table.txt", *(FIGURES if plot else ()))}
    folders = [real / d for d in run_dirs]
    inputs = [("--cluster", spec.cluster)] + [x for t in spec.traces for x in ((f"trace {t.name!r}", t.trace),
                                                                          (f"perf of trace {t.name!r}", t.perf))]
    if spec.spec_file is not None:
        inputs.append(("spec", spec.spec_file))
    for what, path in inputs:
        p = Path(os.path.realpath(path))
        if p in files or any(p == d or d in p.parents for d in folders):
            raise ArenaError(f"-o {output}: the sweep would write over its input ({what}) {path}: write the output "
                             f"elsewhere")


def _sweep(spec: Any, output: Path, executor: Executor, plot: bool, cache: CacheSettings, report: Report,
           created: list[Path]) -> SweepSummary:
    from libarena.schedule.api import is_output_file, make_policy, run_parameters

    for path, what in [(spec.cluster, "cluster spec")] + [p for t in spec.traces for p in
                                                         ((t.trace, f"trace {t.name!r}"), (t.perf, f"performance table of trace {t.name!r}"))]:
        if not Path(path).is_file():
            raise ArenaError(f"{path}: no such file (the sweep's {what})")
    refs = {str(p): input_ref(p) for p in {spec.cluster, *(t.trace for t in spec.traces), *(t.perf for t in spec.traces)}}
    stage = cache.stage(SIMULATE_STAGE, report)
    points = spec.points()
    build = simulation_build()
    records, tasks, keys = [], [], []
    for point in points:
        policy = make_policy(point.policy, **point.variant.options)  # a bad option is the spec's error: nothing runs
        config = spec.simulator_config(point.seed)
        key_inputs = [refs[str(point.trace.trace)], refs[str(point.trace.perf)], refs[str(spec.cluster)]]
        keys.append(simulation_key(stage, run_parameters(policy, config), config, key_inputs,
                                   skip_bad_rows=spec.skip_bad_rows, plot=False))
        tasks.append(SimulationTask(str(point.trace.trace), str(point.trace.perf), str(spec.cluster), point.policy,
                                    dict(point.variant.options), config, spec.skip_bad_rows, tuple(key_inputs),
                                    build))
        records.append(SweepRecord(point.label, point.group, point.trace.name, point.variant.name, point.seed,
                                   point.policy, point.output))
    spec_ref = [input_ref(spec.spec_file, "sweep_spec")] if spec.spec_file is not None else []
    summary = SweepSummary(str(output), records, spec_ref + [refs[path] for path in sorted(refs)])
    groups: dict[str, list[int]] = {}
    for i, point in enumerate(points):
        groups.setdefault(point.group, []).append(i)
    _refuse_writing_inputs(spec, output, groups, [r.output for r in records], plot)
    _make_dir(output, created)
    _refuse_foreign_files(output, [r.output for r in records], is_output_file)
    remove_stale_temps(output, "sweep")  # the staging folders of killed sweeps
    staging = Path(tempfile.mkdtemp(dir=output, prefix=f".sweep.{os.getpid()}.", suffix=".tmp"))
    try:
        summary = _run_into(staging, spec, executor, plot, stage, report, points, records, tasks, keys, groups,
                            summary)
        _move_into_place(staging, output, groups, records)
        return summary
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _refuse_foreign_files(output: Path, run_dirs: list[str], replaceable: Callable[[str], bool]) -> None:
    """Refused before anything runs (not when moving into place): a run's existing folder holding files that
    ``simulate`` does not write (the folder is replaced as a whole)."""
    for run_dir in run_dirs:
        target = output / run_dir
        if not target.is_dir():
            continue
        foreign = foreign_files(target, replaceable)
        if foreign:
            raise ArenaError(f"cannot write {target}/: it holds files a simulation does not write ({foreign[0]}); "
                             f"choose another output or empty it")


def _move_into_place(staging: Path, output: Path, groups: Iterable[str], records: list[SweepRecord]) -> None:
    """The staged results into ``output``: the old summary and comparison files go first (a reader never sees
    them beside new runs), then each run's folder (replacing the old one), the comparisons, the summary last.
    The old files and folders are moved aside into the staging folder, not deleted, so that a move that fails
    (a group folder on another file system, a signal) is undone: the previous results stay as they were."""
    from libarena.schedule.plots import FIGURES

    trash = staging / ".replaced"
    trash.mkdir()
    done: list[tuple[Path, Path]] = []  # the renames made, to undo in reverse

    def move(source: Path, target: Path) -> None:
        os.rename(source, target)
        done.append((source, target))

    def aside(path: Path) -> None:
        if path.exists() or path.is_symlink():
            move(path, trash / str(len(done)))

    try:
        aside(output / SUMMARY)
        names = ("compare.json", "table.txt", *FIGURES)
        for group in groups:
            for name in names:
                aside(output / group / name)
        for rec in records:
            source, target = staging / rec.output, output / rec.output
            if not source.is_dir():
                continue  # a failed simulation: its old folder, if any, stays, and no comparison claims it
            target.parent.mkdir(parents=True, exist_ok=True)
            aside(target)
            move(source, target)
        for group in groups:
            for name in names:
                if (staging / group / name).is_file():
                    move(staging / group / name, output / group / name)
        move(staging / SUMMARY, output / SUMMARY)
    except BaseException as exc:
        for source, target in reversed(done):
            try:
                os.rename(target, source)
            except OSError:
                pass  # nothing better to do: the others are still put back
        if isinstance(exc, OSError):
            raise ArenaError(f"sweep: cannot move its results into {output} ({exc.strerror or exc}): the previous "
                             f"results are left as they were") from None
        raise


def _run_into(output: Path, spec: Any, executor: Executor, plot: bool, stage: Any, report: Report, points: list,
              records: list[SweepRecord], tasks: list[SimulationTask], keys: list[str], groups: dict[str, list[int]],
              summary: SweepSummary) -> SweepSummary:
    """Run or restore every simulation into ``output`` (the staging folder), each comparison as its simulations
    complete, and the summary."""
    from libarena.artifacts import Provenance, write_bytes, write_json_document
    from libarena.schedule.api import is_output_file
    from libarena.schedule.compare import compare_table_text, paired_comparison, write_comparison
    from libarena.schedule.metrics import read_metrics, summary_line, time_limit_note
    from libarena.schedule.traces import ignored_columns_note

    waiting = {group: len(members) for group, members in groups.items()}
    total = len(points)
    finished = 0
    warned_skips: set[str] = set()

    def finalize(group: str) -> None:
        """A comparison whose simulations are all done: its compare.json, table.txt and figures."""
        members = [records[i] for i in groups[group]]
        if any(r.status == "failed" for r in members):
            summary.incomplete_groups.append(group)
            return
        metrics = {r.policy: r.metrics for r in members}
        runs = {r.policy: output / r.output for r in members}
        paired = summary.paired[group] = paired_comparison(runs)
        spec_inputs = [i for i in summary.inputs if i.get("kind") == "sweep_spec"]
        write_comparison(output / group / "compare.json", metrics, paired, runs, "arena-schedule sweep", spec_inputs)
        write_bytes(output / group / "table.txt", compare_table_text(metrics, paired).encode())
        if plot:
            from libarena.schedule.plots import RunSeries, plot_series

            plot_series({r.policy: RunSeries.read(output / r.output) for r in members}, output / group)
        summary.groups[group] = [r.policy for r in members]

    def settle(i: int, status: str, error: str | None = None) -> None:
        nonlocal finished
        finished += 1
        rec = records[i]
        rec.status, rec.error = status, error
        report.progress(ProgressUpdate("simulations", finished, total, rec.label))
        if status == "failed":
            report.warn(f"[{finished}/{total}] {rec.label}: failed: {error}")
        else:
            rec.metrics = read_metrics(output / rec.output / "metrics.json")
            report.log(f"[{finished}/{total}] {rec.label}{' (cached)' if status == 'cached' else ''}: "
                       f"{summary_line(rec.metrics)}")
            note = time_limit_note(rec.metrics)
            if note:
                report.warn(f"[{finished}/{total}] {rec.label}: {note}")
        group = points[i].group
        waiting[group] -= 1
        if not waiting[group]:
            finalize(group)

    def warn_trace(i: int, note: str | None, skipped: int, first_skipped: str | None) -> None:
        """A trace's warnings (columns it does not read, rows skipped), once per trace."""
        trace = records[i].trace
        if trace in warned_skips or not (note or skipped):
            return
        warned_skips.add(trace)
        if note:
            report.warn(note)
        if skipped:
            report.warn(f"trace {trace}: skipped {skipped} bad row(s); " + (
                f"first: {first_skipped}" if first_skipped else "served from the cache: simulate names them"))

    for rec in records:
        (output / rec.output).parent.mkdir(parents=True, exist_ok=True)  # each run's directory is made whole
    misses = []
    for i, key in enumerate(keys):
        if stage.restore_tree(key, output / records[i].output, is_output_file) is not None:
            settle(i, "cached")
            if records[i].trace not in warned_skips:  # a cached run reads no trace: its warnings are made again
                skipped = records[i].metrics.get("skipped_rows")
                warn_trace(i, ignored_columns_note(points[i].trace.trace),
                           skipped if isinstance(skipped, int) else 0, None)
        else:
            misses.append(i)
    if misses:
        report.log(f"sweep: {len(misses)} of {total} simulations to run ({total - len(misses)} cached)")
        order = _costliest_first(misses, tasks)
        if len(order) == 1:
            executor = SequentialExecutor()  # nothing to share out: no Ray to start
        for j, result in executor.map_unordered(run_simulation_task, [tasks[i] for i in order]):
            i = order[j]
            if isinstance(result, SimulationFailure):
                records[i].detail = result.detail or None
                settle(i, "failed", result.message)
                continue
            warn_trace(i, result.trace_note, len(result.skipped), result.skipped[0] if result.skipped else None)
            out_dir = output / records[i].output

            def produce(directory: Path, files: dict[str, bytes] = result.files) -> None:
                for name, data in files.items():
                    (directory / name).parent.mkdir(parents=True, exist_ok=True)
                    write_bytes(directory / name, data)

            stage.produce_tree(keys[i], out_dir, produce, is_output_file)
            settle(i, "simulated")
    # the comparisons in the spec's order, not the order their simulations happened to end in (Ray, the cache)
    incomplete = set(summary.incomplete_groups)
    summary.incomplete_groups = [g for g in groups if g in incomplete]
    summary.groups = {g: summary.groups[g] for g in groups if g in summary.groups}
    summary.paired = {g: summary.paired[g] for g in groups if g in summary.paired}
    write_json_document(output / SUMMARY, "sweep_summary", summary.to_dict(),
                        Provenance(tool="arena-schedule sweep", inputs=summary.inputs))
    return summary
