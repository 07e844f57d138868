"""One class per simulation event; the simulator keeps them on a heap under a total order."""

from libarena.schedule.events.arrival import ArrivalEvent
from libarena.schedule.events.base import Event
from libarena.schedule.events.completion import CompletionEvent
from libarena.schedule.events.launch import LaunchEvent
from libarena.schedule.events.rescale import RescaleEvent
from libarena.schedule.events.tick import SchedulingTickEvent

__all__ = ["ArrivalEvent", "CompletionEvent", "Event", "LaunchEvent", "RescaleEvent", "SchedulingTickEvent"]
