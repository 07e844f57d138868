"""Run a profiling module in a fresh interpreter with N devices, exchanging plain JSON files.

On a host, N devices exist only when XLA is told so before JAX starts, so the communication benchmark and
the direct measurement both run ``python -m <module> request.json result.json`` with
``--xla_force_host_platform_device_count=N`` (on accelerators the child sees the machine's devices).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError
from libarena.profile.host import ChildLayout, XlaThreading, child_layout, merge_xla_flags


def device_env(platform: str, num_devices: int, threading: XlaThreading | None = None) -> ChildLayout:
    """Environment (and cores) of a child that runs ``num_devices`` devices of ``platform``: on a host,
    ``--xla_force_host_platform_device_count`` and the threading layout (None: this process's own)."""
    layout = child_layout(threading if platform == "cpu" else None, num_devices, os.environ)
    if platform == "cpu":
        layout.env["XLA_FLAGS"] = merge_xla_flags(layout.env.get("XLA_FLAGS", ""), (f"--xla_force_host_platform_device_count={int(num_devices)}",))
        layout.env["JAX_PLATFORMS"] = "cpu"
    return layout


def run_module_with_devices(
    module: str, request: Any, *, platform: str, num_devices: int, timeout_s: float, what: str,
    threading: XlaThreading | None = None,
) -> Any:
    """Write ``request`` as JSON, run ``module`` on it and return its JSON result; a failing child raises
    ``ArenaError("<what> failed: <last line of its output>")``."""
    layout = device_env(platform, num_devices, threading)
    with tempfile.TemporaryDirectory(prefix="arena-profile-") as tmp:
        request_path, result_path = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_path.write_text(json.dumps(request))
        proc = subprocess.run(
            layout.command([sys.executable, "-m", module, str(request_path), str(result_path)]),
            env=layout.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ArenaError(f"{what} failed: {tail[0]}")
        return json.loads(result_path.read_text())
