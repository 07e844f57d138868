"""A job submission file (YAML): what ``arena-schedule submit job.yaml`` accepts.

    name: bert-finetune      # optional job id (letters, digits, ._-); default job-<n>
    model: gpt__tiny         # zoo model, family__size
    global_batch: 32
    iterations: 50
    priority: 1              # optional, 1 = highest queue
    deadline: 3600           # optional, seconds after submission (at most 100 years)
    gpu_type: a100           # optional requested GPU type (default: the cluster's largest pool)
    num_gpus: 1              # optional requested GPU count (rigid baselines use it; Arena rescales)
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libarena.checks import MAX_BATCH, MAX_GPUS, MAX_ITERATIONS, MAX_PRIORITY, MAX_SECONDS, brief, range_problem
from libarena.errors import ArenaError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
FIELDS = ("name", "model", "global_batch", "iterations", "priority", "deadline", "gpu_type", "num_gpus")


@dataclass(frozen=True)
class JobSubmission:
    model: str
    global_batch: int
    iterations: int
    name: str | None = None
    priority: int | None = None
    deadline_s: float | None = None
    gpu_type: str | None = None
    num_gpus: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobSubmission:
        return cls(**d)


def _number(src: str, data: dict, key: str, lo: float, hi: float, required: bool, integer: bool = True,
            lo_open: bool = False) -> Any:
    if key not in data or data[key] is None:
        if required:
            raise ArenaError(f"{src}: missing required key '{key}'")
        return None
    v = data[key]
    problem = range_problem(v, lo, hi, integer=integer, lo_open=lo_open)
    if problem is None and integer and not isinstance(v, int):
        problem = f"{brief(v)} is not an integer"
    if problem is not None:
        raise ArenaError(f"{src}: key '{key}': {problem}")
    return v


def parse_job(data: Any, src: str) -> JobSubmission:
    """A JobSubmission from a parsed job file: unknown keys (with a "did you mean" hint), numbers out of their
    ranges (libarena.checks), models that are not in the zoo and unknown GPU types are one-line errors."""
    from libarena.artifacts.untrusted import check_keys
    from libarena.workloads import PAPER_SIZES, is_zoo_model

    if not isinstance(data, dict):
        raise ArenaError(f"{src}: expected a mapping of {', '.join(FIELDS)}, got {type(data).__name__}")
    check_keys(data, FIELDS, src)
    model = data.get("model")
    if model is None:
        raise ArenaError(f"{src}: missing required key 'model'")
    if not isinstance(model, str) or not is_zoo_model(model):
        raise ArenaError(f"{src}: key 'model': unknown model {brief(model)} (expected a zoo model family__size, "
                         f"family one of {', '.join(PAPER_SIZES)}: see arena-analyze --list-models)")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise ArenaError(f"{src}: key 'name': expected letters, digits, '.', '_' or '-' (at most 128), got {brief(name)}")
    batch = _number(src, data, "global_batch", 1, MAX_BATCH, True)
    iters = _number(src, data, "iterations", 1, MAX_ITERATIONS, True)
    prio = _number(src, data, "priority", 1, MAX_PRIORITY, False)
    gpus = _number(src, data, "num_gpus", 1, MAX_GPUS, False) or 1
    deadline = _number(src, data, "deadline", 0, MAX_SECONDS, False, integer=False, lo_open=True)
    if deadline is not None:
        deadline = float(deadline)
    gpu_type = data.get("gpu_type")
    if gpu_type is not None:
        from libarena.hardware import get_gpu

        if not isinstance(gpu_type, str):
            raise ArenaError(f"{src}: key 'gpu_type': expected a GPU type name, got {brief(gpu_type)}")
        try:
            gpu_type = get_gpu(gpu_type).name
        except ArenaError as e:
            raise ArenaError(f"{src}: key 'gpu_type': {e}") from None
    return JobSubmission(model, batch, iters, name, prio, deadline, gpu_type, gpus)


def load_job_file(path: str | Path) -> JobSubmission:
    """A job file (``-``: stdin), read as untrusted input (libarena.artifacts.untrusted: no aliases, bounded size
    and depth)."""
    from libarena.artifacts.untrusted import load_spec_file

    return parse_job(load_spec_file(path, "job file", stdin=True), "stdin" if str(path) == "-" else str(path))
