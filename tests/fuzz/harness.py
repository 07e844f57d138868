"""Fuzz harness: run an Arena tool in-process (or as its console script) and check the bad-input contract.

The contract every generated case must meet (the project's standard for bad input):

- exit code 0 or 2 (never 1 = "internal error", never a traceback);
- exit code 2: exactly one line on stderr, ``<tool>: error: ...``;
- the output directory holds nothing new but the intended complete files (on failure: nothing new at all);
  on success the stage cache may appear too (``.arena-cache/``, the producing commands' default --cache-dir
  relative to the case's fresh working directory, so cases never share cache entries).

Tools run in-process through :func:`libarena.cli.run_app` (the same wrapper the console scripts use), with
stdin/stdout/stderr swapped for in-memory buffers, so a few hundred cases per tool take seconds. A handful
of subprocess cases per tool (``test_console_scripts.py``) prove the real console scripts behave the same
(Python warnings, which pytest records in-process, reach stderr there as users would see them).

An internal error is rerun with ``--debug`` so the assertion message carries the traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

from libarena.cli import run_app

TOOLS = ("arena-analyze", "arena-plan", "arena-profile", "arena-schedule", "arena-run")

#: Generated cases per (tool, test). ``test_budget.py`` checks each tool gets at least 500 in CI, and every
#: fuzz test checks it really ran its share (hypothesis stops early when a strategy's space is exhausted).
BUDGET: dict[str, dict[str, int]] = {
    "arena-analyze": {"cli_args": 260, "absurd_sizes": 6, "show_table": 200, "show_bytes": 60},
    "arena-plan": {"cli_args": 90, "ops_table": 140, "ops_bytes": 40, "cluster_spec": 110, "show_export": 130,
                   "comm_table": 30},
    "arena-profile": {"cli_args": 150, "plans_table": 140, "perf_show": 160, "perf_csv": 60, "comm_args": 60},
    "arena-schedule": {"trace_csv": 170, "trace_stats": 60, "perf_table": 80, "cluster_spec": 60,
                       "sim_args": 70, "job_file": 90, "state_db": 30},
    "arena-run": {"cli_args": 260, "plans_table": 140, "grid": 110},
}
MIN_CASES_PER_TOOL = 500
#: The producing commands' default cache root (libarena.artifacts.stage_cache.DEFAULT_CACHE_DIR).
STAGE_CACHE_DIR = ".arena-cache"
#: (tool, exit code) -> cases seen in this session (printed at the end of the run by conftest).
OUTCOMES: dict[tuple[str, int], int] = {}

FUZZ_SETTINGS = dict(
    derandomize=True,  # fixed seed: CI sees the same cases every run
    database=None,
    deadline=None,
    print_blob=False,
    verbosity=Verbosity.quiet,  # the assertion message names argv and stderr; inputs are whole files
    # no shrinking: a failure is reported as generated (shrinking thousands-row tables costs minutes)
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                           HealthCheck.function_scoped_fixture, HealthCheck.large_base_example],
)


@dataclass
class Outcome:
    code: int
    stdout: bytes
    stderr: str
    argv: list[str]

    def describe(self) -> str:
        return f"argv={self.argv!r} exit={self.code} stderr={self.stderr[-2000:]!r}"


def _app(tool: str):
    return importlib.import_module(f"arena_{tool.removeprefix('arena-')}.main").app


@contextlib.contextmanager
def _chdir(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def _show_warnings_as_a_process_would(stack: contextlib.ExitStack, err: io.TextIOBase) -> None:
    """Python warnings onto the tool's stderr, as a process would show them (pytest would otherwise collect them):
    a numpy RuntimeWarning is a line a user sees, and breaks the one-line error. The filters libraries set stay;
    what none of them decides is shown every time (a process shows each place once, but each case here is a
    process of its own), except the kinds a fresh interpreter hides."""
    stack.enter_context(warnings.catch_warnings())
    for quiet in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.simplefilter("ignore", quiet)
    warnings.simplefilter("always", append=True)
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: err.write(
        warnings.formatwarning(message, category, filename, lineno, line))


def invoke(tool: str, argv: list[str], *, stdin: bytes = b"", cwd: Path | None = None) -> Outcome:
    """Run ``tool argv`` in this process through run_app; return its exit code and captured streams."""
    out_buf, err_buf = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(out_buf, encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(err_buf, encoding="utf-8", errors="backslashreplace", write_through=True)
    inp = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    saved = sys.stdout, sys.stderr, sys.stdin
    code = 0
    with contextlib.ExitStack() as stack:
        if cwd is not None:
            stack.enter_context(_chdir(cwd))
        _show_warnings_as_a_process_would(stack, err)
        sys.stdout, sys.stderr, sys.stdin = out, err, inp
        try:
            run_app(tool, _app(tool), list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            out.flush()
            err.flush()
            sys.stdout, sys.stderr, sys.stdin = saved
    return Outcome(code, out_buf.getvalue(), err_buf.getvalue().decode("utf-8", "backslashreplace"), list(argv))


def invoke_script(tool: str, argv: list[str], *, stdin: bytes = b"", cwd: Path | None = None,
                  timeout: float = 120) -> Outcome:
    """Run the real console script (``.venv/bin/arena-...``) as a subprocess."""
    exe = Path(sys.executable).with_name(tool)
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    r = subprocess.run([str(exe), *argv], input=stdin, cwd=cwd, capture_output=True, timeout=timeout, env=env)
    return Outcome(r.returncode, r.stdout, r.stderr.decode("utf-8", "backslashreplace"), list(argv))


def snapshot(directory: Path) -> dict[str, int]:
    """Every path under ``directory`` (files, directories, temp files included) with its size."""
    return {str(p.relative_to(directory)): (p.stat().st_size if p.is_file() else -1)
            for p in directory.rglob("*")}


def check_contract(tool: str, outcome: Outcome, before: dict[str, int], workdir: Path,
                   allowed_outputs: Iterable[str] = (), verify_output: Callable[[Path], Any] | None = None) -> None:
    """Assert the bad-input contract for one case (see the module docstring)."""
    after = snapshot(workdir)
    new = sorted(set(after) - set(before))
    OUTCOMES[(tool, outcome.code)] = OUTCOMES.get((tool, outcome.code), 0) + 1
    assert outcome.code in (0, 2), f"{tool}: exit code {outcome.code} (expected 0 or 2): {outcome.describe()}"
    assert "Traceback" not in outcome.stderr, f"{tool}: traceback: {outcome.describe()}"
    assert "internal error" not in outcome.stderr, f"{tool}: internal error: {outcome.describe()}"
    # (a warning raised in a library's own code, or from another thread meanwhile, is not the tool's doing)
    assert not re.search(r"/(libarena|tools)/[^\n:]+:\d+: [A-Z]\w*Warning: ", outcome.stderr), \
        f"{tool}: a Python warning from Arena's code: {outcome.describe()}"
    if outcome.code == 2:
        lines = outcome.stderr.splitlines()
        assert len(lines) == 1, f"{tool}: exit 2 with {len(lines)} stderr lines (expected 1): {outcome.describe()}"
        assert lines[0].startswith(f"{tool}: error: "), f"{tool}: unexpected error line: {outcome.describe()}"
        assert not new, f"{tool}: failed but left {new} behind: {outcome.describe()}"
        return
    allowed = set(allowed_outputs)
    stray = [p for p in new if p not in allowed | {STAGE_CACHE_DIR}
             and not any(p.startswith(a + "/") for a in (*allowed, STAGE_CACHE_DIR))]
    assert not stray, f"{tool}: succeeded but also left {stray}: {outcome.describe()}"
    assert not [p for p in after if p.endswith(".tmp")], f"{tool}: left a temp file: {outcome.describe()}"
    if verify_output is not None:
        for name in sorted(allowed):
            if name in after:
                verify_output(workdir / name)


class Case:
    """A generated case with a short repr: hypothesis prints failing cases, and inputs are whole files."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        text = repr(self.value)
        return text if len(text) <= 400 else f"{text[:300]}...<{len(text)} chars>...{text[-80:]}"


def run_cases(tool: str, test: str, strategy: st.SearchStrategy, body: Callable[[Any], None]) -> int:
    """Run ``body`` on ``BUDGET[tool][test]`` derandomized examples of ``strategy``; return the count."""
    budget = BUDGET[tool][test]
    count = 0

    @settings(max_examples=budget, **FUZZ_SETTINGS)
    @given(strategy.map(Case))
    def cases(case: Case) -> None:
        nonlocal count
        count += 1
        body(case.value)

    cases()
    assert count >= budget, f"{tool}/{test}: only {count} of {budget} cases generated (strategy space too small)"
    return count


@contextlib.contextmanager
def workdir(files: dict[str, bytes] | None = None):
    """A fresh directory holding ``files``; yields (path, snapshot before the tool runs)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="arena-fuzz-") as name:
        root = Path(name)
        for rel, data in (files or {}).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        yield root, snapshot(root)


def run_and_check(tool: str, argv: list[str], files: dict[str, bytes] | None = None, *, stdin: bytes = b"",
                  allowed_outputs: Iterable[str] = (), verify_output: Callable[[Path], Any] | None = None,
                  extra_setup: Callable[[Path], None] | None = None) -> Outcome:
    """One fuzz case: fresh directory with ``files``, run in-process, check the contract."""
    with workdir(files) as (root, _):
        if extra_setup is not None:
            extra_setup(root)
        before = snapshot(root)
        outcome = invoke(tool, argv, stdin=stdin, cwd=root)
        if outcome.code not in (0, 2):  # an internal error: rerun with --debug so the failure shows where
            import traceback

            try:
                invoke_debug = invoke(tool, [*argv, "--debug"], stdin=stdin, cwd=root)
                outcome.stderr += invoke_debug.stderr
            except Exception:  # noqa: BLE001 - --debug re-raises the internal error
                outcome.stderr += "".join(traceback.format_exc().splitlines(keepends=True)[-12:])
        check_contract(tool, outcome, before, root, allowed_outputs, verify_output)
        return outcome
