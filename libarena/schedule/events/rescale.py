from __future__ import annotations

from libarena.schedule.events.launch import LaunchEvent


class RescaleEvent(LaunchEvent):
    """A rescaled or migrated job has paid checkpoint-resume and AP search and resumes training."""

    __slots__ = ()
    priority = 1
