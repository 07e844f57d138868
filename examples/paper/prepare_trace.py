"""First stage of examples/paper/Makefile: the trace a run simulates, from an Arena-artifact trace file.

    python examples/paper/prepare_trace.py SRC.csv DST.csv [--max-jobs N] [--iteration-divisor K]
                                                           [--deadline-factor F]

Keeps the first N jobs (by submission time), divides every job's ``num_iteration`` by K (at least 1 iteration
remains) and moves every deadline to submission + F x (deadline - submission). The paper's artifact simulates its
traces with the iteration counts divided by 5 (``ITER_NUM_SCALE_FACTOR_SIM``), the time to each deadline
multiplied by 5 (every policy but ElasticFlow-L, which has none), and stops after 2,000 five-minute scheduling
rounds (``--max_sched_round=2000``); the Makefile's defaults follow it (ITERATION_DIVISOR=5, DEADLINE_FACTOR=5,
HORIZON=600000). Rows are copied otherwise unchanged: arena-schedule validates them (and names bad rows by their
row number in the prepared file).
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from libarena.artifacts import write_bytes
from libarena.errors import ArenaError

ITERATIONS_COLUMN = "num_iteration"
SUBMISSION_COLUMN = "submission_time"
DEADLINE_COLUMN = "deadline"


def prepare(source: Path, max_jobs: int | None, iteration_divisor: int, deadline_factor: float = 1.0) -> str:
    if max_jobs is not None and max_jobs < 1:
        raise ArenaError(f"--max-jobs must be >= 1, got {max_jobs}")
    if iteration_divisor < 1:
        raise ArenaError(f"--iteration-divisor must be >= 1, got {iteration_divisor}")
    if not 0 < deadline_factor <= 1000:  # NaN fails too
        raise ArenaError(f"--deadline-factor must be in (0, 1000], got {deadline_factor}")
    try:
        with source.open(newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            rows = list(reader)
    except OSError as exc:
        raise ArenaError(f"{source}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ArenaError(f"{source}: not a CSV trace ({exc})") from None
    if not header:
        raise ArenaError(f"{source}: empty file (expected a header row)")
    missing = [c for c in (ITERATIONS_COLUMN, SUBMISSION_COLUMN) if c not in header]
    if missing:
        raise ArenaError(f"{source}: no column {', '.join(repr(c) for c in missing)} (columns: {', '.join(header)})")
    it_col, sub_col = header.index(ITERATIONS_COLUMN), header.index(SUBMISSION_COLUMN)

    def submission(row: list[str]) -> float:
        try:
            return float(row[sub_col])
        except (IndexError, ValueError):
            return float("inf")  # a malformed row sorts last; arena-schedule reports it

    if max_jobs is not None:
        # Stable sort: traces are mostly in submission order already (pai is not).
        rows = sorted(rows, key=submission)[:max_jobs]
    if iteration_divisor > 1:
        for number, row in enumerate(rows, start=2):
            try:
                row[it_col] = str(max(1, int(float(row[it_col])) // iteration_divisor))
            except (IndexError, ValueError):
                raise ArenaError(f"{source}: row {number}, column {ITERATIONS_COLUMN!r}: not a number") from None
    if deadline_factor != 1 and DEADLINE_COLUMN in header:
        dl_col = header.index(DEADLINE_COLUMN)
        for number, row in enumerate(rows, start=2):
            if dl_col >= len(row) or not row[dl_col].strip():
                continue  # no deadline: nothing to move
            try:
                moved = float(row[sub_col]) + deadline_factor * (float(row[dl_col]) - float(row[sub_col]))
            except ValueError:
                raise ArenaError(f"{source}: row {number}, column {DEADLINE_COLUMN!r} or {SUBMISSION_COLUMN!r}: "
                                 f"not a number") from None
            row[dl_col] = str(int(moved)) if moved.is_integer() else repr(moved)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--max-jobs", type=int, default=None, help="keep the first N jobs by submission time")
    parser.add_argument("--iteration-divisor", type=int, default=1, help="divide num_iteration by K")
    parser.add_argument("--deadline-factor", type=float, default=1.0,
                        help="move each deadline to submission + F x (deadline - submission)")
    args = parser.parse_args(argv)
    try:
        write_bytes(args.output, prepare(args.source, args.max_jobs, args.iteration_divisor,
                                         args.deadline_factor).encode())
    except ArenaError as exc:
        print(f"prepare_trace: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
