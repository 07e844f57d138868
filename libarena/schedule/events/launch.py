from __future__ import annotations

from typing import TYPE_CHECKING

from libarena.schedule.events.base import Event

if TYPE_CHECKING:
    from libarena.schedule.entities import Job
    from libarena.schedule.simulator import Simulator


class LaunchEvent(Event):
    """A launched job has paid its launch overheads (profiling, AP search) and starts training."""

    __slots__ = ("job", "version")
    priority = 1

    def __init__(self, time: float, job: Job, version: int):
        super().__init__(time)
        self.job = job
        self.version = version

    def handle(self, sim: Simulator) -> None:
        if self.job.version == self.version:
            sim.start_training(self.job)
