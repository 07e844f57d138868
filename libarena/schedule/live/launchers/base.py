"""The launcher interface and registry."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, ClassVar

from libarena.checks import MAX_STEPS, Range, check_fields
from libarena.registry import Registry


@dataclass(frozen=True)
class LaunchRequest:
    """Run version ``version`` of a job on ``num_gpus`` GPUs of ``gpu_type`` (a rescale or migration resumes
    the job's checkpoint; ``previous_version`` is stopped first)."""

    job_id: str
    version: int
    action: str  # launch, rescale, migrate
    model: str
    global_batch: int
    iterations: int
    gpu_type: str
    num_gpus: int
    nodes: tuple[int, ...]  # node indices within the GPU type's pool (the scheduler's buddy placement)
    #: the overhead the scheduler's model expects (profiling, AP search, checkpoint-resume): emulating launchers
    #: pay exactly this; real ones pay what it really costs
    overhead_s: float
    decided_at: float  # scheduler time of the decision
    previous_version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = list(self.nodes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LaunchRequest:
        d = dict(d)
        d["nodes"] = tuple(d["nodes"])
        return cls(**d)


#: phases a version of a job goes through; ``lost``: the launcher has no trace of a version it was given
PHASES = ("starting", "running", "finished", "failed", "lost")


@dataclass
class RunStatus:
    job_id: str
    version: int
    phase: str
    started_at: float | None = None  # scheduler time when training (re)started
    finished_at: float | None = None
    iterations_done: float | None = None
    message: str = ""


@dataclass(frozen=True)
class LauncherOptions:
    """How a launcher runs jobs (the emulating ``perf-table`` launcher needs none of it)."""

    #: the Ray cluster ``arena-run`` joins (None: each job version starts an embedded Ray of its own)
    address: str | None = None
    #: ``arena-run --checkpoint-every`` (None: arena-run's own default)
    checkpoint_every: int | None = None
    #: candidates the pruned AP search measures at every (re)launch (§3.6), as the scheduler's overhead model assumes
    search_max: int = 2
    #: further ``arena-run`` arguments, appended as given
    arena_run_args: tuple[str, ...] = ()
    #: tool name -> the command run in its place (default: this environment's console scripts; a wrapper can stand in)
    commands: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, {
            "checkpoint_every": Range("--checkpoint-every", 1, MAX_STEPS, integer=True, optional=True),
            "search_max": Range("search_max", 0, 10**6, integer=True),
        })
        object.__setattr__(self, "arena_run_args", tuple(str(a) for a in self.arena_run_args))
        object.__setattr__(self, "commands", dict(self.commands))


@dataclass(frozen=True)
class LauncherContext:
    """What a launcher may need from the server: where to keep its files, the cluster and perf inputs, the
    clock (scheduler time <-> wall time), a perf lookup that includes rows profiled on arrival, and the options."""

    workdir: Path
    cluster_path: Path
    clock: Any
    perf: Any = None
    options: LauncherOptions = field(default_factory=LauncherOptions)


class JobLauncher(ABC):
    name: ClassVar[str] = ""
    #: True when ``RunStatus.iterations_done`` is measured (then it overrides the scheduler's progress model)
    measured_progress: ClassVar[bool] = False
    #: the LauncherOptions fields it reads (another one given is refused: it would be silently ignored)
    options_used: ClassVar[tuple[str, ...]] = ()

    def cannot_run(self, iterations: int) -> str | None:
        """Why this launcher cannot run a job of that many iterations (it is rejected on arrival), or None."""
        return None

    @abstractmethod
    def launch(self, request: LaunchRequest) -> None:
        """Start the version (stopping ``previous_version``); a version already started is left alone."""

    @abstractmethod
    def vacate(self, request: LaunchRequest) -> None:
        """Stop ``request.previous_version`` (as of ``request.decided_at``; nothing if there is none, or it is
        already stopped) before any request of the round starts: a round may give one job's GPUs to another (a
        trade gives two jobs each other's), so every job leaving its GPUs stops first. ``launch`` then finds it
        stopped."""

    @abstractmethod
    def poll(self, now: float, versions: dict[str, int]) -> dict[str, RunStatus]:
        """Status, at scheduler time ``now``, of each job's current version (``versions``: job id -> version)."""

    def relaunch(self, request: LaunchRequest) -> None:
        """Start a version again after it was lost (its host died); default: as a fresh launch."""
        self.launch(request)

    def stop(self, job_id: str, version: int, at: float | None = None) -> None:
        """Stop a version for good (the job failed, finished or was cancelled); ``at``: the scheduler time it
        stops (None: when it was decided; a real launcher stops it now, whatever ``at`` says)."""

    def logs(self, job_id: str, version: int) -> Path | None:
        """The version's output file, when it has one."""
        return None

    def close(self) -> None:
        pass


def _load() -> None:
    for mod in ("arena_run", "perf_table"):
        importlib.import_module(f"libarena.schedule.live.launchers.{mod}")


LAUNCHERS: Registry[Callable[[LauncherContext], JobLauncher]] = Registry("launcher", _load)


def register_launcher(cls: type[JobLauncher]) -> type[JobLauncher]:
    LAUNCHERS.register(cls.name, cls)
    return cls


def launcher_names() -> list[str]:
    return LAUNCHERS.names()


def get_launcher(name: str, context: LauncherContext) -> JobLauncher:
    return LAUNCHERS.get(name)(context)
