"""A benchmark's measuring child that keeps what it finished.

The long benchmarks (bench_profile, bench_gpu) measure in a child interpreter that rewrites its results file
(atomically) after every model. When the child overruns its time limit, or the benchmark itself is stopped
(Ctrl-C, SIGTERM), the child is stopped and the models it finished are kept instead of an hour's work lost.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError

#: Seconds a stopped child gets to exit after SIGTERM before it is killed.
STOP_GRACE_S = 10.0


class _Stopped(Exception):
    pass


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped


def run_child(command: list[str], out: Path, timeout_s: float | None = None, env: dict[str, str] | None = None,
              what: str = "the benchmark") -> tuple[dict[str, Any], str | None]:
    """Run ``command``, which writes its JSON results to ``out`` (rewritten as it goes). Returns (the payload,
    None) when it finished, or (the last payload it wrote, why it was stopped) when it overran ``timeout_s`` or
    this process was interrupted or terminated. A one-line ArenaError when it failed, or was stopped before
    writing anything."""
    previous = signal.getsignal(signal.SIGTERM)
    stopped: str | None = None
    # the handler goes in before the child starts: a SIGTERM between the two would leave the child running
    try:
        signal.signal(signal.SIGTERM, _raise_stopped)
        installed = True
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        installed = False
    proc: subprocess.Popen | None = None
    try:
        proc = subprocess.Popen(command, env=env)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stopped = f"overran {timeout_s:.0f} s"
    except (KeyboardInterrupt, _Stopped):
        stopped = "interrupted"
    finally:
        if installed:
            # a handler installed outside Python reads as None: the default action is the closest to it
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if stopped is not None:
        if not out.is_file():
            raise ArenaError(f"{what} {stopped} before finishing a model (its log is above)")
        return json.loads(out.read_text()), stopped
    assert proc is not None  # nothing stopped it, so it was started
    if proc.returncode != 0 or not out.is_file():
        raise ArenaError(f"{what} failed (exit {proc.returncode}; its log is above)")
    return json.loads(out.read_text()), None
