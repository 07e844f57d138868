from __future__ import annotations

from typing import TYPE_CHECKING

from libarena.schedule.events.base import Event

if TYPE_CHECKING:
    from libarena.schedule.entities import Job
    from libarena.schedule.simulator import Simulator


class ArrivalEvent(Event):
    """A job is submitted and handed to the policy's queue."""

    __slots__ = ("job",)
    priority = 2

    def __init__(self, time: float, job: Job):
        super().__init__(time)
        self.job = job

    def handle(self, sim: Simulator) -> None:
        sim.arrive(self.job)
