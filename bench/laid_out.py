"""A benchmark's measuring interpreter laid out as the profiler's measurement is, and the quiet start around it.

bench_sharing and bench_handoff time XLA host devices in a fresh interpreter with N devices under the ``pinned``
layout, on the cores they name, exchanging JSON files (``python -m bench.<module> --child REQUEST RESULT``); both
start only on a quiet host and record the load around the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError


def run_laid_out_child(module: str, request: dict[str, Any], cores: list[int], devices: int, tmp: Path) -> dict[str, Any]:
    """``python -m module --child`` with ``devices`` host devices pinned to ``cores``: its JSON result (a one-line
    ArenaError when it failed)."""
    from libarena.profile.host import XLA_THREADING, ChildLayout
    from libarena.profile.subprocess_devices import device_env

    env = device_env("cpu", devices, XLA_THREADING.get("pinned")).env
    tag = f"{devices}-{len(cores)}"
    request_path, result_path = tmp / f"request-{tag}.json", tmp / f"result-{tag}.json"
    request_path.write_text(json.dumps({**request, "cores": cores, "devices": devices}))
    layout = ChildLayout(env, cores)
    proc = subprocess.run(layout.command([sys.executable, "-m", module, "--child", str(request_path), str(result_path)]), env=layout.env)
    if proc.returncode != 0 or not result_path.is_file():
        name = module.rsplit(".", 1)[-1]
        raise ArenaError(f"{name}: the measuring interpreter on cores {cores} failed (exit {proc.returncode}; its log is above)")
    return json.loads(result_path.read_text())


class QuietRun:
    """Waits for a quiet host (libarena.profile.host.QuietPolicy) when made; ``protocol()`` then records the
    quiet check, the load average before and after, and the wall time since."""

    def __init__(self, log: Callable[[str], None]) -> None:
        from libarena.profile.host import QuietPolicy, wait_until_quiet

        self.quiet = wait_until_quiet(QuietPolicy(), log)
        self.load_before = os.getloadavg()
        self.started = time.perf_counter()

    def protocol(self, **extra: Any) -> dict[str, Any]:
        return {"quiet_check": self.quiet, "load_average_before": [round(x, 2) for x in self.load_before],
                "load_average_after": [round(x, 2) for x in os.getloadavg()], "wall_s": time.perf_counter() - self.started, **extra}


@contextmanager
def laid_out_run(name: str, models: tuple[str, ...], devices: int, log: Callable[[str], None]) -> Iterator[tuple[QuietRun, dict[str, Any], Path]]:
    """A benchmark ``name`` over ``models`` on ``devices`` cores: refuses (one line) without that many usable cores,
    waits for a quiet host, and writes each model's plans table (bench_profile's) into a temporary folder. Yields
    the run (its ``protocol()``), a child request naming the plans tables, and the folder."""
    from bench.bench_profile import _plans
    from libarena.profile.host import STARTING_CORES

    if len(STARTING_CORES) < devices:
        raise ArenaError(f"{name} needs {devices} usable cores, this process has {len(STARTING_CORES)}")
    timed = QuietRun(log)
    with tempfile.TemporaryDirectory(prefix=f"{name.replace('_', '-')}-") as folder:
        tmp = Path(folder)
        yield timed, {"plans": {model: str(_plans(tmp, model)) for model in models}}, tmp


def laid_out_main(child: Callable[[dict[str, Any]], dict[str, Any]], run: Callable[[Path], bool]) -> None:
    """A laid-out benchmark run as a module: ``--child REQUEST RESULT`` is its measuring interpreter; without
    arguments the benchmark alone, its refusals a line on stderr and exit status 2."""
    from libarena.artifacts import write_json

    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        write_json(sys.argv[3], child(json.loads(Path(sys.argv[2]).read_text())))
        raise SystemExit(0)
    try:
        run(Path("bench/results"))
    except ArenaError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None
