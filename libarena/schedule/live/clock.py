"""Virtual time for the live scheduler: seconds of scheduler time = wall seconds x compression, from an origin
persisted in the state database (so time keeps running across a restart, as the jobs do)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from libarena.errors import ArenaError

#: Scheduler seconds per wall second at most (ten million: a year of scheduler time in three wall seconds).
MAX_COMPRESSION = 1e7


@dataclass(frozen=True)
class VirtualClock:
    wall_origin: float
    compression: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.compression <= MAX_COMPRESSION:
            raise ArenaError(f"time compression must be in (0, {MAX_COMPRESSION:g}], got {self.compression}")

    def now(self) -> float:
        return self.at(time.time())

    def at(self, wall: float) -> float:
        return (wall - self.wall_origin) * self.compression

    def wall_of(self, virtual: float) -> float:
        return self.wall_origin + virtual / self.compression
