"""Shared plumbing for the thin typer tools: one-line errors, exit codes, logging to stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from libarena.errors import ArenaError

#: Logs and progress go to stderr; stdout is for data only.
stderr_console = Console(stderr=True, highlight=False)


def fail(tool: str, message: str, code: int = 2) -> None:
    """Print ``tool: error: message`` as one line on stderr and exit."""
    one_line = " ".join(str(message).split())
    print(f"{tool}: error: {one_line}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def run_app(tool: str, app: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Run a typer/click app so that bad input never shows a traceback.

    ArenaError and OSError (missing or unwritable files) exit with code 2; any other exception is an
    internal error, reported in one line with exit code 1 unless ``--debug`` is among the arguments.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        app(args=args, prog_name=tool, standalone_mode=False)
    except ArenaError as exc:
        fail(tool, exc.message, exc.exit_code)
    except OSError as exc:
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        fail(tool, f"{exc.strerror or exc}{':' if where else ''}{where}", 2)
    except KeyboardInterrupt:
        fail(tool, "interrupted", 130)
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
