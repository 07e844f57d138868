"""How a tool's process ends: finished commands skip the native half of interpreter teardown.

A native thread pool alive at exit (Arrow's, apache/arrow#34314) can abort a process with SIGABRT after its
work succeeded; CI saw ``arena-plan show --json`` end that way. The abort happens in C-level exit handlers
and static destructors, so the stand-in here is a C exit handler that calls ``abort()``: a process that goes
through ``exit()`` dies with SIGABRT, one that leaves as the tools do exits with its own status, after its
Python threads and Python exit handlers ran.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, ctypes, sys, threading, time
    import typer
    from libarena.cli import run_app
    from libarena.errors import ArenaError

    libc = ctypes.CDLL(None)
    # what a native pool's teardown can do: a C exit handler that aborts (glibc exports atexit as this)
    libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)

    app = typer.Typer()

    @app.command()
    def main(outcome: str) -> None:
        def late() -> None:
            time.sleep(0.2)
            print("thread finished", file=sys.stderr, flush=True)
        threading.Thread(target=late).start()
        atexit.register(lambda: print("exit handler ran", file=sys.stderr, flush=True))
        print("data")
        if outcome == "fail":
            raise ArenaError("no such thing")

    if sys.argv[1] == "exit":  # control: the ordinary way out reaches the C exit handler
        sys.exit(0)
    run_app("tool", app)
""")


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, timeout=120)


def test_ordinary_exit_reaches_the_native_abort():
    assert _run("exit").returncode == -signal.SIGABRT


@pytest.mark.parametrize(("outcome", "code"), [("ok", 0), ("fail", 2)])
def test_finished_command_leaves_without_native_teardown(outcome, code):
    r = _run(outcome)
    assert r.returncode == code, r.stderr
    assert r.stdout == "data\n"
    assert "thread finished" in r.stderr and "exit handler ran" in r.stderr
    assert r.stderr.index("thread finished") < r.stderr.index("exit handler ran")
    if outcome == "fail":
        assert "tool: error: no such thing" in r.stderr


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_during_a_garbage_collection_still_interrupts(signame) -> None:
    """A SIGTERM or SIGINT whose handler runs inside a collector callback (where a raised exception is only
    printed and ignored) still ends the run with KeyboardInterrupt: the signal is sent again outside the
    collection."""
    child = """
import gc, os, signal, time
from libarena import cli
cli._interrupt_on_signals()
def callback(phase, info):
    if phase == "stop" and not fired:
        fired.append(1)
        os.kill(os.getpid(), signal.""" + signame + """)
        sum(range(10_000))  # bytecode: the handler runs here, inside the callback
fired = []
gc.callbacks.append(callback)
try:
    gc.collect()
    time.sleep(5)
except KeyboardInterrupt:
    print("interrupted")
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "interrupted", proc.stderr


def test_json_summaries_are_strict_json(capsys):
    """NaN and infinities (an unmeasured plan's error, say) print as null: strict parsers refuse the tokens."""
    import json

    from libarena.cli import print_json

    print_json({"a": float("nan"), "b": [1.5, float("inf")], "c": {"d": -float("inf")}, "e": (2, float("nan"))})
    text = capsys.readouterr().out
    assert json.loads(text, parse_constant=lambda token: pytest.fail(f"non-strict token {token}")) == {
        "a": None, "b": [1.5, None], "c": {"d": None}, "e": [2, None]}


PIPE_APP = textwrap.dedent("""
    import sys
    import typer
    from rich.console import Console
    from libarena.artifacts.io import write_bytes
    from libarena.cli import print_json, run_app

    app = typer.Typer()

    @app.command()
    def main(how: str, target: str = typer.Argument("-")) -> None:
        if how == "buffered":  # still in sys.stdout's buffer when the command returns: run_app's flush meets EPIPE
            print("data")
        elif how == "large":  # EPIPE inside the command: typer's handler
            print("x" * 200_000)
        elif how == "json":
            print_json({"a": 1})
        elif how == "rich":  # rich handles EPIPE itself (stdout to /dev/null, exit 1)
            Console(file=sys.stdout, width=80).print("data")
        elif how == "bytes":  # what trace scale, cluster scale and plan export write with -o -
            write_bytes("-", b"y" * 200_000)
        elif how == "named-pipe":  # -o a FIFO: more than its buffer holds, so a write meets the reader's leaving
            write_bytes(target, b"y" * 200_000)

    run_app("tool", app)
""")


def _into_closed_pipe(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run with stdout a pipe whose reader is gone before the start, so the first write meets EPIPE whatever the
    timing (behind `| head -1` output that fits the pipe may all be written first, and the tool rightly ends 0)."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(argv, stdout=write_end, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, timeout=120)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("how", ["buffered", "large", "json", "rich", "bytes"])
def test_a_reader_that_went_away_ends_the_run_with_sigpipe_silently(how):
    r = _into_closed_pipe([sys.executable, "-c", PIPE_APP, how])
    assert r.returncode == -signal.SIGPIPE, (r.returncode, r.stderr.decode())
    assert r.stderr == b""


def test_a_named_pipe_whose_reader_went_away_ends_the_run_with_sigpipe_silently(tmp_path):
    """``-o`` a FIFO is written as a stream: its reader leaving is stdout's case (it had ended with exit 2 and
    "cannot write ...: Broken pipe")."""
    import os
    import time

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader exists, so the tool's open does not block
    proc = subprocess.Popen([sys.executable, "-c", PIPE_APP, "named-pipe", str(fifo)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        # the first byte read: the tool has opened the pipe and is writing; then the reader goes away
        deadline, got = time.monotonic() + 120, b""
        while not got and proc.poll() is None and time.monotonic() < deadline:
            try:
                got = os.read(reader, 1)  # b"" while no writer has opened the pipe yet
            except BlockingIOError:
                pass  # opened, nothing written yet
            if not got:
                time.sleep(0.01)
    finally:
        os.close(reader)
    _, err = proc.communicate(timeout=120)
    assert got == b"y"
    assert proc.returncode == -signal.SIGPIPE, (proc.returncode, err.decode())
    assert err == b""


@pytest.mark.parametrize("argv", [["arena-analyze", "--list-models"], ["arena-schedule", "--help"],
                                  ["arena-schedule", "policies"]], ids=" ".join)
def test_every_tool_ends_with_sigpipe_when_its_reader_is_gone(argv):
    """Tables and help are drawn by rich, which ended with status 1 on a closed pipe where plain writes end 141."""
    from pathlib import Path

    r = _into_closed_pipe([str(Path(sys.executable).with_name(argv[0])), *argv[1:]])
    assert r.returncode == -signal.SIGPIPE, (r.returncode, r.stderr.decode())
    assert r.stderr == b""


def test_a_closed_stdin_and_a_linked_stdout_as_the_tools_streams(repo_root):
    """``-`` with stdin closed (``<&-``) is a one-line error, not an internal one; ``-o /dev/stdout`` (a link to
    a pipe whose /proc name realpath cannot follow) writes the stream, as ``-o -`` does."""
    from pathlib import Path

    exe = Path(sys.executable).with_name("arena-schedule")
    # (the shell closes it: a preexec_fn would fork this multithreaded process)
    closed = subprocess.run(["/bin/sh", "-c", 'exec "$0" trace stats - <&-', str(exe)], capture_output=True, text=True,
                            timeout=120)
    assert closed.returncode == 2 and closed.stderr.strip() == "arena-schedule: error: stdin is closed: expected a trace CSV"
    cluster = repo_root / "examples" / "clusters" / "paper-sim-1280.yaml"
    for target in ("/dev/stdout", "/dev/fd/1"):
        piped = subprocess.run([str(exe), "cluster", "scale", str(cluster), "-x", "2", "-o", target],
                               capture_output=True, text=True, timeout=120)
        assert piped.returncode == 0, piped.stderr
        assert piped.stdout.startswith("name: paper-sim-1280-x2\nnode_groups:\n")
