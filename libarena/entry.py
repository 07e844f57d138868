"""The console scripts' first step: a one-line answer to Ctrl-C or SIGTERM while a tool is still importing.

A tool's imports (typer, rich, pyarrow, and JAX or Ray for some) take a few tenths of a second, before
:func:`libarena.cli.run_app` installs its handlers; a signal then would print Python's KeyboardInterrupt
traceback. This module imports only the standard library, so its handler is in place within milliseconds of
the interpreter starting. Nothing is written before the tool runs, so leaving at once loses nothing.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from types import FrameType

#: the exit status of any failed run (libarena.cli.run_app reports an interrupted run the same way)
INTERRUPTED_STATUS = 2


def launch(tool: str, module: str) -> None:
    """Import ``module`` (a tool's ``main`` module) and call its ``main()``, a signal meanwhile ending the
    process with ``TOOL: error: interrupted`` and status 2. ``run_app`` replaces the handler once it starts."""
    if threading.current_thread() is threading.main_thread():
        handler = _leave_interrupted(tool)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, handler)
    importlib.import_module(module).main()


def _leave_interrupted(tool: str):
    def handler(signum: int, frame: FrameType | None) -> None:
        try:
            os.write(sys.stderr.fileno(), f"{tool}: error: interrupted\n".encode())
        except (OSError, ValueError, AttributeError):  # no stderr to report on: the status says it
            pass
        os._exit(INTERRUPTED_STATUS)

    return handler
