"""Range checks for every number that enters Arena (flags, config fields, trace and table cells, spec files).

One rule, written once: a value is a finite number (an integer where counts are meant) inside a documented
range. Configs call :func:`check_range` from their ``__post_init__``; readers of files call
:func:`range_problem` and put the answer into their own message (file, row, column). The limits below are
the documented "sane" ranges (README, "Limits on inputs"): far beyond any real workload, small enough that
no single value can make a tool run for days or allocate gigabytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from libarena.errors import ArenaError

#: One hundred years in seconds: the bound of every time (submissions, deadlines, durations, horizons).
MAX_SECONDS = 100 * 365 * 86400
#: One week in seconds: the bound of a modelled overhead (profiling, AP search, checkpoint-resume).
MAX_OVERHEAD_S = 7 * 86400
#: One day in seconds: the bound of a scheduling tick and of one training iteration.
MAX_TICK_S = 86400
MIN_TICK_S = 1.0
MAX_ITERATION_S = 86400
#: A measured collective's volume per device (a comm table's ``bytes``): 1 B to 1 PiB.
MAX_COMM_BYTES = 1 << 50
#: Iterations of a job (a trace row, a job file).
MAX_ITERATIONS = 10**12
#: Training steps of one arena-run at most (--steps; a billion).
MAX_STEPS = 10**9
#: Samples in a global batch.
MAX_BATCH = 1 << 20
#: Tokens of a sequence.
MAX_SEQ_LEN = 1 << 20
#: GPUs of a job, of a node group or a cluster; GPUs of one node.
MAX_GPUS = 1 << 20
MAX_GPUS_PER_NODE = 1024
#: Queue priorities (1 = highest).
MAX_PRIORITY = 1000
#: Seeds (numpy and JAX take 32-bit seeds).
MAX_SEED = 2**32 - 1
#: Repetitions of a timed measurement (profiling, benchmarks) and untimed warm-up runs.
MAX_REPEATS = 10_000


def _fmt(x: float) -> str:
    if isinstance(x, int) and abs(x) < 10**15:
        return str(x)
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    if isinstance(x, int) and x.bit_length() > 1000:  # beyond a float: {:.6g} would raise OverflowError
        return f"{'-' if x < 0 else ''}an integer of {len(str(abs(x))) if x.bit_length() < 14_000 else 'over 4,000'} digits"
    return f"{x:.6g}"


def describe_range(lo: float, hi: float, *, integer: bool = False, lo_open: bool = False) -> str:
    """The allowed range as the messages write it: ``an integer in [1, 16]``, ``a number in (0, 1]``."""
    kind = "an integer" if integer else "a finite number"
    return f"{kind} in {'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}]"


def range_problem(value: Any, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False) -> str | None:
    """None when ``value`` is a finite number (an integer when ``integer``) in [lo, hi] ((lo, hi] when
    ``lo_open``); else what is wrong with it, ending with the allowed range."""
    allowed = describe_range(lo, hi, integer=integer, lo_open=lo_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        # numpy scalars are numbers too
        if hasattr(value, "dtype") and hasattr(value, "item"):
            return range_problem(value.item(), lo, hi, integer=integer, lo_open=lo_open)
        return f"{value!r} is not a number (expected {allowed})"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not {allowed}"
    if integer and isinstance(value, float) and not value.is_integer():
        return f"{value!r} is not {allowed}"
    if value < lo or value > hi or (lo_open and value == lo):
        return f"{_fmt(value)} is out of range (expected {allowed})"
    return None


def check_range(value: Any, what: str, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False,
                optional: bool = False) -> None:
    """Raise a one-line ArenaError ``<what>: <problem>`` unless ``value`` is in range (None passes when
    ``optional``). ``what`` names the flag or field, e.g. ``--tick`` or ``overhead checkpoint_resume_s``."""
    if value is None and optional:
        return
    problem = range_problem(value, lo, hi, integer=integer, lo_open=lo_open)
    if problem is not None:
        raise ArenaError(f"{what}: {problem}")


class Range(NamedTuple):
    """The allowed values of one config field: ``what`` names it in messages (the flag users type)."""

    what: str
    lo: float
    hi: float
    integer: bool = False
    lo_open: bool = False
    optional: bool = False

    def describe(self) -> str:
        return describe_range(self.lo, self.hi, integer=self.integer, lo_open=self.lo_open)


def check_fields(config: Any, ranges: Mapping[str, Range]) -> None:
    """Check each named field of a config dataclass against its Range (what ``__post_init__`` calls)."""
    for name, r in ranges.items():
        check_range(getattr(config, name), r.what, r.lo, r.hi, integer=r.integer, lo_open=r.lo_open,
                    optional=r.optional)


def brief(value: Any, limit: int = 80) -> str:
    """A short repr of a value for a message: bounded in length and in the depth it walks (a hostile value
    may be a huge or deeply nested structure)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 3, limit, limit, limit
    text = r.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
