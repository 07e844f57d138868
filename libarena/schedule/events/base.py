"""Base event: the heap orders events by (time, event-type priority, sequence number), a total order.

At equal times, completions come first (they free GPUs), then training (re)starts, then arrivals, and the
scheduling tick last, so that a tick at time t sees everything that happened at t. The sequence number is
assigned by the simulator when the event is pushed, so the order never depends on object identity.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from libarena.schedule.entities import Job
    from libarena.schedule.simulator import Simulator


class Event(ABC):
    __slots__ = ("time",)
    #: lower runs first among events at the same time
    priority: ClassVar[int] = 0

    def __init__(self, time: float):
        self.time = time

    @abstractmethod
    def handle(self, sim: Simulator) -> None:
        """Apply the event to the simulation."""


class JobVersionEvent(Event):
    """An event predicted for a job's allocation at ``version``: stale (ignored) once the job was re-allocated."""

    __slots__ = ("job", "version")

    def __init__(self, time: float, job: Job, version: int):
        super().__init__(time)
        self.job = job
        self.version = version

    def handle(self, sim: Simulator) -> None:
        if self.job.version == self.version:
            self.apply(sim)

    @abstractmethod
    def apply(self, sim: Simulator) -> None:
        """Apply the event (its job is still on the allocation it was predicted for)."""
