"""A training job: what the trace asked for (JobSpec) and its simulated life (Job)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from libarena.schedule.entities.allocation import Allocation


class JobState(str, Enum):
    PENDING = "pending"  # not yet submitted
    QUEUED = "queued"
    STARTING = "starting"  # holds GPUs, paying profiling / AP search / checkpoint-resume: no progress
    RUNNING = "running"
    FINISHED = "finished"
    DROPPED = "dropped"  # rejected by deadline admission control


@dataclass(frozen=True, slots=True)
class JobSpec:
    job_id: str
    row: int  # 1-based data row in the trace file
    submit_time: float
    model: str
    global_batch: int
    num_iterations: int
    requested_gpus: int
    requested_type: str | None  # None when the trace names no type (resolved by adaptation)
    deadline: float | None = None
    priority: int | None = None


@dataclass(slots=True, eq=False)
class Job:
    index: int
    spec: JobSpec
    requested_type_index: int
    priority: int
    #: the policy's decision view and the execution truth, [type, count] samples/s (0 = cannot run)
    view_thr: np.ndarray
    true_thr: np.ndarray
    state: JobState = JobState.PENDING
    alloc: Allocation | None = None
    progress: float = 0.0  # iterations done at progress_time
    progress_time: float = 0.0
    rate: float = 0.0  # iterations/s while RUNNING
    version: int = 0  # bumps on every (re)allocation: stale events are ignored
    first_start: float | None = None
    finish_time: float | None = None
    queue_since: float = 0.0  # when the job entered its current queue (promotion clock)
    enqueue_seq: int = 0
    #: the job's place in the simulator's in-flight order (``Simulator.active``, launch order): policies that
    #: walk the in-flight jobs break ties by that order, and an index of them sorts by this number
    active_seq: int = 0
    reschedules: int = 0
    overhead_s: float = 0.0
    starts_at: float = 0.0  # when a STARTING job begins to train (its overhead paid)
    profiles_at: float = 0.0  # when the job's profiles are (or were) ready, from its launch on
    profiled: bool = False
    #: why the policy can never place the job (its view has no configuration within the cluster); None while it can
    unschedulable: str | None = None
    policy_state: dict = field(default_factory=dict)
    #: the queue it was submitted to (``priority`` moves with Arena's promotions)
    submitted_priority: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.submitted_priority = self.priority

    @property
    def remaining(self) -> float:
        return self.spec.num_iterations - self.progress

    def remaining_at(self, now: float) -> float:
        done = self.progress + (self.rate * (now - self.progress_time) if self.state == JobState.RUNNING else 0.0)
        return max(0.0, self.spec.num_iterations - done)

    @property
    def active(self) -> bool:
        return self.state in (JobState.STARTING, JobState.RUNNING)
