"""A job submission file (YAML): what ``arena-schedule submit job.yaml`` accepts.

    name: bert-finetune      # optional job id (letters, digits, ._-); default job-<n>
    model: gpt__tiny         # zoo model, family__size
    global_batch: 32
    iterations: 50
    priority: 1              # optional, 1 = highest queue
    deadline: 3600           # optional, seconds after submission
    gpu_type: a100           # optional requested GPU type (default: the cluster's largest pool)
    num_gpus: 1              # optional requested GPU count (rigid baselines use it; Arena rescales)
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MODEL = re.compile(r"^[A-Za-z0-9_]+__[A-Za-z0-9.]+$")
FIELDS = ("name", "model", "global_batch", "iterations", "priority", "deadline", "gpu_type", "num_gpus")
#: guards against absurd numbers (a year of iterations at 1 it/s, batches larger than any zoo model uses)
MAX_ITERATIONS = 10**9
MAX_BATCH = 1 << 20


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


def _int(src: str, data: dict, key: str, lo: int, hi: int, required: bool) -> int | None:
    if key not in data or data[key] is None:
        if required:
            raise ArenaError(f"{src}: missing required key '{key}'")
        return None
    v = data[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ArenaError(f"{src}: key '{key}': expected an integer, got {v!r}")
    if not lo <= v <= hi:
        raise ArenaError(f"{src}: key '{key}': {v} is out of range [{lo}, {hi}]")
    return v


def parse_job(data: Any, src: str) -> JobSubmission:
    if not isinstance(data, dict):
        raise ArenaError(f"{src}: expected a mapping of {', '.join(FIELDS)}, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in FIELDS)
    if unknown:
        raise ArenaError(f"{src}: unknown key(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    model = data.get("model")
    if model is None:
        raise ArenaError(f"{src}: missing required key 'model'")
    if not isinstance(model, str) or not _MODEL.match(model):
        raise ArenaError(f"{src}: key 'model': expected family__size (e.g. gpt__tiny), got {model!r}")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not _NAME.match(name)):
        raise ArenaError(f"{src}: key 'name': expected letters, digits, '.', '_' or '-' (at most 128), got {name!r}")
    batch = _int(src, data, "global_batch", 1, MAX_BATCH, True)
    iters = _int(src, data, "iterations", 1, MAX_ITERATIONS, True)
    prio = _int(src, data, "priority", 1, 1000, False)
    gpus = _int(src, data, "num_gpus", 1, 1 << 16, False) or 1
    deadline = data.get("deadline")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline) \
                or not 0 < deadline <= 10 * 365 * 86400:
            raise ArenaError(f"{src}: key 'deadline': expected seconds after submission in (0, 10 years], got {deadline!r}")
        deadline = float(deadline)
    gpu_type = data.get("gpu_type")
    if gpu_type is not None:
        from libarena.hardware import get_gpu

        if not isinstance(gpu_type, str):
            raise ArenaError(f"{src}: key 'gpu_type': expected a GPU type name, got {gpu_type!r}")
        try:
            gpu_type = get_gpu(gpu_type).name
        except ArenaError as e:
            raise ArenaError(f"{src}: key 'gpu_type': {e}") from None
    return JobSubmission(model, batch, iters, name, prio, deadline, gpu_type, gpus)


def load_job_file(path: str | Path) -> JobSubmission:
    import yaml

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArenaError(f"{p}: no such job file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArenaError(f"{p}: cannot read the job file ({e.__class__.__name__})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ArenaError(f"{p}: not valid YAML{where}") from None
    return parse_job(data, str(p))
