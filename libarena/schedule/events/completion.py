from __future__ import annotations

from typing import TYPE_CHECKING

from libarena.schedule.events.base import JobVersionEvent

if TYPE_CHECKING:
    from libarena.schedule.simulator import Simulator


class CompletionEvent(JobVersionEvent):
    """A job has done all its iterations (ignored if the job was re-allocated since it was predicted)."""

    __slots__ = ()
    priority = 0

    def apply(self, sim: Simulator) -> None:
        sim.complete(self.job)
