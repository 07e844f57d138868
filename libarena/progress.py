"""Progress of long library steps (profiling, perf build, simulation), reported without printing.

Library code never writes to the terminal: a long step takes a :data:`ProgressCallback` and calls it with
:class:`ProgressUpdate` values; the tools turn them into rich progress bars on stderr (libarena.cli.Reporter),
tests and benchmarks pass nothing (:func:`no_progress`). Importing this module imports nothing heavy, so the
planner and the scheduler stay fast to start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from dataclasses import dataclass


@dataclass(frozen=True)
class ProgressUpdate:
    """One step forward of a named task: ``completed`` of ``total`` units (``total`` None: unknown)."""

    #: the task's label, also its identity: updates with the same label move the same bar
    task: str
    completed: float
    total: float | None = None
    #: what is being done right now (shown next to the bar)
    detail: str = ""

    @property
    def done(self) -> bool:
        return self.total is not None and self.completed >= self.total


ProgressCallback = Callable[[ProgressUpdate], None]


def no_progress(update: ProgressUpdate) -> None:
    """The default callback: progress is not reported."""
    del update


class Report(Protocol):
    """Where a pipeline step reports what it does (the tools pass their libarena.cli.Reporter)."""

    def log(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...

    def progress(self, update: ProgressUpdate) -> None: ...


class SilentReport:
    """Reports nothing (library callers, tests, benchmarks)."""

    def log(self, message: str) -> None:
        del message

    def warn(self, message: str) -> None:
        del message

    def progress(self, update: ProgressUpdate) -> None:
        del update
