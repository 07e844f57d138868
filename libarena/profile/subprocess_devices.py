"""Run a profiling module in a fresh interpreter with N devices, exchanging plain JSON files.

On a host, N devices exist only when XLA is told so before JAX starts, so the communication benchmark and
the direct measurement both run ``python -m <module> request.json result.json`` with
``--xla_force_host_platform_device_count=N`` (on accelerators the child sees the machine's devices).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError
from libarena.profile.host import ChildLayout, XlaThreading, child_layout, merge_xla_flags


def device_env(platform: str, num_devices: int, threading: XlaThreading | None = None,
               device_index: int | None = None) -> ChildLayout:
    """Environment (and cores) of a child that runs ``num_devices`` devices of ``platform``: on a host,
    ``--xla_force_host_platform_device_count`` and the threading layout (None: this process's own). On an
    accelerator, ``device_index`` (this process's index of one GPU) makes that GPU the child's only one, its gpu:0."""
    layout = child_layout(threading if platform == "cpu" else None, num_devices, os.environ)
    if platform == "cpu":
        layout.env["XLA_FLAGS"] = merge_xla_flags(layout.env.get("XLA_FLAGS", ""), (f"--xla_force_host_platform_device_count={int(num_devices)}",))
        layout.env["JAX_PLATFORMS"] = "cpu"
    elif device_index is not None:
        layout.env["CUDA_VISIBLE_DEVICES"] = visible_device(layout.env.get("CUDA_VISIBLE_DEVICES"), device_index)
    return layout


def visible_device(visible: str | None, index: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child that sees only this process's GPU ``index``: the index-th entry of this
    process's own list where it has one (its gpu:1 under ``2,3`` is the machine's GPU 3), else the index itself."""
    entries = [entry.strip() for entry in (visible or "").split(",") if entry.strip()]
    if not entries:
        return str(index)
    if index >= len(entries):
        raise ArenaError(f"GPU {index} is not among this process's visible devices (CUDA_VISIBLE_DEVICES={visible})")
    return entries[index]


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
        try:
            proc = subprocess.run(
                layout.command([sys.executable, "-m", module, str(request_path), str(result_path)]),
                env=layout.env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:  # subprocess.run has killed the child
            raise ArenaError(f"{what} failed: no result within {timeout_s:g} s (child stopped)") from None
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ArenaError(f"{what} failed: {tail[0]}")
        return json.loads(result_path.read_text())


#: seconds a child may take to answer one request (a compilation and its timings) before it is stopped
REQUEST_TIMEOUT_S = 1800.0


class DeviceChild:
    """A child interpreter with ``num_devices`` devices, kept alive between requests: ``python -m module
    --serve *args`` answering one JSON line per JSON request line (``serve_requests`` is its side). A failing
    child raises ``ArenaError("<what> failed: ...")`` in one line; one that has not answered a request after
    ``timeout_s`` is stopped and raises the same way."""

    def __init__(self, module: str, args: list[str], num_devices: int, *, what: str, platform: str = "cpu",
                 threading: XlaThreading | None = None, timeout_s: float = REQUEST_TIMEOUT_S,
                 device_index: int | None = None) -> None:
        layout = device_env(platform, num_devices, threading, device_index)
        self.num_devices = num_devices
        self.what = what
        self.timeout_s = timeout_s
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            layout.command([sys.executable, "-m", module, "--serve", *args]),
            env=layout.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            # one reply line per request, so nothing is left in the pipe's buffer: waiting on the descriptor is exact
            ready, _, _ = select.select([proc.stdout], [], [], self.timeout_s)
            if not ready:
                proc.kill()
                proc.wait()
                raise ArenaError(f"{self.what} failed: no answer to {request.get('op')!r} within {self.timeout_s:g} s (child stopped)")
            line = proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read().strip().splitlines()[-1:] or ["no output"]
            raise ArenaError(f"{self.what} failed: {tail[0]}")
        reply = json.loads(line)
        if "error" in reply:
            raise ArenaError(f"{self.what} failed: {reply['error']}")
        return reply

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self.ask({"op": "exit"})
            except ArenaError:
                pass
            try:
                self._proc.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a child that does not exit is ended
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> DeviceChild:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def serve_requests(handlers: dict[str, Any]) -> None:
    """The child side of DeviceChild: each request's ``op`` picks a handler (request -> reply dict); ``exit``
    ends the loop. Replies go to the original stdout, one JSON line each; anything else printed goes to stderr;
    a failing handler is reported to the parent as one line."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        request = json.loads(line)
        op = request.get("op")
        if op == "exit":
            replies.write(json.dumps({"ok": True}) + "\n")
            replies.flush()
            break
        try:
            if op not in handlers:
                raise ArenaError(f"unknown request {op!r}")
            reply = handlers[op](request)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as one line
            reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
