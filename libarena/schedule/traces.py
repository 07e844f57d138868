"""Workload trace readers: arena-ae CSV, ElasticFlow CSV and raw ITP CSV.

Formats are recognised by their header:

- ``arena-ae`` (the paper's artifact traces): ``job_id, submission_time, num_iteration, model_name, deadline,
  batch_size, num_gpu, gpu_type``; ``model_name`` is ``family__size`` (``moe__2.4B``). Used as is.
- ``elasticflow``: ``job_id, submission_time, num_iteration, model_name, deadline, batch_size, num_gpu,
  duration`` with ElasticFlow's small models (``resnet50``, ``gpt2``...) and no GPU type. Adapted (below);
  its deadline is kept.
- ``itp-raw``: ``job_id, submission_time, duration, num_gpu``. Adapted (below); deadline generated.

An optional ``priority`` column (1 = highest) is honoured by Arena's queues; a priority above the number of
queues (P, ``--queues``) puts the job in the lowest queue, and its job record shows that queue. Other columns
are not read: commands warn which ones they ignored (a misspelt column would otherwise pass unnoticed).

Adaptation rule (the paper's §5.1: "for each job record (ID, submission time, duration), we randomly
generate GPU count, type, model configurations, and iteration count"), seeded per job by ``(seed, job_id)``
so a job's adaptation does not depend on row order:

1. family uniformly from bert, gpt, moe, wide_resnet; size uniformly from the family's zoo sizes
   (``libarena.workloads.PAPER_SIZES``: the paper's Table 2 plus the traces' BERT sizes); global batch
   uniformly from the family's batch sizes (``GLOBAL_BATCHES``);
2. GPU type uniformly from the cluster's GPU types (the paper's four when no cluster is given);
3. GPU count = the recorded ``num_gpu`` rounded up to a power of two (buddy allocation), capped at 16 (the
   paper's N);
4. iterations = the recorded duration x the job's execution-truth iteration rate on its requested (type,
   count) from the performance table, so the job would run for its recorded duration as submitted; without a
   table (``trace stats``) or where that configuration cannot run, 1 iteration per second;
5. deadline (raw traces only) = submission + duration x U(0.5, 1.5), the distribution of ElasticFlow's
   deadlines (measured on its published traces).
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import math
import os
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from libarena.checks import (MAX_BATCH, MAX_GPUS, MAX_ITERATIONS, MAX_PRIORITY, MAX_SECONDS, MAX_SEED, brief,
                             check_range, range_problem)
from libarena.errors import ArenaError
from libarena.hardware import get_gpu
from libarena.schedule.entities import JobSpec, count_index_at_least
from libarena.workloads import GLOBAL_BATCHES, PAPER_SIZES, is_zoo_model

#: family -> (sizes, global batch sizes)
PAPER_GPU_TYPES = ("a100", "v100", "a40", "a10")
MAX_ADAPTED_GPUS = 16
#: the most jobs ``trace scale`` makes (the paper's largest trace has 13k rows; ten times philly, 19k)
MAX_SCALED_JOBS = 2_000_000
#: the largest trace file read (2M jobs of ~120 bytes fit twice over): a bound on memory for any input
MAX_TRACE_BYTES = 512 << 20
#: the most rows a trace may have: short rows (an itp-raw row can be 15 bytes) would put tens of millions of jobs,
#: gigabytes of them, inside MAX_TRACE_BYTES
MAX_TRACE_ROWS = MAX_SCALED_JOBS
#: the least time from submission to deadline that Arena writes (a trace keeps 3 decimals of a second)
MIN_DEADLINE_GAP_S = 0.001
#: the longest job id (a UUID has 36 characters)
MAX_JOB_ID_CHARS = 256
#: a trace's header has the format's columns, priority and a few of its own; thousands are a damaged file
MAX_COLUMNS = 1000
#: a number as traces write them: decimal, optional sign, fraction and exponent, or nan/inf (refused by range)
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE | re.ASCII)

FORMATS = {
    "arena-ae": ("job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu", "gpu_type"),
    "elasticflow": ("job_id", "submission_time", "num_iteration", "model_name", "deadline", "batch_size", "num_gpu", "duration"),
    "itp-raw": ("job_id", "submission_time", "duration", "num_gpu"),
}

#: rate(model, batch, gpu_type, num_gpus) -> iterations/s of the execution truth, or None
RateFn = Callable[[str, int, str, int], "float | None"]


@dataclass
class Trace:
    source: str
    format: str
    jobs: list[JobSpec]
    skipped: list[str] = field(default_factory=list)
    adapted: bool = False
    #: header columns the format does not read (a misspelt ``priorty`` would otherwise pass unnoticed)
    ignored_columns: list[str] = field(default_factory=list)

    def ignored_columns_note(self) -> str | None:
        """The warning a command gives for :attr:`ignored_columns`, or None."""
        if not self.ignored_columns:
            return None
        return (f"{self.source}: ignored column(s) {', '.join(brief(c) for c in self.ignored_columns)}: the "
                f"{self.format} format reads {', '.join(FORMATS[self.format])} (and priority)")


def detect_format(header: list[str], source: str) -> str:
    cols = set(header)
    if "gpu_type" in cols:
        fmt = "arena-ae"
    elif "num_iteration" in cols or "model_name" in cols:
        fmt = "elasticflow"
    elif "duration" in cols:
        fmt = "itp-raw"
    else:
        fmt = "arena-ae"
    missing = [c for c in FORMATS[fmt] if c not in cols and not (fmt == "arena-ae" and c == "deadline")]
    if missing:
        raise ArenaError(f"{source}: row 0 (header), column {missing[0]!r} is missing "
                         f"({fmt} format needs {', '.join(FORMATS[fmt])})")
    return fmt


class _RowError(Exception):
    def __init__(self, column: str, problem: str):
        self.column = column
        self.problem = problem


#: column -> (low, high, integer, low excluded): the allowed range of every number a trace row carries
#: (libarena.checks: times below 100 years, counts of iterations, samples and GPUs bounded)
COLUMN_RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "submission_time": (0, MAX_SECONDS, False, False),
    "deadline": (0, MAX_SECONDS, False, False),
    "duration": (0, MAX_SECONDS, False, True),
    "num_iteration": (1, MAX_ITERATIONS, True, False),
    "batch_size": (1, MAX_BATCH, True, False),
    "num_gpu": (1, MAX_GPUS, True, False),
    "priority": (1, MAX_PRIORITY, True, False),
}


def _num(row: dict, col: str, *, optional: bool = False) -> float | int | None:
    raw = (row.get(col) or "").strip()
    if raw == "":
        if optional:
            return None
        raise _RowError(col, "empty value")
    # ASCII decimal notation only: float() also takes "1_000" and other scripts' digits, which no trace means
    if not _DECIMAL.fullmatch(raw):
        raise _RowError(col, f"not a number: {brief(raw)}")
    try:
        value = float(raw)
    except ValueError:
        raise _RowError(col, f"not a number: {brief(raw)}") from None
    lo, hi, integer, lo_open = COLUMN_RANGES[col]
    problem = range_problem(value, lo, hi, integer=integer, lo_open=lo_open)
    if problem is not None:
        raise _RowError(col, problem)
    return int(value) if integer else value


def _pow2_at_least(n: int) -> int:
    return 1 << count_index_at_least(n)


def stdin_trace() -> tuple[str, dict[str, Any]]:
    """A trace piped on stdin, read once: its text and its provenance entry, named by its content (the bytes are
    gone once read)."""
    import hashlib

    text = read_trace_text("-")
    return text, {"path": "stdin", "sha256": hashlib.sha256(text.encode()).hexdigest()}


def read_trace_input(path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """A trace read once: its text and its provenance entry, named by the bytes that were parsed (a file; hashing
    it again later would name a file replaced in between by the new content) or by its content (stdin)."""
    if str(path) == "-":
        return stdin_trace()
    from libarena.artifacts.io import read_input_ref

    data = _read_trace_bytes(path)
    return _trace_text(data, str(path)), read_input_ref(path, data)


def read_trace_text(path: str | os.PathLike[str]) -> str:
    """The text of a trace file, or of stdin when ``path`` is ``-``."""
    return _trace_text(_read_trace_bytes(path), "stdin" if str(path) == "-" else str(path))


def _read_trace_bytes(path: str | os.PathLike[str]) -> bytes:
    from libarena.artifacts.untrusted import read_bounded

    return read_bounded(path, MAX_TRACE_BYTES, "trace CSV" if str(path) == "-" else "trace", stdin=True)


def _trace_text(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ArenaError(f"{source}: not a UTF-8 text CSV") from None


def read_trace(path: str | os.PathLike[str], *, gpu_types: list[str] | None = None, seed: int = 0,
               rate: RateFn | None = None, skip_bad_rows: bool = False, text: str | None = None) -> Trace:
    """Read and validate a trace (``-``: from stdin; ``text``: its text, already read); bad rows raise ArenaError
    naming file, row and column (or are skipped)."""
    source = "stdin" if str(path) == "-" else str(path)
    if text is None:
        text = read_trace_text(path)
    reader, header = _read_header(text, source)
    fmt = detect_format(header, source)
    types = list(gpu_types) if gpu_types else list(PAPER_GPU_TYPES)
    has_priority = "priority" in header
    jobs: list[JobSpec] = []
    skipped: list[str] = []
    seen: dict[str, int] = {}
    for i, row in _csv_rows(reader, source):
        try:
            if None in row:
                raise _RowError(header[-1], "more fields than the header")
            if any(row.get(c) is None for c in FORMATS[fmt] if c in header):
                missing = next(c for c in FORMATS[fmt] if c in header and row.get(c) is None)
                raise _RowError(missing, "missing value (row too short)")
            spec = _parse_row(row, i, fmt, types, seed, rate, has_priority)
            job_id = spec.job_id
            if job_id in seen:
                raise _RowError("job_id", f"duplicate job id {brief(job_id)} (first at row {seen[job_id]})")
            seen[job_id] = i
            jobs.append(spec)
        except _RowError as exc:
            msg = f"{source}: row {i}, column {exc.column!r}: {exc.problem}"
            if not skip_bad_rows:
                raise ArenaError(msg) from None
            skipped.append(msg)
    if not jobs:
        raise ArenaError(f"{source}: no usable jobs" + (f" ({len(skipped)} bad rows skipped)" if skipped else ""))
    return Trace(source, fmt, jobs, skipped, adapted=fmt != "arena-ae", ignored_columns=_ignored(header, fmt))


def _read_header(text: str, source: str) -> tuple[csv.DictReader, list[str]]:
    """A reader of the trace's rows, and its checked header."""
    text = text.removeprefix("\ufeff")  # a byte-order mark (spreadsheet exports) is not part of the header
    # newline="": a line break inside a quoted field stays in it, where _csv_rows sees it (with the text's lines
    # handed over one by one it vanished, and an unclosed quote silently took the rows after it into one field)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        raise ArenaError(f"{source}: row 0 (header): malformed CSV ({exc})") from None
    if not header:
        raise ArenaError(f"{source}: empty trace (no header)")
    if any(_breaks_line(h) for h in header):
        raise ArenaError(f"{source}: row 0 (header): a quoted field runs over a line break (an unclosed quote?)")
    if len(header) > MAX_COLUMNS:
        raise ArenaError(f"{source}: row 0 (header): {len(header)} columns, more than {MAX_COLUMNS}")
    repeated = [h for h, n in collections.Counter(header).items() if n > 1]
    if repeated:  # csv would keep the last one's values silently
        raise ArenaError(f"{source}: row 0 (header): column {brief(repeated[0])} is given twice")
    reader.fieldnames = header
    return reader, header


def _ignored(header: list[str], fmt: str) -> list[str]:
    return [h for h in header if h not in FORMATS[fmt] and h != "priority"]


def ignored_columns_note(path: str | os.PathLike[str]) -> str | None:
    """The trace file's :meth:`Trace.ignored_columns_note` from its header alone (for a run served from a cache,
    whose trace is not read again)."""
    source = str(path)
    _, header = _read_header(read_trace_text(path), source)
    fmt = detect_format(header, source)
    return Trace(source, fmt, [], ignored_columns=_ignored(header, fmt)).ignored_columns_note()


def _breaks_line(value: Any) -> bool:
    if isinstance(value, list):  # the fields past the header's
        return any(_breaks_line(v) for v in value)
    return isinstance(value, str) and ("\n" in value or "\r" in value)


def _csv_rows(reader: csv.DictReader, source: str) -> Iterator[tuple[int, dict]]:
    """(row number, row) of a trace; a row the csv module refuses (e.g. a field over its 128 KiB limit), or one
    whose quoted field runs over a line break (an unclosed quote takes every line after it, to the next quote or
    the end, into that field), ends the read with an error naming it: the rows after it cannot be trusted, so it is
    not skipped. So does a row past MAX_TRACE_ROWS."""
    rows = iter(reader)
    i = 0
    while True:
        i += 1
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ArenaError(f"{source}: row {i}: malformed CSV ({exc})") from None
        if any(_breaks_line(v) for v in row.values()):
            raise ArenaError(f"{source}: row {i}: a quoted field runs over a line break (an unclosed quote?); the rows "
                             f"after it cannot be told apart")
        if i > MAX_TRACE_ROWS:
            raise ArenaError(f"{source}: row {i}: more than {MAX_TRACE_ROWS:,} rows")
        yield i, row


def _parse_row(row: dict, i: int, fmt: str, types: list[str], seed: int, rate: RateFn | None,
               has_priority: bool) -> JobSpec:
    job_id = (row.get("job_id") or "").strip()
    if not job_id:
        raise _RowError("job_id", "empty job id")
    if len(job_id) > MAX_JOB_ID_CHARS:
        raise _RowError("job_id", f"job id longer than {MAX_JOB_ID_CHARS} characters: {brief(job_id)}")
    submit = _num(row, "submission_time")
    num_gpu = _num(row, "num_gpu")
    priority = None
    if has_priority:
        priority = _num(row, "priority", optional=True)
    if fmt == "arena-ae":
        iters = _num(row, "num_iteration")
        model = (row.get("model_name") or "").strip()
        if not is_zoo_model(model):
            raise _RowError("model_name", f"unknown model {brief(model)} (expected family__size with family in "
                                          f"{', '.join(PAPER_SIZES)})")
        batch = _num(row, "batch_size")
        raw_type = (row.get("gpu_type") or "").strip()
        try:
            gpu_type = get_gpu(raw_type).name
        except ArenaError:
            raise _RowError("gpu_type", f"unknown GPU type {brief(raw_type)}") from None
        deadline = _deadline_after(_num(row, "deadline", optional=True), submit) if "deadline" in row else None
        return JobSpec(job_id, i, submit, model, batch, iters, _pow2_at_least(num_gpu), gpu_type, deadline, priority)
    duration = _num(row, "duration")
    rng = random.Random(f"{seed}/{job_id}")
    family = rng.choice(sorted(PAPER_SIZES))
    model = f"{family}__{rng.choice(PAPER_SIZES[family])}"
    batch = rng.choice(GLOBAL_BATCHES[family])
    gpu_type = rng.choice(types)
    gpus = min(MAX_ADAPTED_GPUS, _pow2_at_least(num_gpu))
    if fmt == "elasticflow":
        _num(row, "num_iteration")  # validated; replaced by the adapted count
        _num(row, "batch_size")  # likewise
        deadline = _deadline_after(_num(row, "deadline", optional=True), submit)
    else:
        deadline = submit + max(duration * rng.uniform(0.5, 1.5), MIN_DEADLINE_GAP_S)
        if deadline > MAX_SECONDS:  # the adapted job is checked as a written trace's row would be
            raise _RowError("duration", f"{_csv_number(duration)} s adapts to a deadline of {deadline:.4g} s, after "
                                        f"{MAX_SECONDS} s")
    per_s = rate(model, batch, gpu_type, gpus) if rate is not None else None
    iters = max(1, round(duration * (per_s if per_s else 1.0)))
    if iters > MAX_ITERATIONS:
        raise _RowError("duration", f"{_csv_number(duration)} s adapts to {iters:.4g} iterations of {model}, more than "
                                    f"{MAX_ITERATIONS}")
    return JobSpec(job_id, i, submit, model, batch, iters, gpus, gpu_type, deadline, priority)


def _deadline_after(deadline: float | None, submit: float) -> float | None:
    """A row's deadline, which must come after its submission: one at or before it is a malformed row (no job
    of the published traces has one; a deadline-aware policy would otherwise meet a job already late)."""
    if deadline is not None and deadline <= submit:
        raise _RowError("deadline", f"deadline {_csv_number(deadline)} s is not after the submission time {_csv_number(submit)} s")
    return deadline


def trace_stats(trace: Trace) -> dict:
    import numpy as np

    jobs = trace.jobs
    submit = np.array([j.submit_time for j in jobs])
    gpus = np.array([j.requested_gpus for j in jobs])
    iters = np.array([j.num_iterations for j in jobs])
    span = float(submit.max() - submit.min())

    def counts(values) -> dict:
        out: dict = {}
        for v in values:
            out[v] = out.get(v, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (-kv[1], str(kv[0]))))

    with_deadline = [j for j in jobs if j.deadline is not None]
    return {
        "source": trace.source,
        "format": trace.format,
        "adapted": trace.adapted,
        "jobs": len(jobs),
        "skipped_rows": len(trace.skipped),
        "span_s": span,
        "span_days": span / 86400,
        "first_submission_s": float(submit.min()),
        "last_submission_s": float(submit.max()),
        # (None: every job submitted at one time, which gives no rate)
        "arrivals_per_hour": len(jobs) / (span / 3600) if span > 0 else None,
        "requested_gpus": {"total": int(gpus.sum()), "mean": float(gpus.mean()), "max": int(gpus.max()),
                           "by_count": {str(k): v for k, v in counts(gpus.tolist()).items()}},
        "iterations": {"mean": float(iters.mean()), "median": float(np.median(iters)), "max": int(iters.max())},
        "models": counts(j.model for j in jobs),
        "gpu_types": counts(j.requested_type for j in jobs),
        "global_batches": {str(k): v for k, v in counts(j.global_batch for j in jobs).items()},
        "jobs_with_deadline": len(with_deadline),
        "median_deadline_slack_s": float(np.median([j.deadline - j.submit_time for j in with_deadline])) if with_deadline else None,
    }


# --------------------------------------------------------------------------------------------------
# Scaling a trace up


@dataclass(frozen=True)
class TraceScale:
    """A trace replicated ``copies`` times: copy 0 is the trace itself; every job of copy k >= 1 is submitted
    at its original time shifted by a uniform draw in [-jitter_s, +jitter_s] (clamped at 0; its deadline moves
    by the same shift, keeping its slack) and gets the id ``<job_id>-x<k>``. The draw is seeded by
    ``(seed, job_id, k)``, so a job's copies do not depend on the row order of the trace."""

    copies: int
    jitter_s: float = 150.0
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.copies, bool) or not isinstance(self.copies, int) or self.copies < 1:
            raise ArenaError(f"copies must be a positive integer, got {self.copies!r}")
        if not (math.isfinite(self.jitter_s) and 0 <= self.jitter_s <= MAX_SECONDS):
            raise ArenaError(f"jitter must be a number of seconds in [0, {MAX_SECONDS}], got {self.jitter_s!r}")
        check_range(self.seed, "--seed", 0, MAX_SEED, integer=True)  # as simulate and arena-run take it


def scale_trace(jobs: list[JobSpec], scale: TraceScale) -> list[JobSpec]:
    """The jobs of ``scale.copies`` copies of a trace, ordered by submission time (ties: copy, then the
    original order); ``row`` is the 1-based position in that order."""
    if len(jobs) * scale.copies > MAX_SCALED_JOBS:  # bounded memory: refused before any copy is made
        raise ArenaError(f"{scale.copies} copies of {len(jobs)} jobs would be {len(jobs) * scale.copies} jobs, more than "
                         f"{MAX_SCALED_JOBS}")
    ids = {j.job_id for j in jobs}
    out: list[tuple[float, int, int, JobSpec]] = []
    for k in range(scale.copies):
        for i, job in enumerate(jobs):
            if k == 0:
                out.append((job.submit_time, k, i, job))
                continue
            job_id = f"{job.job_id}-x{k}"
            if len(job_id) > MAX_JOB_ID_CHARS:  # the written trace's reader would refuse it
                raise ArenaError(f"job id {brief(job_id)} of copy {k} of {brief(job.job_id)} would be longer than "
                                 f"{MAX_JOB_ID_CHARS} characters")
            if job_id in ids:
                raise ArenaError(f"job id {job_id!r} of copy {k} of {job.job_id!r} is already in the trace")
            shift = random.Random(f"{scale.seed}/{job.job_id}/{k}").uniform(-scale.jitter_s, scale.jitter_s)
            submit = round(max(0.0, job.submit_time + shift), 3)
            # the copy keeps its time to the deadline, at least the 1 ms the written trace's 3 decimals can tell
            deadline = None if job.deadline is None else round(submit + max(job.deadline - job.submit_time, MIN_DEADLINE_GAP_S), 3)
            if max(submit, deadline or 0.0) > MAX_SECONDS:  # a trace the reader would refuse is not written
                raise ArenaError(f"copy {k} of {job.job_id!r} would be submitted (or due) after {MAX_SECONDS} s; "
                                 "use a smaller --jitter")
            out.append((submit, k, i, dataclasses.replace(job, job_id=job_id, submit_time=submit, deadline=deadline)))
    out.sort(key=lambda entry: entry[:3])
    return [dataclasses.replace(job, row=row) for row, (_, _, _, job) in enumerate(out, start=1)]


def _csv_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def trace_csv(jobs: list[JobSpec]) -> str:
    """Jobs as an arena-ae trace (CSV text; a ``priority`` column when a job has one), read back unchanged by
    :func:`read_trace` (GPU counts as the simulator uses them: rounded up to a power of two)."""
    with_priority = any(j.priority is not None for j in jobs)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(FORMATS["arena-ae"] + (("priority",) if with_priority else ()))
    for j in jobs:
        if j.requested_type is None:
            raise ArenaError(f"job {j.job_id!r} has no GPU type: an arena-ae trace needs one")
        row = [j.job_id, _csv_number(j.submit_time), j.num_iterations, j.model,
               "" if j.deadline is None else _csv_number(j.deadline), j.global_batch, j.requested_gpus, j.requested_type]
        writer.writerow(row + ([j.priority if j.priority is not None else ""] if with_priority else []))
    return buf.getvalue()


def write_scaled_trace(source: str | os.PathLike[str], output: str | os.PathLike[str], scale: TraceScale, *,
                       cluster: str | os.PathLike[str] | None = None, perf: str | os.PathLike[str] | None = None,
                       skip_bad_rows: bool = False) -> Trace:
    """``arena-schedule trace scale``: read the trace ``source``, write its ``scale.copies`` copies to ``output``
    (a file, written atomically, or ``-``) as an arena-ae trace; returns the scaled trace.

    An ElasticFlow or raw ITP trace is adapted as ``simulate`` adapts it (to ``cluster``'s GPU types, seeded by
    ``scale.seed``, its iteration counts from the performance table ``perf``'s rates), so that simulating the
    written trace runs the jobs simulating the source would; without ``perf`` it is refused, since 1 iteration
    per second would stretch or shrink every job by its model's speed."""
    from libarena.artifacts import write_bytes
    from libarena.artifacts.io import refuse_overwriting_inputs
    from libarena.hardware import load_cluster

    refuse_overwriting_inputs(output, {"trace": source, "--cluster": cluster, "--perf": perf})
    if perf is not None and cluster is None:
        raise ArenaError("--perf needs --cluster: a performance table is read for a cluster's GPU types")
    spec = load_cluster(cluster) if cluster is not None else None
    gpu_types, rate = (spec.gpu_types if spec is not None else None), None
    if perf is not None:
        from libarena.schedule.perf import load_perf

        lookup = load_perf(perf, spec)
        gpu_types, rate = lookup.gpu_types, lookup.submitted_rate
    trace = read_trace(source, gpu_types=gpu_types, seed=scale.seed, rate=rate, skip_bad_rows=skip_bad_rows)
    if trace.adapted and rate is None:
        raise ArenaError(f"{source} is {'an' if trace.format[0] in 'aeiou' else 'a'} {trace.format} trace: its jobs' "
                         f"iteration counts are made from a performance table's rates, as simulate makes them; "
                         f"give --perf and --cluster")
    if trace.adapted:
        # a job of a (model, batch) the table lacks would get 1 iteration per second: simulate refuses (or skips)
        # it, and so does scaling
        missing = lookup.lacking(trace.jobs, str(source), skip=skip_bad_rows)
        covered = [j for j in trace.jobs if (j.model, j.global_batch) not in missing]
        skipped = trace.skipped + [lookup.lacking_message(j, str(source)) for j in trace.jobs
                                   if (j.model, j.global_batch) in missing]
        if not covered:
            raise ArenaError(f"{source}: no usable jobs ({len(skipped)} bad rows skipped)")
        trace = dataclasses.replace(trace, jobs=covered, skipped=skipped)
    jobs = scale_trace(trace.jobs, scale)
    data = trace_csv(jobs).encode()
    if len(data) > MAX_TRACE_BYTES:  # a trace the reader would refuse is not written
        raise ArenaError(f"{scale.copies} copies of {source} would be a trace of {len(data):,} bytes, more than the "
                         f"{MAX_TRACE_BYTES:,} a trace may have")
    write_bytes(output, data)
    return Trace(str(output), "arena-ae", jobs, trace.skipped, adapted=trace.adapted)
