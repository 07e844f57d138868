from __future__ import annotations

from typing import TYPE_CHECKING

from libarena.schedule.events.base import JobVersionEvent

if TYPE_CHECKING:
    from libarena.schedule.simulator import Simulator


class LaunchEvent(JobVersionEvent):
    """A launched job has paid its launch overheads (profiling, AP search) and starts training."""

    __slots__ = ()
    priority = 1

    def apply(self, sim: Simulator) -> None:
        sim.start_training(self.job)
