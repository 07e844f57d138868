from __future__ import annotations

from typing import TYPE_CHECKING

from libarena.schedule.events.base import Event

if TYPE_CHECKING:
    from libarena.schedule.simulator import Simulator


class SchedulingTickEvent(Event):
    """The periodic scheduling round (every SimulatorConfig.tick_s, 300 s by default as in the paper)."""

    __slots__ = ()
    priority = 3

    def handle(self, sim: Simulator) -> None:
        sim.tick()
