"""Which code a benchmark measured with.

A results file says what it measured, and also with which code, so that a figure can be traced to a commit and
two runs' rows are only put together when the same code produced them (``bench_profile --resume``). The
identity is a digest of the source that does the measuring (every Python file of ``libarena`` and the
benchmark's own modules), not the git commit alone: a run from a checkout with uncommitted edits is told apart,
and a checkout without git (an unpacked archive) still has one. The commit is recorded beside it where git can
tell it. Other benchmarks' modules are left out, so that editing one does not part two runs of another.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from libarena.artifacts.source import source_digest

#: The library: every Python file under it is measuring code for every benchmark.
LIBRARY = ("libarena",)
#: The repository root: bench/ is one of its folders.
REPO_ROOT = Path(__file__).resolve().parent.parent


def git_commit(root: Path, source: tuple[str, ...]) -> dict[str, Any] | None:
    """The checkout's commit and whether ``source``'s Python files differ from it (``dirty``); None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30)
        if head.returncode != 0:
            return None
        # Python files only: a results file written beside the source is not an edit of it
        spec = [f"{entry}/*.py" if (root / entry).is_dir() else entry for entry in source]
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *spec], cwd=root, capture_output=True, text=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}


def code_identity(modules: tuple[str, ...], root: Path = REPO_ROOT) -> dict[str, Any]:
    """What a results file records as the code it was measured with: the library and the benchmark's own
    ``modules`` (paths relative to ``root``, e.g. ``bench/bench_profile.py``)."""
    source = LIBRARY + tuple(modules)
    return {"source_sha256": source_digest(root, source), "source": list(source), "git": git_commit(root, source)}
