from __future__ import annotations

from typing import TYPE_CHECKING

from libarena.schedule.events.base import Event

if TYPE_CHECKING:
    from libarena.schedule.entities import Job
    from libarena.schedule.simulator import Simulator


class CompletionEvent(Event):
    """A job has done all its iterations (ignored if the job was re-allocated since it was predicted)."""

    __slots__ = ("job", "version")
    priority = 0

    def __init__(self, time: float, job: Job, version: int):
        super().__init__(time)
        self.job = job
        self.version = version

    def handle(self, sim: Simulator) -> None:
        if self.job.version == self.version:
            sim.complete(self.job)
