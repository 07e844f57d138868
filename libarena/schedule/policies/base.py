"""Policy interface and registry. A policy decides from its own *decision view* of job performance;
jobs always progress at the execution truth (see libarena.schedule.perf)."""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from libarena.errors import ArenaError
from libarena.registry import Registry
from libarena.schedule.config import APSearch, PolicyConfig, ProfilingKind
from libarena.schedule.entities.allocation import count_index_at_least
from libarena.schedule.perf import DECISION_VIEWS

if TYPE_CHECKING:
    from libarena.schedule.entities import Job
    from libarena.schedule.simulator import Simulator


class Policy(ABC):
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: the view the policy decides from unless configured otherwise
    default_view: ClassVar[str] = "dp"
    profiling: ClassVar[ProfilingKind] = ProfilingKind.FULL
    ap_search: ClassVar[APSearch] = APSearch.FULL
    config_class: ClassVar[type[PolicyConfig]] = PolicyConfig
    #: scalar attributes of the policy's own clock that the live scheduler persists across restarts
    persistent_attrs: ClassVar[tuple[str, ...]] = ()
    #: the rough cost of simulating a trace with this policy, relative to the others (measured on the paper's
    #: philly trace); a sweep starts the costliest simulations first
    relative_cost: ClassVar[float] = 1.0
    #: the policy a comparison measures the others against (the jobs both finished), when it is among them
    comparison_reference: ClassVar[bool] = False

    def __init__(self, config: PolicyConfig | None = None):
        self.config = config if config is not None else self.config_class()
        if not isinstance(self.config, self.config_class):
            raise TypeError(f"policy {self.name} needs a {self.config_class.__name__}")
        self.view = self.config.view or self.default_view
        if self.view not in DECISION_VIEWS:
            raise ArenaError(f"unknown decision view {self.view!r} (known: {', '.join(DECISION_VIEWS)})")
        validate = getattr(self.config, "validate", None)
        if validate:
            validate()
        self.sim: Simulator

    def attach(self, sim: Simulator) -> None:
        self.sim = sim
        self.max_count = max(0, min(sim.perf.num_counts - 1, int(np.log2(max(1, self.config.max_gpus_per_job)))))
        # allowed[t, c]: 2**c GPUs of type t exist in the cluster and are within the per-job limit
        self.allowed = sim.perf.usable & (np.arange(sim.perf.num_counts) <= self.max_count)[None, :]

    # -- hooks -------------------------------------------------------------------------------------
    def runnable(self, job: Job) -> bool:
        """Whether the job can ever be placed under this policy on an empty cluster (else: unschedulable): some
        allowed count its view can run on one of its :meth:`placement_types`."""
        return bool(((job.view_thr > 0) & self.allowed)[self.placement_types(job)].any())

    def placement_types(self, job: Job) -> list[int]:
        """The GPU types this policy may place the job on (what :meth:`runnable` and the message for an
        unschedulable job go by)."""
        return list(range(len(self.sim.perf.gpu_types)))

    def unschedulable_reason(self, job: Job) -> str:
        """Why :meth:`runnable` is False for the job, in one line (its status says it)."""
        perf = self.sim.perf
        spec = job.spec
        runs = [(int(t), int(c)) for t, c in zip(*np.nonzero(job.view_thr > 0))]
        if not runs:
            return (f"{self.name}: {spec.model} at global batch {spec.global_batch} fits in memory on no GPU type and "
                    f"count of this cluster in the performance table")
        counts: dict[str, list[str]] = {}
        for t, c in runs:
            counts.setdefault(perf.gpu_types[t], []).append(str(1 << c))
        shown = ", ".join(f"{t} ({', '.join(n)} GPUs)" for t, n in counts.items())
        types = self.placement_types(job)
        requested = ("" if len(types) == len(perf.gpu_types)
                     else f", on {' or '.join(perf.gpu_types[t] for t in types)} only")
        cluster = ", ".join(f"{int(n)} {t}" for t, n in zip(perf.gpu_types, perf.capacity))
        return (f"{self.name}: no configuration it may use (at most {1 << self.max_count} GPUs per job{requested}; "
                f"the cluster has {cluster}); the performance table runs {spec.model} at global batch "
                f"{spec.global_batch} only on {shown}")

    @abstractmethod
    def on_arrival(self, job: Job) -> None:
        """A job arrived (after its profiling): queue it."""

    @abstractmethod
    def withdraw(self, job: Job) -> None:
        """A queued job leaves before it was placed (the live scheduler's ``cancel``): forget it wherever this
        policy keeps the jobs it has not placed (abstract: a policy that forgot it would launch a cancelled job)."""

    def on_finish(self, job: Job) -> None:
        """A job finished (optional hook: most policies keep no per-job state)."""

    def on_start(self, job: Job) -> None:
        """A job began training on its allocation (after its launch or a rescale: Job.state is RUNNING)."""

    def needs_schedule(self) -> bool:
        return self.sim.dirty

    @abstractmethod
    def schedule(self) -> None:
        """One scheduling round: launch, rescale or migrate jobs through the simulator."""

    # -- helpers shared by policies ----------------------------------------------------------------
    def requested_count_on(self, job: Job, t: int) -> int | None:
        """Rigid count on type t: the requested count, or the smallest larger count the view can run
        (a job that does not fit as requested gets more GPUs, the paper's Case 2), else the largest runnable."""
        c_req = count_index_at_least(job.spec.requested_gpus)
        ok = np.flatnonzero((job.view_thr[t] > 0) & self.allowed[t])
        if ok.size == 0:
            return None
        above = ok[ok >= c_req]
        return int(above[0]) if above.size else int(ok[-1])

    def apply_moves(self, moves: list[tuple[Job, int, int]]) -> None:
        """Move running jobs to their (type, count index) as a solver chose them together: a move whose GPUs
        another move of the list frees is retried after it (passes until one changes nothing), so the order
        of the list does not decide which moves happen; moves that only fit together (two jobs swapping GPU
        types, a rotation) are then made at once (Simulator.reassign); what still does not fit (fragmentation)
        stays."""
        pending = moves
        while pending:
            left = [(job, t, c) for job, t, c in pending if not self.sim.rescale(job, t, c)]
            if len(left) == len(pending):
                self.sim.reassign(left)
                return
            pending = left


def _load() -> None:
    import libarena.schedule.policies as pkg

    for module in pkgutil.iter_modules(pkg.__path__):
        if module.name not in ("base",):
            importlib.import_module(f"{pkg.__name__}.{module.name}")


POLICIES: Registry[type[Policy]] = Registry("policy", _load)


def register_policy(cls: type[Policy]) -> type[Policy]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    return POLICIES.register(cls.name, cls)


def policy_names() -> list[str]:
    return POLICIES.names()


def get_policy(name: str) -> type[Policy]:
    return POLICIES.get(name)
