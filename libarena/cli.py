"""Shared plumbing for the thin typer tools: one-line errors, exit codes, logging to stderr."""

from __future__ import annotations

import atexit
import contextlib
import errno
import gc
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import typer
from rich.console import Console

from libarena.errors import ArenaError
from libarena.progress import ProgressUpdate

#: Logs and progress go to stderr; stdout is for data only.
stderr_console = Console(stderr=True, highlight=False)

#: Help texts of the options every producing command shares.
QUIET_HELP = "no progress bars or info logs on stderr (warnings and errors are still printed)"
JSON_HELP = "print a one-object JSON summary of what was done on stdout (not with -o -)"

#: The options every producing command shares, declared once (typer accepts one OptionInfo in many commands).
QUIET_OPTION = typer.Option(False, "--quiet", "-q", help=QUIET_HELP)
JSON_OPTION = typer.Option(False, "--json", help=JSON_HELP)
NO_CACHE_OPTION = typer.Option(False, "--no-cache", help="recompute even when the stage cache has this output")
CACHE_DIR_OPTION = typer.Option(None, "--cache-dir", help="cache root; outputs in DIR/stages/ (default .arena-cache)")


class Reporter:
    """What a tool shows on stderr while it works: info logs, warnings, and rich progress bars.

    ``quiet`` hides logs and bars (warnings and errors stay). Bars are drawn only when stderr is a terminal,
    and are transient (they vanish when the step ends, leaving the log lines), so redirected stderr holds
    only the short log lines and a failing run still ends with its one-line error. Library code never
    prints: it gets :meth:`log` and :meth:`progress` (a :data:`libarena.progress.ProgressCallback`).
    """

    def __init__(self, *, quiet: bool = False, prefix: str = "", console: Console | None = None) -> None:
        self.quiet = quiet
        self.prefix = prefix
        self.console = console or stderr_console
        self.started = time.perf_counter()
        self._bars: Any = None  # rich.progress.Progress, created on the first update
        self._tasks: dict[str, Any] = {}

    @property
    def bars_enabled(self) -> bool:
        return not self.quiet and self.console.is_terminal

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def log(self, message: str) -> None:
        if not self.quiet:
            self.console.print(f"{self.prefix}{message}", markup=False, highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        self.console.print(f"{self.prefix}warning: {message}", markup=False, highlight=False, soft_wrap=True)

    def progress(self, update: ProgressUpdate) -> None:
        if not self.bars_enabled:
            return
        if self._bars is None:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                                  TextColumn("{task.fields[detail]}"), console=self.console, transient=True)
            self._bars.start()
        count = f"{update.completed:g}/{update.total:g}" if update.total is not None else ""
        task = self._tasks.get(update.task)
        if task is None:
            task = self._tasks[update.task] = self._bars.add_task(update.task, total=update.total, count=count,
                                                                  detail=update.detail)
        self._bars.update(task, completed=update.completed, total=update.total, count=count, detail=update.detail)

    def close(self) -> None:
        if self._bars is not None:
            self._bars.stop()
            self._bars = None
            self._tasks.clear()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def refuse_json_with_stdout_data(as_json: bool, output: Any) -> None:
    """``--json`` writes its summary on stdout, so it cannot share stdout with the data (``-o -``)."""
    if as_json and str(output) == "-":
        raise ArenaError("--json prints its summary on stdout, which -o - uses for the data: write the output "
                         "to a file with -o FILE, or drop --json")


def refuse_binary_to_terminal(output: Any) -> None:
    """An Arrow stream (``-o -``) is binary: refused when stdout is a terminal, where it would only garble it."""
    if str(output) == "-" and sys.stdout.isatty():
        raise ArenaError("refusing to write an Arrow stream to a terminal: use -o FILE or pipe the output")


def _strict(value: Any) -> Any:
    """``value`` with NaN and infinities as null: JSON has no such numbers, and strict parsers refuse the tokens."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def strict_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` with NaN and infinities as null: what every tool prints or writes as JSON
    is strict JSON, whatever numbers a table read from elsewhere holds."""
    return json.dumps(_strict(value), allow_nan=False, **options)


def print_json(summary: Mapping[str, Any]) -> None:
    """The ``--json`` summary: one strict JSON object on stdout (NaN and infinities as null)."""
    sys.stdout.write(strict_json(summary, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def fail(tool: str, message: str, code: int = 2) -> None:
    """Print ``tool: error: message`` as one line on stderr and exit."""
    one_line = " ".join(str(message).split())
    print(f"{tool}: error: {one_line}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def _raise_interrupt(signum: int, frame: Any) -> None:
    # A handler that runs inside a garbage-collector callback (JAX registers one; a collection of a large heap
    # runs its Python code first when it ends) raises into the collector, which only prints and ignores it:
    # send the signal again shortly, to land outside the collection.
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks:
            threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def _interrupt_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C, so temporary files are removed and the cache stays valid; both go through
    _raise_interrupt (Python's own SIGINT handler raises inside a collector callback too, where it is lost)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, _raise_interrupt)


def run_app(tool: str, app: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Run a typer/click app so that bad input never shows a traceback.

    ArenaError and OSError (missing or unwritable files) exit with code 2; any other exception is an
    internal error, reported in one line with exit code 1 unless ``--debug`` is among the arguments. A
    reader that stops early (``arena-analyze -o - | head -c 10``) ends the run as it ends Unix tools: killed
    by SIGPIPE, without a word.
    """
    try:
        _run_app(tool, app, argv)
        if argv is None:
            sys.stdout.flush()  # what is still buffered meets a closed pipe here
        code: Any = 0
    except BrokenPipeError:
        _closed_pipe(argv)
    except SystemExit as exc:
        if _stdout_closed_by_reader() or _exit_for_closed_pipe(exc):
            _closed_pipe(argv)
        if argv is not None or not isinstance(exc.code, (int, type(None))):
            raise
        code = exc.code or 0
    if argv is None and not _ray_running():
        _leave_without_native_teardown(code)
    if code:
        raise SystemExit(code)


def _leave_without_native_teardown(code: int) -> None:
    """End a finished command without the C++ half of interpreter teardown.

    Its outputs are already renamed into place and its temporary files removed, so nothing is left to do;
    but a native thread pool still alive at exit (Arrow's, apache/arrow#34314) can abort the process with
    SIGABRT ("terminate called without an active exception") after the work succeeded, or after the one-line
    error, when static destructors run. Python's own exit handlers still run; then the process leaves.
    """
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _closed_pipe(None)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    for thread in threading.enumerate():  # as teardown would: Python threads the command started finish
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # the interpreter's own first step of teardown (CPython, every version we support)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _stdout_closed_by_reader() -> bool:
    """Whether click met EPIPE on stdout: it swaps stdout for a wrapper that ignores it (click's, or the copy
    typer vendors; matched by name), and exits 1."""
    return type(sys.stdout).__name__.lstrip("_") == "PacifyFlushWrapper"


def _exit_for_closed_pipe(exc: SystemExit) -> bool:
    """Whether a library ended the run because its reader went away: rich does on EPIPE (its console points
    stdout at /dev/null and exits 1, from inside the handler of the error), so that error is the exit's context."""
    context = exc.__context__
    return exc.code == 1 and isinstance(context, OSError) and context.errno == errno.EPIPE


#: the exit status of a process killed by SIGPIPE, as shells report it
SIGPIPE_STATUS = 128 + signal.SIGPIPE


def _closed_pipe(argv: list[str] | None) -> None:
    """End like a Unix tool whose reader went away: killed by SIGPIPE (status 141 in the shell), silently.
    Work already unwound (temp files removed by their context managers on the way out)."""
    if argv is not None:  # in-process (tests): no signal to this process
        raise SystemExit(SIGPIPE_STATUS)
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing more is written to the closed pipe
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(SIGPIPE_STATUS)  # not reached: the signal ends the process


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _run_app(tool: str, app: Callable[..., Any], argv: list[str] | None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    _interrupt_on_signals()
    try:
        code = app(args=args, prog_name=tool, standalone_mode=False)
        # typer turns KeyboardInterrupt (Ctrl-C, or SIGTERM above) into Exit(130), which non-standalone
        # mode *returns* instead of raising: without this check an interrupted run would exit 0.
        if code == 130:
            raise KeyboardInterrupt
    except ArenaError as exc:
        fail(tool, exc.message, exc.exit_code)
    except OSError as exc:
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        fail(tool, f"{exc.strerror or exc}{':' if where else ''}{where}", 2)
    except KeyboardInterrupt:
        # An interrupted run is reported like any other failed run (exit 2); atomic writes leave no partial output.
        fail(tool, "interrupted", 2)
    except SystemExit:
        raise
    except typer.Exit as exc:
        raise SystemExit(getattr(exc, "exit_code", 0)) from None
    except typer.Abort:
        fail(tool, "aborted", 1)
    except typer.TyperException as exc:  # usage errors: unknown option, missing argument, bad value
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        fail(tool, message, 2)
    except Exception as exc:  # noqa: BLE001 - the last guard before the user's terminal
        if debug:
            raise
        fail(tool, f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)", 1)
